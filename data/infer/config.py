"""The options of ``psrec spec infer``: :class:`InferOptions` (plain
Python, each field an option; ``psrec.options``)."""

from __future__ import annotations

import dataclasses

from psrec.errors import check
from psrec.options import option
from psrec.options import qualified


@dataclasses.dataclass(frozen=True)
class InferOptions:
    """How columns become features when a spec is inferred."""

    label_threshold: float | None = option(
        None, flag="--label-threshold",
        help="label = value >= T (for a label that is not 0/1, e.g. a "
        "rating)")
    max_buckets: int = option(
        2 ** 20, flag="--max-buckets",
        help="most hash buckets per feature (default 2**20)")
    vocab_max: int = option(
        1000, flag="--vocab-max",
        help="string columns with at most this many distinct values get a "
        "vocabulary file (default 1000; 0: hash all)")
    exclude: tuple[str, ...] = option((), flag="--exclude",
                                      help="columns to leave out")

    def __post_init__(self) -> None:
        object.__setattr__(self, "exclude", tuple(self.exclude))
        check(self.max_buckets >= 2, qualified(self, "max_buckets"),
              self.max_buckets, "must be >= 2")
        check(self.vocab_max >= 0, qualified(self, "vocab_max"),
              self.vocab_max, "must be >= 0")
