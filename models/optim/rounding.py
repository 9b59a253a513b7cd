"""16-bit tables: the sparse update computed in float32 and rounded back.

A table stored as ``bfloat16`` (``TableConfig.dtype``; ``float16`` tables
are refused: TensorFlow cannot read part of one back from a checkpoint) is
trained by the same sparse optimizers as a float32 one. :class:`Float32Rows`
is a mixin of every optimizer class of the registry
(``models.optim.optimizers``); for a 16-bit variable it

* keeps the optimizer's slots in **float32** (:meth:`Float32Rows.add_slot`:
  a 16-bit table of dim 16 with row-wise Adagrad is ``16 * 2 + 4`` bytes a
  row);
* sums the gradient's duplicate rows in float32;
* gathers the touched rows and their slots' rows, casts the rows to float32,
  computes the optimizer's update there (``_update_rows``: the same formula
  as its fused float32 kernel, checked against it by
  ``tests/test_table_dtype.py``), writes the slots' rows back and
* rounds the new rows to 16 bits **stochastically** (:func:`stochastic_round`)
  and scatters them into the table.

A float32 variable takes the optimizer's own path (TensorFlow's fused sparse
kernel, or row-wise Adagrad's scatters), unless the optimizer is made with
``single_writer=True``: a promise that nothing else updates its tables while
a step applies its update (one device; each replica's copy under a mirrored
strategy). Then a float32 table takes the same gather, float32 update and
scatter of whole rows as a 16-bit one, without the rounding: about twice as
fast as the fused kernel on this machine's CPU, whose per-row loop is its
cost (``benchmarks/sparse_apply.py``; docs/benchmarks.md, "Round 3
(2026-12-06): one writer updates whole rows"). Under
``ParameterServerStrategy`` several workers update a shard at once, and a
row gathered by one step and written back whole would undo another worker's
update of it made in between, so the fused kernels (read-modify-write per
value, no lock) stay there. 16-bit tables have no fused kernel and take the
gather-and-write path under every strategy: on a PS cluster two workers'
updates of the same row within the same few milliseconds keep only the later
(docs/decisions.md, "16-bit tables").

Stochastic rounding without a custom op: the float32 value's bits get a
uniform random integer below the 16-bit format's unit in the last place
added, and the bits under that unit are cleared (``bitcast``, ``+``,
``bitwise_and``): the result is the next representable value up with
probability equal to the distance from the one below, so its mean is the
float32 value. An update smaller than half a unit (1e-4 on a value of 1 in
bfloat16, whose unit there is 2**-7) is lost by round-to-nearest every time
and kept on average here. float16's values below its normal range (2**-14)
have a fixed step of 2**-24 and are rounded in fixed point. The noise is
stateless, seeded by the optimizer's iteration count and the variable's
name, so a replica of a mirrored strategy draws the same as the others.
"""

from __future__ import annotations

import re
import zlib

import tensorflow as tf
import tf_keras

#: The 16-bit storage dtypes and the float32 mantissa bits each drops.
_DROPPED_BITS = {tf.bfloat16: 16, tf.float16: 13}
_FLOAT16_NORMAL = 2.0 ** -14  # float16's smallest normal value
_FLOAT16_STEP = 2.0 ** -24  # float16's step below it


def is_16bit(variable) -> bool:
    """True for a ``bfloat16`` or ``float16`` variable (or tensor)."""
    return tf.as_dtype(variable.dtype).base_dtype in _DROPPED_BITS


