"""Exact retrieval metrics (recall@k, MRR), how closure sums merge into
them, and the popularity baseline they are read against; plain NumPy, so
readers of a saved result need no TensorFlow."""

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
      popularity: the same metrics of the popularity baseline on the same
        pairs under the same rule (:func:`popularity_baseline`, or ranked
        in the closures when ``seen_excluded``): ``recall`` (k -> share)
        and ``mrr``; None when the catalogue does not count the split's
        pairs.
      seen_excluded: each pair was ranked without its user's train
        candidates (but its own); False: against the whole catalogue.
    """

    count: int
    catalogue: int
    recall: dict[int, float]
    mrr: float
    popularity: dict[str, Any] | None = None
    seen_excluded: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "recall", {
            int(k): float(v) for k, v in self.recall.items()})
        if self.popularity is not None:  # JSON keys are strings
            object.__setattr__(self, "popularity", {
                "recall": {int(k): float(v) for k, v in
                           self.popularity["recall"].items()},
                "mrr": float(self.popularity["mrr"])})

    def summary(self) -> str:
        """One line: each metric, the popularity baseline's beside it."""
        baseline = self.popularity or {}

        def beside(name: str, value: float, base: float | None) -> str:
            return (f"{name} {value:.4f}" if base is None
                    else f"{name} {value:.4f} (popularity {base:.4f})")

        recalls = ", ".join(
            beside(f"recall@{k}", v, baseline.get("recall", {}).get(k))
            for k, v in sorted(self.recall.items()))
        seen = (" (each user's train candidates left out)"
                if self.seen_excluded else "")
        return (f"eval: {self.count} pairs against {self.catalogue} "
                f"candidates{seen}, {recalls}, "
                f"{beside('MRR', self.mrr, baseline.get('mrr'))}")

    def not_above_popularity(self) -> list[str]:
        """The metrics (``recall@100``, ``MRR``) on which the model does
        not beat the popularity baseline (scores at most the baseline's)."""
        if self.popularity is None:
            return []
        names = [f"recall@{k}" for k, v in sorted(self.recall.items())
                 if v <= self.popularity["recall"].get(k, -1.0)]
        return names + (["MRR"] if self.mrr <= self.popularity["mrr"]
                        else [])

    def popularity_note(self) -> str | None:
        """The line saying the model does not beat the popularity baseline
        (None when it beats it on every metric, or there is no baseline)."""
        names = self.not_above_popularity()
        if not names:
            return None
        return ("the model does not beat the popularity baseline (every "
                "candidate ranked by its train-split positives) on "
                f"{', '.join(names)}: serving the most popular candidates "
                "to everyone would score as well (see "
                "docs/tutorials/retrieval.md)")

    def scalars(self) -> dict[str, float]:
        """TensorBoard scalars (``eval/<name>``)."""
        return {**{f"recall_at_{k}": v for k, v in self.recall.items()},
                "mrr": self.mrr}

    def named(self) -> dict[str, float]:
        """Each metric by its ``--keep-best`` name (``recall@10``,
        ``mrr``)."""
        return {**{f"recall@{k}": v for k, v in sorted(self.recall.items())},
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


def popularity_ranks(train_counts: np.ndarray) -> np.ndarray:
    """[N] int64: each candidate's 0-based rank when the catalogue is
    ordered by train-split positives, most first; ties go to the earlier
    catalogue row (the lower raw id), so every rank is distinct."""
    counts = np.asarray(train_counts, np.int64)
    order = np.lexsort((np.arange(len(counts)), -counts))
    ranks = np.empty(len(counts), np.int64)
    ranks[order] = np.arange(len(counts))
    return ranks


def popularity_baseline(train_counts: np.ndarray, pairs: np.ndarray,
                        ks=RECALL_KS) -> dict[str, Any] | None:
    """Recall@k and MRR of ranking every query's candidates by
    :func:`popularity_ranks`, for the pairs ``pairs`` (``[N]``: the pairs
    of each candidate), each against the whole catalogue with nothing
    excluded (the evaluation's rule without seen lists; with them the
    closures rank the baseline, ``ps_cluster.retrieval.eval``): a pair is in
    the top k exactly when its candidate's rank is below k. None when there
    is no pair."""
    pairs = np.asarray(pairs, np.int64)
    total = int(pairs.sum())
    if total == 0:
        return None
    ranks = popularity_ranks(train_counts)
    return {"recall": {int(k): float(pairs[ranks < k].sum()) / total
                       for k in ks},
            "mrr": float((pairs / (ranks + 1.0)).sum()) / total}


def _merged(parts: list[dict[str, np.ndarray]], prefix: str = ""
            ) -> tuple[int, dict[int, float], float]:
    """The pairs, recall@k and MRR of the sums ``{prefix}count`` ... of
    ``parts``."""
    count = int(sum(int(p[f"{prefix}count"]) for p in parts))
    hits = sum((np.asarray(p[f"{prefix}hits"], np.int64) for p in parts),
               np.zeros(len(RECALL_KS), np.int64))
    rr = float(sum(float(p[f"{prefix}reciprocal_rank_sum"]) for p in parts))
    denominator = max(1, count)
    return (count, {k: float(h) / denominator
                    for k, h in zip(RECALL_KS, hits)}, rr / denominator)


def merge_retrieval(catalogue: int, seen_excluded: bool = False
                    ) -> Callable[[list], RetrievalEvalResult]:
    """The ``combine`` of ``evaluate_files``: shard sums -> result; with
    ``seen_excluded`` the sums carry the popularity baseline's
    (``popularity_*``), attached when it ranked every pair."""

    def combine(parts: list[dict[str, np.ndarray]]) -> RetrievalEvalResult:
        count, recall, mrr = _merged(parts)
        popularity = None
        if seen_excluded:
            pairs, base_recall, base_mrr = _merged(parts, "popularity_")
            if pairs == count and count:  # else: other pairs than counted
                popularity = {"recall": base_recall, "mrr": base_mrr}
        return RetrievalEvalResult(
            count=count, catalogue=catalogue, recall=recall, mrr=mrr,
            popularity=popularity, seen_excluded=seen_excluded)

    return combine
