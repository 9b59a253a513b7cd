"""ROC, precision-recall and calibration curves of an evaluation, from
counts summed in the evaluation's own pass.

ROC and precision-recall come from the AUC histograms the evaluation
already keeps (:func:`~psrec.ps_cluster.evaluation.metrics.batch_statistics`:
``AUC_BINS`` bins of 1/1024 logit): the cumulative counts above each bin
edge are the confusion counts at that threshold, and the trapezoid area
under those ROC points is exactly the evaluation's AUC (ties 1/2).

Calibration and TensorBoard's PR-curve plugin (thresholds equally spaced in
probability) use :data:`CURVE_BUCKETS` equal-width probability buckets,
counted by :func:`bucket_statistics` beside the AUC histograms: positives,
negatives and the sum of predicted probabilities per bucket. Like every
evaluation statistic they are fixed-size sums, so batches merge by addition.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from psrec.ps_cluster.evaluation.metrics import auc_from_histograms

CURVE_BUCKETS = 200  # equal-width probability buckets: [i/200, (i+1)/200)
#: The most points a drawn curve keeps (a point is dropped when it lies
#: closer than 1/_MAX_POINTS to the last one kept, in both coordinates).
_MAX_POINTS = 1000


def probability_buckets(probabilities: tf.Tensor) -> tf.Tensor:
    """The bucket (int32 in ``[0, CURVE_BUCKETS)``) of each probability;
    1.0 falls in the last bucket."""
    scaled = tf.floor(tf.cast(probabilities, tf.float32) * CURVE_BUCKETS)
    return tf.clip_by_value(tf.cast(scaled, tf.int32), 0, CURVE_BUCKETS - 1)


def bucket_statistics(labels: tf.Tensor, logits: tf.Tensor
                      ) -> dict[str, tf.Tensor]:
    """Per-batch sums per probability bucket: ``bucket_pos``,
    ``bucket_neg`` and ``bucket_prediction_sum`` (of the sigmoid)."""
    labels = tf.reshape(tf.cast(labels, tf.float32), [-1])
    probabilities = tf.sigmoid(tf.reshape(tf.cast(logits, tf.float32), [-1]))
    buckets = probability_buckets(probabilities)

    def count(weights):
        return tf.math.bincount(buckets, weights=weights,
                                minlength=CURVE_BUCKETS,
                                maxlength=CURVE_BUCKETS)

    return {"bucket_pos": count(labels), "bucket_neg": count(1.0 - labels),
            "bucket_prediction_sum": count(probabilities)}


def _thin(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At most about ``2 * _MAX_POINTS`` of the points, first and last
    kept: a point closer than ``1/_MAX_POINTS`` to the last kept one in
    both coordinates is dropped."""
    if len(x) <= _MAX_POINTS:
        return x, y
    keep = [0]
    step = 1.0 / _MAX_POINTS
    for i in range(1, len(x) - 1):
        j = keep[-1]
        if abs(x[i] - x[j]) >= step or abs(y[i] - y[j]) >= step:
            keep.append(i)
    keep.append(len(x) - 1)
    return x[keep], y[keep]


@dataclasses.dataclass(frozen=True)
class Curves:
    """The curves of one evaluation, from its summed statistics.

    Attributes:
      pos_hist, neg_hist: the AUC histograms (logit bins).
      bucket_pos, bucket_neg, bucket_prediction_sum: per probability bucket.
    """

    pos_hist: np.ndarray
    neg_hist: np.ndarray
    bucket_pos: np.ndarray
    bucket_neg: np.ndarray
    bucket_prediction_sum: np.ndarray

    @classmethod
    def from_totals(cls, total: dict[str, np.ndarray]) -> Curves:
        """From the summed :func:`batch_statistics` and
        :func:`bucket_statistics` of an evaluation."""
        return cls(*(np.asarray(total[k], np.float64) for k in (
            "pos_hist", "neg_hist", "bucket_pos", "bucket_neg",
            "bucket_prediction_sum")))

    @property
    def auc(self) -> float:
        return auc_from_histograms(self.pos_hist, self.neg_hist)

    def _cumulative(self) -> tuple[np.ndarray, np.ndarray]:
        """True and false positives when predicting positive above each
        edge of a non-empty logit bin, the highest first; from (0, 0) to
        (all positives, all negatives)."""
        filled = (self.pos_hist + self.neg_hist) > 0
        tp = np.cumsum(self.pos_hist[filled][::-1])
        fp = np.cumsum(self.neg_hist[filled][::-1])
        return np.concatenate([[0.0], tp]), np.concatenate([[0.0], fp])

    def roc(self, thin: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(false positive rate, true positive rate) points; the trapezoid
        area under all of them is :attr:`auc`."""
        tp, fp = self._cumulative()
        fpr, tpr = fp / max(fp[-1], 1.0), tp / max(tp[-1], 1.0)
        return _thin(fpr, tpr) if thin else (fpr, tpr)

    def precision_recall(self, thin: bool = True
                         ) -> tuple[np.ndarray, np.ndarray]:
        """(recall, precision) points at each threshold that predicts at
        least one example positive."""
        tp, fp = self._cumulative()
        tp, fp = tp[1:], fp[1:]
        recall = tp / max(tp[-1], 1.0) if len(tp) else tp
        precision = tp / np.maximum(tp + fp, 1.0)
        return _thin(recall, precision) if thin else (recall, precision)

    def average_precision(self) -> float:
        """Area under the step precision-recall curve (sum of precision
        times the recall gained at each threshold)."""
        recall, precision = self.precision_recall(thin=False)
        gained = np.diff(np.concatenate([[0.0], recall]))
        return float((gained * precision).sum()) if len(recall) else 0.0

    def calibration(self) -> list[dict[str, float]]:
        """Each non-empty probability bucket: its edges, example count,
        mean predicted probability and observed positive rate."""
        rows = []
        for i in np.flatnonzero(self.bucket_pos + self.bucket_neg):
            n = self.bucket_pos[i] + self.bucket_neg[i]
            rows.append({"low": i / CURVE_BUCKETS,
                         "high": (i + 1) / CURVE_BUCKETS, "count": float(n),
                         "mean_prediction":
                             float(self.bucket_prediction_sum[i] / n),
                         "positive_rate": float(self.bucket_pos[i] / n)})
        return rows

    def threshold_counts(self) -> dict[str, np.ndarray]:
        """Confusion counts at the ``CURVE_BUCKETS + 1`` thresholds
        ``i / CURVE_BUCKETS`` (predicted positive: probability in a bucket
        at or above the threshold), as TensorBoard's PR-curve plugin takes
        them, with precision and recall."""
        tp = np.concatenate([np.cumsum(self.bucket_pos[::-1])[::-1], [0.0]])
        fp = np.concatenate([np.cumsum(self.bucket_neg[::-1])[::-1], [0.0]])
        fn, tn = tp[0] - tp, fp[0] - fp
        precision = np.where(tp + fp > 0, tp / np.maximum(tp + fp, 1.0), 1.0)
        recall = tp / max(tp[0], 1.0)
        return {"tp": tp, "fp": fp, "tn": tn, "fn": fn,
                "precision": precision, "recall": recall}
