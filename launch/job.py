"""The main job: data -> cluster -> train -> eval -> checkpoint -> export.

``run_job`` is the typed function behind ``psrec train``; the CLI only
builds a :class:`JobConfig`. With no data given it generates the embedded
default data (synthetic Criteo-like rows from the spec) and converts it;
with no cluster given it starts a :class:`launch.local.LocalCluster`.
Everything that can be checked is checked before any server starts: the
manifest (shards present, sizes, sha256, spec hash) and the shard count
against the number of workers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Iterator

from psrec.data.dataset import InputConfig
from psrec.data.dataset import NotEnoughShardsError
from psrec.data.files import write_json_atomic
from psrec.data.manifest import Manifest
from psrec.data.manifest import ManifestError
from psrec.features.presets import criteo
from psrec.features.spec import FeatureSpec
from psrec.launch.jobfile import JobRecord
from psrec.launch.local import LocalCluster
from psrec.models.config import ModelConfig
from psrec.models.config import model_config
from psrec.models.optim import OptimizerConfig
from psrec.ps_cluster.metrics import EvalResult
from psrec.ps_cluster.partitioning import PartitionConfig
from psrec.ps_cluster.spec import ClusterSpec
from psrec.ps_cluster.train_loop import LoopConfig


@dataclasses.dataclass(frozen=True)
class SyntheticData:
    """The embedded default data: rows generated from the spec.

    Attributes:
      rows: total rows (train + eval).
      eval_fraction: the last share of rows used for evaluation.
      files: Parquet files generated.
      shards: TFRecord train shards (>= workers).
      seed: generator seed.
    """

    rows: int = 250_000
    eval_fraction: float = 0.2
    files: int = 4
    shards: int = 8
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """Everything ``psrec train`` needs.

    Attributes:
      workdir: holds data/, checkpoints/, export/, tensorboard/, logs/.
      spec: the feature spec.
      model_name: dlrm, dcn, deepfm or wide_deep.
      model: the architecture (default: the named configuration).
      optimizer: optimizers and learning rates.
      input: batch size and shuffling.
      loop: steps, steps per closure, eval/checkpoint intervals.
      partition: how tables are sharded across PS tasks.
      data: a manifest (file or folder); None generates synthetic data.
      synthetic: the synthetic data to generate when ``data`` is None.
      workers: local worker processes (ignored with an existing cluster).
      ps: local PS processes (ignored with an existing cluster).
      export: export a SavedModel at the end.
      verify_checksums: recompute every shard's sha256 and check that the
        train and eval splits share no example id before starting (both
        read all the data; without it only presence and sizes are checked).
      keep_checkpoints: recent checkpoints kept.
      max_corrupt_records: corrupted records that may be skipped (counted
        and reported); 0 refuses any corrupted shard.
      stall_timeout: seconds without progress before the watchdog exits
        the coordinator with a retryable code (None: no watchdog).
    """

    workdir: Path = Path("runs/default")
    spec: FeatureSpec = dataclasses.field(default_factory=criteo)
    model_name: str = "dcn"
    model: ModelConfig | None = None
    optimizer: OptimizerConfig = OptimizerConfig()
    input: InputConfig = InputConfig(batch_size=1024)
    loop: LoopConfig = LoopConfig(steps=400, steps_per_closure=10,
                                  log_every=50, eval_every=0,
                                  checkpoint_every=200)
    partition: PartitionConfig = PartitionConfig()
    data: Path | None = None
    synthetic: SyntheticData = SyntheticData()
    workers: int = 2
    ps: int = 1
    export: bool = True
    verify_checksums: bool = True
    max_corrupt_records: int = 0
    keep_checkpoints: int = 3
    stall_timeout: float | None = 900.0

    @property
    def model_config(self) -> ModelConfig:
        return self.model or model_config(self.model_name)

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.workdir) / "checkpoints"


def summary_dict(summary) -> dict:
    """A job summary dataclass as JSON-able data."""
    data = dataclasses.asdict(summary)
    data["eval"] = dataclasses.asdict(summary.eval) if summary.eval else None
    return data


def summary_lines(title: str, summary, middle: list[str]) -> str:
    """The printed summary of a job: title, eval, ``middle``, artefacts."""
    lines = [title]
    if summary.eval is not None:
        lines.append(f"  AUC {summary.eval.auc:.4f}  logloss "
                     f"{summary.eval.logloss:.4f}  on {summary.eval.count} "
                     "eval examples")
    lines += middle + [
        f"  data:        {summary.manifest}",
        f"  checkpoint:  {summary.checkpoint}",
        f"  export:      {summary.export}",
        f"  tensorboard: {summary.tensorboard}",
    ]
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class JobSummary:
    """What ``psrec train`` prints at the end."""

    manifest: str
    checkpoint: str | None
    export: str | None
    tensorboard: str
    start_step: int
    step: int
    executed_steps: int
    examples_per_sec: float
    eval: EvalResult | None
    seconds: float
    cluster: dict

    def to_dict(self) -> dict:
        return summary_dict(self)

    def text(self) -> str:
        return summary_lines("psrec train summary:", self, [
            f"  steps {self.start_step} -> {self.step} (optimizer updates "
            f"executed: {self.executed_steps}), {self.examples_per_sec:,.0f} "
            "examples/s",
            f"  total time {self.seconds:.1f} s on "
            f"{len(self.cluster.get('worker', []))} workers + "
            f"{len(self.cluster.get('ps', []))} PS"])


def prepare_data(config: JobConfig, log=print) -> Manifest:
    """Returns a manifest that is safe to train on; nothing here needs a
    server, so bad data is refused before any role starts.

    Generates and converts the default synthetic data when no data is given
    (reused when already converted with the same spec, so a rerun resumes
    instead of regenerating). Then checks: the spec hash, every shard
    (presence, size, sha256; corrupted shards repaired within
    ``max_corrupt_records``), that train and eval splits share no example,
    and that there are enough train shards for the workers.
    """
    from psrec.data.integrity import check_disjoint_splits
    from psrec.data.integrity import repair_corrupted_shards
    if config.data is not None:
        manifest = Manifest.load(config.data)
    else:
        root = Path(config.workdir) / "data"
        try:
            manifest = Manifest.load(root / "tfrecord")
            manifest.check_spec(config.spec.fingerprint())
        except ManifestError:
            manifest = _generate(config, root, log)
    manifest.check_spec(config.spec.fingerprint())
    manifest, repair = repair_corrupted_shards(
        manifest, Path(config.workdir) / "repaired",
        config.max_corrupt_records, checksums=config.verify_checksums)
    if repair is not None:
        log(repair.summary())
    if config.verify_checksums:  # both read every byte of the data
        check_disjoint_splits(manifest)
    if len(manifest.files("train")) < config.workers:
        raise NotEnoughShardsError(
            f"{len(manifest.files('train'))} train shards cannot feed "
            f"{config.workers} workers without overlap; convert with "
            f"`--shards {config.workers}` or more.")
    return manifest


VERIFIED_FILE = "verified-data.json"


def record_verified(config: JobConfig, manifest: Manifest) -> Path:
    """Notes in the workdir that ``manifest`` passed :func:`prepare_data`
    (with the repaired shards it uses), so the coordinators a supervisor
    starts -- and restarts after every failure -- do not read all the data
    again."""
    original = Manifest.load(manifest.root)
    replaced = {
        before.file: after.file
        for split in original.shards
        for before, after in zip(original.shards[split],
                                 manifest.shards[split])
        if before.file != after.file}
    return write_json_atomic(Path(config.workdir) / VERIFIED_FILE, {
        "manifest": str(manifest.root.resolve()),
        "spec_hash": config.spec.fingerprint(), "replaced": replaced})


def load_verified(config: JobConfig) -> Manifest:
    """The manifest :func:`record_verified` noted for this job.

    Raises:
      ManifestError: when there is no record, or it is for another spec or
        other data than ``config`` names.
    """
    path = Path(config.workdir) / VERIFIED_FILE
    if not path.is_file():
        raise ManifestError(f"{path} is missing: the data was not checked by "
                            "a supervisor; run without --data-verified.")
    record = json.loads(path.read_text())
    root = Path(record["manifest"])
    wanted = (Path(config.data) if config.data is not None
              else Path(config.workdir) / "data" / "tfrecord")
    if wanted.is_file():
        wanted = wanted.parent
    if (record["spec_hash"] != config.spec.fingerprint()
            or wanted.resolve() != root):
        raise ManifestError(f"{path} records other data or another spec than "
                            "this job; run without --data-verified.")
    return Manifest.load(root).with_files(record["replaced"])


def _generate(config: JobConfig, root: Path, log) -> Manifest:
    from psrec.data.convert import ConversionOptions
    from psrec.data.convert import convert
    from psrec.data.synthetic import write_synthetic_parquet
    synthetic = config.synthetic
    log(f"generating {synthetic.rows:,} synthetic rows for spec "
        f"{config.spec.name!r} (embedded default data) ...")
    files = write_synthetic_parquet(config.spec, root / "parquet",
                                    synthetic.rows, files=synthetic.files,
                                    seed=synthetic.seed)
    report = convert(files, config.spec, root / "tfrecord", ConversionOptions(
        shards=max(synthetic.shards, config.workers),
        eval_fraction=synthetic.eval_fraction))
    log(report.summary())
    return report.manifest


@contextlib.contextmanager
def _cluster(config: JobConfig, cluster: ClusterSpec | None,
             log) -> Iterator[ClusterSpec]:
    if cluster is not None:
        log(f"coordinating existing cluster: {cluster.to_tf_cluster_dict()}")
        yield cluster
        return
    with LocalCluster(config.workers, config.ps,
                      log_dir=Path(config.workdir) / "logs") as local:
        log(f"local cluster: {config.workers} workers + {config.ps} PS on "
            f"127.0.0.1 (pids {', '.join(map(str, local.pids()))})")
        yield local.cluster


def run_job(config: JobConfig, cluster: ClusterSpec | None = None,
            log=print, data_verified: bool = False) -> JobSummary:
    """Runs the whole job; resumes from the latest checkpoint if any.

    Args:
      data_verified: the data already passed :func:`prepare_data` in this
        workdir (a supervisor checked it); use the recorded result.
    """
    began = time.perf_counter()
    manifest = (load_verified(config) if data_verified
                else prepare_data(config, log))
    workdir = Path(config.workdir)
    record = JobRecord(spec=config.spec, model_name=config.model_name,
                       model=config.model_config,
                       batch_size=config.input.batch_size,
                       manifest=str(manifest.root))
    record.write(config.checkpoint_dir)
    with _cluster(config, cluster, log) as live:
        result = _train(config, live, manifest, log)
    export_path = None
    if config.export and result.checkpoint is not None:
        from psrec.launch.exporting import export_checkpoint
        export_path = str(export_checkpoint(config.checkpoint_dir,
                                            workdir / "export"))
    summary = JobSummary(
        manifest=str(manifest.root / "manifest.json"),
        checkpoint=result.checkpoint, export=export_path,
        tensorboard=str(workdir / "tensorboard"),
        start_step=result.start_step, step=result.step,
        executed_steps=result.executed_steps,
        examples_per_sec=result.examples_per_sec, eval=result.eval,
        seconds=time.perf_counter() - began,
        cluster=(cluster or live).to_tf_cluster_dict())
    write_json_atomic(workdir / "summary.json", summary.to_dict())
    return summary


def _train(config: JobConfig, cluster: ClusterSpec, manifest: Manifest, log):
    from psrec.launch.progress import ProgressReporter
    from psrec.ps_cluster.trainer import PSTrainer
    from psrec.ps_cluster.watchdog import Watchdog
    trainer = PSTrainer(cluster, config.spec, config.model_config,
                        config.optimizer, config.input, config.partition,
                        checkpoint_dir=config.checkpoint_dir,
                        keep_checkpoints=config.keep_checkpoints)
    with _translated_errors(manifest):
        restored = trainer.restore()
    if restored:
        log(f"resumed from {restored} at step "
            f"{int(trainer.progress.step.numpy())} (restore verified against "
            "the checkpoint's values)")
        _write_restore_report(config, trainer, restored)
    start = int(trainer.progress.step.numpy())
    reporter = ProgressReporter(
        config.loop.steps, start, Path(config.workdir) / "tensorboard",
        learning_rates={
            "sparse": trainer.sparse_optimizer.learning_rate,
            "dense": trainer.dense_optimizer.learning_rate},
        log_every=config.loop.log_every,
        extra=lambda: _per_worker(trainer))
    watchdog = None
    if config.stall_timeout:
        watchdog = Watchdog(config.stall_timeout, trainer.describe_pending)
        watchdog.start()
    try:
        with _translated_errors(manifest):
            result = trainer.train(
                trainer.dataset_fn(manifest), config.loop,
                eval_manifest=manifest, on_progress=reporter.update,
                on_boundary=reporter.boundary,
                heartbeat=watchdog.beat if watchdog else None)
    finally:
        if watchdog is not None:
            watchdog.stop()
        reporter.close()
    log(f"closures finished per worker: {_per_worker(trainer)}")
    return result


def _per_worker(trainer) -> str:
    loop = getattr(trainer, "loop", None)
    counts = dict(sorted(loop.closures_per_pipeline.items())) if loop else {}
    return "workers " + str(counts)


@contextlib.contextmanager
def _translated_errors(manifest: Manifest) -> Iterator[None]:
    """TF errors from the cluster -> psrec errors with exit codes: a lost
    PS is retryable, a corrupted record names its file."""
    import tensorflow as tf

    from psrec.data.records import locate_corruption
    from psrec.ps_cluster.errors import ClusterUnavailableError
    try:
        yield
    except tf.errors.DataLossError as error:
        located = locate_corruption(manifest.files("train")
                                    + manifest.files("eval"))
        raise (located or error) from error
    except (tf.errors.UnavailableError, tf.errors.AbortedError,
            tf.errors.CancelledError) as error:
        raise ClusterUnavailableError(
            f"the cluster became unreachable ({type(error).__name__}: "
            f"{str(error).splitlines()[0][:300]}); a PS task was probably "
            "lost. Restart the PS tasks and rerun: training resumes from the "
            "latest checkpoint.") from error


def _write_restore_report(config: JobConfig, trainer, path: str) -> None:
    """``restore.json``: sha256 of every restored table, so a restore can be
    audited against the checkpoint file independently."""
    import hashlib

    import numpy as np
    tables = {}
    for name, variable in trainer.model.sparse_arch.tables.items():
        shards = getattr(variable, "variables", [variable])
        values = np.concatenate([s.numpy() for s in shards], axis=0)
        tables[name] = hashlib.sha256(values.tobytes()).hexdigest()
    report = {"checkpoint": path, "step": int(trainer.progress.step.numpy()),
              "table_sha256": tables}
    write_json_atomic(Path(config.workdir) / "restore.json", report)
