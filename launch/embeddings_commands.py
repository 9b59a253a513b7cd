"""``psrec embeddings stats CHECKPOINT``: rows used and free per dynamic
table and shard, ids admitted, evicted and pending admission -- read from
the checkpoint's files, with no cluster."""

from __future__ import annotations

import argparse

from psrec.errors import EXIT_OK
from psrec.launch.argtypes import positive
from psrec.launch.cli_support import add_json_flag
from psrec.launch.cli_support import print_result


def _cmd_stats(args: argparse.Namespace) -> int:
    from psrec.ps_cluster.dynamic_stats import dynamic_stats
    print_result(args, dynamic_stats(args.checkpoint, shards=args.shards))
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
    s.add_argument("--shards", type=positive, default=1,
                   help="report rows per shard as N shards of each table "
                   "(the run's shard count, e.g. its PS count)")
    add_json_flag(s)
    s.set_defaults(run=_cmd_stats)
