"""``psrec embeddings stats CHECKPOINT``: rows used and free per dynamic
table and shard, ids admitted, evicted and pending admission -- read from
the checkpoint's files, with no cluster."""

from __future__ import annotations

import argparse

from psrec.errors import EXIT_OK
from psrec.launch.cli.argtypes import positive
from psrec.launch.cli.support import add_json_flag
from psrec.launch.cli.support import print_result


def _run_shard_rows(checkpoint: str) -> dict[str, list[int]] | None:
    """Rows per shard of every dynamic table as the run that wrote
    ``checkpoint`` cut them (its ``job.json``: PS count, partitioner);
    None when no job.json is found beside it."""
    from psrec.errors import ConfigError
    from psrec.launch.job.config import JobConfig
    from psrec.ps_cluster.planner.plan import shard_rows
    from psrec.uri_path import as_path
    path = as_path(checkpoint)
    for folder in (path, path.parent, path.parent.parent):  # best/best-N
        try:
            config = JobConfig.read(folder)
        except (ConfigError, OSError):
            continue
        ps = config.strategy.kind == "ps"
        return {t.name: (shard_rows(t.rows, config.ps, config.partition,
                                    t.dim) if ps else [t.rows])
                for t in config.spec.tables if t.dynamic}
    return None


def _cmd_stats(args: argparse.Namespace) -> int:
    from psrec.ps_cluster.checkpoint.dynamic_stats import dynamic_stats
    sizes = None if args.shards else _run_shard_rows(args.checkpoint)
    print_result(args, dynamic_stats(args.checkpoint, shards=args.shards or 1,
                                     shard_rows=sizes))
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Registers ``embeddings stats``."""
    p = sub.add_parser("embeddings", help="inspect embedding tables")
    inner = p.add_subparsers(dest="embeddings_command", metavar="COMMAND",
                             required=True, help="stats: the dynamic "
                             "tables of a checkpoint")
    s = inner.add_parser(
        "stats", help="rows used/free, admitted, evicted and pending ids "
        "of the dynamic tables of a checkpoint",
        description="Reads a checkpoint's files (no cluster) and reports, "
        "per `mode: dynamic` table, the rows used and free (in total and "
        "per shard), the ids admitted and evicted so far and the ids "
        "waiting for admission.")
    s.add_argument("checkpoint", help="a checkpoint prefix (DIR/ckpt-N) or "
                   "a checkpoint folder (its latest checkpoint)")
    s.add_argument("--shards", type=positive, default=None,
                   help="report rows per shard as an even split into N "
                   "shards (default: the run's shards, planned from the "
                   "job.json beside the checkpoint; 1 without it)")
    add_json_flag(s)
    s.set_defaults(run=_cmd_stats)
