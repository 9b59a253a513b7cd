"""Configuration of the two-tower retrieval task (plain Python, no
TensorFlow): the towers' shape and the sampled-softmax loss."""

from __future__ import annotations

import dataclasses
import math

from psrec.errors import check
from psrec.models.ranking.config import ModelConfigError
from psrec.options import Codec
from psrec.options import option

TASKS = ("ranking", "retrieval")
#: The cut-offs of the exact evaluation (recall@k).
RECALL_KS = (1, 5, 10, 50, 100)
#: The metrics a retrieval run can keep its best checkpoint by
#: (``--keep-best``), and the one it keeps by default: MRR, the whole
#: ranking's head in one figure (docs/decisions.md, "Retrieval keeps its
#: best checkpoint").
RETRIEVAL_METRICS = ("mrr", *(f"recall@{k}" for k in RECALL_KS))
RETRIEVAL_KEEP_BEST = "mrr"
#: Fields added since the first retrieval ``job.json``, with the value a
#: run recorded before them trained with.
_ADDED_FIELDS = {"candidate_bias": False}


def as_recorded(data: dict) -> dict:
    """A recorded ``RetrievalConfig`` (``job.json``'s ``retrieval``) with
    the fields added since it was written, at the values that run trained
    with."""
    return {**_ADDED_FIELDS, **data}


@dataclasses.dataclass(frozen=True)
class RetrievalConfig(Codec, where="retrieval"):
    """A two-tower model (``psrec train --task retrieval``)."""

    tower_mlp: tuple[int, ...] = option(
        (64,), flag="--tower-mlp",
        help="hidden widths of each tower, e.g. 64,32")
    output_dim: int = option(32, flag="--output-dim",
                             help="query and candidate embedding width")
    temperature: float = option(
        0.05, flag="--temperature",
        help="softmax temperature (scores are cosines unless "
        "--no-normalize)")
    normalize: bool = option(True, flag="--no-normalize",
                             help="raw dot products instead of cosines")
    logq: bool = option(
        True, flag="--no-logq",
        help="no sampling-probability (logQ) correction of the in-batch "
        "logits")
    uniform_negatives: int = option(
        0, flag="--uniform-negatives",
        help="extra negatives per batch drawn uniformly from the catalogue")
    remove_accidental_hits: bool = option(
        True, flag="--keep-accidental-hits",
        help="keep negatives that are the positive's own candidate "
        "(default: removed)")
    candidate_bias: bool = option(
        True, flag="--no-candidate-bias",
        help="no learned bias per candidate (default: a score is the two "
        "towers' dot product plus the candidate's bias, the sum of one "
        "learned weight per candidate feature value)")
    exclude_seen: bool = option(
        True, flag="--no-exclude-seen",
        help="evaluate each held-out pair against the whole catalogue "
        "(default: without the candidates its user has in the train split, "
        "for the model and the popularity baseline alike; the spec's "
        "towers.query_id names the user)")

    def __post_init__(self) -> None:
        object.__setattr__(self, "tower_mlp", tuple(self.tower_mlp))
        name = type(self).__name__
        check(all(isinstance(w, int) and w >= 1 for w in self.tower_mlp),
              f"{name}.tower_mlp", self.tower_mlp, "must hold positive integers",
              ModelConfigError)
        check(isinstance(self.output_dim, int) and self.output_dim >= 1,
              f"{name}.output_dim", self.output_dim, "must be >= 1",
              ModelConfigError)
        check(isinstance(self.temperature, (int, float))
              and math.isfinite(self.temperature) and self.temperature > 0,
              f"{name}.temperature", self.temperature, "must be a number > 0",
              ModelConfigError)
        check(isinstance(self.uniform_negatives, int)
              and self.uniform_negatives >= 0, f"{name}.uniform_negatives",
              self.uniform_negatives, "must be >= 0", ModelConfigError)

    @classmethod
    def from_dict(cls, data: dict, where: str | None = None
                  ) -> "RetrievalConfig":
        """As :meth:`Codec.from_dict`; a field the data lacks takes the
        value its run trained with (:func:`as_recorded`)."""
        return super().from_dict(as_recorded(data), where)

    @property
    def embedding_dim(self) -> int:
        """The width of the query and candidate embeddings whose dot
        product is the score: ``output_dim``, plus one with
        ``candidate_bias`` (1 in the query's, the bias in the
        candidate's)."""
        return self.output_dim + int(self.candidate_bias)

    def wide_tables(self, spec) -> tuple[str, ...]:
        """The tables of ``spec`` with a wide (``[rows, 1]``) twin: those of
        the candidate features, whose wide weights make the candidate bias,
        with ``candidate_bias``; else none."""
        if not self.candidate_bias:
            return ()
        candidate = set(spec.towers.candidate)
        return tuple(dict.fromkeys(f.table for f in spec.categorical
                                   if f.name in candidate))


def check_no_dynamic_tables(spec) -> None:
    """Two-tower retrieval takes hashed tables only: its catalogue and
    log-q counts index table rows by id, which raw ids of a ``mode:
    dynamic`` table are not (pure Python, before anything starts)."""
    dynamic = [t.name for t in spec.tables if getattr(t, "dynamic", False)]
    if dynamic:
        raise ModelConfigError(
            f"`--task retrieval` does not support `mode: dynamic` tables "
            f"({', '.join(dynamic)}): the catalogue and its log-q counts "
            "index rows by id; use hashed tables (drop `mode: dynamic`) or "
            "train a ranking model.")
