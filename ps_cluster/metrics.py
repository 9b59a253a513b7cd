"""Streaming CTR metrics that merge across closures: counts, logloss and AUC
from prediction histograms (exact up to the bin width)."""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

AUC_BINS = 10_000


def batch_statistics(labels: tf.Tensor, logits: tf.Tensor,
                     ids: tf.Tensor) -> dict[str, tf.Tensor]:
    """Per-batch sums that add up across batches and closures."""
    labels = tf.cast(labels, tf.float32)
    probs = tf.sigmoid(logits)
    bins = tf.clip_by_value(tf.cast(probs * AUC_BINS, tf.int32), 0,
                            AUC_BINS - 1)
    return {
        "count": tf.size(labels, out_type=tf.int64),
        "positives": tf.reduce_sum(labels),
        "logloss_sum": tf.reduce_sum(
            tf.nn.sigmoid_cross_entropy_with_logits(labels, logits)),
        "id_sum": tf.reduce_sum(ids),
        "pos_hist": tf.math.bincount(bins, weights=labels,
                                     minlength=AUC_BINS, maxlength=AUC_BINS),
        "neg_hist": tf.math.bincount(bins, weights=1.0 - labels,
                                     minlength=AUC_BINS, maxlength=AUC_BINS),
    }


def zero_statistics() -> dict[str, tf.Tensor]:
    return {
        "count": tf.constant(0, tf.int64),
        "positives": tf.constant(0.0),
        "logloss_sum": tf.constant(0.0),
        "id_sum": tf.constant(0, tf.int64),
        "pos_hist": tf.zeros([AUC_BINS]),
        "neg_hist": tf.zeros([AUC_BINS]),
    }


def auc_from_histograms(pos: np.ndarray, neg: np.ndarray) -> float:
    """ROC AUC: P(score of a positive > score of a negative), ties 1/2."""
    pos = np.asarray(pos, np.float64)
    neg = np.asarray(neg, np.float64)
    total_pos, total_neg = pos.sum(), neg.sum()
    if total_pos == 0 or total_neg == 0:
        return float("nan")
    pos_below = np.cumsum(pos) - pos  # positives in lower bins
    # A negative in bin b beats positives below it... count positives above.
    pos_above = total_pos - pos_below - pos
    wins = (neg * (pos_above + 0.5 * pos)).sum()
    return float(wins / (total_pos * total_neg))


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """Aggregated evaluation of one pass over the eval split."""

    count: int
    positives: float
    logloss: float
    auc: float
    id_sum: int

    def to_dict(self) -> dict[str, float | int]:
        """The result as JSON-able data (AUC is NaN when one class is
        missing)."""
        return {**dataclasses.asdict(self),
                "positive_rate": self.positives / max(1, self.count)}

    def summary(self) -> str:
        return (f"eval: {self.count} examples, AUC {self.auc:.4f}, logloss "
                f"{self.logloss:.4f}, positive rate "
                f"{self.positives / max(1, self.count):.4f}")


def merge(parts: list[dict[str, np.ndarray]]) -> EvalResult:
    total = {k: sum(np.asarray(p[k]) for p in parts) for k in parts[0]}
    count = int(total["count"])
    return EvalResult(
        count=count, positives=float(total["positives"]),
        logloss=float(total["logloss_sum"]) / max(1, count),
        auc=auc_from_histograms(total["pos_hist"], total["neg_hist"]),
        id_sum=int(total["id_sum"]))
