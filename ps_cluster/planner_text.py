"""The text of a :class:`~psrec.ps_cluster.planner.ShardingPlan`: bytes per
PS task, a row per table shard, the partitioning and the largest shard."""

from __future__ import annotations

from psrec.ps_cluster.planner import ShardingPlan
from psrec.ps_cluster.planner import format_bytes


def _partitioning(result: ShardingPlan) -> str:
    partition = result.partition
    cap = partition.shards or result.ps
    if partition.kind == "fixed":
        return f"fixed: {cap} shard(s) per table"
    if partition.kind == "min-size":
        return (f"min-size: ceil(table bytes / "
                f"{format_bytes(partition.min_shard_bytes)}) shards, at most "
                f"{cap} per table")
    return (f"max-size: shards of at most "
            f"{format_bytes(partition.max_shard_bytes)}, up to {cap} per "
            "table")


def _ps_lines(result: ShardingPlan) -> list[str]:
    lines = ["bytes per PS (table shards + optimizer slots + dense part):"]
    for ps, total in enumerate(result.ps_bytes):
        shards = result.shards_on(ps)
        tables = sum(s.bytes for s in shards)
        slots = sum(s.slot_bytes for s in shards)
        lines.append(
            f"  PS {ps}: {format_bytes(total):>10}  ({len(shards)} shard"
            f"{'' if len(shards) == 1 else 's'}: "
            f"{format_bytes(tables)} + slots {format_bytes(slots)} + dense "
            f"{format_bytes(result.dense_bytes)})")
    return lines


def _shard_lines(result: ShardingPlan) -> list[str]:
    width = max([len(t.name) for t in result.tables] + [5])
    lines = ["table shards:",
             f"  {'table':<{width}}  shard  {'rows':>12}  {'dim':>4}  PS  "
             f"{'bytes':>10}  {'slots':>10}"]
    for table in result.tables:
        for s in table.shards:
            lines.append(
                f"  {s.table:<{width}}  {s.index:>5}  {s.rows:>12,}  "
                f"{s.dim:>4}  {s.ps:>2}  {format_bytes(s.bytes):>10}  "
                f"{format_bytes(s.slot_bytes):>10}")
    return lines


def plan_text(result: ShardingPlan) -> str:
    """The plan as text (``psrec plan`` without ``--json``)."""
    largest = result.largest_shard
    lines = [f"sharding plan: {result.ps} PS, partitioner "
             f"{_partitioning(result)}, {result.optimizer} slots"]
    lines += _ps_lines(result)
    lines += _shard_lines(result)
    lines.append(
        f"largest shard: {largest.table}/part_{largest.index} "
        f"({largest.rows:,} x {largest.dim}) on PS {largest.ps}: "
        f"{format_bytes(largest.total_bytes)} with its slots")
    verdict = f"most on one PS: {format_bytes(result.max_ps_bytes)}"
    if result.ps_memory is not None:
        verdict += (f"; --ps-memory {format_bytes(result.ps_memory)}: "
                    + ("fits" if result.fits else "does NOT fit"))
        if result.min_ps is not None:
            verdict += f" (smallest PS count that fits: {result.min_ps})"
    lines.append(verdict)
    return "\n".join(lines)
