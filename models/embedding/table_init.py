"""Bounded-memory initialisation of embedding tables.

Creating a variable from a random initializer materialises the random values
(and the temporaries of the op that scales them) beside the variable: up to
about three times the table while it is created. Here a table is created
from zeros instead (the zeros buffer *becomes* the variable: TensorFlow's
``AssignVariableOp`` takes the buffer without copying it), then each shard is
filled in place, block by block of rows, on the shard's own device (its PS):
the most that exists beside the table is one block of :data:`BLOCK_BYTES`
and its temporaries.

Values come from the same Keras initializer (same distribution and scale).
Each block is drawn with ``partition_offset`` = its first row in the whole
table, which Keras folds into the initializer's seed, so blocks differ from
one another and a seeded run (``tf_keras.utils.set_random_seed``) draws the
same table again.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tf_keras

from psrec.progress import SILENT
from psrec.progress import Progress
from psrec.progress import default_progress

BLOCK_BYTES = 32 << 20  # rows drawn and written at a time
PROGRESS_ROWS = 10_000_000  # tables from this size report progress


def fills_in_blocks(initializer: tf_keras.initializers.Initializer) -> bool:
    """True when a table with ``initializer`` is created from zeros and then
    filled (:func:`fill_table`): random initializers, in eager mode, where
    each shard is one plain variable (no strategy, one device or parameter
    servers). Under the mirrored strategies every replica's copy must get
    the same values, which the strategy's own initialisation guarantees, so
    they keep it."""
    if isinstance(initializer, tf_keras.initializers.Zeros):
        return False
    if not tf.executing_eagerly():
        return False
    if not tf.distribute.has_strategy():
        return True
    return isinstance(tf.distribute.get_strategy(), (
        tf.distribute.OneDeviceStrategy,
        tf.distribute.ParameterServerStrategy))


def assign_rows(variable: tf.Variable, start: int, value: tf.Tensor) -> None:
    """Writes ``value`` into rows ``start ..`` of ``variable`` in place, on
    the variable's device, without reading the variable (a read would keep
    its buffer shared, and the write would then copy the whole variable)."""
    rows = int(value.shape[0])
    rest = [int(d) for d in variable.shape[1:]]
    with tf.device(variable.device):
        tf.raw_ops.ResourceStridedSliceAssign(
            ref=variable.handle, begin=[start] + [0] * len(rest),
            end=[start + rows] + rest, strides=[1] * (1 + len(rest)),
            value=value)


def fill_table(table, initializer: tf_keras.initializers.Initializer, *,
               label: str = "init", progress: Progress | None = None) -> None:
    """Fills every shard of ``table`` (a variable or a ``ShardedVariable``)
    with ``initializer``'s values, one block of rows at a time on the
    shard's device. Tables of :data:`PROGRESS_ROWS` rows or more report
    their rows to ``progress`` (default: the process's default progress,
    bars on stderr in the CLI)."""
    shards = list(getattr(table, "variables", [table]))
    total = sum(int(s.shape[0]) for s in shards)
    row_bytes = 4 * int(np.prod(table.shape[1:]))  # drawn as float32
    step = max(1, BLOCK_BYTES // max(row_bytes, 1))
    reporter = SILENT
    if total >= PROGRESS_ROWS:
        reporter = default_progress() if progress is None else progress
    offset = 0
    with reporter.task(label, total, "rows") as task:
        for shard in shards:
            rows = int(shard.shape[0])
            rest = tuple(int(d) for d in shard.shape[1:])
            for start in range(0, rows, step):
                n = min(step, rows - start)
                with tf.device(shard.device):  # float32, cast: 16 bits
                    value = tf.cast(initializer(
                        (n, *rest), dtype=tf.float32,
                        partition_shape=(n, *rest),
                        partition_offset=(offset + start,) + (0,) * len(rest)),
                        shard.dtype)
                assign_rows(shard, start, value)
                del value
                task.advance(n)
            offset += rows
