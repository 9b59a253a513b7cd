"""The ``psrec`` commands that use or time a model outside a training job:
``export`` and ``eval`` read a trained checkpoint, ``predict`` (alias
``score``) scores raw rows with an export, ``bench`` measures training
throughput."""

from __future__ import annotations

import argparse
import os
import sys

from psrec.errors import EXIT_OK
from psrec.launch.cli.argtypes import positive
from psrec.launch.cli.support import add_batch_flag
from psrec.launch.cli.support import add_count_flags
from psrec.launch.cli.support import add_json_flag
from psrec.launch.cli.support import add_model_flag
from psrec.launch.cli.support import add_step_flags
from psrec.launch.cli.support import print_result
from psrec.launch.monitor.progress_bar import add_progress_flag
from psrec.launch.monitor.progress_bar import progress_for


def _cmd_export(args: argparse.Namespace) -> int:
    from psrec.launch.job.config import JobConfig
    from psrec.launch.job.data import training_neg_sample_rate
    from psrec.launch.job.export import export_checkpoint
    from psrec.launch.job.export import sampling_note
    from psrec.ps_cluster.checkpoint.best import choose_checkpoint
    JobConfig.read(args.checkpoint_dir)  # a run's folder, or one line
    chosen = choose_checkpoint(args.checkpoint_dir, args.checkpoint)
    report = export_checkpoint(args.checkpoint_dir, args.out,
                               args.checkpoint, version=args.version)
    rate = training_neg_sample_rate(args.checkpoint_dir)
    print_result(args, {"saved_model": report.path, **_chosen_dict(chosen),
                        "version": report.version, "root": report.root,
                        "neg_sample_rate": rate, "warmup": report.warmup},
                 f"{report.path} (version {report.version}): "
                 f"{chosen.describe()}{sampling_note(rate)}\n"
                 f"warmup requests: {report.warmup}")
    return EXIT_OK


def _chosen_dict(chosen) -> dict:
    best = chosen.best
    return {"checkpoint": chosen.name, "step": chosen.step,
            "eval_auc": best.auc if best else None,
            "eval_logloss": best.logloss if best else None}


def _cmd_eval(args: argparse.Namespace) -> int:
    from psrec.data.format.manifest import Manifest
    from psrec.launch.job.config import JobConfig
    from psrec.launch.job.data import training_neg_sample_rate
    from psrec.launch.job.export import evaluate_checkpoint
    from psrec.launch.job.export import sampling_note
    from psrec.ps_cluster.checkpoint.best import choose_checkpoint
    manifest = Manifest.load(args.data)
    JobConfig.read(args.checkpoint_dir)  # a run's folder, or one line
    chosen = choose_checkpoint(args.checkpoint_dir, args.checkpoint)
    result = evaluate_checkpoint(args.checkpoint_dir, manifest,
                                 split=args.split,
                                 checkpoint=args.checkpoint,
                                 progress=progress_for(args))
    rate = training_neg_sample_rate(args.checkpoint_dir)
    print_result(args, {"split": args.split, "checkpoint": chosen.name,
                        "step": chosen.step, **result.to_dict(),
                        "neg_sample_rate": rate},
                 f"{chosen.name} (step {chosen.step}) {result.summary()}"
                 f"{sampling_note(rate)}")
    return EXIT_OK


def _cmd_predict(args: argparse.Namespace) -> int:
    """``psrec predict`` and its older spelling ``psrec score``."""
    from psrec.launch.cli.support import UsageError
    from psrec.models.serving.scoring import score_files
    keep = [c.strip() for c in args.keep.split(",")] if args.keep else []
    if not all(keep):
        raise UsageError(f"--keep {args.keep!r}: give comma-separated column "
                         "names, none empty (e.g. user_id,item_id)")
    report = score_files(args.model, args.data, args.out,
                         batch_rows=args.batch_rows, label=args.label,
                         keep=keep, progress=progress_for(args))
    print_result(args, report)
    return EXIT_OK


