"""GAUC (AUC per user, or per any categorical column) and per-slice
metrics, from per-group partial sums that merge by addition.

Each eval closure adds, per *group slot*, two histograms (positives,
negatives) of the logit over :data:`GROUP_BINS` bins uniform on
``[-GROUP_LOGIT_RANGE, GROUP_LOGIT_RANGE]`` (1/8 logit; logits outside
are clipped into the end bins), plus the slot's logloss and prediction
sums. The slot of an example is its encoded id (the column's embedding row)
modulo :data:`GROUP_SLOTS`. The arrays are fixed-size (``GROUP_SLOTS x
GROUP_BINS`` each, 4 MiB in float32), so closures and shards merge by
addition and no example ever leaves its worker; the coordinator computes
the metrics from the summed arrays (:func:`group_metrics`).

Exactness: a column of ``hash_buckets`` or a vocabulary uses a contiguous
range of ids, so when it has at most :data:`GROUP_SLOTS` ids every value has
a slot of its own and the grouping is exact; a larger column (or a dynamic
table's raw ids) shares slots between values, which then count as one
group (``groups_exact`` is False in the result).

Error bound: within a group, the histogram AUC scores every (positive,
negative) pair sharing a bin as a tie (1/2), so it differs from the exact
rank AUC of that group by at most half the fraction of the group's pairs
that share a bin; GAUC, the weighted mean over groups, differs from the
exact GAUC by at most the same weighted mean of those halves, which the
result reports (``gauc_error_bound``, computed from the histograms: no
guess). Scores that fall on distinct bins (e.g. on bin centres) make it 0
and the GAUC exact, ties included (tests/test_groups.py compares with a
brute-force per-group rank AUC both ways).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from psrec.errors import ConfigError
from psrec.ps_cluster.evaluation.breakdown import GAUC_WEIGHTINGS
from psrec.ps_cluster.evaluation.breakdown import Breakdown

GROUP_SLOTS = 4096
GROUP_BINS = 256
GROUP_LOGIT_RANGE = 16.0
GROUP_BIN_WIDTH = 2 * GROUP_LOGIT_RANGE / GROUP_BINS  # 1/8 logit.
def group_bins(logits: tf.Tensor) -> tf.Tensor:
    """The coarse histogram bin (int32 in ``[0, GROUP_BINS)``) of each
    logit."""
    logits = tf.cast(logits, tf.float32)
    clipped = tf.clip_by_value(logits, -GROUP_LOGIT_RANGE, GROUP_LOGIT_RANGE)
    scaled = (clipped + GROUP_LOGIT_RANGE) * (1.0 / GROUP_BIN_WIDTH)
    return tf.clip_by_value(tf.cast(tf.floor(scaled), tf.int32), 0,
                            GROUP_BINS - 1)


def group_slots(ids: tf.Tensor) -> tf.Tensor:
    """The slot (int32 in ``[0, GROUP_SLOTS)``) of each encoded id."""
    ids = tf.reshape(tf.cast(ids, tf.int64), [-1])
    return tf.cast(tf.math.floormod(ids, GROUP_SLOTS), tf.int32)


def group_statistics(prefix: str, labels: tf.Tensor, logits: tf.Tensor,
                     ids: tf.Tensor, present: tf.Tensor | None = None
                     ) -> dict[str, tf.Tensor]:
    """Per-slot sums of one batch that add up across batches and closures:
    ``{prefix}_pos``/``{prefix}_neg`` ``[GROUP_SLOTS, GROUP_BINS]``
    histograms, ``{prefix}_logloss`` and ``{prefix}_prediction``
    ``[GROUP_SLOTS]``; ``present`` (a multi-task spec's missing labels)
    leaves the other rows out."""
    labels = tf.reshape(tf.cast(labels, tf.float32), [-1])
    logits = tf.reshape(tf.cast(logits, tf.float32), [-1])
    if present is not None:  # a left-out row adds 0 everywhere
        present = tf.reshape(present, [-1])
        ids = tf.boolean_mask(tf.reshape(ids, [-1]), present)
        labels = tf.boolean_mask(labels, present)
        logits = tf.boolean_mask(logits, present)
    slots = group_slots(ids)
    cells = slots * GROUP_BINS + group_bins(logits)
    size = GROUP_SLOTS * GROUP_BINS

    def histogram(weights):
        return tf.reshape(tf.math.unsorted_segment_sum(weights, cells, size),
                          [GROUP_SLOTS, GROUP_BINS])

    return {
        f"{prefix}_pos": histogram(labels),
        f"{prefix}_neg": histogram(1.0 - labels),
        f"{prefix}_logloss": tf.math.unsorted_segment_sum(
            tf.nn.sigmoid_cross_entropy_with_logits(labels, logits), slots,
            GROUP_SLOTS),
        f"{prefix}_prediction": tf.math.unsorted_segment_sum(
            tf.sigmoid(logits), slots, GROUP_SLOTS),
    }


def zero_group_statistics(prefix: str) -> dict[str, tf.Tensor]:
    """The identity of the sums of :func:`group_statistics`."""
    return {f"{prefix}_pos": tf.zeros([GROUP_SLOTS, GROUP_BINS]),
            f"{prefix}_neg": tf.zeros([GROUP_SLOTS, GROUP_BINS]),
            f"{prefix}_logloss": tf.zeros([GROUP_SLOTS]),
            f"{prefix}_prediction": tf.zeros([GROUP_SLOTS])}


def breakdown_statistics(breakdown: Breakdown, batch: dict,
                         labels: tf.Tensor, logits: tf.Tensor,
                         present: tf.Tensor | None = None
                         ) -> dict[str, tf.Tensor]:
    """The :func:`group_statistics` of every column ``breakdown`` asks
    for (none: ``{}``)."""
    stats: dict[str, tf.Tensor] = {}
    for prefix, column in breakdown.columns().items():
        stats.update(group_statistics(prefix, labels, logits, batch[column],
                                      present))
    return stats


def zero_breakdown_statistics(breakdown: Breakdown) -> dict[str, tf.Tensor]:
    stats: dict[str, tf.Tensor] = {}
    for prefix in breakdown.columns():
        stats.update(zero_group_statistics(prefix))
    return stats


def _row_aucs(pos: np.ndarray, neg: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """Each row's histogram AUC (NaN without both classes) and half its
    shared-bin pair fraction (the AUC's error bound)."""
    pos = np.asarray(pos, np.float64)
    neg = np.asarray(neg, np.float64)
    total_pos, total_neg = pos.sum(axis=1), neg.sum(axis=1)
    pairs = total_pos * total_neg
    pos_above = total_pos[:, None] - np.cumsum(pos, axis=1)
    wins = (neg * (pos_above + 0.5 * pos)).sum(axis=1)
    shared = (pos * neg).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = np.where(pairs > 0, wins / pairs, np.nan)
        bound = np.where(pairs > 0, 0.5 * shared / pairs, np.nan)
    return auc, bound


def gauc(pos: np.ndarray, neg: np.ndarray, weighting: str = "impressions"
         ) -> dict[str, float | int]:
    """GAUC of per-group histograms (``[groups, bins]``): the mean of the
    AUCs of the groups with both classes, weighted by their examples
    (``impressions``) or equally (``uniform``); groups with examples of one
    class only are left out and counted (``gauc_skipped_groups``)."""
    if weighting not in GAUC_WEIGHTINGS:
        raise ValueError(f"weighting {weighting!r}: one of {GAUC_WEIGHTINGS}")
    auc, bound = _row_aucs(pos, neg)
    examples = np.asarray(pos, np.float64).sum(1) + np.asarray(
        neg, np.float64).sum(1)
    scored = ~np.isnan(auc)
    weights = (examples if weighting == "impressions"
               else np.ones_like(examples))[scored]
    total = weights.sum()
    return {
        "gauc": float((weights * auc[scored]).sum() / total) if total
        else float("nan"),
        "gauc_error_bound": float((weights * bound[scored]).sum() / total)
        if total else float("nan"),
        "gauc_groups": int(scored.sum()),
        "gauc_skipped_groups": int(((examples > 0) & ~scored).sum()),
    }


def _slot_id(slot: int, offset: int | None) -> int:
    """The encoded id of ``slot`` of a column whose ids start at
    ``offset`` (exact when the column has at most GROUP_SLOTS ids)."""
    base = offset or 0
    return base + (slot - base) % GROUP_SLOTS


def slices(total: dict[str, np.ndarray], top: int,
           offset: int | None = None) -> list[dict]:
    """Count, positives, AUC (with its error bound), logloss and
    calibration of the ``top`` slots with the most examples (each named by
    its encoded ``id``) and of the rest together (``id`` ``"other"``,
    when there is a rest), most examples first."""
    pos = np.asarray(total["slice_pos"], np.float64)
    neg = np.asarray(total["slice_neg"], np.float64)
    logloss = np.asarray(total["slice_logloss"], np.float64)
    prediction = np.asarray(total["slice_prediction"], np.float64)
    counts = pos.sum(1) + neg.sum(1)
    present = np.flatnonzero(counts > 0)
    order = present[np.argsort(-counts[present], kind="stable")]
    chosen, rest = order[:top], order[top:]
    rows = [(str(_slot_id(int(s), offset)), [int(s)]) for s in chosen]
    if len(rest):
        rows.append(("other", [int(s) for s in rest]))
    out = []
    for name, members in rows:
        p, n = pos[members].sum(0)[None], neg[members].sum(0)[None]
        auc, bound = _row_aucs(p, n)
        count = float(counts[members].sum())
        positives = float(p.sum())
        out.append({
            "id": name, "count": int(round(count)), "positives": positives,
            "auc": float(auc[0]), "auc_error_bound": float(bound[0]),
            "logloss": float(logloss[members].sum() / count),
            "calibration": (float(prediction[members].sum() / positives)
                            if positives else float("nan"))})
    return out


def group_metrics(total: dict[str, np.ndarray], breakdown: Breakdown,
                  spec=None) -> dict:
    """The :class:`~psrec.ps_cluster.evaluation.metrics.EvalResult` fields
    of the summed statistics ``total`` of ``breakdown`` (``spec``: to name
    the slices by their ids and say whether the grouping is exact)."""
    features = {f.name: f for f in spec.categorical} if spec else {}

    def exact(column: str) -> bool | None:
        feature = features.get(column)
        if feature is None or feature.raw_ids:
            return None if feature is None else False
        try:
            return feature.num_ids <= GROUP_SLOTS
        except ConfigError:  # a `share` not resolved: unknown
            return None

    fields: dict = {}
    if breakdown.group_by is not None:
        fields.update(gauc(total["group_pos"], total["group_neg"],
                           breakdown.weighting))
        fields.update(group_by=breakdown.group_by,
                      gauc_weighting=breakdown.weighting,
                      groups_exact=exact(breakdown.group_by))
    if breakdown.slice_by is not None:
        feature = features.get(breakdown.slice_by)
        fields.update(slice_by=breakdown.slice_by, slices=slices(
            total, breakdown.top,
            getattr(feature, "row_offset", None)))
    return fields
