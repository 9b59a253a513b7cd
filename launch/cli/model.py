"""The parsers of the ``psrec`` commands that use or time a model outside
a training job: ``export`` and ``eval`` read a trained checkpoint,
``predict`` (alias ``score``) scores raw rows with an export, ``bench``
measures training throughput. They import no TensorFlow; what runs them
is :mod:`psrec.launch.cli.model_run`, imported only when one runs."""

from __future__ import annotations

import argparse
import dataclasses

from psrec.data.format.manifest import SPLITS
from psrec.data.format.manifest import Manifest
from psrec.data.input.config import InputConfig
from psrec.launch.cli.argtypes import positive
from psrec.launch.cli.options import add_option
from psrec.launch.cli.support import UsageError
from psrec.launch.cli.support import add_json_flag
from psrec.launch.cli.support import add_model_flag
from psrec.launch.cli.support import existing_files
from psrec.launch.job.config import BenchConfig
from psrec.launch.job.config import JobConfig
from psrec.launch.job.config import check_breakdown
from psrec.launch.job.config import check_curves
from psrec.launch.monitor.progress_bar import add_progress_flag
from psrec.models.retrieval.config import RetrievalConfig
from psrec.models.serving.config import ExportConfig
from psrec.options import option_values
from psrec.ps_cluster.checkpoint.names import check_checkpoint_name
from psrec.ps_cluster.training.config import LoopConfig
from psrec.uri import is_uri
from psrec.uri_path import as_path


def _add_checkpoint_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", default=None,
                   help="latest, best or ckpt-N (default: best when the run "
                   "recorded one in best.json, else latest)")


_PREDICT_DESCRIPTION = (
    "Scores raw rows (the Parquet columns `psrec ingest` wrote; nulls are "
    "missing values, as at conversion) in batches with a model from `psrec "
    "export` and writes row, [label, --keep columns,] probability and "
    "logit, one row per input row in input order.")
_MODEL_HELP = ("export folder: a version folder (OUT/3) or the versioned "
               "root (OUT: its highest version is used)")


def _add_predict_flags(p: argparse.ArgumentParser) -> None:
    """The flags ``predict`` and ``score`` share."""
    p.add_argument("--out", required=True,
                   help="scores file to write: CSV if it ends in .csv, else "
                   "Parquet")
    p.add_argument("--batch-rows", type=positive, default=65536,
                   help="rows read and scored at a time")
    p.add_argument("--label", default=None, metavar="COL",
                   help="label column to copy to the output (must be in "
                   "every input; default: `label` when every input has it)")
    p.add_argument("--keep", default=None, metavar="COL,...",
                   help="more input columns to copy, e.g. ids")
    add_progress_flag(p)
    add_json_flag(p)


def add_export(sub: argparse._SubParsersAction, name: str
               ) -> argparse.ArgumentParser:
    """``psrec export``: a checkpoint as a serving SavedModel version."""
    p = sub.add_parser(
        name, help="checkpoint dir -> serving SavedModel version",
        description="Writes OUT/<version>/ (a SavedModel with "
        "assets.extra/tf_serving_warmup_requests built from the run's eval "
        "rows; with --split a split bundle: model/, tables/*.parquet, "
        "manifest.json), published atomically, as TF Serving expects; an "
        "existing version is never overwritten.")
    p.add_argument("checkpoint_dir",
                   help="checkpoint folder of a run (with its job.json)")
    p.add_argument("--out", required=True,
                   help="export folder (path or URI); the model goes to "
                   "OUT/<version>/")
    p.add_argument("--version", type=positive, default=None,
                   help="version number (default: one more than the "
                   "largest in OUT, 1 for none); refused if it exists")
    add_option(p, ExportConfig, "table_dtype")
    add_option(p, ExportConfig, "split")
    add_option(p, ExportConfig, "delta_since", type=positive,
               metavar="VERSION")
    _add_checkpoint_flag(p)
    add_json_flag(p)
    return p


