"""What runs the ``psrec`` commands that use or time a model outside a
training job: ``export``, ``eval``, ``predict`` (and ``score``) and
``bench`` -- all TensorFlow (their parsers: :mod:`psrec.launch.cli.model`).
"""

from __future__ import annotations

import argparse
import os
import sys

from psrec.data.format.manifest import Manifest
from psrec.errors import EXIT_OK
from psrec.launch.cli.bundle_run import bundle_lines
from psrec.launch.cli.model import breakdown_of
from psrec.launch.cli.model import keep_columns
from psrec.launch.cli.support import print_result
from psrec.launch.job import bench
from psrec.launch.job.config import BenchConfig
from psrec.launch.job.config import JobConfig
from psrec.launch.job.data import training_neg_sample_rate
from psrec.launch.job.export import evaluate_checkpoint
from psrec.launch.job.export import export_checkpoint
from psrec.launch.job.export import sampling_note
from psrec.launch.job.plots import write_plots
from psrec.launch.monitor.progress_bar import progress_for
from psrec.models.serving.config import ExportConfig
from psrec.models.serving.scoring import score_files
from psrec.options import option_values
from psrec.ps_cluster.checkpoint.best import choose_checkpoint


def run_export(args: argparse.Namespace) -> int:
    JobConfig.read(args.checkpoint_dir)  # a run's folder, or one line
    chosen = choose_checkpoint(args.checkpoint_dir, args.checkpoint)
    config = option_values(args, ExportConfig)
    report = export_checkpoint(args.checkpoint_dir, args.out,
                               args.checkpoint, version=args.version,
                               config=config)
    rate = training_neg_sample_rate(args.checkpoint_dir)
    result = {"saved_model": report.path, **_chosen_dict(chosen),
              "version": report.version, "root": report.root,
              "neg_sample_rate": rate, "warmup": report.warmup,
              "table_dtype": config.table_dtype}
    head = (f"{report.path} (version {report.version}): "
            f"{chosen.describe()}{sampling_note(rate)}")
    if report.bundle is not None:
        print_result(args, {**result, "split": report.bundle},
                     f"{head}\n{bundle_lines(report.bundle)}")
        return EXIT_OK
    print_result(args, result,
                 f"{head}{_table_note(config)}\n"
                 f"warmup requests: {report.warmup}")
    return EXIT_OK


def _table_note(config: ExportConfig) -> str:
    """What the CLI says about the tables' storage ("" for float32)."""
    if config.table_dtype == "float32":
        return ""
    return f"; tables stored as {config.table_dtype}"


def _chosen_dict(chosen) -> dict:
    best = chosen.best
    return {"checkpoint": chosen.name, "step": chosen.step,
            "eval_auc": best.auc if best else None,
            "eval_logloss": best.logloss if best else None}


def run_eval(args: argparse.Namespace) -> int:
    manifest = Manifest.load(args.data)
    JobConfig.read(args.checkpoint_dir)  # a run's folder, or one line
    chosen = choose_checkpoint(args.checkpoint_dir, args.checkpoint)
    result = evaluate_checkpoint(args.checkpoint_dir, manifest,
                                 split=args.split,
                                 checkpoint=args.checkpoint,
                                 progress=progress_for(args),
                                 curves=args.plots,
                                 breakdown=breakdown_of(args),
                                 exclude_seen=not args.no_exclude_seen)
    plots = None
    if args.plots:
        result, curves = result
        plots = write_plots(curves, args.checkpoint_dir, chosen.name,
                            args.split, chosen.step)
    rate = training_neg_sample_rate(args.checkpoint_dir)
    print_result(args, {"split": args.split, "checkpoint": chosen.name,
                        "step": chosen.step, **result.to_dict(),
                        "neg_sample_rate": rate,
                        **({"plots": plots.to_dict()} if plots else {})},
                 f"{chosen.name} (step {chosen.step}) {result.summary()}"
                 f"{sampling_note(rate)}{_popularity_line(result)}"
                 + (f"\n{plots.summary()}" if plots else ""))
    return EXIT_OK


def _popularity_line(result) -> str:
    """The line saying a retrieval model does not beat the popularity
    baseline (empty otherwise)."""
    note = getattr(result, "popularity_note", lambda: None)()
    return f"\nnote: {note}" if note else ""


def run_predict(args: argparse.Namespace) -> int:
    """``psrec predict`` and its older spelling ``psrec score``."""
    keep = keep_columns(args)
    report = score_files(args.model, args.data, args.out,
                         batch_rows=args.batch_rows, label=args.label,
                         keep=keep, progress=progress_for(args),
                         progress_label=args.command)
    print_result(args, report)
    return EXIT_OK


def run_bench(args: argparse.Namespace) -> int:
    result = bench.run_bench(option_values(
        args, BenchConfig, model=args.model, workers=args.workers,
        ps=args.ps, batch_size=args.batch_size,
        steps_per_closure=args.steps_per_closure))
    print_result(args, result,
                 "\n".join(f"{k}: {v}" for k, v in result.items()))
    # In-process gRPC servers cannot be shut down; leave without waiting.
    sys.stdout.flush()
    os._exit(EXIT_OK)