def _cmd_bench(args: argparse.Namespace) -> int:
    from psrec.launch.job.bench import BenchConfig
    from psrec.launch.job.bench import run_bench
    result = run_bench(BenchConfig(
        model=args.model, workers=args.workers, ps=args.ps,
        batch_size=args.batch_size, buckets=args.buckets, dim=args.dim,
        steps=args.steps, steps_per_closure=args.steps_per_closure,
        single_process=args.single_process))
    print_result(args, result,
                 "\n".join(f"{k}: {v}" for k, v in result.items()))
    # In-process gRPC servers cannot be shut down; leave without waiting.
    sys.stdout.flush()
    os._exit(EXIT_OK)


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
    p.set_defaults(run=_cmd_predict)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Registers ``export``, ``eval``, ``predict``, ``score`` and
    ``bench``."""

    p = sub.add_parser(
        "export", help="checkpoint dir -> serving SavedModel version",
        description="Writes OUT/<version>/ (a SavedModel with "
        "assets.extra/tf_serving_warmup_requests built from the run's eval "
        "rows), published atomically, as TF Serving expects; an existing "
        "version is never overwritten.")
    p.add_argument("checkpoint_dir",
                   help="checkpoint folder of a run (with its job.json)")
    p.add_argument("--out", required=True,
                   help="export folder (path or URI); the model goes to "
                   "OUT/<version>/")
    p.add_argument("--version", type=positive, default=None,
                   help="version number (default: one more than the "
                   "largest in OUT, 1 for none); refused if it exists")
    _add_checkpoint_flag(p)
    add_json_flag(p)
    p.set_defaults(run=_cmd_export)

    p = sub.add_parser("eval", help="AUC/logloss of a checkpoint")
    p.add_argument("checkpoint_dir",
                   help="checkpoint folder of a run (with its job.json)")
    p.add_argument("--data", required=True,
                   help="manifest of converted data (file or folder)")
    p.add_argument("--split", choices=("train", "eval"), default="eval",
                   help="the split to evaluate, every example once")
    _add_checkpoint_flag(p)
    add_progress_flag(p)
    add_json_flag(p)
    p.set_defaults(run=_cmd_eval)

    p = sub.add_parser(
        "predict", help="exported model + raw Parquet rows -> probabilities",
        description=_PREDICT_DESCRIPTION)
    p.add_argument("--model", required=True, metavar="EXPORT_DIR",
                   help=_MODEL_HELP)
    p.add_argument("--data", required=True, nargs="+", metavar="PARQUET",
                   help="Parquet files, or folders of them, read in order")
    _add_predict_flags(p)

    p = sub.add_parser(
        "score", help="the same as predict, with positional arguments",
        description=_PREDICT_DESCRIPTION + " `psrec score EXPORT_DIR INPUT "
        "...` is `psrec predict --model EXPORT_DIR --data INPUT ...`.")
    p.add_argument("model", metavar="export_dir", help=_MODEL_HELP)
    p.add_argument("data", nargs="+", metavar="INPUT",
                   help="Parquet files, or folders of them, read in order")
    _add_predict_flags(p)

    p = sub.add_parser("bench", help="training throughput (examples/s)")
    workload = p.add_argument_group("model")
    add_model_flag(workload)
    add_batch_flag(workload, "global batch size (rows per step)")
    workload.add_argument("--buckets", type=positive, default=100_000,
                          help="hash buckets per synthetic table")
    workload.add_argument("--dim", type=positive, default=16,
                          help="embedding dimension")
    cluster = p.add_argument_group("cluster")
    add_count_flags(cluster)
    cluster.add_argument("--single-process", action="store_true",
                         help="no cluster: train in this process (baseline)")
    add_step_flags(p.add_argument_group("schedule"), steps=300)
    add_json_flag(p.add_argument_group("output"))
    p.set_defaults(run=_cmd_bench)
