"""Small building blocks: the MLP used by the bottom and top towers."""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf
import tf_keras

from psrec.errors import check_choice

BATCH_NORM_KINDS = ("none", "batch", "sync")


def batch_norm_layer(kind: str, **kwargs: object
                     ) -> tf_keras.layers.BatchNormalization:
    """A batch-normalization layer: ``batch`` uses each replica's own batch
    statistics, ``sync`` all-reduces mean and variance across the replicas
    in sync (``BatchNormalization(synchronized=True)``; without a strategy
    it is a plain batch norm)."""
    check_choice("batch_norm", kind, ("batch", "sync"))
    return tf_keras.layers.BatchNormalization(synchronized=kind == "sync",
                                              **kwargs)


class MLP(tf_keras.layers.Layer):
    """ReLU layers of the given widths, optionally ending in a linear layer.

    Args:
      widths: hidden widths (ReLU).
      output_units: width of a final linear layer, or None for none.
      batch_norm: ``none``; or ``batch``/``sync``: hidden layers become
        Dense -> BatchNormalization -> ReLU (see :func:`batch_norm_layer`).
      output_dtype: dtype policy of the final linear layer (``"float32"``
        keeps logits in float32 under a mixed-precision policy); None: the
        layer's own policy.
      output_bias: when given, the final linear layer starts as this
        constant: zero kernel, bias ``output_bias`` (a ranking model's
        base-rate logit, an ``mse`` task's label mean); None: the default
        initialisation.
    """

    def __init__(self, widths: Sequence[int], output_units: int | None = None,
                 batch_norm: str = "none", output_dtype: str | None = None,
                 output_bias: float | None = None,
                 **kwargs: object) -> None:
        super().__init__(**kwargs)
        check_choice("batch_norm", batch_norm, BATCH_NORM_KINDS)
        self.widths = tuple(widths)
        self.output_units = output_units
        self.batch_norm = batch_norm
        self.output_dtype = output_dtype
        self.output_bias = output_bias
        normalize = batch_norm != "none"
        self.hidden = [tf_keras.layers.Dense(
            w, activation=None if normalize else "relu") for w in self.widths]
        self.norms = ([batch_norm_layer(batch_norm) for _ in self.widths]
                      if normalize else [])
        extra = {"dtype": output_dtype} if output_dtype is not None else {}
        if output_bias is not None:
            extra["kernel_initializer"] = "zeros"
            extra["bias_initializer"] = tf_keras.initializers.Constant(
                float(output_bias))
        self.out = (tf_keras.layers.Dense(output_units, **extra)
                    if output_units is not None else None)

    def call(self, x, training=None):
        for i, layer in enumerate(self.hidden):
            x = layer(x)
            if self.norms:
                x = tf.nn.relu(self.norms[i](x, training=training))
        return self.out(x) if self.out is not None else x

    def get_config(self) -> dict:
        config = {**super().get_config(), "widths": self.widths,
                  "output_units": self.output_units}
        if self.batch_norm != "none":
            config["batch_norm"] = self.batch_norm
        if self.output_dtype is not None:
            config["output_dtype"] = self.output_dtype
        if self.output_bias is not None:
            config["output_bias"] = self.output_bias
        return config
