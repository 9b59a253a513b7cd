"""What runs ``psrec embeddings stats``: the dynamic tables of a
checkpoint, read with TensorFlow (its parser:
:mod:`psrec.launch.cli.embeddings`)."""

from __future__ import annotations

import argparse

from psrec.errors import EXIT_OK
from psrec.errors import ConfigError
from psrec.launch.cli.support import print_result
from psrec.launch.job.config import JobConfig
from psrec.ps_cluster.checkpoint.dynamic_stats import dynamic_stats
from psrec.ps_cluster.planner.plan import shard_rows
from psrec.uri_path import as_path


def _run_shard_rows(checkpoint: str) -> dict[str, list[int]] | None:
    """Rows per shard of every dynamic table as the run that wrote
    ``checkpoint`` cut them (its ``job.json``: PS count, partitioner);
    None when no job.json is found beside it."""
    path = as_path(checkpoint)
    for folder in (path, path.parent, path.parent.parent):  # best/best-N
        try:
            config = JobConfig.read(folder)
        except (ConfigError, OSError):
            continue
        ps = config.strategy.kind == "ps"
        return {t.name: (shard_rows(t.rows, config.ps, config.partition,
                                    t.dim, t.storage) if ps else [t.rows])
                for t in config.spec.tables if t.dynamic}
    return None


def run_embeddings_stats(args: argparse.Namespace) -> int:
    sizes = None if args.shards else _run_shard_rows(args.checkpoint)
    print_result(args, dynamic_stats(args.checkpoint, shards=args.shards or 1,
                                     shard_rows=sizes))
    return EXIT_OK