def add_apply_delta(sub: argparse._SubParsersAction, name: str
                    ) -> argparse.ArgumentParser:
    """``psrec apply-delta``: a split version and its deltas -> the next
    full split version (pyarrow only: no TensorFlow, no cluster)."""
    p = sub.add_parser(
        name, help="split base + delta versions -> the full split version",
        description="Applies delta bundles (`psrec export --split "
        "--delta-since`) to a full split version and publishes the result "
        "as OUT/<the last delta's version>/, atomically: the tables a full "
        "split export at the last delta's step writes, byte for byte, and "
        "the last delta's dense SavedModel. Each delta must be made on the "
        "version before it; every input file is checked against its "
        "manifest. Needs no TensorFlow.")
    p.add_argument("base_dir", help="a full split version folder (OUT/3)")
    p.add_argument("delta_dirs", nargs="+", metavar="delta_dir",
                   help="delta version folders, oldest first (OUT/4 OUT/5)")
    p.add_argument("--out", required=True,
                   help="versioned folder to publish the full version in")
    add_json_flag(p)
    return p


def add_eval(sub: argparse._SubParsersAction, name: str
             ) -> argparse.ArgumentParser:
    """``psrec eval``: AUC and logloss of a checkpoint."""
    p = sub.add_parser(name, help="AUC/logloss of a checkpoint")
    p.add_argument("checkpoint_dir",
                   help="checkpoint folder of a run (with its job.json)")
    p.add_argument("--data", required=True,
                   help="manifest of converted data (file or folder)")
    p.add_argument("--split", choices=SPLITS, default=SPLITS[1],
                   help="the split to evaluate, every example once")
    p.add_argument("--plots", action="store_true",
                   help="also write ROC, precision-recall and calibration "
                   "curves (roc.svg, pr.svg, calibration.svg, curves.json) "
                   "to WORKDIR/eval/<checkpoint>-<split>/ and the PR curve "
                   "to WORKDIR/tensorboard/eval-<checkpoint>-<split>/ "
                   "(WORKDIR: the folder holding CHECKPOINT_DIR)")
    add_option(p, RetrievalConfig, "exclude_seen")
    add_breakdown_flags(p)
    _add_checkpoint_flag(p)
    add_progress_flag(p)
    add_json_flag(p)
    return p


def add_breakdown_flags(group) -> None:
    """``--group-by``, ``--gauc-weighting``, ``--slice-by``,
    ``--slice-top`` (``psrec train`` and ``psrec eval``)."""
    add_option(group, LoopConfig, "group_by", metavar="COLUMN")
    add_option(group, LoopConfig, "gauc_weighting")
    add_option(group, LoopConfig, "slice_by", metavar="COLUMN")
    add_option(group, LoopConfig, "slice_top", type=positive, metavar="N")


def breakdown_of(args: argparse.Namespace):
    """The :class:`~psrec.ps_cluster.evaluation.breakdown.Breakdown` of
    the flags of :func:`add_breakdown_flags`."""
    return LoopConfig(group_by=args.group_by,
                      gauc_weighting=args.gauc_weighting,
                      slice_by=args.slice_by,
                      slice_top=args.slice_top).breakdown()


def check_export(args: argparse.Namespace) -> None:
    """What ``psrec export`` refuses before its run imports TensorFlow: a
    checkpoint folder without the ``job.json`` of a run, a ``--checkpoint``
    that names no checkpoint, ``--table-dtype`` other than float32 or
    ``--split`` for a retrieval run, ``--split`` for a multi-task run."""
    record = JobConfig.read(args.checkpoint_dir)
    check_checkpoint_name(args.checkpoint_dir, args.checkpoint)
    option_values(args, ExportConfig).check_task(
        record.retrieval is not None, args.checkpoint_dir,
        labels=record.spec.label_names)


