"""Attention over a user-history list, pooled by the row's target item
(the history's ``of`` feature, the candidate).

* ``combiner: din``: target attention (DIN, Zhou et al. 2018): an MLP
  scores each history item from ``[history item, target, their product,
  their difference]``; padding slots are masked out. The weights are the
  raw scores (not normalised, as in the paper, so the pooled vector keeps
  how much of the history matters), or their softmax over the real items
  (``ModelConfig.attention_softmax``).
* ``combiner: bst``: one transformer layer (BST, Chen et al. 2019) over the
  target and the history with learned position embeddings, its outputs'
  masked mean (:class:`BehaviorTransformer`).
"""

from __future__ import annotations

import math
from typing import Sequence

import tensorflow as tf
import tf_keras


class TargetAttention(tf_keras.layers.Layer):
    """Pools ``history`` ``[B, L, d]`` by its attention to ``target``
    ``[B, d]``, where ``mask`` ``[B, L]`` (1 = item, 0 = padding); a list
    of padding only pools to zeros.

    Args:
      widths: hidden widths of the scoring MLP (ReLU); a linear 1-unit
        score follows.
      softmax: normalise the scores over the real items.
    """

    def __init__(self, widths: Sequence[int], softmax: bool = False,
                 **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.widths = tuple(widths)
        self.softmax = softmax
        self.hidden = [tf_keras.layers.Dense(w, activation="relu",
                                             name=f"hidden_{i}")
                       for i, w in enumerate(self.widths)]
        self.score = tf_keras.layers.Dense(1, name="score")

    def call(self, history: tf.Tensor, mask: tf.Tensor,
             target: tf.Tensor) -> tf.Tensor:
        target = tf.broadcast_to(target[:, None, :], tf.shape(history))
        x = tf.concat([history, target, history * target, history - target],
                      axis=-1)
        for layer in self.hidden:
            x = layer(x)
        scores = tf.squeeze(self.score(x), -1)  # [B, L]
        mask = tf.cast(mask, scores.dtype)
        if self.softmax:
            scores = tf.nn.softmax(tf.where(mask > 0, scores,
                                            tf.cast(-1e9, scores.dtype)))
        weights = scores * mask
        return tf.reduce_sum(history * weights[:, :, None], axis=1)

    def get_config(self) -> dict:
        return {**super().get_config(), "widths": self.widths,
                "softmax": self.softmax}


class BehaviorTransformer(tf_keras.layers.Layer):
    """Pools ``history`` ``[B, L, d]`` (``mask`` ``[B, L]``: 1 = item, 0 =
    padding) with ``target`` ``[B, d]`` through one transformer layer.

    The sequence is the target (position 0) then the history items, the
    ``k``-th real item at position ``k`` (most recent first; padding, even
    in the middle of a list, takes no position), each plus its learned
    position embedding; one multi-head self-attention (padding masked as a
    key) and one ReLU feed-forward layer, each with a residual connection
    and layer normalisation (post-norm, as the paper); the output is the
    mean of the outputs of the target and the real items. Padding values
    change nothing; a list of padding only pools the target's own output.

    Args:
      length: the history's ``max_length``.
      dim: the embedding width (of the history and the target).
      heads: attention heads, each ``ceil(dim / heads)`` wide.
      ff_units: the feed-forward part's hidden width; None: ``4 * dim``.
    """

    def __init__(self, length: int, dim: int, heads: int,
                 ff_units: int | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.length, self.dim, self.heads = length, dim, heads
        self.ff_units = ff_units
        self.attention = tf_keras.layers.MultiHeadAttention(
            heads, math.ceil(dim / heads), name="self_attention")
        self.attention_norm = tf_keras.layers.LayerNormalization(
            name="attention_norm")
        self.hidden = tf_keras.layers.Dense(ff_units or 4 * dim,
                                            activation="relu",
                                            name="ff_hidden")
        self.out = tf_keras.layers.Dense(dim, name="ff_out")
        self.ff_norm = tf_keras.layers.LayerNormalization(name="ff_norm")

    def build(self, input_shape) -> None:
        self.positions = self.add_weight(
            name="positions", shape=(self.length + 1, self.dim),
            initializer=tf_keras.initializers.TruncatedNormal(
                stddev=0.02),  # as BERT
            trainable=True)
        super().build(input_shape)

    def call(self, history: tf.Tensor, mask: tf.Tensor,
             target: tf.Tensor) -> tf.Tensor:
        target = tf.cast(target, history.dtype)
        mask = tf.cast(mask, history.dtype)
        real = tf.concat([tf.ones_like(mask[:, :1]), mask], axis=1)
        rank = tf.cast(tf.cumsum(mask, axis=1, exclusive=True), tf.int32)
        position = tf.concat([tf.zeros_like(rank[:, :1]), rank + 1], axis=1)
        x = (tf.concat([target[:, None, :], history], axis=1)
             + tf.gather(tf.cast(self.positions, history.dtype), position))
        keys = tf.cast(real[:, None, :], tf.bool)  # [B, 1, L + 1]
        attended = self.attention(
            x, x, attention_mask=tf.broadcast_to(
                keys, tf.concat([tf.shape(real), tf.shape(real)[1:]], 0)))
        x = self.attention_norm(x + attended)
        x = self.ff_norm(x + self.out(self.hidden(x)))
        real = real[:, :, None]
        return tf.reduce_sum(x * real, axis=1) / tf.reduce_sum(real, axis=1)

    def get_config(self) -> dict:
        return {**super().get_config(), "length": self.length,
                "dim": self.dim, "heads": self.heads,
                "ff_units": self.ff_units}
