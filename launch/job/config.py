"""The configuration of a ``psrec train`` job, and its codec.

:class:`JobConfig` is what the CLI builds and :func:`psrec.launch.job.run.
run_job` runs, for every strategy. ``job.json`` beside the checkpoints is
:meth:`JobConfig.to_dict`; ``psrec export`` and ``psrec eval`` rebuild the
model from it with :meth:`JobConfig.from_dict`. Every field is an option
(``psrec.options``): its default, help, choices and the strategies it
applies to live on the field; options set under a strategy they do not
apply to are refused here, naming the field (the CLI names the flag).
:class:`BenchConfig` is ``psrec bench``'s workload and cluster.

Plain Python: the CLI builds its flags from these fields without
TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from psrec.data.format.files import write_json_atomic
from psrec.data.input.config import InputConfig
from psrec.errors import ConfigError
from psrec.errors import check
from psrec.errors import did_you_mean
from psrec.features.spec.columns import TABLE_DTYPES
from psrec.features.spec.presets import criteo
from psrec.features.spec.spec import FeatureSpec
from psrec.launch.monitor.heartbeat import run_state_dir
from psrec.models.optim.config import OptimizerConfig
from psrec.models.optim.sizing import DEFAULT_MEMORY_FRACTION
from psrec.models.ranking.config import DEFAULT_MODEL
from psrec.models.ranking.config import MODEL_PRESETS
from psrec.models.ranking.config import ModelConfig
from psrec.models.ranking.config import check_model_spec
from psrec.models.ranking.config import model_config
from psrec.models.retrieval.config import RETRIEVAL_KEEP_BEST
from psrec.models.retrieval.config import RETRIEVAL_METRICS
from psrec.models.retrieval.config import RetrievalConfig
from psrec.models.retrieval.config import check_no_dynamic_tables
from psrec.options import Codec
from psrec.options import check_choices
from psrec.options import default_of
from psrec.options import from_dict
from psrec.options import option
from psrec.options import qualified
from psrec.options import refuse_out_of_scope
from psrec.options import to_dict
from psrec.ps_cluster.checkpoint import WRITERS
from psrec.ps_cluster.cluster.partition_config import PartitionConfig
from psrec.ps_cluster.evaluation.watched import split_keep_best
from psrec.ps_cluster.training.config import LoopConfig
from psrec.uri_path import UriPath
from psrec.uri_path import as_path

JOB_FILE = "job.json"
STRATEGIES = ("ps", "mirrored", "multi-worker-mirrored", "one-device")
COLLECTIVES = ("auto", "ring", "nccl")
MIRRORED = ("mirrored", "multi-worker-mirrored")
REPLICATED = ("mirrored", "multi-worker-mirrored", "one-device")
#: Where 16-bit tables train (tested): the mirrored strategies refuse them.
TABLE_DTYPE_STRATEGIES = ("ps", "one-device")


@dataclasses.dataclass(frozen=True)
class SyntheticData(Codec, where="synthetic"):
    """The embedded default data, generated from the spec."""

    rows: int = option(
        250_000, flag="--synthetic-rows",
        help="rows of synthetic data when --data is not given")
    eval_fraction: float = option(
        0.2, help="the last share of rows used for evaluation")
    files: int = option(4, help="Parquet files generated")
    shards: int = option(8, help="TFRecord train shards (>= workers)")
    seed: int = option(0, help="generator seed")


#: The strategies ``--follow`` runs under: one process drives the
#: partition loop (a multi-worker-mirrored cluster would need every worker
#: to see the same partitions at the same time).
FOLLOW_STRATEGIES = ("ps", "mirrored", "one-device")


@dataclasses.dataclass(frozen=True)
class FollowConfig(Codec, where="follow"):
    """Continuous training on a partitioned log (``psrec train --follow``):
    each new partition is evaluated by the current model first, then
    trained on, checkpointed and exported (docs/checkpoints-and-export.md)."""

    dir: str | None = option(
        None, flag="--follow", strategies=FOLLOW_STRATEGIES,
        help="a folder of partitions (DIR/dt=2026-12-01/, ... each a `psrec "
        "convert` output, ready once its manifest.json exists), processed in "
        "name order: each new one is evaluated by the current model first "
        "(progressive validation), then trained on for --epochs passes "
        "(default 1), checkpointed and exported; then the next is awaited. "
        "Each partition is trained exactly once across restarts "
        "(checkpoints/follow.json); None: train on --data")
    once: bool = option(
        False, flag="--once",
        help="with --follow: process the partitions that are ready, then "
        "exit (a batch scheduler starting one job per partition)")
    until: str | None = option(
        None, flag="--follow-until",
        help="with --follow: exit once this partition (a folder name) is "
        "done, waiting for it if needed")
    poll_seconds: float = option(
        60.0, flag="--poll-interval",
        help="with --follow: seconds between two looks for a new partition "
        "while waiting")

    def __post_init__(self) -> None:
        if self.dir is None:
            for name in ("once", "until", "poll_seconds"):
                check(getattr(self, name) == default_of(FollowConfig, name),
                      qualified(self, name), getattr(self, name),
                      f"applies with `{qualified(self, 'dir')}` only")
        check(not (self.once and self.until is not None),
              qualified(self, "once"), self.once,
              f"and `{qualified(self, 'until')}` are two ends: give one")
        check(self.poll_seconds > 0, qualified(self, "poll_seconds"),
              self.poll_seconds, "must be > 0")
        check(self.until is None or ("/" not in self.until
                                     and self.until.strip() == self.until
                                     and self.until not in ("", ".", "..")),
              qualified(self, "until"), self.until,
              "must be one partition folder's name (no path)")

    @property
    def active(self) -> bool:
        return self.dir is not None


@dataclasses.dataclass(frozen=True)
class StrategyConfig(Codec, where="strategy"):
    """How the job is distributed."""

    kind: str = option(
        "ps", flag="--strategy", choices=STRATEGIES,
        help="ps: parameter servers (tables sharded); mirrored: all local "
        "GPUs/CPU replicas, all-reduce; multi-worker-mirrored: workers from "
        "TF_CONFIG (or --workers local ones); one-device: one GPU or the "
        "CPU; see `psrec advise`")
    collective: str = option(
        "auto", flag="--collective", choices=COLLECTIVES,
        strategies=MIRRORED,
        help="all-reduce implementation (mirrored strategies)")
    mixed_precision: bool = option(
        False, flag="--mixed-precision",
        help="mixed_float16 on GPU (dynamic loss scale; an overflowing "
        "update is skipped whole), mixed_bfloat16 on CPU; float32 variables, "
        "logits and loss. Under ps it runs the workers' dense towers in 16 "
        "bits. On a CPU with bfloat16 instructions (avx512_bf16, amx_bf16; "
        "`psrec advise` says) it is the faster choice at the same AUC")
    grad_accum_steps: int = option(
        1, flag="--grad-accum-steps",
        help="micro-batches of --batch-size whose gradients are summed into "
        "one update (every strategy)")
    memory_fraction: float = option(
        DEFAULT_MEMORY_FRACTION, flag="--memory-fraction",
        strategies=REPLICATED,
        help="size guard: replicated tables + optimizer slots may use this "
        "share of one device's memory, in (0, 1] (mirrored strategies)")
    cpu_replicas: int | None = option(
        None, flag="--cpu-replicas", strategies=("mirrored",),
        help="--strategy mirrored without GPUs: split the CPU into N logical "
        "devices (default: no split)")
    allow_remote: bool = option(
        False, flag="--allow-remote",
        help="permit non-loopback hosts; TF gRPC servers accept "
        "unauthenticated, unencrypted connections on all interfaces: "
        "isolated networks only")
    ps_memory: int | None = option(
        None, flag="--ps-memory", strategies=("ps",),
        help="bytes one PS task may hold (table shards, their optimizer "
        "slots, the dense weights); None: unchecked")

    def __post_init__(self) -> None:
        check_choices(self)
        check(self.grad_accum_steps >= 1, qualified(self, "grad_accum_steps"),
              self.grad_accum_steps, "must be >= 1")
        check(0.0 < self.memory_fraction <= 1.0,
              qualified(self, "memory_fraction"), self.memory_fraction,
              "must be in (0, 1]")
        check(self.cpu_replicas is None or self.cpu_replicas >= 1,
              qualified(self, "cpu_replicas"), self.cpu_replicas,
              "must be >= 1")
        refuse_out_of_scope(self, self.kind)

    @property
    def replicated(self) -> bool:
        return self.kind != "ps"


def _path(value: str | None) -> Path | UriPath | None:
    return None if value is None else as_path(value)


def _retrieval(value: dict[str, Any] | None) -> RetrievalConfig | None:
    return None if value is None else RetrievalConfig.from_dict(
        value, "retrieval")


def has_ranking_metrics(spec: FeatureSpec,
                        retrieval: RetrievalConfig | None) -> bool:
    """AUC and logloss exist: a ranking task with a binary label (a
    retrieval task or an MSE label exports its latest checkpoint)."""
    return retrieval is None and spec.label.loss != "mse"


def check_curves(record: JobConfig) -> None:
    """ROC, precision-recall and calibration curves (``psrec eval
    --plots``) need a binary label: refused for a retrieval run and a
    regression (``loss: mse``) run."""
    if record.spec.multi_task:
        raise ConfigError(
            "--plots: the curves are drawn for a run of one label; this "
            f"run's spec names {len(record.spec.labels)} "
            f"({', '.join(record.spec.label_names)}): drop --plots (each "
            "task's AUC, logloss and calibration are in the eval result).")
    if has_ranking_metrics(record.spec, record.retrieval):
        return
    kind = ("a retrieval run (recall@k)" if record.retrieval is not None
            else "a regression run (`loss: mse`, reported as RMSE)")
    raise ConfigError(
        "--plots: ROC, precision-recall and calibration curves need a "
        f"binary label; this is {kind}: drop --plots.")


def keep_best_metrics(spec: FeatureSpec,
                      retrieval: RetrievalConfig | None) -> tuple[str, ...]:
    """The metrics a task can keep its best checkpoint by: AUC/logloss of
    a ranking task with a binary label, MRR/recall@K of the retrieval task,
    none of a regression (``loss: mse``)."""
    if retrieval is not None:
        return RETRIEVAL_METRICS
    return ("auc", "logloss") if has_ranking_metrics(spec, None) else ()


def _keep_best_error(keep_best: str, patience: int, spec: FeatureSpec,
                    retrieval: RetrievalConfig | None) -> ConfigError:
    """The refusal of a best-checkpoint metric a task does not have."""
    offered = keep_best_metrics(spec, retrieval)
    if offered:
        return ConfigError(
            f"`{qualified(LoopConfig, 'keep_best')}` = {keep_best!r}: the "
            + ("retrieval task" if retrieval is not None else "ranking task")
            + f" reports {', '.join(offered)} (or none)"
            + (did_you_mean(keep_best, offered) or "."))
    return ConfigError(
        f"`{qualified(LoopConfig, 'keep_best')}` = {keep_best!r} / "
        f"`{qualified(LoopConfig, 'early_stop_patience')}` = {patience} "
        f"watch AUC/logloss, which do not exist for the label "
        f"{spec.label.name!r} of spec {spec.name!r}, a regression target "
        "(loss: mse, reported as RMSE); the export is the latest checkpoint: "
        "drop them.")


def check_task_metric(keep_best: str, spec: FeatureSpec) -> None:
    """``--keep-best TASK:METRIC``: TASK is a label of ``spec`` and METRIC
    one of its loss's metrics (AUC/logloss of a 0/1 label, RMSE of an
    ``mse`` one); else one line naming the choices (exit 2)."""
    task, metric = split_keep_best(keep_best)
    labels = {label.name: label for label in spec.labels}
    flag = f"`{qualified(LoopConfig, 'keep_best')}` = {keep_best!r}"
    label = labels.get(task)
    if label is None:
        raise ConfigError(
            f"{flag}: {task!r} is not a label of spec {spec.name!r} "
            f"(labels: {', '.join(labels)})"
            f"{did_you_mean(task, labels) or '.'}")
    metrics = ("rmse",) if label.regression else ("auc", "logloss")
    if metric not in metrics:
        raise ConfigError(
            f"{flag}: {metric!r} is not a metric of the {label.loss} label "
            f"{task!r}; use "
            + " or ".join(f"{task}:{m}" for m in metrics) + ".")


def check_keep_best(loop: LoopConfig, spec: FeatureSpec,
                    retrieval: RetrievalConfig | None, *,
                    given: bool = False) -> None:
    """The one rule of the best checkpoint: ``LoopConfig.keep_best`` is
    ``none`` or a metric the task reports (:func:`keep_best_metrics`), or
    its default (which then means the task's: ``mrr`` for retrieval,
    ``none`` for a regression, :func:`task_keep_best`); a regression's
    ``early_stop_patience`` is 0. ``given``: the value was typed (the
    CLI), so the default too must be the task's. ``TASK:METRIC`` (a
    ranking run) names a label of the spec and a metric of its loss
    (:func:`check_task_metric`)."""
    if split_keep_best(loop.keep_best)[0] is not None:
        if retrieval is not None:
            raise _keep_best_error(loop.keep_best, loop.early_stop_patience,
                                   spec, retrieval)
        check_task_metric(loop.keep_best, spec)
        return
    default = default_of(LoopConfig, "keep_best")
    offered = keep_best_metrics(spec, retrieval)
    if loop.keep_best == "none" or loop.keep_best in offered or (
            loop.keep_best == default and not given):
        if offered or not loop.early_stop_patience:
            return
    raise _keep_best_error(loop.keep_best, loop.early_stop_patience, spec,
                          retrieval)


def task_keep_best(keep_best: str, spec: FeatureSpec,
                   retrieval: RetrievalConfig | None) -> str:
    """``keep_best`` with its default replaced by the task's: MRR for
    retrieval, none for a regression."""
    if keep_best != default_of(LoopConfig, "keep_best"):
        return keep_best
    if retrieval is not None:
        return RETRIEVAL_KEEP_BEST
    return keep_best if has_ranking_metrics(spec, None) else "none"


def _no_ranking_metrics(retrieval: RetrievalConfig | None) -> str:
    """What a run without ranking metrics is, for a refusal's line."""
    return ("a retrieval task" if retrieval is not None
            else "a regression (loss: mse)")


