"""The coordinator's progress reporter of a run: TensorBoard folder,
learning rates, per-worker throughput, the run's hyper-parameters, and the
heartbeat fields the metrics server reads (loss, last eval)."""

from __future__ import annotations

from typing import Any
from typing import Callable

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
        "steps": config.loop.steps,
        "steps_per_closure": config.loop.steps_per_closure,
        "workers": trainer.num_workers,
        "partitioner": partition.kind,
        "table_shards": partition.shards or 0,
        "input_mode": str(config.input.mode), "seed": config.input.seed}


def make_reporter(config, trainer, heartbeat=None,
                  extra: Callable[[], str] | None = None):
    """The chief's :class:`ProgressReporter` (None elsewhere), its loss
    and evals also published in ``heartbeat``."""
    from psrec.launch import job_runtime
    from psrec.launch.progress import ProgressReporter
    if not trainer.chief:
        return None
    reporter = ProgressReporter(
        config.loop.steps, int(trainer.progress.step.numpy()),
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
