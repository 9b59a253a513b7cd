"""Exact retrieval metrics (recall@k, MRR) and how closure sums merge into
them; plain NumPy, so readers of a saved result need no TensorFlow."""

from __future__ import annotations

import dataclasses
import math
from typing import Any
from typing import Callable

import numpy as np

from psrec.models.retrieval.config import RECALL_KS


@dataclasses.dataclass(frozen=True)
class RetrievalEvalResult:
    """Exact recall@k and MRR of the held-out pairs.

    Attributes:
      count: the pairs evaluated (eval rows with a positive label).
      catalogue: the candidates every pair was ranked against.
      recall: k -> share of pairs whose candidate ranked in the top k.
    """

    count: int
    catalogue: int
    recall: dict[int, float]
    mrr: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "recall", {
            int(k): float(v) for k, v in self.recall.items()})

    def summary(self) -> str:
        recalls = ", ".join(f"recall@{k} {v:.4f}"
                            for k, v in sorted(self.recall.items()))
        return (f"eval: {self.count} pairs against {self.catalogue} "
                f"candidates, {recalls}, MRR {self.mrr:.4f}")

    def scalars(self) -> dict[str, float]:
        """TensorBoard scalars (``eval/<name>``)."""
        return {**{f"recall_at_{k}": v for k, v in self.recall.items()},
                "mrr": self.mrr}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # The ranking metrics are not defined for retrieval: NaN, which the
    # ranking-only readers (heartbeat, metrics endpoint) leave out.
    auc = property(lambda self: math.nan)
    logloss = property(lambda self: math.nan)


def ranking_auc(result) -> float | None:
    """The AUC of a ranking eval result; None for retrieval, regression
    (``loss: mse``) or no result."""
    if result is None or isinstance(result, RetrievalEvalResult) or (
            result.rmse is not None):
        return None
    return result.auc


def eval_result_from_dict(data: dict[str, Any]):
    """An eval result saved with ``dataclasses.asdict``: retrieval (has
    ``mrr``) or ranking."""
    if "mrr" in data:
        return RetrievalEvalResult(**data)
    from psrec.ps_cluster.evaluation.metrics import EvalResult
    return EvalResult(**data)


def merge_retrieval(catalogue: int) -> Callable[[list], RetrievalEvalResult]:
    """The ``combine`` of ``evaluate_files``: shard sums -> result."""

    def combine(parts: list[dict[str, np.ndarray]]) -> RetrievalEvalResult:
        count = int(sum(int(p["count"]) for p in parts))
        hits = sum((np.asarray(p["hits"], np.int64) for p in parts),
                   np.zeros(len(RECALL_KS), np.int64))
        rr = float(sum(float(p["reciprocal_rank_sum"]) for p in parts))
        denominator = max(1, count)
        return RetrievalEvalResult(
            count=count, catalogue=catalogue,
            recall={k: float(h) / denominator
                    for k, h in zip(RECALL_KS, hits)},
            mrr=rr / denominator)

    return combine
