"""The parser of ``psrec embeddings stats CHECKPOINT`` (its description says
what it reports). It imports no TensorFlow; what runs it is
:mod:`psrec.launch.cli.embeddings_run`, imported only when it runs."""

from __future__ import annotations

import argparse

from psrec.errors import did_you_mean
from psrec.launch.cli.argtypes import positive
from psrec.launch.cli.support import UsageError
from psrec.launch.cli.support import add_json_flag
from psrec.uri import is_uri
from psrec.uri_path import as_path


def add_embeddings(sub: argparse._SubParsersAction, name: str
                   ) -> argparse._SubParsersAction:
    """``psrec embeddings``: the parser of the group; returns where its
    sub-commands are added."""
    p = sub.add_parser(name, help="inspect embedding tables")
    return p.add_subparsers(dest="embeddings_command", metavar="COMMAND",
                            required=True, help="stats: the dynamic "
                            "tables of a checkpoint")


def add_stats(sub: argparse._SubParsersAction, name: str
              ) -> argparse.ArgumentParser:
    """``psrec embeddings stats``."""
    s = sub.add_parser(
        name, help="rows used/free, admitted, evicted and pending ids "
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
    return s


def check_stats(args: argparse.Namespace) -> None:
    """What ``psrec embeddings stats`` refuses before its run imports
    TensorFlow: a local checkpoint that is neither a folder nor a prefix
    with its ``.index`` file (a URI is checked when read)."""
    path = args.checkpoint
    if is_uri(path) or as_path(path).is_dir() or as_path(
            f"{path}.index").is_file():
        return
    folder = as_path(path).parent
    kept = sorted(str(folder / p.stem) for p in folder.glob("ckpt-*.index")
                  ) if folder.is_dir() else []
    raise UsageError(f"checkpoint {path!r} does not exist (no folder, no "
                     f"{path}.index); give a checkpoint prefix such as "
                     "DIR/ckpt-100 or its folder"
                     f"{did_you_mean(path, kept) or '.'}")