def check_breakdown(loop: LoopConfig, spec: FeatureSpec,
                    retrieval: RetrievalConfig | None) -> None:
    """``--group-by`` and ``--slice-by`` name single-valued categorical
    features of the spec, of a task with ranking metrics (exit 2)."""
    breakdown = loop.breakdown()
    if breakdown.active and not has_ranking_metrics(spec, retrieval):
        flag = "--group-by" if breakdown.group_by else "--slice-by"
        raise ConfigError(
            f"{flag}: GAUC and slices are AUC/logloss breakdowns of a binary "
            f"label; this run is {_no_ranking_metrics(retrieval)}: drop "
            "it.")
    breakdown.check(spec)


def _check_table_dtypes(spec: FeatureSpec, strategy: str) -> None:
    """16-bit tables train under the strategies of
    :data:`TABLE_DTYPE_STRATEGIES` only (a spec's own ``dtype`` too)."""
    sixteen = [t.name for t in spec.tables if t.storage != "float32"]
    if sixteen and strategy not in TABLE_DTYPE_STRATEGIES:
        raise ConfigError(
            f"table {sixteen[0]!r} is stored as "
            f"{spec.table(sixteen[0]).storage}: 16-bit tables train under "
            f"--strategy {' or '.join(TABLE_DTYPE_STRATEGIES)}, not "
            f"{strategy}; use one of those, or float32 tables.")