def stochastic_round(values: tf.Tensor, dtype: tf.DType,
                     seed: tf.Tensor) -> tf.Tensor:
    """float32 ``values`` rounded to ``dtype`` (bfloat16 or float16) up or
    down at random, so that the mean of the result is ``values`` (module
    docstring); ``seed``: a ``[2]`` int32/int64 stateless seed."""
    dtype = tf.as_dtype(dtype)
    dropped = _DROPPED_BITS[dtype]
    values = tf.cast(values, tf.float32)
    noise = tf.random.stateless_uniform(
        tf.shape(values), seed, minval=0, maxval=1 << dropped,
        dtype=tf.int32)
    bits = tf.bitwise.bitwise_and(tf.bitcast(values, tf.int32) + noise,
                                  tf.constant(-(1 << dropped), tf.int32))
    rounded = tf.bitcast(bits, tf.float32)
    if dtype == tf.float16:
        fraction = tf.random.stateless_uniform(
            tf.shape(values), seed[::-1], dtype=tf.float32)
        fixed = tf.floor(values / _FLOAT16_STEP + fraction) * _FLOAT16_STEP
        rounded = tf.where(tf.abs(values) < _FLOAT16_NORMAL, fixed, rounded)
    return tf.cast(rounded, dtype)


def _name_seed(variable) -> int:
    """A stable int from the variable's name, the same on every replica
    (``.../replica_1`` and ``:0`` left out)."""
    name = re.sub(r"(/replica_\d+)?(:\d+)?$", "", variable.name)
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


class _Float32Slots:
    """A view of a 16-bit variable whose ``true_dtype`` is float32: what
    ``OptimizerV2.add_slot`` reads to choose a slot's dtype (it is how a
    mixed-precision ``AutoCastVariable`` gets float32 slots)."""

    true_dtype = tf.float32

    def __init__(self, variable) -> None:
        self._variable = variable

    def __getattr__(self, name: str):
        return getattr(self._variable, name)


