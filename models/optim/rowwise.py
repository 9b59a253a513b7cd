"""Row-wise Adagrad: one accumulator per table row (FBGEMM's
``EXACT_ROWWISE_ADAGRAD``).

Adagrad keeps one accumulator per table value (``[rows, dim]``);
:class:`RowwiseAdagrad` keeps one per row (``[rows, 1]``), the running sum
of the row's *mean* squared gradient. For the rows ``i`` a step touches::

    acc[i] += mean_j(g[i, j] ** 2)
    w[i]   -= lr * g[i] / (sqrt(acc[i]) + epsilon)

Its slot is a ``[rows, 1]`` variable made with ``add_slot(shape=...)``;
under ``ParameterServerStrategy`` each table shard gets its own
``[shard_rows, 1]`` slot on the shard's PS (``colocate_vars_with``, as
every legacy slot), so the update of a row never leaves its PS. A variable
of rank 1 has one value per row already: its accumulator is element-wise
(plain Adagrad).
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras

from psrec.models.optim.rounding import Float32Rows


def rowwise_slot_shape(shape: tf.TensorShape) -> tf.TensorShape:
    """The accumulator's shape for a variable of ``shape``: ``[rows, 1]``
    (rank >= 2), else ``shape``."""
    shape = tf.TensorShape(shape)
    return shape if shape.rank < 2 else tf.TensorShape([shape[0], 1])


class RowwiseAdagrad(Float32Rows, tf_keras.optimizers.legacy.Optimizer):
    """Adagrad with one accumulator per row (module docstring); a 16-bit
    table is updated in float32 and rounded back (:class:`Float32Rows`).

    Args:
      learning_rate: a float or a ``LearningRateSchedule``.
      initial_accumulator_value: the accumulators' start (>= 0), as
        ``Adagrad``'s.
      epsilon: added to ``sqrt(acc)`` (the denominator).
    """

    _HAS_AGGREGATE_GRAD = True

    def __init__(self, learning_rate=0.001, initial_accumulator_value=0.1,
                 epsilon=1e-7, name="RowwiseAdagrad", **kwargs) -> None:
        if initial_accumulator_value < 0.0:
            raise ValueError("`initial_accumulator_value` must be >= 0, got "
                             f"{initial_accumulator_value}.")
        super().__init__(name, **kwargs)
        self._set_hyper("learning_rate", kwargs.get("lr", learning_rate))
        self._set_hyper("decay", self._initial_decay)
        self._initial_accumulator_value = initial_accumulator_value
        self.epsilon = epsilon

    def _create_slots(self, var_list) -> None:
        for var in var_list:
            init = tf.compat.v1.constant_initializer(
                self._initial_accumulator_value, dtype=var.dtype.base_dtype)
            self.add_slot(var, "accumulator", init,
                          shape=rowwise_slot_shape(var.shape))

    def _prepare_local(self, var_device, var_dtype, apply_state) -> None:
        super()._prepare_local(var_device, var_dtype, apply_state)
        apply_state[(var_device, var_dtype)]["epsilon"] = (
            tf.convert_to_tensor(self.epsilon, var_dtype))

    def _coefficients(self, var, apply_state) -> dict:
        key = (var.device, var.dtype.base_dtype)
        return (apply_state or {}).get(key) or self._fallback_apply_state(
            *key)

    @staticmethod
    def _row_mean_square(grad: tf.Tensor, rank: int) -> tf.Tensor:
        square = tf.square(grad)
        return (square if rank < 2 else tf.reduce_mean(
            tf.reshape(square, [tf.shape(square)[0], -1]), axis=1,
            keepdims=True))

    @classmethod
    def _step(cls, acc: tf.Tensor, grad: tf.Tensor, coefficients: dict,
              rank: int) -> tuple[tf.Tensor, tf.Tensor]:
        """The accumulator ``acc`` after ``grad`` (of a variable of
        ``rank``), and each row's step size ``lr / (sqrt(acc) + eps)``,
        shaped to multiply ``grad``."""
        new_acc = acc + cls._row_mean_square(grad, rank)
        scale = coefficients["lr_t"] / (tf.sqrt(new_acc)
                                        + coefficients["epsilon"])
        if rank > 2:
            scale = tf.reshape(scale, [-1] + [1] * (rank - 1))
        return new_acc, scale

    def _resource_apply_dense(self, grad, var, apply_state=None):
        acc = self.get_slot(var, "accumulator")
        new_acc, scale = self._step(acc, grad, self._coefficients(
            var, apply_state), var.shape.rank)
        return tf.group(acc.assign(new_acc, use_locking=self._use_locking),
                        var.assign_sub(scale * grad,
                                       use_locking=self._use_locking))

    def _update_rows(self, rows, grad, slots, coefficients):
        acc, scale = self._step(slots["accumulator"], grad, coefficients,
                                rows.shape.rank)
        return rows - scale * grad, {"accumulator": acc}

    def _resource_apply_sparse(self, grad, var, indices, apply_state=None):
        # Indices are unique here (OptimizerV2 sums duplicates first).
        acc = self.get_slot(var, "accumulator")
        new_acc, scale = self._step(tf.gather(acc, indices), grad,
                                    self._coefficients(var, apply_state),
                                    var.shape.rank)
        update_acc = acc.scatter_update(tf.IndexedSlices(new_acc, indices))
        with tf.control_dependencies([update_acc]):
            return var.scatter_sub(tf.IndexedSlices(scale * grad, indices))

    def get_config(self) -> dict:
        config = super().get_config()
        config.update({
            "learning_rate": self._serialize_hyperparameter("learning_rate"),
            "decay": self._initial_decay,
            "initial_accumulator_value": self._initial_accumulator_value,
            "epsilon": self.epsilon,
        })
        return config