def _check_follow(config: JobConfig) -> None:
    """What ``--follow`` excludes: ``--data`` (the partitions are the
    data), ``--steps`` (one pass, or ``--epochs``, per partition), early
    stopping (each partition trains to its end), ``--plots`` (drawn of a
    run's one exported checkpoint), the retrieval task and an MSE label
    (test-before-train is AUC/logloss/calibration)."""
    follow = qualified(FollowConfig, "dir")
    check(config.data is None, qualified(config, "data"), config.data,
          f"cannot be given with `{follow}`: the partitions are the data")
    check(config.loop.steps is None, qualified(LoopConfig, "steps"),
          config.loop.steps, f"cannot be given with `{follow}`: each "
          f"partition trains one pass (`{qualified(config, 'epochs')}` "
          "passes)")
    check(not config.loop.early_stop_patience,
          qualified(LoopConfig, "early_stop_patience"),
          config.loop.early_stop_patience,
          f"does not apply with `{follow}`: each partition trains to its end")
    check(config.input.mode == "static", qualified(InputConfig, "mode"),
          config.input.mode, f"must be static with `{follow}` (each "
          "partition's files are read by worker index)")
    check(not config.plots, qualified(config, "plots"), config.plots,
          f"does not apply with `{follow}`: each partition's test before "
          "training is its evaluation (run `psrec eval --plots` on an "
          "exported checkpoint)")
    if not has_ranking_metrics(config.spec, config.retrieval):
        raise ConfigError(
            f"`{follow}` evaluates each partition by AUC, logloss and "
            "calibration before training on it: it needs a ranking task with "
            "a binary label; this run is "
            f"{_no_ranking_metrics(config.retrieval)}: drop it.")


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """Everything ``psrec train`` needs; each field's option metadata says
    what it means (``help``), which values it takes and which strategies it
    applies to.

    ``loop.keep_best`` left at its default means the task's metric
    (:func:`task_keep_best`: ``mrr`` for retrieval, ``none`` for a
    regression); ``epochs`` (passes
    over the train split) is converted to steps once the manifest is known
    (:func:`psrec.launch.job.run.resolve_loop`).
    """

    workdir: Path = option(
        Path("runs/default"), flag="--workdir", decode=as_path,
        help="holds data/, checkpoints/, export/, tensorboard/ and logs/; a "
        "path or gs:// URI")
    spec: FeatureSpec = option(default_factory=criteo,
                               decode=FeatureSpec.from_dict,
                               help="the feature spec", flag="--spec")
    model_name: str = option(DEFAULT_MODEL, flag="--model",
                             choices=tuple(MODEL_PRESETS),
                             help="named model configuration")
    model: ModelConfig = option(
        default_factory=lambda: model_config(DEFAULT_MODEL),
        help="the architecture (default: the named configuration)")
    optimizer: OptimizerConfig = option(
        OptimizerConfig(), help="optimizers and learning rates")
    table_dtype: str = option(
        "float32", flag="--table-dtype", choices=tuple(TABLE_DTYPES),
        strategies=TABLE_DTYPE_STRATEGIES,
        help="how the embedding tables are stored while they train, for "
        "every spec table that leaves its `dtype` unset: float32, or "
        "bfloat16 (half the bytes a value; each update is computed in "
        "float32 and rounded back stochastically; optimizer slots stay "
        "float32)")
    input: InputConfig = option(InputConfig(),
                                help="batch size and shuffling")
    loop: LoopConfig = option(
        LoopConfig(steps=None, steps_per_closure=10, log_every=50,
                   eval_every=None, checkpoint_every=200),
        help="steps, steps per call, eval/checkpoint intervals, the best "
        "checkpoint's metric and early stopping")
    epochs: float | None = option(
        None, flag="--epochs",
        help="train N passes over the train split (manifest rows / "
        "(--batch-size x --grad-accum-steps) steps each) instead of --steps; "
        "with --follow, passes over each partition (default 1)")
    strategy: StrategyConfig = option(StrategyConfig(),
                                      help="how the job is distributed")
    partition: PartitionConfig = option(
        PartitionConfig(), strategies=("ps",),
        help="how tables are sharded across PS tasks")
    data: Path | None = option(
        None, flag="--data", decode=_path,
        help="a manifest (file or folder); None generates synthetic data")
    synthetic: SyntheticData = option(
        SyntheticData(), help="the synthetic data to generate when `data` "
        "is None")
    workers: int = option(2, flag="--workers",
                          strategies=("ps", "multi-worker-mirrored"),
                          help="number of worker tasks")
    ps: int = option(1, flag="--ps", strategies=("ps",),
                     help="number of parameter-server tasks")
    export: bool = option(True, flag="--no-export",
                          help="do not export a SavedModel at the end")
    plots: bool = option(
        False, flag="--plots",
        help="at the end, evaluate the exported checkpoint (the best, else "
        "the latest) once more on the eval split and write its ROC, "
        "precision-recall and calibration curves as `psrec eval --plots` "
        "does: SVGs in WORKDIR/eval/<checkpoint>-eval/, a PR curve in "
        "TensorBoard")
    verify_checksums: bool = option(
        True, flag="--no-verify-checksums",
        help="check shard presence and size but not sha256")
    max_corrupt_records: int = option(
        0, flag="--max-corrupt-records",
        help="skip up to N corrupted records (counted, reported); 0 refuses "
        "corrupted data")
    keep_checkpoints: int = option(
        3, flag="--keep-checkpoints",
        help="recent checkpoints kept (the best one is kept besides them)")
    checkpoint_writers: str = option(
        "auto", flag="--checkpoint-writers", choices=WRITERS,
        strategies=("ps",),
        help="--strategy ps: who writes checkpoint files (and on restore "
        "reads and checks them). tasks: every PS writes and reads its own "
        "shards, no table passes through the coordinator; the checkpoint "
        "folder must be on storage every task sees (NFS, GCS fuse, a gs:// "
        "bucket every task can write): each PS is proven to read and write "
        "it before training, exit 2 naming the PS otherwise. coordinator: "
        "the coordinator writes and reads every tensor (a folder only it "
        "sees; about the whole training state in its memory during a save). "
        "auto: tasks for a local path when every task is on this host (the "
        "local cluster), else coordinator")
    stall_timeout: float | None = option(
        900.0, flag="--stall-timeout",
        help="seconds without progress (in any phase: connecting, training, "
        "eval, checkpoint) before the watchdog acts: the supervisor reads "
        "the coordinator's heartbeat file, prints its phase, step and "
        "per-worker progress, kills it and restarts what failed; the "
        "coordinator's own watchdog dumps stacks and exits 138. 0 disables")
    connect_timeout: float = option(
        300.0, flag="--connect-timeout",
        help="seconds to wait for every PS and worker port before failing "
        "(retryable, 138) with the unreachable tasks named")
    grace_period: float = option(
        30.0, flag="--grace-period",
        help="after SIGTERM/SIGINT: seconds to drain the closures in flight "
        "and save a checkpoint at the step reached (skipped when the last "
        "save took longer than what is left), then exit 143 (SIGTERM) or 130 "
        "(SIGINT) with one line")
    retrieval: RetrievalConfig | None = option(
        None, decode=_retrieval,
        help="the two-tower model of the retrieval task (`model` is then "
        "unused); None: the ranking task")
    data_service: str | None = option(
        None, flag="--data-service",
        help="the tf.data service dispatcher (grpc://host:port or host:port) "
        "the workers read through under input mode data-service: given, or "
        "the service the local launcher started (it hands the coordinator "
        "this job with the address set); None: none")

    warm_start: str | None = option(
        None, flag="--warm-start", strategies=("ps",),
        help="start from another run's checkpoint: its workdir (its latest "
        "checkpoint), its checkpoints folder or one checkpoint prefix "
        "(.../checkpoints/ckpt-N), on any PS count; tables, dense weights "
        "and optimizer slots are carried where the spec and model still "
        "fit them, the rest starts fresh (one line per feature). The step "
        "counter starts at 0. Only a workdir without a checkpoint of its "
        "own is warm-started: a rerun resumes its own checkpoints")
    follow: FollowConfig = option(
        FollowConfig(), strategies=FOLLOW_STRATEGIES, help="continuous training on a folder of partitions "
        "(test, then train each); the default follows nothing")
    reset_optimizer: bool = option(
        False, flag="--reset-optimizer", strategies=("ps",),
        help="with --warm-start: fresh optimizer slots (and iteration "
        "counts) instead of the source's")

    def __post_init__(self) -> None:
        check(not self.reset_optimizer or self.warm_start is not None,
              qualified(self, "reset_optimizer"), self.reset_optimizer,
              f"applies with `{qualified(self, 'warm_start')}` only")
        check_model_spec(self.spec, self.model, self.model_name)
        object.__setattr__(self, "spec", self.spec.with_table_dtype(
            self.table_dtype))
        _check_table_dtypes(self.spec, self.strategy.kind)
        if self.retrieval is not None:
            check_no_dynamic_tables(self.spec)
        check_keep_best(self.loop, self.spec, self.retrieval)
        check_breakdown(self.loop, self.spec, self.retrieval)
        if self.plots:
            check_curves(self)
        # The default metric (auc) is the task's: mrr for retrieval, none
        # for a regression (a value set otherwise was refused just above).
        object.__setattr__(self, "loop", dataclasses.replace(
            self.loop, keep_best=task_keep_best(
                self.loop.keep_best, self.spec, self.retrieval)))
        check_choices(self)
        kind = self.strategy.kind
        refuse_out_of_scope(self, kind)
        refuse_out_of_scope(self.loop, kind)
        check(self.stall_timeout is None or self.stall_timeout > 0,
              qualified(self, "stall_timeout"), self.stall_timeout,
              "must be > 0 (None: no watchdog)")
        check(self.connect_timeout > 0, qualified(self, "connect_timeout"),
              self.connect_timeout, "must be > 0")
        check(self.grace_period >= 0, qualified(self, "grace_period"),
              self.grace_period, "must be >= 0")
        check(self.epochs is None or self.epochs > 0,
              qualified(self, "epochs"), self.epochs, "must be > 0")
        if self.follow.active:
            _check_follow(self)

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
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "") -> JobConfig:
        """Rebuilds a job; an unknown key is a ConfigError naming it."""
        return from_dict(cls, data, where)

    def write(self, directory: str | Path) -> Path | UriPath:
        """``job.json`` in ``directory``."""
        return write_json_atomic(as_path(directory) / JOB_FILE,
                                 self.to_dict())

    @classmethod
    def read(cls, directory: str | Path) -> JobConfig:
        """The job a checkpoint directory was trained with."""
        path = as_path(directory) / JOB_FILE
        if not path.is_file():
            raise ConfigError(
                f"{path} not found: {directory} is not a psrec checkpoint "
                "directory (psrec train writes job.json beside its "
                "checkpoints).")
        return cls.from_dict(json.loads(path.read_text()))


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """The workload and cluster ``psrec bench`` measures. The model, task
    counts, batch size and steps per closure are the training job's options
    (their one source, and their flags: the fields of ``JobConfig``,
    ``InputConfig`` and ``LoopConfig``), defaulting as they do there."""

    model: str = default_of(JobConfig, "model_name")
    workers: int = default_of(JobConfig, "workers")
    ps: int = default_of(JobConfig, "ps")
    batch_size: int = default_of(InputConfig, "batch_size")
    buckets: int = option(100_000, flag="--buckets",
                          help="hash buckets per synthetic table")
    dim: int = option(16, flag="--dim", help="embedding dimension")
    steps: int = option(
        300, flag="--steps",
        help="training steps (the run ends at this global step)")
    steps_per_closure: int = default_of(LoopConfig, "steps_per_closure")
    single_process: bool = option(
        False, flag="--single-process",
        help="no cluster: train in this process (baseline)")
