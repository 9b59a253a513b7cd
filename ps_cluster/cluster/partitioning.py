"""Variable partitioners that shard embedding tables, and only them.

``ParameterServerStrategy`` calls its ``variable_partitioner`` for every
variable created in its scope. psrec wants the giant embedding tables split
across all PS tasks, but the small dense-tower weights whole (a sharded
dense kernel is concatenated back on every step). :class:`TablePartitioner`
applies the configured policy inside ``models.embedding.sparse_arch.table_creation_scope``
and keeps every other variable in one piece.
"""

from __future__ import annotations

import tensorflow as tf

from psrec.errors import check
from psrec.models.embedding.sparse_arch import creating_table
from psrec.ps_cluster.cluster.partition_config import PartitionConfig


class TablePartitioner(tf.distribute.experimental.partitioners.Partitioner):
    """Shards tables per a :class:`PartitionConfig`; other variables whole."""

    def __init__(self, config: PartitionConfig, num_ps: int) -> None:
        check(num_ps >= 1, "num_ps", num_ps, "must be >= 1")
        cap = config.shards or num_ps
        partitioners = tf.distribute.experimental.partitioners
        if config.kind == "fixed":
            self._inner = partitioners.FixedShardsPartitioner(cap)
        elif config.kind == "min-size":
            self._inner = partitioners.MinSizePartitioner(
                min_shard_bytes=config.min_shard_bytes, max_shards=cap)
        else:
            self._inner = partitioners.MaxSizePartitioner(
                max_shard_bytes=config.max_shard_bytes, max_shards=cap)

    def __call__(self, shape: tf.TensorShape, dtype: tf.DType,
                 axis: int = 0) -> list[int]:
        if not creating_table():
            return [1] * len(shape)
        return self._inner(shape, dtype, axis)
