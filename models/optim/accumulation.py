"""Gradient accumulation over micro-batches, sparse-safe.

Gradients of k micro-batches are summed before one optimizer update. Dense
gradients are added; ``tf.IndexedSlices`` (embedding-table gradients) are
concatenated -- indices and values -- so a table's accumulated gradient
still names only the rows the micro-batches touched and stays a sparse
update (the optimizers sum duplicate indices). No table-sized buffer is
needed, and untouched rows are never updated (with FTRL a dense zero
gradient would change them).
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

Gradient = tf.Tensor | tf.IndexedSlices | None


def add_gradient(total: Gradient, grad: Gradient) -> Gradient:
    """``total + grad``; None is zero; slices + slices stay slices, and a
    dense term makes the sum dense.

    Raises:
      TypeError: for anything but a tensor, ``IndexedSlices`` or None.
    """
    for value, name in ((total, "total"), (grad, "grad")):
        if value is not None and not isinstance(
                value, (tf.Tensor, tf.IndexedSlices, tf.Variable)):
            raise TypeError(f"`{name}` = {type(value).__name__} is not a "
                            "gradient (tensor, IndexedSlices or None).")
    if total is None:
        return grad
    if grad is None:
        return total
    if isinstance(total, tf.IndexedSlices) and isinstance(
            grad, tf.IndexedSlices):
        return tf.IndexedSlices(
            values=tf.concat([total.values, grad.values], 0),
            indices=tf.concat([tf.cast(total.indices, tf.int64),
                               tf.cast(grad.indices, tf.int64)], 0),
            dense_shape=total.dense_shape)
    return tf.convert_to_tensor(total) + tf.convert_to_tensor(grad)


def add_gradients(total: Sequence[Gradient] | None,
                  grads: Sequence[Gradient]) -> list[Gradient]:
    """Element-wise :func:`add_gradient`; ``total`` None starts a sum.

    Raises:
      ValueError: if the lists differ in length.
    """
    if total is None:
        return list(grads)
    if len(total) != len(grads):
        raise ValueError(f"`grads` has {len(grads)} gradients but the sum "
                         f"has {len(total)}: the variable lists differ.")
    return [add_gradient(a, b) for a, b in zip(total, grads)]
