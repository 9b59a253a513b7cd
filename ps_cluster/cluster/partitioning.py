"""Variable partitioners that shard embedding tables, and only them.

``ParameterServerStrategy`` calls its ``variable_partitioner`` for every
variable created in its scope. psrec wants the giant embedding tables split
across all PS tasks, but the small dense-tower weights whole (a sharded
dense kernel is concatenated back on every step). :class:`TablePartitioner`
applies the configured policy inside ``models.embedding.sparse_arch.table_creation_scope``
and keeps every other variable in one piece.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from psrec.errors import check
from psrec.errors import check_choice
from psrec.models.embedding.sparse_arch import creating_table

PARTITIONER_KINDS = ("min-size", "fixed", "max-size")


@dataclasses.dataclass(frozen=True)
class PartitionConfig:
    """How embedding tables are split across PS tasks.

    Attributes:
      kind: ``min-size`` (as many shards as PS tasks, but no shard smaller
        than ``min_shard_bytes``), ``fixed`` (exactly ``shards`` shards,
        default: one per PS task) or ``max-size`` (enough shards that none
        exceeds ``max_shard_bytes``, capped at ``shards``/PS count).
      min_shard_bytes: for ``min-size``.
      max_shard_bytes: for ``max-size``.
      shards: shard count for ``fixed``, and the cap for the others;
        defaults to the number of PS tasks.
    """

    kind: str = "min-size"
    min_shard_bytes: int = 256 << 10
    max_shard_bytes: int = 64 << 20
    shards: int | None = None

    def __post_init__(self) -> None:
        check_choice("partitioner", self.kind, PARTITIONER_KINDS)
        check(self.shards is None or self.shards >= 1, "shards", self.shards,
              "must be >= 1")


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
