"""The configuration of a ``psrec train`` job, and its one codec.

:class:`JobConfig` is what the CLI builds and :func:`psrec.launch.job.run.
run_job` runs, for every strategy. ``job.json`` beside the checkpoints is
:meth:`JobConfig.to_dict`; ``psrec export`` and ``psrec eval`` rebuild the
model from it with :meth:`JobConfig.from_dict`. Options that mean nothing
under the chosen strategy are refused here, naming the flag.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from psrec.data.format.files import write_json_atomic
from psrec.data.input.dataset import InputConfig
from psrec.errors import ConfigError
from psrec.errors import check
from psrec.errors import check_choice
from psrec.features.spec.presets import criteo
from psrec.features.spec.spec import FeatureSpec
from psrec.launch.monitor.heartbeat import run_state_dir
from psrec.models.optim.optimizers import OptimizerConfig
from psrec.models.ranking.config import ModelConfig
from psrec.models.ranking.config import check_model_spec
from psrec.models.ranking.config import model_config
from psrec.models.retrieval.config import RetrievalConfig
from psrec.models.retrieval.config import check_no_dynamic_tables
from psrec.ps_cluster.checkpoint.writers import WRITERS
from psrec.ps_cluster.cluster.partitioning import PartitionConfig
from psrec.ps_cluster.training.loop import LoopConfig
from psrec.uri_path import UriPath
from psrec.uri_path import as_path

JOB_FILE = "job.json"
STRATEGIES = ("ps", "mirrored", "multi-worker-mirrored", "one-device")
COLLECTIVES = ("auto", "ring", "nccl")


@dataclasses.dataclass(frozen=True)
class SyntheticData:
    """The embedded default data, generated from the spec.

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
class StrategyConfig:
    """How the job is distributed.

    Attributes:
      kind: ``ps``, ``mirrored``, ``multi-worker-mirrored`` or
        ``one-device`` (see :mod:`psrec.ps_cluster.cluster.strategy`).
      collective: all-reduce implementation (mirrored strategies).
      mixed_precision: ``mixed_float16`` on GPU, ``mixed_bfloat16`` on CPU;
        under PS, the workers' dense towers (a speed option).
      grad_accum_steps: micro-batches of ``batch_size`` per update.
      memory_fraction: size guard of the replicated strategies: tables and
        optimizer slots may use this share of one device's memory.
      cpu_replicas: ``mirrored`` without GPUs: split the CPU into N
        logical devices.
      ps_memory: ``ps``: bytes one PS task may hold (table shards, their
        slots, dense weights; ``ps_cluster.planner.plan``); None: unchecked.
      allow_remote: accept non-loopback hosts (TF_CONFIG / --cluster).
    """

    kind: str = "ps"
    collective: str = "auto"
    mixed_precision: bool = False
    grad_accum_steps: int = 1
    memory_fraction: float = 0.5
    cpu_replicas: int | None = None
    allow_remote: bool = False
    ps_memory: int | None = None

    def __post_init__(self) -> None:
        check_choice("--strategy", self.kind, STRATEGIES)
        check_choice("--collective", self.collective, COLLECTIVES)
        check(self.grad_accum_steps >= 1, "--grad-accum-steps",
              self.grad_accum_steps, "must be >= 1")
        check(0.0 < self.memory_fraction <= 1.0, "--memory-fraction",
              self.memory_fraction, "must be in (0, 1]")
        check(self.cpu_replicas is None or self.cpu_replicas >= 1,
              "--cpu-replicas", self.cpu_replicas, "must be >= 1")
        _refuse(self.kind, "--collective", self.collective != "auto",
                ("mirrored", "multi-worker-mirrored"))
        _refuse(self.kind, "--cpu-replicas", self.cpu_replicas is not None,
                ("mirrored",))
        _refuse(self.kind, "--memory-fraction", self.memory_fraction != 0.5,
                ("mirrored", "multi-worker-mirrored", "one-device"))
        _refuse(self.kind, "--ps-memory", self.ps_memory is not None,
                ("ps",))

    @property
    def replicated(self) -> bool:
        return self.kind != "ps"


