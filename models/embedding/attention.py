"""Target attention over a user-history list (DIN, Zhou et al. 2018).

A history feature with ``combiner: din`` (``features.spec.history``) is
pooled by weights that depend on the row's target item (the history's
``of`` feature): an MLP scores each history item from ``[history item,
target, their product, their difference]``; padding slots are masked out.
The weights are the raw scores (not normalised, as in the paper, so the
pooled vector keeps how much of the history matters), or their softmax
over the real items (``ModelConfig.attention_softmax``).
"""

from __future__ import annotations

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
