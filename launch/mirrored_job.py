"""``psrec train --strategy mirrored|multi-worker-mirrored``: the typed job.

``run_mirrored_job`` is to the mirrored strategies what ``launch.job.run_job``
is to the PS path: same :class:`launch.job.JobConfig`, same data
preparation, same ``job.json`` and the same export (the plain model rebuilt
from the checkpoint, so the serving signature is the PS path's), plus
:class:`MirroredOptions`.

* ``mirrored``: one process, ``MirroredStrategy`` over the local GPUs (or
  the CPU, optionally split into ``cpu_replicas`` logical devices).
* ``multi-worker-mirrored`` with ``TF_CONFIG`` naming this task: this
  process is one worker (every worker runs the same command); the chief
  writes checkpoints, job.json, the export and summary.json.
* ``multi-worker-mirrored`` without ``TF_CONFIG``: a local launcher prepares
  the data once, starts ``config.workers`` worker processes on 127.0.0.1
  (``python -m launch.mirrored_job CONFIG``, each with its own TF_CONFIG),
  waits for them with a timeout, stops them by pid whatever happens, then
  exports and evaluates the chief's checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from psrec.data.dataset import InputConfig
from psrec.data.dataset import make_train_dataset_fn
from psrec.data.manifest import Manifest
from psrec.errors import DataError
from psrec.features.spec import FeatureSpec
from psrec.launch.job import JobConfig
from psrec.launch.job import SyntheticData
from psrec.launch.job import prepare_data
from psrec.launch.job import summary_dict
from psrec.launch.job import summary_lines
from psrec.launch.jobfile import JobRecord
from psrec.launch.local import die_with_parent
from psrec.launch.local import tail_log
from psrec.models.config import ModelConfig
from psrec.models.optim import OptimizerConfig
from psrec.ps_cluster.metrics import EvalResult
from psrec.ps_cluster.mirrored import COLLECTIVES
from psrec.ps_cluster.mirrored import STRATEGIES
from psrec.ps_cluster.mirrored import MirroredConfigError
from psrec.ps_cluster.spec import ClusterSpec
from psrec.ps_cluster.spec import TaskInfo
from psrec.ps_cluster.spec import TFConfig
from psrec.ps_cluster.spec import free_loopback_ports
from psrec.ps_cluster.train_loop import LoopConfig
from psrec.runtime import role_environment

RESULT_FILE = "mirrored-result.json"


class WorkerFailedError(DataError):
    """A local multi-worker-mirrored worker exited with an error or hung."""


@dataclasses.dataclass(frozen=True)
class MirroredOptions:
    """The mirrored-path options of ``psrec train``.

    Attributes:
      strategy: ``mirrored`` or ``multi-worker-mirrored``.
      collective: ``auto``, ``ring`` or ``nccl`` (all-reduce implementation).
      sync_batch_norm: synchronized batch norm in the MLP towers.
      mixed_precision: ``mixed_float16`` on GPU, ``mixed_bfloat16`` on CPU.
      grad_accum_steps: micro-batches per optimizer update.
      memory_fraction: size-guard budget (share of one device's memory).
      cpu_replicas: split the CPU into this many logical devices
        (``mirrored`` on a machine without GPUs; must precede any other
        TensorFlow call of the process).
      allow_remote: accept non-loopback hosts in TF_CONFIG.
      worker_timeout: seconds the local launcher waits for its workers.
    """

    strategy: str = "mirrored"
    collective: str = "auto"
    sync_batch_norm: bool = False
    mixed_precision: bool = False
    grad_accum_steps: int = 1
    memory_fraction: float = 0.5
    cpu_replicas: int | None = None
    allow_remote: bool = False
    worker_timeout: float = 1800.0

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise MirroredConfigError(
                f"`--strategy` = {self.strategy!r} is not one of "
                f"{', '.join(STRATEGIES)}.")
        if self.collective not in COLLECTIVES:
            raise MirroredConfigError(
                f"`--collective` = {self.collective!r} is not one of "
                f"{', '.join(COLLECTIVES)}.")
        if self.grad_accum_steps < 1:
            raise MirroredConfigError(
                f"`--grad-accum-steps` = {self.grad_accum_steps!r} must be "
                ">= 1.")
        if not 0.0 < self.memory_fraction <= 1.0:
            raise MirroredConfigError(
                f"`--memory-fraction` = {self.memory_fraction!r} must be in "
                "(0, 1].")
        if self.cpu_replicas is not None and self.cpu_replicas < 1:
            raise MirroredConfigError(
                f"`--cpu-replicas` = {self.cpu_replicas!r} must be >= 1.")
        if self.worker_timeout <= 0:
            raise MirroredConfigError(
                f"`worker_timeout` = {self.worker_timeout!r} must be > 0.")


@dataclasses.dataclass(frozen=True)
class MirroredJobSummary:
    """What ``psrec train --strategy mirrored|multi-worker-mirrored`` prints."""

    strategy: str
    manifest: str
    checkpoint: str | None
    export: str | None
    tensorboard: str
    start_step: int
    step: int
    replicas: int
    workers: int
    global_batch_size: int
    grad_accum_steps: int
    precision: str
    examples_per_sec: float
    final_loss: float
    eval: EvalResult | None
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return summary_dict(self)

    def text(self) -> str:
        return summary_lines(f"psrec train ({self.strategy}) summary:", self, [
            f"  steps {self.start_step} -> {self.step}, final train loss "
            f"{self.final_loss:.4f}, {self.examples_per_sec:,.0f} examples/s",
            f"  {self.replicas} replica(s) on {self.workers} worker(s), "
            f"global batch {self.global_batch_size} x "
            f"{self.grad_accum_steps} micro-batch(es), {self.precision}",
            f"  total time {self.seconds:.1f} s"])


def effective_model(config: JobConfig, options: MirroredOptions
                    ) -> ModelConfig:
    """The job's model with ``--sync-batch-norm`` applied."""
    model = config.model_config
    if options.sync_batch_norm:
        model = dataclasses.replace(model, batch_norm="sync")
    return model


# -- (de)serialising a job for worker processes --------------------------------


_NESTED = {"spec": FeatureSpec.from_dict, "model": lambda d: ModelConfig(**d),
           "optimizer": lambda d: OptimizerConfig(**d),
           "input": lambda d: InputConfig(**d),
           "loop": lambda d: LoopConfig(**d),
           "synthetic": lambda d: SyntheticData(**d)}


def job_to_dict(config: JobConfig, options: MirroredOptions,
                model: ModelConfig) -> dict[str, Any]:
    """The JSON a local worker process rebuilds its job from: the nested
    configurations, paths, and every plain (JSON) field of the job."""
    data: dict[str, Any] = {"options": dataclasses.asdict(options)}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name == "model":
            data["model"] = dataclasses.asdict(model)
        elif field.name == "spec":
            data["spec"] = value.to_dict()
        elif field.name in _NESTED:
            data[field.name] = dataclasses.asdict(value)
        elif isinstance(value, Path):
            data[field.name] = str(value)
        elif value is None or isinstance(value, (bool, int, float, str)):
            data[field.name] = value
    return data


def job_from_dict(data: dict[str, Any]) -> tuple[JobConfig, MirroredOptions]:
    """Inverse of :func:`job_to_dict` (other job fields keep defaults)."""
    names = {f.name for f in dataclasses.fields(JobConfig)}
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        if name not in names:
            continue
        if name in _NESTED:
            kwargs[name] = _NESTED[name](value)
        elif name in ("workdir", "data"):
            kwargs[name] = Path(value) if value is not None else None
        else:
            kwargs[name] = value
    return JobConfig(**kwargs), MirroredOptions(**data["options"])


# -- training in this process ---------------------------------------------------


def _train_here(config: JobConfig, options: MirroredOptions, strategy,
                manifest: Manifest, log) -> tuple[Any, Any]:
    """Builds the trainer (size guard first), resumes, trains."""
    from psrec.launch.progress import ProgressReporter
    from psrec.ps_cluster.mirrored import MirroredTrainer
    from psrec.ps_cluster.mirrored import mixed_precision_policy
    trainer = MirroredTrainer(
        strategy, config.spec, effective_model(config, options),
        config.optimizer, config.input,
        grad_accum_steps=options.grad_accum_steps,
        precision=mixed_precision_policy(options.mixed_precision),
        checkpoint_dir=config.checkpoint_dir,
        memory_fraction=options.memory_fraction,
        keep_checkpoints=getattr(config, "keep_checkpoints", 3))
    restored = trainer.restore()
    if restored:
        log(f"resumed from {restored} at step "
            f"{int(trainer.progress.step.numpy())}")
    resumes = int(trainer.progress.resumes.numpy())
    dataset_fn = make_train_dataset_fn(
        manifest, config.spec, dataclasses.replace(
            config.input, seed=config.input.seed + 7919 * resumes))
    reporter = None
    if trainer.chief:
        reporter = ProgressReporter(
            config.loop.steps, int(trainer.progress.step.numpy()),
            Path(config.workdir) / "tensorboard",
            learning_rates={
                "sparse": trainer.sparse_optimizer.learning_rate,
                "dense": trainer.dense_optimizer.learning_rate},
            log_every=config.loop.log_every)
    try:
        result = trainer.train(
            dataset_fn, config.loop,
            on_progress=reporter.update if reporter else None)
    finally:
        if reporter is not None:
            reporter.close()
    return trainer, result


def _finish(config: JobConfig, options: MirroredOptions, manifest: Manifest,
            checkpoint: str | None, result: dict[str, Any], workers: int,
            began: float, log) -> MirroredJobSummary:
    """Export, evaluation and summary.json (the chief's or launcher's)."""
    from psrec.launch.exporting import evaluate_checkpoint
    from psrec.launch.exporting import export_checkpoint
    workdir = Path(config.workdir)
    export_path = eval_result = None
    if checkpoint is not None:
        if config.export:
            export_path = str(export_checkpoint(config.checkpoint_dir,
                                                workdir / "export"))
        if manifest.files("eval"):
            eval_result = evaluate_checkpoint(config.checkpoint_dir,
                                              manifest)
            log(eval_result.summary())
    summary = MirroredJobSummary(
        strategy=options.strategy,
        manifest=str(manifest.root / "manifest.json"), checkpoint=checkpoint,
        export=export_path, tensorboard=str(workdir / "tensorboard"),
        workers=workers, eval=eval_result,
        seconds=time.perf_counter() - began, **result)
    (workdir / "summary.json").write_text(
        json.dumps(summary.to_dict(), indent=2) + "\n")
    return summary


def _result_fields(result, options: MirroredOptions, precision: str
                   ) -> dict[str, Any]:
    return {"start_step": result.start_step, "step": result.step,
            "replicas": result.replicas,
            "global_batch_size": result.global_batch_size,
            "grad_accum_steps": options.grad_accum_steps,
            "precision": precision,
            "examples_per_sec": result.examples_per_sec,
            "final_loss": result.final_loss}


def _record(config: JobConfig, options: MirroredOptions,
            manifest: Manifest) -> None:
    JobRecord(spec=config.spec, model_name=config.model_name,
              model=effective_model(config, options),
              batch_size=config.input.batch_size,
              manifest=str(manifest.root)).write(config.checkpoint_dir)


def run_mirrored(config: JobConfig, options: MirroredOptions,
                 log=print) -> MirroredJobSummary:
    """``--strategy mirrored``: one process, all local devices."""
    from psrec.ps_cluster.mirrored import build_strategy
    from psrec.ps_cluster.mirrored import split_cpu
    began = time.perf_counter()
    if options.cpu_replicas:
        split_cpu(options.cpu_replicas)
    strategy = build_strategy("mirrored", options.collective)
    log(f"MirroredStrategy over {strategy.num_replicas_in_sync} replica(s): "
        f"{', '.join(strategy.extended.worker_devices)}")
    _guard(config, options, strategy)
    manifest = prepare_data(dataclasses.replace(config, workers=1), log)
    _record(config, options, manifest)
    trainer, result = _train_here(config, options, strategy, manifest, log)
    return _finish(config, options, manifest, result.checkpoint,
                   _result_fields(result, options, trainer.precision), 1,
                   began, log)


def _guard(config: JobConfig, options: MirroredOptions, strategy) -> None:
    """The size guard, before any data is generated or model built."""
    from psrec.models.sizing import check_fits
    from psrec.models.sizing import device_memory_bytes
    from psrec.models.sizing import estimate_replicated_bytes
    from psrec.ps_cluster.mirrored import local_replicas_sharing_memory
    check_fits(estimate_replicated_bytes(
        config.spec, effective_model(config, options), config.optimizer),
        device_memory_bytes(), options.memory_fraction,
        local_replicas_sharing_memory(strategy))


def run_worker(config: JobConfig, options: MirroredOptions,
               tf_config: TFConfig, log=print, *, finish: bool = True
               ) -> MirroredJobSummary | None:
    """One multi-worker-mirrored worker (TF_CONFIG names its task).

    The strategy is created first, as MultiWorkerMirroredStrategy requires.
    The chief writes job.json, the checkpoints and :data:`RESULT_FILE`;
    with ``finish`` it also exports, evaluates and writes summary.json (the
    local launcher does that itself). Returns the summary on the chief when
    ``finish``, else None.

    Raises:
      MirroredConfigError: no ``--data`` (workers must not each generate
        data; the local launcher prepares it once).
    """
    from psrec.ps_cluster.mirrored import build_strategy
    from psrec.ps_cluster.mirrored import is_chief
    began = time.perf_counter()
    strategy = build_strategy("multi-worker-mirrored", options.collective,
                              tf_config=tf_config,
                              allow_remote=options.allow_remote)
    chief = is_chief(strategy)
    if config.data is None:
        raise MirroredConfigError(
            "`--data` is required for a multi-worker-mirrored worker: convert "
            "the data once (psrec convert) onto storage every worker reads; "
            "without TF_CONFIG, psrec starts local workers and prepares it.")
    manifest = Manifest.load(config.data)
    manifest.verify(config.spec.fingerprint(),
                    checksums=config.verify_checksums)
    if chief:
        _record(config, options, manifest)
    trainer, result = _train_here(config, options, strategy, manifest, log)
    _barrier(strategy)
    fields = _result_fields(result, options, trainer.precision)
    if not chief:
        log(f"{tf_config.task} is not the chief: its "
            f"{trainer.scratch_saves} checkpoint save(s) went to "
            f"{trainer.scratch_dir}, deleted after each "
            f"(exists now: {trainer.scratch_dir.exists()})")
        return None
    (Path(config.workdir) / RESULT_FILE).write_text(json.dumps(
        {"checkpoint": result.checkpoint, **fields}) + "\n")
    if not finish:
        return None
    return _finish(config, options, manifest, result.checkpoint, fields,
                   len(tf_config.cluster.workers)
                   + len(tf_config.cluster.jobs.get("chief", ())), began, log)


def _barrier(strategy) -> None:
    """A last all-reduce: no worker leaves while another still needs it."""
    import tensorflow as tf
    value = strategy.run(tf.function(lambda: tf.constant(1.0)))
    strategy.reduce("SUM", value, axis=None).numpy()


# -- the local launcher ------------------------------------------------------------


def local_worker_cluster(workers: int) -> ClusterSpec:
    """``workers`` worker tasks on free 127.0.0.1 ports (worker 0 is chief),
    validated for multi-worker-mirrored."""
    if workers < 1:
        raise MirroredConfigError(f"`--workers` = {workers!r} must be >= 1.")
    cluster = ClusterSpec({"worker": [f"127.0.0.1:{p}"
                                      for p in free_loopback_ports(workers)]})
    cluster.validate(strategy="multi-worker-mirrored")
    return cluster


def run_local_workers(config: JobConfig, options: MirroredOptions,
                      log=print) -> MirroredJobSummary:
    """Prepares the data, runs ``config.workers`` worker processes on
    loopback, then exports and evaluates the chief's checkpoint.

    Raises:
      WorkerFailedError: a worker exited non-zero or did not finish within
        ``options.worker_timeout`` (the log tail is in the message).
    """
    began = time.perf_counter()
    manifest = prepare_data(config, log)
    workdir = Path(config.workdir)
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (workdir / RESULT_FILE).unlink(missing_ok=True)
    cluster = local_worker_cluster(config.workers)
    worker_config = dataclasses.replace(config, data=manifest.root,
                                        export=False, verify_checksums=False)
    job_file = logs / "mirrored-job.json"
    job_file.write_text(json.dumps(job_to_dict(
        worker_config, options, effective_model(config, options)), indent=2))
    processes: dict[int, subprocess.Popen] = {}
    try:
        for index in range(config.workers):
            env = role_environment()
            env["TF_CONFIG"] = TFConfig(cluster,
                                        TaskInfo("worker", index)).to_json()
            env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
            with open(logs / f"mwms-worker-{index}.log", "ab") as out:
                processes[index] = subprocess.Popen(
                    [sys.executable, "-m", "psrec.launch.mirrored_job",
                     str(job_file)], stdout=out, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env=env,
                    preexec_fn=die_with_parent)
        log(f"local multi-worker-mirrored: {config.workers} workers on "
            f"{', '.join(cluster.workers)} (pids "
            f"{', '.join(str(p.pid) for p in processes.values())})")
        _wait(processes, logs, options.worker_timeout)
    finally:
        _stop(processes)
    result = json.loads((workdir / RESULT_FILE).read_text())
    checkpoint = result.pop("checkpoint")
    return _finish(config, options, manifest, checkpoint, result,
                   config.workers, began, log)


def _wait(processes: dict[int, subprocess.Popen], logs: Path,
          timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = dict(processes)
    while pending:
        for index, process in list(pending.items()):
            code = process.poll()
            if code is None:
                continue
            del pending[index]
            if code != 0:
                raise WorkerFailedError(
                    f"multi-worker-mirrored worker {index} exited with code "
                    f"{code}; log tail:\n"
                    f"{tail_log(logs / f'mwms-worker-{index}.log')}")
        if pending and time.monotonic() > deadline:
            index = min(pending)
            raise WorkerFailedError(
                f"multi-worker-mirrored worker(s) {sorted(pending)} did not "
                f"finish within {timeout:.0f} s; log tail of worker "
                f"{index}:\n{tail_log(logs / f'mwms-worker-{index}.log')}")
        time.sleep(0.2)


def _stop(processes: dict[int, subprocess.Popen], grace: float = 5.0) -> None:
    """Terminates every started worker by pid; kills stragglers."""
    for process in processes.values():
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + grace
    for process in processes.values():
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def run_mirrored_job(config: JobConfig, options: MirroredOptions,
                     log=print) -> MirroredJobSummary | None:
    """The job behind ``psrec train --strategy mirrored|multi-worker-mirrored``.

    Returns None on a non-chief worker of a TF_CONFIG cluster.
    """
    if options.strategy == "mirrored":
        return run_mirrored(config, options, log)
    tf_config = TFConfig.from_env()
    if tf_config is not None and tf_config.task is not None:
        return run_worker(config, options, tf_config, log)
    return run_local_workers(config, options, log)


def _worker_main(job_file: str) -> int:
    """Entry of a local worker process: ``python -m launch.mirrored_job``."""
    config, options = job_from_dict(json.loads(Path(job_file).read_text()))
    tf_config = TFConfig.from_env()
    if tf_config is None or tf_config.task is None:
        raise MirroredConfigError("a local worker needs TF_CONFIG with its "
                                  "task; start it with run_local_workers.")
    run_worker(config, options, tf_config,
               log=lambda text: print(text, flush=True), finish=False)
    return 0


if __name__ == "__main__":
    code = _worker_main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    # MultiWorkerMirroredStrategy's gRPC server cannot be shut down; leave
    # without waiting on it.
    os._exit(code)
