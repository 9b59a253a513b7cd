"""InteractionArch: how dense and sparse vectors meet.

Each interaction takes the dense tower's output ``[B, d_dense]`` and the
list of ``[B, d]`` embeddings and returns ``(features, extra_logit)``: the
input of the top MLP and an optional ``[B]`` term added to the logit
(the FM second-order term of DeepFM).

A spec without dense features gives a zero-width dense input ``[B, 0]``:
it is then no field of the ``dot`` and ``fm`` interactions, which interact
the embeddings only.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tensorflow_recommenders as tfrs
import tf_keras

from psrec.models.ranking.config import ModelConfig


def _fields(dense: tf.Tensor, embeddings: list[tf.Tensor]
            ) -> list[tf.Tensor]:
    """The field vectors: the dense vector (unless zero-width) and the
    embeddings."""
    return embeddings if dense.shape[-1] == 0 else [dense] + embeddings


class DotInteraction(tf_keras.layers.Layer):
    """DLRM: pairwise dot products of all field vectors (upper triangle),
    concatenated with the dense vector. Dense and sparse widths must match.

    Without dense features the embeddings themselves take the dense
    vector's place beside the pairs (the first-order signal the top MLP
    gets from the bottom MLP otherwise; and the only input left with a
    single categorical feature, which has no pair)."""

    def call(self, dense: tf.Tensor, embeddings: list[tf.Tensor]):
        fields = _fields(dense, embeddings)
        num = len(fields)
        first_order = dense if dense.shape[-1] else tf.concat(embeddings, 1)
        fields = tf.stack(fields, axis=1)  # [B, F, d]
        dots = tf.matmul(fields, fields, transpose_b=True)  # [B, F, F]
        rows, cols = np.triu_indices(num, k=1)
        flat = tf.reshape(dots, [-1, num * num])
        pairs = tf.gather(flat, rows * num + cols, axis=1)
        return tf.concat([first_order, pairs], axis=1), None


class CrossInteraction(tf_keras.layers.Layer):
    """DCN-v2: ``x_{l+1} = x0 * (W x_l + b) + x_l`` over the concatenation
    of dense and sparse vectors (``tfrs.layers.dcn.Cross``)."""

    def __init__(self, layers: int, low_rank: int | None = None,
                 **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.crosses = [tfrs.layers.dcn.Cross(projection_dim=low_rank)
                        for _ in range(layers)]

    def call(self, dense: tf.Tensor, embeddings: list[tf.Tensor]):
        x0 = tf.concat([dense] + embeddings, axis=1)
        x = x0
        for cross in self.crosses:
            x = cross(x0, x)
        return x, None


class FMInteraction(tf_keras.layers.Layer):
    """DeepFM: the deep part sees the concatenation; the factorization
    machine's second-order term ``0.5 * sum((sum v)^2 - sum v^2)`` over all
    field vectors is added to the logit."""

    def call(self, dense: tf.Tensor, embeddings: list[tf.Tensor]):
        fields = tf.stack(_fields(dense, embeddings), axis=1)  # [B, F, d]
        square_of_sum = tf.square(tf.reduce_sum(fields, axis=1))
        sum_of_square = tf.reduce_sum(tf.square(fields), axis=1)
        fm = 0.5 * tf.reduce_sum(square_of_sum - sum_of_square, axis=1)
        return tf.concat([dense] + embeddings, axis=1), fm


class ConcatInteraction(tf_keras.layers.Layer):
    """Wide & Deep's deep part: plain concatenation."""

    def call(self, dense: tf.Tensor, embeddings: list[tf.Tensor]):
        return tf.concat([dense] + embeddings, axis=1), None


def make_interaction(config: ModelConfig) -> tf_keras.layers.Layer:
    """The one place an interaction name becomes a layer."""
    if config.interaction == "dot":
        return DotInteraction(name="interaction")
    if config.interaction == "cross":
        return CrossInteraction(config.cross_layers, config.cross_low_rank,
                                name="interaction")
    if config.interaction == "fm":
        return FMInteraction(name="interaction")
    return ConcatInteraction(name="interaction")
