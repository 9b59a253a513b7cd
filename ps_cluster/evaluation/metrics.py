"""Streaming CTR metrics that merge across closures: counts, logloss,
calibration and AUC from prediction histograms.

AUC is computed from two histograms (positives, negatives) over
``AUC_BINS`` bins uniform in the *logit*, on ``[-AUC_LOGIT_RANGE,
AUC_LOGIT_RANGE]`` (logits outside are clipped into the end bins). The
histograms are fixed-size sums, so batches, closures and shards merge by
addition. Bins uniform in probability would crowd every prediction of a
0.2%-positive CTR model into the first few dozen bins; bins of 1/1024
logit keep the error far below 0.001 (tests/test_metrics.py measures it
against an exact rank AUC).

Error bound: the histogram AUC scores every (positive, negative) pair that
shares a bin as a tie (1/2), so it differs from the exact rank AUC by at
most half the fraction of pairs that share a bin without sharing a score
(:func:`shared_bin_fraction`); in practice the in-bin orderings are near
1/2 on average and the error is orders of magnitude below that bound.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import tensorflow as tf

from psrec.features.spec.spec import ID_COLUMN
from psrec.features.spec.spec import FeatureSpec
from psrec.models.ranking.model import task_labels
from psrec.models.ranking.model import task_outputs
from psrec.ps_cluster.evaluation.breakdown import Breakdown
from psrec.ps_cluster.evaluation.groups import breakdown_statistics
from psrec.ps_cluster.evaluation.groups import group_metrics
from psrec.ps_cluster.evaluation.groups import zero_breakdown_statistics

AUC_BINS = 65_536
AUC_LOGIT_RANGE = 32.0  # sigmoid(-32) ~ 1.3e-14: nothing real lies beyond.
AUC_BIN_WIDTH = 2 * AUC_LOGIT_RANGE / AUC_BINS  # 1/1024 logit.


def auc_bins(logits: tf.Tensor) -> tf.Tensor:
    """The histogram bin (int32 in ``[0, AUC_BINS)``) of each logit."""
    logits = tf.cast(logits, tf.float32)
    clipped = tf.clip_by_value(logits, -AUC_LOGIT_RANGE, AUC_LOGIT_RANGE)
    scaled = (clipped + AUC_LOGIT_RANGE) * (1.0 / AUC_BIN_WIDTH)
    return tf.clip_by_value(tf.cast(tf.floor(scaled), tf.int32), 0,
                            AUC_BINS - 1)


def batch_statistics(labels: tf.Tensor, logits: tf.Tensor,
                     ids: tf.Tensor, regression: bool = False,
                     present: tf.Tensor | None = None
                     ) -> dict[str, tf.Tensor]:
    """Per-batch sums that add up across batches and closures; with
    ``regression`` (``loss: mse``) also the squared error of the output as
    a prediction of the label (for RMSE). ``present`` (a multi-task
    spec's task: its label is not NaN) leaves the other rows out of every
    sum but ``id_sum`` (which counts the rows evaluated)."""
    labels = tf.reshape(tf.cast(labels, tf.float32), [-1])
    logits = tf.reshape(tf.cast(logits, tf.float32), [-1])
    bins = auc_bins(logits)
    if present is None:
        weights, count = None, tf.size(labels, out_type=tf.int64)
    else:
        present = tf.reshape(present, [-1])
        labels = tf.where(present, labels, 0.0)
        weights = tf.cast(present, tf.float32)
        count = tf.math.count_nonzero(present, dtype=tf.int64)

    def total(values: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(values if weights is None else values * weights)

    def histogram(values: tf.Tensor) -> tf.Tensor:
        return tf.math.bincount(
            bins, weights=values if weights is None else values * weights,
            minlength=AUC_BINS, maxlength=AUC_BINS)

    extra = ({"squared_error_sum": total(tf.square(logits - labels))}
             if regression else {})
    return {**extra,
        "count": count,
        "positives": total(labels),
        "logloss_sum": total(
            tf.nn.sigmoid_cross_entropy_with_logits(labels, logits)),
        "prediction_sum": total(tf.sigmoid(logits)),
        "id_sum": tf.reduce_sum(ids),
        "pos_hist": histogram(labels),
        "neg_hist": histogram(1.0 - labels),
    }


def _task_key(task: str, key: str) -> str:
    """The statistics key of a further task's sum (the first task's are
    the plain keys)."""
    return f"task/{task}/{key}"


def eval_statistics(spec: FeatureSpec, outputs, batch: dict[str, tf.Tensor],
                    breakdown: Breakdown | None = None
                    ) -> dict[str, tf.Tensor]:
    """The statistics of one eval batch: the first task's under the plain
    keys (with ``breakdown``'s per-group sums), each further task's under
    ``task/<name>/`` (``outputs``: the model's, ``{task: logits}`` or the
    one label's tensor). A multi-task spec's missing labels (NaN) are left
    out of their task's sums; a ``given`` task is scored on ``given x
    label`` over every row (``task_labels``)."""
    outputs = task_outputs(outputs, spec)
    targets = task_labels(spec, batch) if spec.multi_task else None
    stats: dict[str, tf.Tensor] = {}
    for index, label in enumerate(spec.labels):
        value, present = (targets[label.name] if targets is not None
                          else (tf.cast(batch[label.name], tf.float32),
                                None))
        part = batch_statistics(value, outputs[label.name], batch[ID_COLUMN],
                                label.regression, present)
        if index == 0:
            stats.update(part)
            if breakdown is not None:
                stats.update(breakdown_statistics(
                    breakdown, batch, value, outputs[label.name], present))
        else:
            stats.update({_task_key(label.name, key): v
                          for key, v in part.items() if key != "id_sum"})
    return stats


def zero_eval_statistics(spec: FeatureSpec, breakdown: Breakdown | None = None
                         ) -> dict[str, tf.Tensor]:
    """The identity of the sums of :func:`eval_statistics`."""
    stats = zero_statistics(spec.label.regression)
    if breakdown is not None:
        stats.update(zero_breakdown_statistics(breakdown))
    for label in spec.further_labels:
        stats.update({_task_key(label.name, key): v for key, v in
                      zero_statistics(label.regression).items()
                      if key != "id_sum"})
    return stats


def zero_statistics(regression: bool = False) -> dict[str, tf.Tensor]:
    """The identity of :func:`add_statistics` (the ``reduce`` start)."""
    extra = {"squared_error_sum": tf.constant(0.0)} if regression else {}
    return {**extra,
        "count": tf.constant(0, tf.int64),
        "positives": tf.constant(0.0),
        "logloss_sum": tf.constant(0.0),
        "prediction_sum": tf.constant(0.0),
        "id_sum": tf.constant(0, tf.int64),
        "pos_hist": tf.zeros([AUC_BINS]),
        "neg_hist": tf.zeros([AUC_BINS]),
    }


def add_statistics(parts: list[dict[str, np.ndarray]]
                   ) -> dict[str, np.ndarray]:
    """Element-wise sum of the statistics of batches, closures or shards."""
    return {k: sum(np.asarray(p[k]) for p in parts) for k in parts[0]}


def auc_from_histograms(pos: np.ndarray, neg: np.ndarray) -> float:
    """ROC AUC: P(score of a positive > score of a negative), ties 1/2."""
    pos = np.asarray(pos, np.float64)
    neg = np.asarray(neg, np.float64)
    total_pos, total_neg = pos.sum(), neg.sum()
    if total_pos == 0 or total_neg == 0:
        return float("nan")
    pos_below = np.cumsum(pos) - pos  # positives in lower bins
    # A negative in bin b loses to the positives above it, ties count 1/2.
    pos_above = total_pos - pos_below - pos
    wins = (neg * (pos_above + 0.5 * pos)).sum()
    return float(wins / (total_pos * total_neg))


def shared_bin_fraction(pos: np.ndarray, neg: np.ndarray) -> float:
    """Fraction of (positive, negative) pairs in the same bin: twice the
    largest possible error of :func:`auc_from_histograms`."""
    pos = np.asarray(pos, np.float64)
    neg = np.asarray(neg, np.float64)
    pairs = pos.sum() * neg.sum()
    return float((pos * neg).sum() / pairs) if pairs else float("nan")


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """Aggregated evaluation of one pass over the eval split.

    ``mean_prediction`` is the mean predicted probability; ``calibration``
    is ``mean_prediction`` / observed positive rate (1.0 when calibrated,
    NaN without positives). Both default so that results written before
    they existed still load; ``calibration`` is derived when not given.
    """

    count: int
    positives: float
    logloss: float
    auc: float
    id_sum: int
    mean_prediction: float = math.nan
    calibration: float | None = None
    rmse: float | None = None  # regression (``loss: mse``) only
    # ``--group-by`` (psrec.ps_cluster.evaluation.groups): GAUC, its error
    # bound, the groups scored and those left out (one class only).
    gauc: float | None = None
    gauc_error_bound: float | None = None
    gauc_groups: int | None = None
    gauc_skipped_groups: int | None = None
    group_by: str | None = None
    gauc_weighting: str | None = None
    groups_exact: bool | None = None
    # ``--slice-by``: one dict per slice (id, count, positives, auc,
    # auc_error_bound, logloss, calibration), the last one ``other``.
    slice_by: str | None = None
    slices: list | None = None
    # A multi-task spec: one dict per task, the first task first (name,
    # loss, weight, count, positives, auc, logloss, calibration, rmse); the
    # fields above are the first task's.
    tasks: list | None = None

    def __post_init__(self) -> None:
        if self.calibration is None:
            rate = self.positives / self.count if self.count else 0.0
            value = (self.mean_prediction / rate if rate > 0
                     else math.nan)
            object.__setattr__(self, "calibration", float(value))

    @property
    def positive_rate(self) -> float:
        return self.positives / max(1, self.count)

    def to_dict(self) -> dict[str, float | int]:
        """The result as JSON-able data (AUC is NaN when one class is
        missing, calibration when there are no positives)."""
        return {**dataclasses.asdict(self),
                "positive_rate": self.positive_rate}

    def summary(self) -> str:
        if self.tasks:
            return (f"eval: {len(self.tasks)} tasks"
                    + "".join(f"\n  task {task_line(t)}" for t in self.tasks)
                    + "".join(f"\n  {self.tasks[0]['name']}: {line}"
                              for line in self.breakdown_lines()))
        if self.rmse is not None:  # regression: AUC etc. do not apply
            return f"eval: {self.count} examples, RMSE {self.rmse:.4f}"
        return (f"eval: {self.count} examples, AUC {self.auc:.4f}, logloss "
                f"{self.logloss:.4f}, calibration {self.calibration:.2f}, "
                f"positive rate {self.positive_rate:.4f}"
                + "".join(f"\n  {line}" for line in self.breakdown_lines()))

    def task(self, name: str) -> dict:
        """The metrics of task ``name`` (a multi-task result); KeyError
        for another name."""
        for task in self.tasks or ():
            if task["name"] == name:
                return task
        raise KeyError(name)

    def gauc_line(self) -> str | None:
        """``GAUC by COLUMN ...`` (None without ``--group-by``)."""
        if self.group_by is None:
            return None
        return (f"GAUC by {self.group_by} ({self.gauc_weighting}) "
                f"{self.gauc:.4f} (error <= {self.gauc_error_bound:.4f}) "
                f"over {self.gauc_groups} groups; "
                f"{self.gauc_skipped_groups} with one class left out"
                + ("" if self.groups_exact is not False else
                   "; values share group slots (approximate grouping)"))

    def breakdown_lines(self) -> list[str]:
        """The GAUC line and one line per slice (none without
        ``--group-by`` and ``--slice-by``)."""
        lines = [self.gauc_line()] if self.group_by is not None else []
        for s in self.slices or ():
            lines.append(
                f"slice {self.slice_by}={s['id']}: {s['count']} examples, "
                f"AUC {s['auc']:.4f}, logloss {s['logloss']:.4f}, "
                f"calibration {s['calibration']:.2f}")
        return lines

    def scalars(self) -> dict[str, float]:
        """The TensorBoard scalars of this evaluation (``eval/NAME``)."""
        values = {"auc": self.auc, "logloss": self.logloss}
        for task in self.tasks or ():
            for name in TASK_METRICS[task["loss"]]:
                values[f"task/{task['name']}/{name}"] = task[name]
        if self.gauc is not None:
            values["gauc"] = self.gauc
        for s in self.slices or ():
            for name in ("auc", "logloss", "calibration"):
                values[f"slice/{self.slice_by}={s['id']}/{name}"] = s[name]
        return values


#: The metrics a task reports, by its loss.
TASK_METRICS = {"logloss": ("auc", "logloss", "calibration"),
                "mse": ("rmse",)}


_METRIC_NAMES = {"auc": "AUC", "rmse": "RMSE"}


def task_line(task: dict) -> str:
    """One task's metrics in one line (``like: 1200 examples, AUC ...``)."""
    words = ", ".join(f"{_METRIC_NAMES.get(m, m)} {task[m]:.4f}"
                      for m in TASK_METRICS[task["loss"]])
    return f"{task['name']}: {task['count']} examples, {words}"


def _task_metrics(total: dict[str, np.ndarray], label) -> dict:
    """A task's metrics from its summed statistics (plain keys)."""
    count = int(total["count"])
    positives = float(total["positives"])
    prediction_sum = float(total["prediction_sum"])
    metrics = {"name": label.name, "loss": label.loss,
               "weight": float(label.weight), "count": count}
    if label.regression:
        metrics["rmse"] = math.sqrt(float(total["squared_error_sum"])
                                    / max(1, count))
    else:
        metrics.update(
            positives=positives,
            auc=auc_from_histograms(total["pos_hist"], total["neg_hist"]),
            logloss=float(total["logloss_sum"]) / max(1, count),
            calibration=(prediction_sum / positives if positives
                         else math.nan))
    return metrics


def _tasks(total: dict[str, np.ndarray], spec) -> list[dict] | None:
    """Every task's metrics of a multi-task spec (None: one label)."""
    if spec is None or not spec.multi_task:
        return None
    tasks = [_task_metrics(total, spec.label)]
    for label in spec.further_labels:
        prefix = _task_key(label.name, "")
        tasks.append(_task_metrics(
            {key[len(prefix):]: value for key, value in total.items()
             if key.startswith(prefix)}, label))
    return tasks


def merge(parts: list[dict[str, np.ndarray]],
          breakdown: Breakdown | None = None, spec=None) -> EvalResult:
    """The :class:`EvalResult` of the summed statistics of ``parts`` (with
    ``breakdown``: also its GAUC and slices, of the feature spec
    ``spec``; a multi-task ``spec``: every task's metrics, ``tasks``)."""
    total = add_statistics(parts)
    extra = (group_metrics(total, breakdown, spec)
             if breakdown is not None and breakdown.active else {})
    count = int(total["count"])
    positives = float(total["positives"])
    prediction_sum = float(total["prediction_sum"])
    return EvalResult(
        count=count, positives=positives,
        logloss=float(total["logloss_sum"]) / max(1, count),
        auc=auc_from_histograms(total["pos_hist"], total["neg_hist"]),
        id_sum=int(total["id_sum"]),
        mean_prediction=prediction_sum / count if count else math.nan,
        calibration=prediction_sum / positives if positives else math.nan,
        rmse=(math.sqrt(float(total["squared_error_sum"]) / max(1, count))
              if "squared_error_sum" in total else None),
        tasks=_tasks(total, spec), **extra)
