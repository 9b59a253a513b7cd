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

As for ranking, each eval shard is one function call (one closure under
PS) returning sums, so a retried closure still counts each pair once.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from psrec.data.input.dataset import make_eval_dataset
from psrec.features.spec.spec import FeatureSpec
from psrec.models.retrieval.config import RECALL_KS
from psrec.models.retrieval.loss import CandidateTables
from psrec.models.retrieval.model import RetrievalModel

_TIE_TOLERANCE = 1e-5


def _zero() -> dict[str, tf.Tensor]:
    return {"count": tf.constant(0, tf.int64),
            "hits": tf.zeros([len(RECALL_KS)], tf.int64),
            "reciprocal_rank_sum": tf.constant(0.0, tf.float64)}


def pair_ranks(model: RetrievalModel, tables: CandidateTables,
               batch: dict[str, tf.Tensor]) -> tf.Tensor:
    """``[B]`` int64: catalogue entries scored above each row's candidate
    (the 0-based rank of the pair)."""
    query = model.query_embedding(batch)
    positive = tf.reduce_sum(query * model.candidate_embedding(batch), 1)
    bar = positive + _TIE_TOLERANCE * tf.maximum(1.0, tf.abs(positive))
    above = tf.zeros_like(positive, tf.int64)
    for chunk in tables.embeddings:
        scores = tf.matmul(query, chunk, transpose_b=True)
        above += tf.reduce_sum(tf.cast(scores > bar[:, None], tf.int64), 1)
    return above


def make_retrieval_eval_function(model: RetrievalModel,
                                 tables: CandidateTables, spec: FeatureSpec,
                                 batch_size: int, block_rows: int
                                 ) -> Callable:
    """A ``tf.function(path)`` with the sums of one eval shard file."""
    label = spec.label.name
    ks = tf.constant(RECALL_KS, tf.int64)

    @tf.function
    def evaluate_shard(path: tf.Tensor):
        dataset = make_eval_dataset(path, spec, batch_size, block_rows)

        def add(state, batch):
            ranks = pair_ranks(model, tables, batch)
            kept = tf.reshape(batch[label], [-1]) > 0
            ranks = tf.boolean_mask(ranks, kept)
            hits = tf.reduce_sum(tf.cast(
                ranks[:, None] < ks[None, :], tf.int64), axis=0)
            reciprocal = tf.reduce_sum(
                1.0 / (tf.cast(ranks, tf.float64) + 1.0))
            return {"count": state["count"] + tf.size(ranks,
                                                      out_type=tf.int64),
                    "hits": state["hits"] + hits,
                    "reciprocal_rank_sum": state["reciprocal_rank_sum"]
                    + reciprocal}

        return dataset.reduce(_zero(), add)

    return evaluate_shard
