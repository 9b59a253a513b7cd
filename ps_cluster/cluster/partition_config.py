"""How embedding tables are split across PS tasks: :class:`PartitionConfig`
(plain Python, each field an option; ``psrec.options``). The partitioner
that applies it is ``ps_cluster.cluster.partitioning``."""

from __future__ import annotations

import dataclasses
from typing import Any

from psrec.errors import check
from psrec.options import check_choices
from psrec.options import from_dict
from psrec.options import option
from psrec.options import to_dict

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

    kind: str = option(
        "min-size", flag="--partitioner", choices=PARTITIONER_KINDS,
        help="how embedding tables are split across PS tasks")
    min_shard_bytes: int = option(256 << 10,
                                  help="smallest shard of min-size")
    max_shard_bytes: int = option(64 << 20, help="largest shard of max-size")
    shards: int | None = option(
        None, flag="--table-shards",
        help="shards per table (default: one per PS task)")

    def __post_init__(self) -> None:
        check_choices(self)
        check(self.shards is None or self.shards >= 1,
              "PartitionConfig.shards", self.shards, "must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "partition"
                  ) -> PartitionConfig:
        return from_dict(cls, data, where)