class Float32Rows:
    """Mixin of a legacy ``tf_keras`` optimizer: 16-bit variables keep
    float32 slots and are updated in float32, rounded back stochastically
    (module docstring). A subclass defines :meth:`_update_rows`.

    ``single_writer=True``: nothing else updates the variables while a step
    applies its update, so float32 ones take the same whole-row path, faster
    than TensorFlow's fused kernels (module docstring); never under
    ``ParameterServerStrategy``."""

    #: Whether a single writer's float32 tables take the whole-row path:
    #: where it beats the optimizer's own (``benchmarks/sparse_apply.py``).
    _ROWS_FOR_SINGLE_WRITER = True

    def __init__(self, *args, single_writer: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._single_writer = single_writer

    def add_slot(self, var, slot_name, initializer="zeros", shape=None):
        if is_16bit(var):
            var = _Float32Slots(var)
        return super().add_slot(var, slot_name, initializer, shape)

    def _update_rows(self, rows: tf.Tensor, grad: tf.Tensor,
                     slots: dict[str, tf.Tensor], coefficients: dict
                     ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """The float32 ``rows`` and their ``slots`` rows after one update
        by the float32 ``grad`` of those rows (distinct)."""
        raise NotImplementedError

    def _resource_apply_sparse_duplicate_indices(self, grad, handle, indices,
                                                 **kwargs):
        if not ((self._single_writer and self._ROWS_FOR_SINGLE_WRITER)
                or is_16bit(handle)):
            return super()._resource_apply_sparse_duplicate_indices(
                grad, handle, indices, **kwargs)
        unique, positions = tf.unique(indices)
        summed = tf.math.unsorted_segment_sum(
            tf.cast(grad, tf.float32), positions, tf.shape(unique)[0])
        return self._apply_rows(summed, handle, unique,
                                kwargs.get("apply_state"))

    def _resource_apply_dense(self, grad, var, apply_state=None):
        if not is_16bit(var):
            return super()._resource_apply_dense(grad, var, apply_state)
        rows = tf.range(tf.shape(var)[0])
        return self._apply_rows(tf.cast(grad, tf.float32), var, rows,
                                apply_state)

    def _apply_rows(self, grad, var, indices, apply_state):
        key = (var.device, tf.float32)
        coefficients = ((apply_state or {}).get(key)
                        or self._fallback_apply_state(*key))
        rows = tf.cast(tf.gather(var, indices), tf.float32)
        slots = {name: self.get_slot(var, name)
                 for name in self.get_slot_names()}
        new_rows, new_slots = self._update_rows(
            rows, grad, {name: tf.gather(slot, indices)
                         for name, slot in slots.items()}, coefficients)
        writes = [slots[name].scatter_update(tf.IndexedSlices(value, indices))
                  for name, value in new_slots.items()]
        if is_16bit(var):
            seed = tf.stack([tf.cast(self.iterations, tf.int64),
                             tf.constant(_name_seed(var), tf.int64)])
            new_rows = stochastic_round(new_rows, var.dtype, seed)
        with tf.control_dependencies(writes):
            return var.scatter_update(tf.IndexedSlices(new_rows, indices))


def adagrad_rows(rows, grad, slots, coefficients):
    """Adagrad: ``acc += g**2; w -= lr * g / (sqrt(acc) + epsilon)``."""
    acc = slots["accumulator"] + tf.square(grad)
    return (rows - coefficients["lr_t"] * grad
            / (tf.sqrt(acc) + coefficients["epsilon"]),
            {"accumulator": acc})


def ftrl_rows(rows, grad, slots, coefficients, shrinkage: float = 0.0):
    """FTRL-proximal as TensorFlow's ``ApplyFtrl(V2)`` kernel (l2 with
    Keras' ``beta`` folded in, as ``Ftrl._resource_apply_sparse`` does)."""
    lr = coefficients["lr_t"]
    power = -coefficients["learning_rate_power"]
    l1 = coefficients["l1_regularization_strength"]
    l2 = (coefficients["l2_regularization_strength"]
          + coefficients["beta"] / (2.0 * lr))
    acc = slots["accumulator"]
    new_acc = acc + tf.square(grad)
    shrunk = grad + 2.0 * shrinkage * rows
    linear = slots["linear"] + shrunk - (
        tf.pow(new_acc, power) - tf.pow(acc, power)) / lr * rows
    quadratic = tf.pow(new_acc, power) / lr + 2.0 * l2
    new_rows = tf.where(tf.abs(linear) > l1,
                        (tf.sign(linear) * l1 - linear) / quadratic,
                        tf.zeros_like(linear))
    return new_rows, {"accumulator": new_acc, "linear": linear}


class Adagrad(Float32Rows, tf_keras.optimizers.legacy.Adagrad):
    """``tf_keras``' legacy Adagrad; 16-bit tables as :class:`Float32Rows`."""

    def _update_rows(self, rows, grad, slots, coefficients):
        return adagrad_rows(rows, grad, slots, coefficients)


class Ftrl(Float32Rows, tf_keras.optimizers.legacy.Ftrl):
    """``tf_keras``' legacy FTRL; 16-bit tables as :class:`Float32Rows`."""

    def _update_rows(self, rows, grad, slots, coefficients):
        return ftrl_rows(rows, grad, slots, coefficients,
                         self._l2_shrinkage_regularization_strength)


class SGD(Float32Rows, tf_keras.optimizers.legacy.SGD):
    """``tf_keras``' legacy SGD; 16-bit tables as :class:`Float32Rows`.
    Its own sparse update of a float32 table is one ``ResourceScatterAdd``
    of the rows, without de-duplication: 0.75x the whole-row path's time
    (``benchmarks/sparse_apply.py``), so a single writer keeps it."""

    _ROWS_FOR_SINGLE_WRITER = False

    def _update_rows(self, rows, grad, slots, coefficients):
        lr = coefficients["lr_t"]
        if not self._momentum:
            return rows - lr * grad, {}
        momentum = coefficients["momentum"]
        velocity = momentum * slots["momentum"] - lr * grad
        step = (momentum * velocity - lr * grad if self.nesterov
                else velocity)
        return rows + step, {"momentum": velocity}
