"""Exact retrieval evaluation against the whole candidate catalogue.

Each held-out row with a positive label is a (query, candidate) pair. Its
rank is the number of catalogue entries the query scores strictly higher
than its own candidate, counted chunk by chunk (``matmul`` against each
chunk variable of :class:`~psrec.models.retrieval.loss.CandidateTables`,
on the PS tasks under ``ParameterServerStrategy``): the pair is in the
top k exactly when its rank is below k, so recall@k (the share of pairs in
the top k) and MRR (the mean of ``1 / (rank + 1)``) are exact, with memory
of one chunk's scores per batch. Scores within a relative ``1e-5`` of the
positive's count as ties (not above it): the positive's own catalogue
entry, computed in another batch, may differ from it in the last bits.

With the eval pairs' seen candidates (:class:`SeenTables`, from
``seen.parquet``: ``towers.query_id``), each pair is ranked against the
catalogue less the candidates its user was seen with in the train split
(the standard protocol: they are never the user's held-out pairs), its own
candidate kept: those entries are masked out of each chunk's scores before
counting. The popularity baseline is ranked in the same pass under the same
rule (a pair's popularity rank less its user's seen candidates ranked above
it), so both are computed once, in the closures, from the same lists.

As for ranking, each eval shard is one function call (one closure under
PS) returning sums, so a retried closure still counts each pair once.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import tensorflow as tf

from psrec.data.convert.seen import SeenItems
from psrec.data.input.dataset import make_eval_dataset
from psrec.features.spec.spec import ID_COLUMN
from psrec.features.spec.spec import FeatureSpec
from psrec.models.retrieval.config import RECALL_KS
from psrec.models.retrieval.loss import CandidateTables
from psrec.models.retrieval.model import RetrievalModel
from psrec.ps_cluster.retrieval.metrics import popularity_ranks

_TIE_TOLERANCE = 1e-5


class SeenTables(tf.Module):
    """The eval pairs' seen candidates (:class:`SeenItems`) and the
    catalogue's popularity ranks as variables (create under the strategy
    scope: each lands on a PS task, where the lookups of a batch run, so a
    closure moves only its batch's lists). Memory: 8 bytes per eval pair
    (x3), per user with a pair, per seen entry and per candidate."""

    def __init__(self, seen: SeenItems, train_counts: np.ndarray) -> None:
        super().__init__(name="seen_tables")

        def variable(values, name: str) -> tf.Variable:
            return tf.Variable(np.asarray(values, np.int64), trainable=False,
                               name=name)

        self.pair_ids = variable(seen.pair_ids, "pair_ids")
        self.pair_users = variable(seen.pair_users, "pair_users")
        self.pair_candidates = variable(seen.pair_candidates,
                                        "pair_candidates")
        self.offsets = variable(seen.offsets, "offsets")
        self.seen = variable(seen.seen, "seen")
        self.popularity = variable(popularity_ranks(train_counts),
                                   "popularity")

    def lookup(self, ids: tf.Tensor
               ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """For a batch's example ids ``[B]``: each row's candidate (its
        catalogue row; -1 for a row that is not an eval pair) and the
        ``(row, catalogue row)`` pairs ``[T]`` to leave out of its ranking
        (its user's seen candidates but its own)."""
        with tf.device(self.pair_ids.device):  # the search runs by the ids
            at = tf.minimum(tf.searchsorted(self.pair_ids, ids,
                                            out_type=tf.int64),
                            tf.size(self.pair_ids, out_type=tf.int64) - 1)
            found = tf.gather(self.pair_ids, at) == ids
        candidate = tf.where(found, tf.gather(self.pair_candidates, at), -1)
        user = tf.where(found, tf.gather(self.pair_users, at), 0)
        start = tf.gather(self.offsets, user)
        length = tf.where(found, tf.gather(self.offsets, user + 1) - start, 0)
        lists = tf.ragged.range(start, start + length)
        items = tf.gather(self.seen, lists.flat_values)
        rows = lists.value_rowids()
        other = items != tf.gather(candidate, rows)
        return (candidate, tf.boolean_mask(rows, other),
                tf.boolean_mask(items, other))

    def popularity_ranks(self, candidate: tf.Tensor, rows: tf.Tensor,
                         items: tf.Tensor) -> tf.Tensor:
        """``[B]`` each pair's popularity rank less its left-out candidates
        ranked above it (meaningless where ``candidate`` is -1)."""
        own = tf.gather(self.popularity, tf.maximum(candidate, 0))
        above = tf.gather(self.popularity, items) < tf.gather(own, rows)
        return own - tf.math.unsorted_segment_sum(
            tf.cast(above, tf.int64), rows, tf.size(candidate))


def _zero(seen: bool) -> dict[str, tf.Tensor]:
    zero = {"count": tf.constant(0, tf.int64),
            "hits": tf.zeros([len(RECALL_KS)], tf.int64),
            "reciprocal_rank_sum": tf.constant(0.0, tf.float64)}
    if seen:  # the popularity baseline, computed beside
        zero.update({f"popularity_{k}": v for k, v in zero.items()})
    return zero


def _sums(ranks: tf.Tensor, ks: tf.Tensor) -> dict[str, tf.Tensor]:
    """The count, hits at each k and reciprocal-rank sum of ``ranks``."""
    return {"count": tf.size(ranks, out_type=tf.int64),
            "hits": tf.reduce_sum(tf.cast(ranks[:, None] < ks[None, :],
                                          tf.int64), axis=0),
            "reciprocal_rank_sum": tf.reduce_sum(
                1.0 / (tf.cast(ranks, tf.float64) + 1.0))}


def pair_ranks(model: RetrievalModel, tables: CandidateTables,
               batch: dict[str, tf.Tensor],
               excluded: tuple[tf.Tensor, tf.Tensor] | None = None
               ) -> tf.Tensor:
    """``[B]`` int64: catalogue entries scored above each row's candidate
    (the 0-based rank of the pair), the ``(row, catalogue row)`` pairs of
    ``excluded`` (``[T]`` each) not counted."""
    query = model.query_embedding(batch)
    positive = tf.reduce_sum(query * model.candidate_embedding(batch), 1)
    bar = positive + _TIE_TOLERANCE * tf.maximum(1.0, tf.abs(positive))
    above = tf.zeros_like(positive, tf.int64)
    for (start, end), chunk in zip(tables.bounds, tables.embeddings):
        scores = tf.matmul(query, chunk, transpose_b=True)
        counted = scores > bar[:, None]
        if excluded is not None:
            rows, items = excluded
            inside = (items >= start) & (items < end)
            index = tf.stack([tf.boolean_mask(rows, inside),
                              tf.boolean_mask(items, inside) - start], 1)
            hidden = tf.scatter_nd(
                index, tf.ones(tf.shape(index)[:1], tf.int32),
                tf.shape(scores, out_type=tf.int64)) > 0
            counted &= ~hidden
        above += tf.reduce_sum(tf.cast(counted, tf.int64), 1)
    return above


def make_retrieval_eval_function(model: RetrievalModel,
                                 tables: CandidateTables, spec: FeatureSpec,
                                 batch_size: int, block_rows: int,
                                 seen: SeenTables | None = None
                                 ) -> Callable:
    """A ``tf.function(path)`` with the sums of one eval shard file; with
    ``seen``, each pair's user's seen candidates left out of its ranking and
    the popularity baseline's sums (``popularity_*``) beside."""
    label = spec.label.name
    ks = tf.constant(RECALL_KS, tf.int64)

    @tf.function
    def evaluate_shard(path: tf.Tensor):
        dataset = make_eval_dataset(path, spec, batch_size, block_rows)

        def add(state, batch):
            kept = tf.reshape(batch[label], [-1]) > 0
            if seen is None:
                return {k: state[k] + v for k, v in _sums(tf.boolean_mask(
                    pair_ranks(model, tables, batch), kept), ks).items()}
            candidate, rows, items = seen.lookup(
                tf.reshape(batch[ID_COLUMN], [-1]))
            sums = _sums(tf.boolean_mask(
                pair_ranks(model, tables, batch, (rows, items)), kept), ks)
            popular = seen.popularity_ranks(candidate, rows, items)
            sums.update({f"popularity_{k}": v for k, v in _sums(
                tf.boolean_mask(popular, kept & (candidate >= 0)),
                ks).items()})
            return {k: state[k] + v for k, v in sums.items()}

        return dataset.reduce(_zero(seen is not None), add)

    return evaluate_shard