def check_eval(args: argparse.Namespace) -> None:
    """What ``psrec eval`` refuses before its run imports TensorFlow: a
    missing manifest (``--data``), a checkpoint folder without ``job.json``
    (in the run's order), a ``--checkpoint`` that names no checkpoint,
    ``--plots`` of a run without a binary label, ``--no-exclude-seen`` of a
    ranking run."""
    Manifest.load(args.data)
    record = JobConfig.read(args.checkpoint_dir)
    check_checkpoint_name(args.checkpoint_dir, args.checkpoint)
    if args.plots:
        check_curves(record)
    if args.no_exclude_seen and record.retrieval is None:
        raise UsageError(
            f"--no-exclude-seen: {args.checkpoint_dir} holds a ranking run; "
            "the flag applies to a retrieval run's recall@k (drop it).")
    check_breakdown(dataclasses.replace(
        record.loop, group_by=args.group_by,
        gauc_weighting=args.gauc_weighting, slice_by=args.slice_by,
        slice_top=args.slice_top), record.spec, record.retrieval)


def check_predict(args: argparse.Namespace) -> None:
    """What ``psrec predict`` (and ``score``) refuses before its run
    imports TensorFlow: a local export folder that does not exist, an
    input that does not exist."""
    if not is_uri(args.model) and not as_path(args.model).exists():
        raise UsageError(
            f"export folder not found: {args.model}; write one with `psrec "
            "export CHECKPOINT_DIR --out DIR` (`psrec train` exports to "
            "WORKDIR/export).")
    keep_columns(args)
    existing_files(args.data, "input Parquet")


def keep_columns(args: argparse.Namespace) -> list[str]:
    """``--keep A,B``: the columns to copy (none empty)."""
    keep = [c.strip() for c in args.keep.split(",")] if args.keep else []
    if not all(keep):
        raise UsageError(f"--keep {args.keep!r}: give comma-separated column "
                         "names, none empty (e.g. user_id,item_id)")
    return keep


def add_predict(sub: argparse._SubParsersAction, name: str
                ) -> argparse.ArgumentParser:
    """``psrec predict``: an export's scores of raw Parquet rows."""
    p = sub.add_parser(
        name, help="exported model + raw Parquet rows -> probabilities (or "
        "a retrieval export's top-K ids)",
        description=_PREDICT_DESCRIPTION)
    p.add_argument("--model", required=True, metavar="EXPORT_DIR",
                   help=_MODEL_HELP)
    p.add_argument("--data", required=True, nargs="+", metavar="PARQUET",
                   help="Parquet files, or folders of them, read in order")
    _add_predict_flags(p)
    return p


def add_score(sub: argparse._SubParsersAction, name: str
              ) -> argparse.ArgumentParser:
    """``psrec score``: ``predict`` with positional arguments."""
    p = sub.add_parser(
        name, help="the same as predict, with positional arguments",
        description=_PREDICT_DESCRIPTION + " `psrec score EXPORT_DIR INPUT "
        "...` is `psrec predict --model EXPORT_DIR --data INPUT ...`.")
    p.add_argument("model", metavar="export_dir", help=_MODEL_HELP)
    p.add_argument("data", nargs="+", metavar="INPUT",
                   help="Parquet files, or folders of them, read in order")
    _add_predict_flags(p)
    return p


def add_bench(sub: argparse._SubParsersAction, name: str
              ) -> argparse.ArgumentParser:
    """``psrec bench``: training throughput."""
    p = sub.add_parser(name, help="training throughput (examples/s)")
    workload = p.add_argument_group("model")
    add_model_flag(workload)
    add_option(workload, InputConfig, "batch_size", type=positive,
               help="global batch size (rows per step)")
    add_option(workload, BenchConfig, "buckets", type=positive)
    add_option(workload, BenchConfig, "dim", type=positive)
    cluster = p.add_argument_group("cluster")
    add_option(cluster, JobConfig, "workers", type=positive)  # task counts
    add_option(cluster, JobConfig, "ps", type=positive)
    add_option(cluster, BenchConfig, "single_process")
    schedule = p.add_argument_group("schedule")
    add_option(schedule, BenchConfig, "steps", type=positive)
    add_option(schedule, LoopConfig, "steps_per_closure", type=positive)
    add_json_flag(p.add_argument_group("output"))
    return p