def _refuse(kind: str, flag: str, given: bool, kinds: tuple[str, ...]
            ) -> None:
    if given and kind not in kinds:
        raise ConfigError(
            f"`{flag}` has no effect with --strategy {kind}; it applies to "
            f"--strategy {' / '.join(kinds)} only: drop it or change the "
            "strategy.")


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
      loop: steps, steps per call, eval/checkpoint intervals, the best
        checkpoint's metric and early stopping. ``eval_every`` None (the
        default) evaluates about 5 times per run.
      epochs: passes over the train split to train, instead of
        ``loop.steps``: converted to steps once the manifest is known (see
        :func:`psrec.launch.job.run.resolve_loop`); None trains ``loop.steps``.
      strategy: how the job is distributed.
      partition: how tables are sharded across PS tasks (``ps`` only).
      data: a manifest (file or folder); None generates synthetic data.
      synthetic: the synthetic data to generate when ``data`` is None.
      workers: local worker processes (``ps``, ``multi-worker-mirrored``).
      ps: local PS processes (``ps``).
      export: export a SavedModel at the end.
      verify_checksums: recompute every shard's sha256 and check that the
        train and eval splits share no example id before starting.
      keep_checkpoints: recent checkpoints kept.
      checkpoint_writers: ``ps``: who writes (and on restore reads and
        checks) checkpoint files: ``tasks`` (each PS its own shards, on
        storage every task shares), ``coordinator`` (every tensor through
        it), ``auto`` (``tasks`` for a local path with every task on this
        host, else ``coordinator``); see ``ps_cluster.checkpoint.writers``.
      max_corrupt_records: corrupted records that may be skipped (counted
        and reported); 0 refuses any corrupted shard.
      stall_timeout: seconds without progress before the watchdog exits
        with a retryable code (None: no watchdog).
      connect_timeout: seconds the coordinator waits for every PS and
        worker port to accept connections before failing (retryable) with
        the unreachable tasks named.
      grace_period: seconds after SIGTERM/SIGINT within which the
        coordinator drains its closures and saves a checkpoint (skipped
        when the last save took longer than what is left).
      retrieval: ``psrec train --task retrieval``: the two-tower model
        (``model`` is then unused); None: the ranking task.
      data_service: the tf.data service dispatcher (``grpc://host:port`` or
        ``host:port``) the workers read through under ``input.mode``
        ``data-service``: ``--data-service``, or the service the local
        launcher started (it hands the coordinator this job with the
        address set); None: none given.
    """

    workdir: Path = Path("runs/default")
    spec: FeatureSpec = dataclasses.field(default_factory=criteo)
    model_name: str = "dcn"
    model: ModelConfig = dataclasses.field(
        default_factory=lambda: model_config("dcn"))
    optimizer: OptimizerConfig = OptimizerConfig()
    input: InputConfig = InputConfig(batch_size=1024)
    loop: LoopConfig = LoopConfig(steps=400, steps_per_closure=10,
                                  log_every=50, eval_every=None,
                                  checkpoint_every=200)
    epochs: float | None = None
    strategy: StrategyConfig = StrategyConfig()
    partition: PartitionConfig = PartitionConfig()
    data: Path | None = None
    synthetic: SyntheticData = SyntheticData()
    workers: int = 2
    ps: int = 1
    export: bool = True
    verify_checksums: bool = True
    max_corrupt_records: int = 0
    keep_checkpoints: int = 3
    checkpoint_writers: str = "auto"
    stall_timeout: float | None = 900.0
    connect_timeout: float = 300.0
    grace_period: float = 30.0
    retrieval: RetrievalConfig | None = None
    data_service: str | None = None

    def __post_init__(self) -> None:
        check_model_spec(self.spec, self.model, self.model_name)
        if self.retrieval is not None:
            check_no_dynamic_tables(self.spec)
        if self.loop.keep_best != "none" and (
                self.retrieval is not None or self.spec.label.loss == "mse"):
            # AUC/logloss do not apply: the export is the latest checkpoint.
            object.__setattr__(self, "loop", dataclasses.replace(
                self.loop, keep_best="none", early_stop_patience=0))
        kind = self.strategy.kind
        _refuse(kind, "--partitioner/--table-shards",
                self.partition != PartitionConfig(), ("ps",))
        _refuse(kind, "--ps", self.ps != 1, ("ps",))
        _refuse(kind, "--workers", self.workers != 2,
                ("ps", "multi-worker-mirrored"))
        check_choice("--checkpoint-writers", self.checkpoint_writers,
                     WRITERS)
        _refuse(kind, "--checkpoint-writers",
                self.checkpoint_writers != "auto", ("ps",))
        check(self.stall_timeout is None or self.stall_timeout > 0,
              "--stall-timeout", self.stall_timeout,
              "must be > 0 (0 disables the watchdog)")
        check(self.connect_timeout > 0, "--connect-timeout",
              self.connect_timeout, "must be > 0")
        check(self.grace_period >= 0, "--grace-period", self.grace_period,
              "must be >= 0")
        check(self.epochs is None or self.epochs > 0, "--epochs",
              self.epochs, "must be > 0")
        _refuse(kind, "--early-stop-patience",
                self.loop.early_stop_patience > 0,
                ("ps", "mirrored", "one-device"))

    @property
    def checkpoint_dir(self) -> Path | UriPath:
        return as_path(self.workdir) / "checkpoints"

    @property
    def state_dir(self) -> Path:
        """The local folder of the heartbeat, supervisor and cluster logs:
        the workdir, or a local stand-in for a remote one
        (``launch.monitor.heartbeat``)."""
        return run_state_dir(self.workdir)

    # -- the codec -----------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-able data; :meth:`from_dict` inverts it."""
        data: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, FeatureSpec):
                value = value.to_dict()
            elif dataclasses.is_dataclass(value):
                value = dataclasses.asdict(value)
            elif isinstance(value, (Path, UriPath)):
                value = str(value)
            data[field.name] = value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobConfig:
        """Rebuilds a job; an unknown key is an error naming it.

        Raises:
          ConfigError: unknown keys.
        """
        unknown = set(data) - set(_DECODERS)
        if unknown:
            raise ConfigError(f"unknown job keys {sorted(unknown)}; known: "
                              f"{', '.join(_DECODERS)}.")
        return cls(**{key: _DECODERS[key](value)
                      for key, value in data.items()})

    def write(self, directory: str | Path) -> Path | UriPath:
        """``job.json`` in ``directory``."""
        return write_json_atomic(as_path(directory) / JOB_FILE,
                                 self.to_dict())

    @classmethod
    def read(cls, directory: str | Path) -> JobConfig:
        """The job a checkpoint directory was trained with.

        Raises:
          ConfigError: no ``job.json`` there.
        """
        path = as_path(directory) / JOB_FILE
        if not path.is_file():
            raise ConfigError(
                f"{path} not found: {directory} is not a psrec checkpoint "
                "directory (psrec train writes job.json beside its "
                "checkpoints).")
        return cls.from_dict(json.loads(path.read_text()))


