"""Small building blocks: the MLP used by the bottom and top towers."""

from __future__ import annotations

from typing import Sequence

import tf_keras


class MLP(tf_keras.layers.Layer):
    """ReLU layers of the given widths, optionally ending in a linear layer.

    Args:
      widths: hidden widths (ReLU).
      output_units: width of a final linear layer, or None for none.
    """

    def __init__(self, widths: Sequence[int], output_units: int | None = None,
                 **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.widths = tuple(widths)
        self.output_units = output_units
        self.hidden = [tf_keras.layers.Dense(w, activation="relu")
                       for w in self.widths]
        self.out = (tf_keras.layers.Dense(output_units)
                    if output_units is not None else None)

    def call(self, x):
        for layer in self.hidden:
            x = layer(x)
        return self.out(x) if self.out is not None else x

    def get_config(self) -> dict:
        return {**super().get_config(), "widths": self.widths,
                "output_units": self.output_units}
