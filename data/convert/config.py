"""The options of one conversion: :class:`ConversionOptions` (plain Python,
each field an option; ``psrec.options``)."""

from __future__ import annotations

import dataclasses
import functools
import math

from psrec.errors import check
from psrec.errors import check_at_least
from psrec.options import check_choices
from psrec.options import option
from psrec.options import qualified

SPLIT_MODES = ("tail", "hash")


def check_neg_sample_rate(rate: float, name: str = "neg_sample_rate") -> None:
    """``rate`` is a number in (0, 1]."""
    ok = isinstance(rate, (int, float)) and not isinstance(rate, bool)
    check(ok and math.isfinite(rate) and 0.0 < rate <= 1.0, name, rate,
          "must be in (0, 1] (the share of train negatives kept; 1 keeps "
          "all)")


#: The eval split's share of rows when a conversion names none: held out
#: so that a first run evaluates (``--eval-fraction 0``: none).
DEFAULT_EVAL_FRACTION = 0.1


@dataclasses.dataclass(frozen=True)
class ConversionOptions:
    """Options of one conversion."""

    shards: int = option(
        4, flag="--shards",
        help="train shards (>= the input pipelines that read them)")
    eval_fraction: float | None = option(
        None, flag="--eval-fraction",
        help="share of rows in the eval split, in [0, 1); 0: no eval split "
        f"(default: {DEFAULT_EVAL_FRACTION:g} unless --eval-files picks the "
        "eval rows)")
    split_mode: str = option(
        "tail", flag="--split", choices=SPLIT_MODES,
        help="eval rows: the last rows (tail: time-ordered logs) or a stable "
        "hash of the row id")
    eval_shards: int | None = option(
        None, flag="--eval-shards", help="eval shards (default: --shards)")
    block_rows: int = option(256, flag="--block-rows",
                             help="rows packed per TFRecord record")
    max_bad_fraction: float = option(
        0.001, flag="--max-bad-fraction",
        help="fail above this share of bad rows (they go to "
        "quarantine.parquet)")
    batch_rows: int = option(65_536, help="Parquet rows read per batch")
    order_by: str | None = option(
        None, flag="--order-by",
        help="tail split by this column: eval = the rows with the last "
        "values (ties: input order), e.g. a timestamp; the column may be "
        "outside the spec, must not be null")
    eval_files: str | None = option(
        None, flag="--eval-files",
        help="eval = every row of the inputs whose file name matches GLOB, "
        "train = the others (instead of --eval-fraction)")
    neg_sample_rate: float = option(
        1.0, flag="--neg-sample-rate",
        help="keep every positive and this share of the train negatives "
        "(stable hash of the row id; the eval split is not sampled); "
        "training, eval and the export correct the logits by log(R); 1: "
        "keep all")
    overwrite: bool = option(
        False, flag="--overwrite",
        help="replace the dataset in the output folder even when it was "
        "converted from other inputs (without it, such a folder is "
        "refused; the same inputs may be converted into it again)")

    @property
    def eval_share(self) -> float:
        """The share of rows the eval split takes: ``eval_fraction``, or
        :data:`DEFAULT_EVAL_FRACTION` when it is not given, 0 when
        ``eval_files`` picks the eval rows."""
        if self.eval_files is not None:
            return 0.0
        if self.eval_fraction is None:
            return DEFAULT_EVAL_FRACTION
        return self.eval_fraction

    def __post_init__(self) -> None:
        name = functools.partial(qualified, self)
        check_neg_sample_rate(self.neg_sample_rate, name("neg_sample_rate"))
        for key in ("shards", "block_rows", "batch_rows"):
            value = getattr(self, key)
            check(isinstance(value, int) and value >= 1, name(key), value,
                  "must be an integer >= 1")
        if self.eval_shards is not None:
            check_at_least(self, 1, "eval_shards")
        if self.eval_fraction is not None:
            check(0.0 <= self.eval_fraction < 1.0, name("eval_fraction"),
                  self.eval_fraction, "must be in [0, 1)")
        check(0.0 <= self.max_bad_fraction <= 1.0, name("max_bad_fraction"),
              self.max_bad_fraction, "must be in [0, 1]")
        check_choices(self)
        if self.order_by is not None:
            check(self.split_mode == "tail" and self.eval_share > 0,
                  name("order_by"), self.order_by,
                  f"applies to `{name('split_mode')}` tail with "
                  f"`{name('eval_fraction')}` > 0 (it orders the rows the "
                  "tail is cut from)")
        if self.eval_files is not None:
            check(not self.eval_fraction and self.split_mode == "tail"
                  and self.order_by is None, name("eval_files"),
                  self.eval_files, "picks the eval rows by file: give it "
                  f"without `{name('eval_fraction')}`, `{name('split_mode')}` "
                  f"hash and `{name('order_by')}`")