def _same(value: Any) -> Any:
    return value


def _path(value: str | None) -> Path | UriPath | None:
    return None if value is None else as_path(value)


def _nested(key: str, cls: type) -> Any:
    """Decodes a nested dataclass; an unknown key is a ConfigError naming it
    (not a TypeError with a traceback in `psrec export`/`eval`)."""
    def decode(data: dict[str, Any]) -> Any:
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            named = [f"{key}.{u}" for u in unknown]
            raise ConfigError(f"unknown job keys {named}; known in {key!r}: "
                              f"{', '.join(known)}.")
        return cls(**data)
    return decode


_DECODERS = {
    "workdir": as_path, "spec": FeatureSpec.from_dict, "model_name": str,
    "model": _nested("model", ModelConfig),
    "optimizer": _nested("optimizer", OptimizerConfig),
    "input": _nested("input", InputConfig),
    "loop": _nested("loop", LoopConfig), "epochs": _same,
    "strategy": _nested("strategy", StrategyConfig),
    "partition": _nested("partition", PartitionConfig), "data": _path,
    "synthetic": _nested("synthetic", SyntheticData), "workers": int,
    "ps": int,
    "export": bool, "verify_checksums": bool, "max_corrupt_records": int,
    "keep_checkpoints": int, "checkpoint_writers": str,
    "stall_timeout": _same,
    "connect_timeout": float, "grace_period": float,
    "retrieval": lambda value: (None if value is None else _nested(
        "retrieval", RetrievalConfig)(value)),
    "data_service": _same,
}
