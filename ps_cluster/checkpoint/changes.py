"""Which rows of each table changed since the last save: one flag per row,
kept beside each table shard, for delta checkpoints
(:mod:`psrec.ps_cluster.checkpoint.delta`).

Each shard of each table (the wide twins and the dynamic tables' rows too)
gets a ``bool`` variable of its rows, colocated with the shard (on its PS).
The sparse update marks the rows it writes in the same apply
(:meth:`ChangeTracker.mark`, called by the train step): the ops run on the
shard's PS with the gradient's row indices, which the update sends there
anyway, so nothing per row reaches the coordinator. Rows that dynamic-table
maintenance gives to admitted ids (their embedding and slots are reset) are
marked by :meth:`ChangeTracker.mark_rows`. A save that succeeds clears the
flags (:meth:`ChangeTracker.clear`, on each PS): the flags are the rows
changed since the last save, full or delta.

The flags are not part of any checkpoint: a restored state equals its
last save, so after a restore no row has changed since.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from psrec.models.dynamic.shards import colocated_with
from psrec.models.dynamic.shards import parts


class ChangeTracker(tf.Module):
    """The changed-row flags of ``tables`` (name -> table variable, sharded
    or not). Create it under the strategy's scope (each flag variable is
    colocated with its shard)."""

    def __init__(self, tables: dict[str, object]) -> None:
        super().__init__(name="changed_rows")
        self.flags: dict[str, list[tf.Variable]] = {}
        for name, table in tables.items():
            flags = []
            for k, shard in enumerate(parts(table)):
                rows = int(shard.shape[0])
                with colocated_with(shard):
                    flags.append(tf.Variable(
                        lambda rows=rows: tf.zeros([rows], tf.bool),
                        trainable=False, name=f"{name}/part_{k}"))
            self.flags[name] = flags

    def _ordered(self) -> list[tf.Variable]:
        """Every flag variable, in the order of the tables' shard
        variables (``SparseArch.table_variables``)."""
        return [flag for flags in self.flags.values() for flag in flags]

    def mark(self, table_grads: list) -> None:
        """Marks the rows of ``table_grads`` (one per shard variable, in
        ``SparseArch.table_variables`` order; ``IndexedSlices`` of local
        rows, a dense gradient marks every row). Call in the apply, inside
        the train function: each op runs on the shard's PS."""
        for grad, flag in zip(table_grads, self._ordered()):
            if grad is None:
                continue
            with tf.device(flag.device):
                if isinstance(grad, tf.IndexedSlices):
                    rows = grad.indices
                    flag.scatter_update(tf.IndexedSlices(
                        tf.ones_like(rows, tf.bool), rows))
                else:
                    flag.assign(tf.ones(flag.shape, tf.bool))

    def mark_rows(self, name: str, rows: np.ndarray) -> None:
        """Marks the global ``rows`` of table ``name`` (eager, from the
        coordinator: dynamic-table maintenance)."""
        start = 0
        for flag in self.flags.get(name, ()):
            size = int(flag.shape[0])
            inside = rows[(rows >= start) & (rows < start + size)] - start
            if inside.size:
                with tf.device(flag.device):
                    flag.scatter_update(tf.IndexedSlices(
                        tf.ones([inside.size], tf.bool),
                        tf.constant(inside, tf.int64)))
            start += size

    def changed(self, name: str, part: int) -> tf.Tensor:
        """The local rows of shard ``part`` of ``name`` that changed, as
        an int64 vector on the shard's device."""
        flag = self.flags[name][part]
        with tf.device(flag.device):
            return tf.where(flag)[:, 0]

    def clear(self, rows: dict[str, list[tf.Tensor]] | None = None) -> None:
        """No row has changed (after a save), each flag cleared on its PS:
        only ``rows`` (table -> the :meth:`changed` rows of each shard,
        what a delta wrote: no pass over the whole shard), else all."""
        for name, flags in self.flags.items():
            for k, flag in enumerate(flags):
                with tf.device(flag.device):
                    if rows is None:
                        flag.assign(tf.zeros(flag.shape, tf.bool))
                        continue
                    local = rows[name][k]
                    flag.scatter_update(tf.IndexedSlices(
                        tf.zeros_like(local, tf.bool), local))
