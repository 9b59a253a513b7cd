"""The eval metric a run watches for its best checkpoint and early stopping
(``LoopConfig.keep_best``): plain Python, read by the configuration checks
and the best-checkpoint tracker."""

from __future__ import annotations

from psrec.models.retrieval.config import RETRIEVAL_METRICS

#: ``--keep-best`` values that name the first task's metric (auc/logloss
#: of a ranking run; mrr/recall@K of a retrieval run), or none.
KEEP_BEST = ("auc", "logloss", *RETRIEVAL_METRICS, "none")
#: The metrics ``--keep-best TASK:METRIC`` takes (a task of a spec's labels).
TASK_BEST_METRICS = ("auc", "logloss", "rmse")


def split_keep_best(value: str) -> tuple[str | None, str]:
    """``(task, metric)`` of a ``keep_best`` value: ``like:auc`` ->
    ``("like", "auc")``; ``auc`` -> ``(None, "auc")`` (the first task)."""
    task, _, metric = value.rpartition(":")
    return (task or None), metric


def higher_is_better(keep_best: str) -> bool:
    """AUC, MRR and recall improve upwards; logloss and RMSE downwards."""
    return split_keep_best(keep_best)[1] not in ("logloss", "rmse")
