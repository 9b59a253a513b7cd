"""The main job, for every strategy: data -> strategy -> train (periodic
eval and checkpoints) -> export -> summary.

``run_job`` is the typed function behind ``psrec train``; the CLI only
builds a :class:`~psrec.launch.job.config.JobConfig`. Under ``ps`` it
coordinates the given cluster (or starts a :class:`LocalCluster`); under
the replicated strategies this process trains (one worker of a
multi-worker-mirrored cluster when ``TF_CONFIG`` names it). Everything that
can be checked is checked before any server starts or any model is built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Iterator

from psrec.data.format.files import write_json_atomic
from psrec.data.format.manifest import Manifest
from psrec.errors import one_line
from psrec.launch.job.config import JobConfig
from psrec.launch.job.data import load_verified
from psrec.launch.job.data import prepare_data
from psrec.launch.job.data import record_sampling
from psrec.launch.job.reporting import coverage_fields
from psrec.launch.job.reporting import input_options
from psrec.launch.job.reporting import write_restore_report
from psrec.launch.job.summary import FollowSummary
from psrec.launch.job.summary import JobSummary
from psrec.launch.local.cluster import LocalCluster
from psrec.launch.local.cluster import psrec_command
from psrec.launch.monitor.heartbeat import run_state_dir
from psrec.ps_cluster.cluster.tf_config import ClusterSpec
from psrec.ps_cluster.cluster.tf_config import TFConfig
from psrec.ps_cluster.retrieval.metrics import ranking_auc
from psrec.ps_cluster.training.config import LoopConfig
from psrec.ps_cluster.training.config import can_stop_early
from psrec.ps_cluster.training.loop import steps_for_epochs
from psrec.ps_cluster.training.loop import steps_per_epoch
from psrec.uri_path import as_path
from psrec.uri_path import shown_path


@contextlib.contextmanager
def _ps_cluster(config: JobConfig, cluster: ClusterSpec | None,
                log) -> Iterator[ClusterSpec]:
    if cluster is not None:
        log(f"coordinating existing cluster: {cluster.to_tf_cluster_dict()}")
        yield cluster
        return
    with LocalCluster(config.workers, config.ps,
                      log_dir=run_state_dir(config.workdir) / "logs") as local:
        log(f"local cluster: {config.workers} workers + {config.ps} PS on "
            f"127.0.0.1 (pids {', '.join(map(str, local.pids()))})")
        yield local.cluster


def _on_ps_cluster(config: JobConfig, cluster: ClusterSpec | None, log,
                   train: Callable) -> tuple[Any, int]:
    """``train(strategy, heartbeat, cluster)`` on the job's PS cluster (the
    given one, or a local one), with the coordinator's heartbeat, once
    every task is reachable; returns its result and the PS count."""
    from psrec.launch.job.runtime import coordinator_heartbeat
    from psrec.ps_cluster.cluster.probe import wait_reachable
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    beat = coordinator_heartbeat(run_state_dir(as_path(config.workdir)))
    with _ps_cluster(config, cluster, log) as live:
        wait_reachable(live, config.connect_timeout, log)
        outcome = train(build_ps_strategy(live, config.partition), beat, live)
    return outcome, live.num_ps


def _replicated_strategy(config: JobConfig, log):
    """The strategy of a replicated job (first: MultiWorkerMirrored must be
    created before any other TensorFlow op), with the size guard."""
    from psrec.models.optim.sizing import check_fits
    from psrec.models.optim.sizing import device_memory_bytes
    from psrec.models.optim.sizing import estimate_replicated_bytes
    from psrec.ps_cluster.cluster.strategy import build_replicated_strategy
    from psrec.ps_cluster.cluster.strategy import local_replicas_sharing_memory
    from psrec.ps_cluster.cluster.strategy import split_cpu
    options = config.strategy
    if options.cpu_replicas:
        split_cpu(options.cpu_replicas)
    strategy = build_replicated_strategy(options.kind, options.collective,
                                         allow_remote=options.allow_remote)
    log(f"{type(strategy).__name__} over {strategy.num_replicas_in_sync} "
        f"replica(s): {', '.join(strategy.extended.worker_devices)}")
    check_fits(estimate_replicated_bytes(config.spec, config.model,
                                         config.optimizer),
               device_memory_bytes(), options.memory_fraction,
               local_replicas_sharing_memory(strategy))
    return strategy


def _manifest(config: JobConfig, data_verified: bool, log) -> Manifest:
    if data_verified:
        return load_verified(config)
    if config.strategy.kind == "multi-worker-mirrored" and (
            TFConfig.from_env() is not None):
        if config.data is None:
            from psrec.ps_cluster.cluster.strategy import StrategyError
            raise StrategyError(
                "`--data` is required for a multi-worker-mirrored worker: "
                "convert the data once (psrec convert) onto storage every "
                "worker reads; without TF_CONFIG, psrec starts local "
                "workers and prepares it.")
        manifest = Manifest.load(config.data)
        manifest.verify(config.spec.fingerprint(),
                        checksums=config.verify_checksums)
        return manifest
    return prepare_data(config, log)


def run_job(config: JobConfig, cluster: ClusterSpec | None = None,
            log=print, data_verified: bool = False) -> JobSummary | None:
    """Runs the whole job; resumes from the latest checkpoint if any.

    Args:
      cluster: ``ps``: the cluster to coordinate (None starts a local one).
      data_verified: the data already passed :func:`prepare_data` in this
        workdir (a supervisor or launcher checked it): use the record.

    Returns:
      The summary, or None on a worker of a multi-worker cluster that is
      not the chief.
    """
    began = time.perf_counter()
    strategy = None
    if config.strategy.replicated:
        strategy = _replicated_strategy(config, log)
    if config.follow.active:
        return _run_follow(config, strategy, cluster, log, began)
    manifest = _manifest(config, data_verified, log)
    workdir = as_path(config.workdir)
    if strategy is not None:
        result, trainer = _train(config, strategy, manifest, log)
        if config.strategy.kind == "multi-worker-mirrored":
            _barrier(strategy)  # no worker leaves while another needs it
        if not trainer.chief:
            return None
        num_ps = 0
    else:
        (result, trainer), num_ps = _on_ps_cluster(
            config, cluster, log, lambda strategy, beat, live: _train(
                config, strategy, manifest, log, beat, live))
    export_path, exported = None, None
    # The best checkpoint when the run keeps and recorded one, else the
    # latest: what the export and the plots are of.
    which = "latest" if config.loop.keep_best == "none" else None
    if config.export and result.checkpoint is not None:
        from psrec.launch.job.export import export_checkpoint
        from psrec.ps_cluster.checkpoint.best import choose_checkpoint
        exported = choose_checkpoint(config.checkpoint_dir, which)
        export_path = export_checkpoint(  # workdir/export/<version>
            config.checkpoint_dir, workdir / "export", which,
            manifest=manifest).path
        log(f"exported {exported.describe()} to {shown_path(export_path)}")
    plots = (_plots(config, manifest, which, log)
             if config.plots and result.checkpoint is not None else None)
    if exported is not None and exported.best is not None:
        exported_auc = exported.best.auc
    elif exported is not None and exported.path == result.checkpoint and (
            result.eval is not None):
        exported_auc = ranking_auc(result.eval)
    else:
        exported_auc = None
    per_epoch = epoch_steps(config, manifest)
    summary = JobSummary(
        strategy=config.strategy.kind,
        manifest=str(manifest.root / "manifest.json"),
        checkpoint=result.checkpoint, export=export_path,
        tensorboard=str(workdir / "tensorboard"),
        start_step=result.start_step, step=result.step,
        executed_steps=result.executed_steps,
        examples_per_sec=result.examples_per_sec,
        final_loss=result.final_loss, eval=result.eval,
        seconds=time.perf_counter() - began, workers=trainer.num_workers,
        ps=num_ps,
        replicas=result.replicas, batch_size=config.input.batch_size,
        micro_batches=trainer.micro_batches, precision=trainer.precision,
        closures_per_worker=result.closures_per_worker,
        epochs=result.step / per_epoch, steps_per_epoch=per_epoch,
        best=result.best,
        exported_checkpoint=exported.name if exported else None,
        exported_auc=exported_auc, stopped_early_at=result.stopped_early_at,
        plots=plots,
        **coverage_fields(result, config.input.mode, log))
    write_json_atomic(workdir / "summary.json", summary.to_dict())
    return summary


def _plots(config: JobConfig, manifest: Manifest, which: str | None,
           log) -> str | None:
    """``--plots``: the curves of checkpoint ``which`` (None: the best) on
    the eval split, written as ``psrec eval --plots`` writes them, in one
    more evaluation pass; returns their folder (None without an eval
    split)."""
    if not manifest.shards.get("eval") or manifest.rows("eval") == 0:
        log("--plots: no eval split, so no plots (hold out eval rows with "
            "`psrec convert --eval-fraction 0.1`)")
        return None
    from psrec.launch.job.export import evaluate_checkpoint
    from psrec.launch.job.plots import write_plots
    from psrec.ps_cluster.checkpoint.best import choose_checkpoint
    chosen = choose_checkpoint(config.checkpoint_dir, which)
    _, curves = evaluate_checkpoint(config.checkpoint_dir, manifest,
                                    checkpoint=which, curves=True)
    files = write_plots(curves, config.checkpoint_dir, chosen.name, "eval",
                        chosen.step)
    log(files.summary())
    return files.folder


def _run_follow(config: JobConfig, strategy, cluster: ClusterSpec | None,
                log, began: float) -> JobSummary:
    """``--follow``: the partition loop on the job's strategy (under
    ``ps`` on the given or a local cluster), then its summary."""
    from psrec.launch.job.data import check_output_folders
    check_output_folders(config)
    workdir = as_path(config.workdir)
    if strategy is not None:
        outcome, trainer = _follow(config, strategy, log)
        num_ps = 0
    else:
        (outcome, trainer), num_ps = _on_ps_cluster(
            config, cluster, log, lambda strategy, beat, live: _follow(
                config, strategy, log, beat, live))
    state = outcome.state if outcome is not None else None
    done = state.done if state is not None else ()
    last = done[-1] if done else None
    summary = JobSummary(
        strategy=config.strategy.kind, manifest=str(config.follow.dir),
        checkpoint=(trainer.keeper.latest if trainer is not None
                    and trainer.keeper else None),
        export=outcome.export if outcome is not None else None,
        tensorboard=str(workdir / "tensorboard"),
        start_step=outcome.start_step if outcome else 0,
        step=outcome.step if outcome else 0,
        executed_steps=(outcome.step - outcome.start_step) if outcome else 0,
        examples_per_sec=(outcome.examples / outcome.seconds
                          if outcome and outcome.seconds else 0.0),
        final_loss=outcome.final_loss if outcome else float("nan"),
        eval=None, seconds=time.perf_counter() - began,
        workers=trainer.num_workers if trainer is not None else 0,
        ps=num_ps, replicas=trainer.replicas if trainer is not None else 0,
        batch_size=config.input.batch_size,
        micro_batches=config.strategy.grad_accum_steps,
        precision=trainer.precision if trainer is not None else "float32",
        closures_per_worker={},
        exported_checkpoint=(f"ckpt-{last.end_step}" if last is not None
                             and last.export_version is not None else None),
        partitions=[r.to_dict() for r in done],
        follow=FollowSummary(
            dir=str(config.follow.dir),
            processed=list(outcome.processed) if outcome else [],
            waiting_for=outcome.waiting_for if outcome else None))
    write_json_atomic(workdir / "summary.json", summary.to_dict())
    return summary


def _follow(config: JobConfig, strategy, log, heartbeat=None,
            cluster: ClusterSpec | None = None):
    """Builds the trainer from the first ready partition, resumes (or
    warm-starts) and runs the partition loop with the heartbeat, the stall
    watchdog and a graceful SIGTERM. Returns ``(FollowResult, trainer)``,
    ``(None, None)`` when ``--once`` finds no partition at all."""
    from psrec.launch.job import runtime as job_runtime
    from psrec.launch.job.follow import Follower
    from psrec.launch.job.follow import first_ready
    from psrec.launch.job.reporting import make_reporter
    from psrec.ps_cluster.training.watchdog import Watchdog
    trainer = reporter = watchdog = None
    if config.stall_timeout:
        watchdog = Watchdog(config.stall_timeout, lambda: (
            trainer.describe_pending() if trainer is not None
            else "waiting for the first partition"))
        watchdog.start()
    try:
        with job_runtime.StopRequest(config.grace_period) as stop:
            beat = job_runtime.beat_all(heartbeat, watchdog)
            manifest = first_ready(config, log, beat, stop.requested)
            if manifest is None:
                if stop.requested():
                    raise stop.error(0, None, False)
                log(f"follow: no partition is ready in {config.follow.dir} "
                    "(--once): nothing to do")
                return None, None
            manifest.verify(config.spec.fingerprint(), checksums=False)
            trainer = _make_trainer(config, strategy, manifest)
            _restore(config, trainer, manifest, log, heartbeat, cluster)
            reporter = make_reporter(config, trainer, heartbeat, extra=(
                (lambda: _per_worker(trainer)) if trainer.is_ps else None))
            follower = Follower(
                config, trainer, log,
                lambda data: translated_errors(data, cluster), heartbeat,
                reporter, watchdog)
            return follower.run(stop), trainer
    finally:
        if watchdog is not None:
            watchdog.stop()
        if reporter is not None:
            reporter.close()


# The job processes psrec's launchers start: the coordinator of a supervised
# local cluster, the workers of a local multi-worker-mirrored run. Each is
# handed its job as a job.json file (the one codec of a JobConfig) and runs
# it with the data already checked by its launcher; the module's command
# line is all it reads (no flags of `psrec train`, no environment variable).
JOB_PROCESS = "psrec.launch.cli.job_process"
JOB_ROLES = ("coordinator", "worker")


def job_process_command(config: JobConfig, role: str, folder: Path,
                        *options: str) -> list[str]:
    """Writes ``config`` to ``folder/job.json`` and returns the command of
    a process that runs it as ``role`` (:data:`JOB_ROLES`): ``python -P -m
    psrec.launch.cli.job_process ROLE FOLDER/job.json OPTIONS`` (options:
    ``--json``; the supervisor appends ``--cluster FILE``). Only for a job
    whose data the caller checked and recorded
    (:func:`psrec.launch.job.data.record_verified`)."""
    if role not in JOB_ROLES:
        raise ValueError(f"job process role {role!r}: one of {JOB_ROLES}")
    return psrec_command(JOB_PROCESS, role, str(config.write(folder)),
                         *options)


def epoch_steps(config: JobConfig, manifest: Manifest) -> int:
    """Steps of one epoch: the train split's rows over the rows of one
    step, ``batch_size * grad_accum_steps`` -- under ``ps`` a step is one
    worker's batch (the workers share the step count), under the replicated
    strategies ``batch_size`` is the global batch."""
    return steps_per_epoch(manifest.rows("train"), config.input.batch_size
                           * config.strategy.grad_accum_steps)


def resolve_loop(config: JobConfig, manifest: Manifest) -> LoopConfig:
    """The job's loop with ``--epochs`` converted to steps, ``steps`` None
    sized from the data (:meth:`LoopConfig.sized`: early stopping where
    there is an eval split, a metric to watch and a strategy that stops
    early) and the default evaluation interval (about 5 per run) made a
    step count."""
    loop = config.loop
    per_epoch = epoch_steps(config, manifest)
    if config.epochs is not None:
        loop = dataclasses.replace(loop, steps=steps_for_epochs(
            config.epochs, per_epoch))
    is_ps = config.strategy.kind == "ps"
    # --workers counts worker tasks under ps and multi-worker-mirrored only
    workers = config.workers if is_ps or (
        config.strategy.kind == "multi-worker-mirrored") else 1
    early_stop = (manifest.rows("eval") > 0 and loop.keep_best != "none"
                  and can_stop_early(is_ps, workers))
    return loop.sized(per_epoch, early_stop=early_stop,
                      workers=workers if is_ps else 1,
                      all_epochs=config.retrieval is not None).resolved()


def _make_trainer(config: JobConfig, strategy, manifest: Manifest):
    """The trainer of the job's task (its base rate and sampling from
    ``manifest``)."""
    from psrec.data.convert.catalogue import Catalogue
    from psrec.ps_cluster.cluster.strategy import precision_policy
    from psrec.ps_cluster.retrieval.trainer import RetrievalTrainer
    from psrec.ps_cluster.training.trainer import Trainer
    precision = precision_policy(config.strategy.mixed_precision)
    common = dict(micro_batches=config.strategy.grad_accum_steps,
                  precision=precision, checkpoint_dir=config.checkpoint_dir,
                  keep_checkpoints=config.keep_checkpoints,
                  checkpoint_writers=config.checkpoint_writers,
                  track_changes=config.loop.delta_every > 0)
    if config.retrieval is not None:
        trainer = RetrievalTrainer(
            strategy, config.spec, config.retrieval, config.optimizer,
            config.input, catalogue=Catalogue.load(manifest.root,
                                                   config.spec), **common)
    else:
        trainer = Trainer(
            strategy, config.spec, config.model, config.optimizer,
            config.input, positive_rate=_base_rate(manifest),
            neg_sample_rate=manifest.neg_sample_rate, **common)
    return trainer


def _restore(config: JobConfig, trainer, manifest: Manifest, log,
             heartbeat=None, cluster: ClusterSpec | None = None) -> None:
    """Records the job beside the checkpoints (chief), then resumes the
    latest checkpoint, or warm-starts a new workdir from
    ``config.warm_start``."""
    from psrec.launch.job import runtime as job_runtime
    if trainer.chief:
        config.write(config.checkpoint_dir)
        record_sampling(config.checkpoint_dir, manifest, log)
    if heartbeat is not None:  # phase restoring, with per-worker progress
        job_runtime.attach_trainer(heartbeat, trainer)
    with translated_errors(manifest, cluster):
        restored = trainer.restore()
    if restored:
        log(f"resumed from {shown_path(restored)} at step "
            f"{int(trainer.progress.step.numpy())} (restore verified against "
            "the checkpoint's values)")
        if trainer.chief:
            write_restore_report(config.workdir, trainer, restored)
    elif config.warm_start is not None:  # a new workdir: from the source
        _warm_start(config, trainer, manifest, cluster, log)


def _train(config: JobConfig, strategy, manifest: Manifest, log,
           heartbeat=None, cluster: ClusterSpec | None = None):
    """Builds the trainer, resumes, trains with progress, eval, checkpoints
    (the best one kept), the heartbeat, the stall watchdog and a graceful
    SIGTERM. Returns ``(result, trainer)``."""
    from psrec.launch.job import runtime as job_runtime
    from psrec.launch.job.reporting import make_reporter
    from psrec.ps_cluster.training.step import NonFiniteLossError
    from psrec.ps_cluster.training.watchdog import Watchdog
    trainer = _make_trainer(config, strategy, manifest)
    requested = config.loop
    config = dataclasses.replace(config, loop=resolve_loop(config, manifest))
    if config.epochs is not None or requested.steps is None:
        how = (f"--epochs {config.epochs:g}" if config.epochs is not None
               else "steps sized from the data (--steps or --epochs to "
               "choose)")
        log(f"{how}: {config.loop.steps} steps of "
            f"{config.input.batch_size * trainer.micro_batches} rows over "
            f"{manifest.rows('train'):,} train rows"
            + (f", stopping early after {config.loop.early_stop_patience} "
               "evaluations without improvement"
               if config.loop.early_stop_patience
               and not requested.early_stop_patience else ""))
    _restore(config, trainer, manifest, log, heartbeat, cluster)
    reporter = make_reporter(config, trainer, heartbeat, extra=(
        (lambda: _per_worker(trainer)) if trainer.is_ps else None))
    watchdog = None
    if config.stall_timeout:
        watchdog = Watchdog(config.stall_timeout, trainer.describe_pending)
        watchdog.start()
    try:
        with translated_errors(manifest, cluster), job_runtime.StopRequest(
                config.grace_period) as stop:
            result = trainer.train(
                trainer.dataset_fn(manifest, **input_options(
                    config, trainer, manifest)), config.loop,
                eval_manifest=manifest,
                on_progress=reporter.update if reporter else None,
                on_boundary=reporter.boundary if reporter else None,
                heartbeat=job_runtime.beat_all(heartbeat, watchdog),
                on_best=reporter.best if reporter else None,
                should_stop=stop.requested, save_on_stop=stop.save_fits)
        job_runtime.finish(heartbeat, stop, trainer, result.interrupted_at)
    except NonFiniteLossError as error:  # name the last good checkpoint
        raise error.with_checkpoint(
            trainer.keeper.latest if trainer.keeper else None) from None
    finally:
        if watchdog is not None:
            watchdog.stop()
        if reporter is not None:
            reporter.close()
    if trainer.is_ps:
        log(f"closures finished per worker: {_per_worker(trainer)}")
    if result.stopped_early_at is not None:
        log(f"early stopping at step {result.stopped_early_at}: "
            f"{config.loop.early_stop_patience} evaluation(s) without "
            f"improvement of {config.loop.keep_best}; best: "
            f"{result.best.summary() if result.best else None}")
    return result, trainer


def _warm_start(config: JobConfig, trainer, manifest: Manifest,
                cluster: ClusterSpec | None, log) -> None:
    """Fills the fresh trainer from ``config.warm_start`` (checked again
    here: the coordinator may run long after the CLI did) and logs one line
    per feature not carried as-is and the summary."""
    from psrec.launch.job.warm_start import check_source
    source = check_source(config, str(config.warm_start))
    with translated_errors(manifest, cluster):
        result = trainer.warm_start(source.prefix, source.plan,
                                    reset_optimizer=config.reset_optimizer)
    for line in result.lines:
        log(line)
    log(result.summary + " (verified against the checkpoint's values; "
        "step counter starts at 0)")


def _barrier(strategy) -> None:
    """A last all-reduce over every worker."""
    import tensorflow as tf
    value = strategy.run(tf.function(lambda: tf.constant(1.0)))
    strategy.reduce("SUM", value, axis=None).numpy()


def _per_worker(trainer) -> str:
    executor = trainer.executor
    counts = (dict(sorted(executor.closures_per_pipeline.items()))
              if executor else {})
    return "workers " + str(counts)


def _base_rate(manifest: Manifest) -> float | None:
    """The train split's positive rate, strictly inside (0, 1), if the
    manifest records it (older manifests do not)."""
    rate = manifest.positive_rate("train")
    return rate if rate is not None and 0.0 < rate < 1.0 else None


@contextlib.contextmanager
def translated_errors(manifest: Manifest, cluster: ClusterSpec | None = None
                      ) -> Iterator[None]:
    """TF errors from the cluster -> psrec errors with exit codes: a lost
    task is retryable (named after probing each task), a corrupted record
    names its file."""
    import tensorflow as tf

    from psrec.data.format.records import corruption_named
    from psrec.ps_cluster.cluster.probe import ClusterUnavailableError
    from psrec.ps_cluster.cluster.probe import lost_task_message
    try:
        with corruption_named(manifest.files("train")
                              + manifest.files("eval")):
            yield
    except (tf.errors.UnavailableError, tf.errors.AbortedError,
            tf.errors.CancelledError) as error:
        raise ClusterUnavailableError(
            f"the cluster became unreachable ({type(error).__name__}: "
            f"{one_line(error)[:600]}); "
            f"{lost_task_message(cluster)}. Restart the lost task(s); a lost "
            "PS also needs the coordinator rerun (it resumes from the latest "
            "checkpoint).") from error
    except tf.errors.OutOfRangeError as error:
        if "IteratorGetNext" not in str(error):
            raise
        # The training stream repeats forever: an end means a worker's
        # iterator was lost (measured right after a PS partition healed, on
        # a worker the previous coordinator had used).
        raise ClusterUnavailableError(
            f"a worker's input iterator ended ({one_line(error)[:300]}); "
            "rerun: it resumes from the latest checkpoint.") from error
    except tf.errors.FailedPreconditionError as error:
        if _LOST_FUNCTIONS not in str(error):
            raise
        raise ClusterUnavailableError(  # a reset connection, not the input
            f"a worker lost its functions ({one_line(error)[:300]}): its "
            "connection was reset (a network partition?); rerun: it resumes "
            "from the latest checkpoint.") from error


# What a worker whose gRPC connection was reset (a partition of ~30 s) says
# when the next function runs there (measured with a 30 s link cut between
# network namespaces, as tests/test_multihost.py makes them).
_LOST_FUNCTIONS = "Could not find required function definition"
