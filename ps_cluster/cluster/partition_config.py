"""How embedding tables are split across PS tasks: :class:`PartitionConfig`
(plain Python, each field an option; ``psrec.options``). The partitioner
that applies it is ``ps_cluster.cluster.partitioning``."""

from __future__ import annotations

import dataclasses

from psrec.errors import check
from psrec.options import Codec
from psrec.options import check_choices
from psrec.options import option

PARTITIONER_KINDS = ("min-size", "fixed", "max-size")


@dataclasses.dataclass(frozen=True)
class PartitionConfig(Codec, where="partition"):
    """How embedding tables are split across PS tasks."""

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
