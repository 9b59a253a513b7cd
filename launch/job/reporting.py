"""The coordinator's progress reporter of a run: TensorBoard folder,
learning rates, per-worker throughput, the run's hyper-parameters, and the
heartbeat fields the metrics server reads (loss, last eval)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any
from typing import Callable

import numpy as np

from psrec.data.format.files import write_json_atomic
from psrec.launch.job import runtime as job_runtime
from psrec.launch.monitor.progress import ProgressReporter
from psrec.ps_cluster.training.coverage import WARN_BELOW
from psrec.ps_cluster.training.coverage import coverage_warning
from psrec.ps_cluster.training.data_service import service_options
from psrec.uri_path import as_path


def run_hparams(config, trainer) -> dict[str, Any]:
    """The hyper-parameters shown in TensorBoard's HParams dashboard: what
    distinguishes one run of a sweep from another."""
    optimizer, partition = config.optimizer, config.partition
    return {
        "model": config.model_name, "spec": config.spec.name,
        "strategy": config.strategy.kind,
        "batch_size": config.input.batch_size,
        "grad_accum_steps": config.strategy.grad_accum_steps,
        "mixed_precision": bool(config.strategy.mixed_precision),
        "sparse_optimizer": optimizer.sparse,
        "dense_optimizer": optimizer.dense,
        "sparse_lr": float(optimizer.sparse_lr),
        "dense_lr": float(optimizer.dense_lr),
        "base_batch_size": optimizer.base_batch_size,
        "warmup_steps": optimizer.warmup_steps,
        "steps": config.loop.steps or 0,  # 0: --follow, per partition
        "steps_per_closure": config.loop.steps_per_closure,
        "workers": trainer.num_workers,
        "partitioner": partition.kind,
        "table_shards": partition.shards or 0,
        "input_mode": str(config.input.mode), "seed": config.input.seed}


def make_reporter(config, trainer, heartbeat=None,
                  extra: Callable[[], str] | None = None):
    """The chief's :class:`ProgressReporter` (None elsewhere), its loss
    and evals also published in ``heartbeat``."""
    if not trainer.chief:
        return None
    step = int(trainer.progress.step.numpy())
    reporter = ProgressReporter(  # --follow sets each partition's end
        config.loop.steps or step, step,
        as_path(config.workdir) / "tensorboard",
        learning_rates={
            "sparse": trainer.sparse_optimizer.learning_rate,
            "dense": trainer.dense_optimizer.learning_rate},
        log_every=config.loop.log_every, extra=extra,
        per_worker=((lambda: _examples_per_worker(trainer))
                    if trainer.is_ps else None),
        hparams=run_hparams(config, trainer))
    job_runtime.attach_reporter(heartbeat, reporter)
    return reporter


def _examples_per_worker(trainer) -> dict[int, int]:
    executor = trainer.executor
    return dict(executor.examples_per_pipeline) if executor else {}


def write_restore_report(workdir: str | Path, trainer, path: str) -> None:
    """``restore.json``: sha256 of every restored table, so a restore can be
    audited against the checkpoint file independently."""
    tables = {}
    for name, variable in trainer.model.sparse_arch.tables.items():
        shards = getattr(variable, "variables", [variable])
        values = np.concatenate([s.numpy() for s in shards], axis=0)
        tables[name] = hashlib.sha256(values.tobytes()).hexdigest()
    report = {"checkpoint": path, "step": int(trainer.progress.step.numpy()),
              "table_sha256": tables}
    write_json_atomic(as_path(workdir) / "restore.json", report)


def input_options(config, trainer, manifest) -> dict:
    """``make_train_dataset_fn`` options of the job's ``--input-mode``
    (the tf.data service address, its job name, the first epoch)."""
    return service_options(
        config.input.mode, config.data_service,
        int(trainer.progress.resumes.numpy()),
        int(trainer.progress.step.numpy()),
        config.input.batch_size * trainer.micro_batches,
        manifest.rows("train"))


def coverage_fields(result, mode: str, log=print) -> dict:
    """``coverage`` and ``coverage_warning`` of the job summary (the
    warning is also logged)."""
    warning = coverage_warning(list(result.coverage), mode)
    if warning:
        log(f"psrec: warning: {warning}")
    return {"coverage": [c.to_dict() for c in result.coverage],
            "coverage_warning": warning, "input_mode": mode}


def coverage_lines(summary) -> list[str]:
    """The summary's coverage lines: how many epochs, then one line per
    epoch that finished below :data:`WARN_BELOW` of the train rows or saw
    rows twice, then the warning (every epoch: ``summary.json``)."""
    if not summary.coverage:
        return []
    short = [c for c in summary.coverage
             if c["finished"] and c["fraction"] < WARN_BELOW]
    # Without a warning, the finished epochs' missing rows are no more than
    # the input holds read ahead when a run stops: untrained, not lost.
    held = sum(c["rows"] - c["seen"] for c in short
               ) if not summary.coverage_warning else 0
    listed = [c for c in summary.coverage
              if c["repeats"] or (c in short and not held)]
    judged = sum(c["finished"] for c in summary.coverage)
    head = (f"  input:       --input-mode {summary.input_mode}; "
            f"{len(summary.coverage)} epoch(s) this coordinator session, "
            f"{judged} finished")
    if held:
        head += (f", {held:,} of their rows still read ahead in the input "
                 f"when the run stopped (it holds up to "
                 f"{short[0]['read_ahead']:,}): untrained, not lost")
    if not listed:
        once = "" if held else (f", each saw >= {100 * WARN_BELOW:.0f}% of "
                                "the train rows once")
        return [f"{head}{once} (per epoch: summary.json)"]
    lines = [f"{head}; below {100 * WARN_BELOW:.0f}% of the train rows or "
             "with rows seen twice:"]
    for c in listed:
        text = (f"    epoch {c['epoch']}: {c['seen']} of {c['rows']} train "
                f"rows seen ({100 * c['fraction']:.2f}%)")
        if c["repeats"]:
            text += f", {c['repeats']} seen twice or more"
        if not c["finished"]:
            text += " (not judged: in progress when the run stopped)"
        lines.append(text)
    if summary.coverage_warning:
        lines.append(f"  WARNING: {summary.coverage_warning}")
    return lines
