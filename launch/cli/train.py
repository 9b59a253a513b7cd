"""The ``psrec`` commands of a training job: ``advise`` picks its
strategy, ``train`` runs it (on the coordinator, or supervising a local
cluster), ``server`` runs one of its PS or worker tasks."""

from __future__ import annotations

import argparse
import os
import sys

from psrec.data.input.config import InputConfig
from psrec.errors import EXIT_OK
from psrec.launch.cli import metrics_flags
from psrec.launch.cli import plan as plan_commands
from psrec.launch.cli import retrieval_flags
from psrec.launch.cli.argtypes import integer
from psrec.launch.cli.argtypes import non_negative
from psrec.launch.cli.argtypes import non_negative_float
from psrec.launch.cli.argtypes import positive
from psrec.launch.cli.argtypes import positive_float
from psrec.launch.cli.argtypes import positive_fraction
from psrec.launch.cli.argtypes import widths
from psrec.launch.cli.data_service import add_data_server_command
from psrec.launch.cli.data_service import add_input_flags
from psrec.launch.cli.data_service import local_data_service
from psrec.launch.cli.data_service import resolve_input_mode
from psrec.launch.cli.model import add_breakdown_flags
from psrec.launch.cli.options import add_option
from psrec.launch.cli.options import given
from psrec.launch.cli.options import refuse_given_out_of_scope
from psrec.launch.cli.support import UsageError
from psrec.launch.cli.support import add_cluster_flags
from psrec.launch.cli.support import add_json_flag
from psrec.launch.cli.support import add_model_flag
from psrec.launch.cli.support import add_spec_and_data_flags
from psrec.launch.cli.support import print_result
from psrec.launch.job.config import FollowConfig
from psrec.launch.job.config import JobConfig
from psrec.launch.job.config import StrategyConfig
from psrec.launch.job.config import SyntheticData
from psrec.launch.job.config import check_keep_best
from psrec.launch.job.warm_start import resolve_warm_start
from psrec.launch.job.workdir import claim_workdir
from psrec.launch.local.netns import add_allow_exposed_flag
from psrec.launch.supervise.restart_policy import RestartLimits
from psrec.launch.supervise.restart_policy import SupervisorConfig
from psrec.models.optim.config import OptimizerConfig
from psrec.models.ranking.config import ModelConfig
from psrec.models.ranking.config import model_config
from psrec.options import field_named
from psrec.options import option_of
from psrec.options import option_values
from psrec.ps_cluster.cluster.partition_config import PartitionConfig
from psrec.ps_cluster.training.config import LoopConfig
from psrec.uri_path import as_path

_JOB = JobConfig()  # the defaults of the flags of nested configurations
#: The task towers each expert flag applies to.
_EXPERT_FLAGS = {"experts": ("mmoe", "ple"), "expert_units": ("mmoe", "ple"),
                 "task_experts": ("ple",), "ple_levels": ("ple",)}


def _existing_cluster(args: argparse.Namespace):
    """The cluster to coordinate, from --cluster or TF_CONFIG; None means
    start a local one."""
    from psrec.ps_cluster.cluster.tf_config import REMOTE_WARNING
    from psrec.ps_cluster.cluster.tf_config import TFConfig
    if args.cluster:
        config = TFConfig.from_file(args.cluster)
    else:
        config = TFConfig.from_env()
        if config is None:
            return None
        if not config.is_coordinator:
            raise UsageError(
                f"TF_CONFIG names this task {config.task.type}:"
                f"{config.task.index}; run `psrec server` for PS/worker tasks "
                "and `psrec train` on the chief/coordinator only.")
    config.validate(strategy="ps", allow_remote=args.allow_remote)
    if not config.cluster.is_loopback():
        print(f"psrec: warning: {REMOTE_WARNING}", file=sys.stderr)
    return config.cluster


def _job_config(args: argparse.Namespace) -> JobConfig:
    """The :class:`JobConfig` of ``psrec train``'s arguments; a flag given
    under a ``--strategy`` it does not apply to is refused (exit 2). A
    library refusal names fields; the error line names the flags
    (``launch.cli.main.error_line``)."""
    from psrec.data.format.manifest import Manifest
    from psrec.data.format.manifest import spec_for
    if args.strategy != "ps":
        for flag, flag_given in (
                ("--cluster", args.cluster),
                ("--no-restart-workers", args.no_restart_workers)):
            if flag_given:
                raise UsageError(
                    f"`{flag}` applies to --strategy ps only; with "
                    f"--strategy {args.strategy} each worker reads its own "
                    "TF_CONFIG (see `psrec tf-config`), and without it psrec "
                    "starts --workers local workers.")
    refuse_given_out_of_scope(args, args.strategy)
    if given(args, "steps") and args.epochs is not None:
        raise UsageError(
            f"give --steps ({args.steps}) or --epochs ({args.epochs:g}), not "
            "both: --epochs N trains N passes over the train split.")
    overrides = {"batch_norm": "sync"} if args.sync_batch_norm else {}
    if args.cross_low_rank:
        overrides["cross_low_rank"] = args.cross_low_rank
    for name, towers in _EXPERT_FLAGS.items():
        if given(args, name) and args.task_towers not in towers:
            raise UsageError(
                f"--{name.replace('_', '-')} applies to --task-towers "
                f"{' or '.join(towers)}; this run's is {args.task_towers}: "
                "drop it or choose those towers.")
    overrides.update(task_towers=args.task_towers, experts=args.experts,
                     task_experts=args.task_experts,
                     expert_units=args.expert_units,
                     ple_levels=args.ple_levels,
                     attention_mlp=args.attention_mlp,
                     attention_softmax=args.attention_softmax,
                     bst_heads=args.bst_heads,
                     bst_ff_units=args.bst_ff_units)
    manifest = Manifest.load(args.data) if args.data else None
    if manifest is not None:  # refused before anything starts (exit 1)
        manifest.require_rows("train")
    elif args.follow:  # the spec of the followed data
        manifest = follow_manifest(args.follow, args.spec)
    spec = spec_for(manifest, args.spec)
    retrieval = retrieval_flags.retrieval_config(args, spec)
    check_keep_best(LoopConfig(keep_best=args.keep_best,
                               early_stop_patience=args.early_stop_patience),
                    spec, retrieval, given=given(args, "keep_best"))
    return option_values(
        args, JobConfig, workdir=as_path(args.workdir), spec=spec,
        model=model_config(args.model, **overrides),
        optimizer=option_values(args, OptimizerConfig),
        input=option_values(args, InputConfig, mode=resolve_input_mode(args)),
        loop=option_values(args, LoopConfig),
        strategy=option_values(args, StrategyConfig),
        partition=option_values(args, PartitionConfig),
        data=as_path(args.data) if args.data else None,
        synthetic=option_values(args, SyntheticData, seed=args.seed),
        follow=option_values(args, FollowConfig),
        stall_timeout=args.stall_timeout or None, retrieval=retrieval)


def follow_manifest(folder: str, spec_flag: str | None):
    """The manifest of the first ready partition of ``folder`` (the spec
    of a ``--follow`` job comes from it, as from ``--data``); None when no
    partition is ready yet, which needs ``--spec`` (exit 2 without)."""
    from psrec.data.format.manifest import Manifest
    from psrec.launch.job.follow_state import partitions
    for partition in partitions(folder):
        if partition.ready:
            return Manifest.load(partition.path)
    if spec_flag is None:
        raise UsageError(
            f"--follow {folder}: no partition is ready yet, so the spec "
            "cannot be read from the data: give --spec (each partition must "
            "then be converted with it).")
    return None


def _cmd_advise(args: argparse.Namespace) -> int:
    from psrec.features.spec.presets import resolve_spec
    from psrec.ps_cluster.planner.advise import advise
    advice = advise(resolve_spec(args.spec), args.model,
                    batch_size=args.batch_size,
                    memory_fraction=args.memory_fraction,
                    repeats=args.repeats,
                    log=None if args.json else (
                        lambda text: print(text, file=sys.stderr,
                                           flush=True)))
    print_result(args, advice)
    return EXIT_OK


def _log(args: argparse.Namespace):
    """Where the job's progress lines go: stdout, or stderr under --json
    (stdout holds the one JSON object)."""
    if not args.json:
        return print
    return lambda text: print(text, file=sys.stderr, flush=True)


def _cmd_train(args: argparse.Namespace) -> int:
    """One command for every strategy: ``ps`` supervises a local cluster (or
    coordinates an existing one), ``multi-worker-mirrored`` without
    TF_CONFIG launches local workers, everything else trains here."""
    # A local cluster: into its namespace before TensorFlow is imported.
    metrics = metrics_flags.isolate_keeping_metrics(args)
    config = _job_config(args)
    # Refused before anything is written or started: another job's workdir
    # (exit 2), or one another psrec train holds (exit 2, its pid named).
    with claim_workdir(config, lock=_runs_the_job(config)):
        # The warm-start source checked and its feature plan made (exit 2)
        # before any server starts; a workdir with its own checkpoint
        # resumes it instead.
        config = resolve_warm_start(config, _log(args))
        return _train(args, config, metrics)


def _runs_the_job(config: JobConfig) -> bool:
    """This ``psrec train`` holds the workdir for the run's life: all but a
    non-chief worker of a multi-worker-mirrored cluster named by
    ``TF_CONFIG`` (its chief holds it; the processes psrec itself starts are
    job processes and servers, which never take it)."""
    from psrec.ps_cluster.cluster.tf_config import TFConfig
    if config.strategy.kind != "multi-worker-mirrored":
        return True
    tf_config = TFConfig.from_env()
    if tf_config is None or tf_config.task is None:
        return True
    task = tf_config.task
    chief = tf_config.cluster.chief is not None
    return task.type == "chief" or (
        not chief and task.type == "worker" and task.index == 0)


def _train(args: argparse.Namespace, config: JobConfig, metrics) -> int:
    from psrec.ps_cluster.cluster.tf_config import TFConfig
    kind = config.strategy.kind
    # --cluster / TF_CONFIG checked before TensorFlow is imported.
    cluster = _existing_cluster(args) if kind == "ps" else None
    from psrec.launch.job.data import prepare_data
    from psrec.launch.job.data import record_verified
    from psrec.launch.job.summary import JobSummary
    if kind == "ps":
        if cluster is not None:  # coordinate it; an orchestrator restarts us
            return coordinate(args, config, cluster, metrics)
        # Local: check the data once, before any server starts, then
        # supervise the roles and the coordinator (a job process handed
        # this job, the data checked; after every restart too).
        from psrec.launch.local.cluster import LocalCluster
        from psrec.launch.local.netns import announce
        from psrec.launch.supervise.supervisor import supervise
        plan_commands.check_ps_memory(config, None)
        if not config.follow.active:  # --follow checks each partition
            record_verified(config, prepare_data(config, _log(args)))
        local = LocalCluster(config.workers, config.ps,
                             log_dir=config.state_dir / "logs",
                             allow_exposed=args.allow_exposed)
        announce(local.exposed, local.exposed_warning, _log(args))
        with local_data_service(config, _log(args)) as (config, service):
            return supervise(local, config, supervisor_config(args),
                             config.state_dir, metrics, service,
                             json_output=args.json)
    if kind == "multi-worker-mirrored" and TFConfig.from_env() is None:
        from psrec.launch.job.local_workers import run_local_workers
        record_verified(config, prepare_data(config, _log(args)))
        data = run_local_workers(config, log=_log(args),
                                 allow_exposed=args.allow_exposed,
                                 json_output=args.json)
        print_result(args, JobSummary.from_dict(data))
        return EXIT_OK
    return train_here(args, config)


def coordinate(args: argparse.Namespace, config, cluster, metrics=None,
               data_verified: bool = False) -> int:
    """Coordinates ``config``'s job on ``cluster`` (``--strategy ps``),
    serving ``/metrics`` on the ``metrics`` socket when one is given, and
    prints its summary (``args.json``). ``data_verified``: the launcher
    checked the data and recorded it (a supervised coordinator)."""
    from psrec.launch.job.run import run_job
    plan_commands.check_ps_memory(config, cluster)
    with metrics_flags.serving(metrics, config.state_dir,
                               config.stall_timeout, _log(args)):
        print_result(args, run_job(config, cluster, log=_log(args),
                                   data_verified=data_verified))
    return EXIT_OK


def train_here(args: argparse.Namespace, config,
               data_verified: bool = False) -> int:
    """Trains ``config``'s replicated job in this process (one worker of a
    multi-worker-mirrored cluster, named by ``TF_CONFIG``) and prints its
    summary where this process is the chief (``args.json``)."""
    from psrec.launch.job.run import run_job
    summary = run_job(config, log=_log(args), data_verified=data_verified)
    if summary is not None:
        print_result(args, summary)
    if config.strategy.kind == "multi-worker-mirrored":
        # MultiWorkerMirroredStrategy's server cannot be shut down.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_OK)
    return EXIT_OK


def _cmd_server(args: argparse.Namespace) -> int:
    from psrec.ps_cluster.cluster.tf_config import TaskInfo
    from psrec.ps_cluster.cluster.tf_config import TFConfig
    if args.cluster:
        if args.role is None or args.index is None:
            raise UsageError("give --role and --index with --cluster FILE.")
        config = TFConfig(TFConfig.from_file(args.cluster).cluster,
                          TaskInfo(args.role, args.index))
    else:
        config = TFConfig.from_env()
        if config is None or config.task is None:
            raise UsageError(
                "no task to run: set TF_CONFIG (see `psrec tf-config`) or give "
                "--cluster FILE --role ps|worker --index N.")
    config.validate(strategy="ps", allow_remote=args.allow_remote)
    cluster, task = config.cluster, config.task
    # TensorFlow is imported once the arguments are known good.
    from psrec.ps_cluster.cluster.server import start_server
    server = start_server(cluster, task)
    from psrec.launch.local.netns import print_listening
    print(f"psrec server: {task.type}:{task.index} serving "
          f"{cluster.address_of(task)} (pid {os.getpid()})", flush=True)
    print_listening(int(cluster.address_of(task).rsplit(":", 1)[1]))
    server.join()
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Registers ``train``, ``advise`` and ``server``."""

    p = sub.add_parser("train", help="train a model (PS cluster, mirrored or "
                       "one device)",
                       description="Train under --strategy ps on a local "
                       "supervised cluster, or coordinate an existing one "
                       "(--cluster or TF_CONFIG); or under a replicated "
                       "strategy (mirrored, multi-worker-mirrored, "
                       "one-device). Every other option means the same under "
                       "each strategy, or is refused where it cannot apply.")
    data = p.add_argument_group("data")
    add_spec_and_data_flags(
        data, spec_beside_data=", which --spec may only repeat",
        data="default: generate the embedded synthetic data")
    add_option(data, SyntheticData, "rows", type=positive)
    add_option(data, InputConfig, "batch_size", type=positive)
    add_option(data, InputConfig, "seed", type=integer)
    add_option(data, JobConfig, "verify_checksums")
    add_option(data, JobConfig, "max_corrupt_records", type=non_negative)
    add_input_flags(data)

    model = p.add_argument_group("model")
    add_model_flag(model)
    add_option(model, ModelConfig, "cross_low_rank", type=positive)
    add_option(model, ModelConfig, "task_towers")
    add_option(model, ModelConfig, "experts", type=positive)
    add_option(model, ModelConfig, "task_experts", type=positive)
    add_option(model, ModelConfig, "expert_units", type=widths)
    add_option(model, ModelConfig, "ple_levels", type=positive)
    add_option(model, ModelConfig, "attention_mlp", type=widths)
    add_option(model, ModelConfig, "attention_softmax")
    add_option(model, ModelConfig, "bst_heads", type=positive)
    add_option(model, ModelConfig, "bst_ff_units", type=positive)
    model.add_argument("--sync-batch-norm", action="store_true",
                       help="batch norm in the MLP towers with statistics "
                       "all-reduced across the replicas in sync (under ps: "
                       "a worker's local replicas)")
    add_option(model, StrategyConfig, "mixed_precision")
    add_option(model, JobConfig, "table_dtype")

    optimizer = p.add_argument_group(
        "optimizer", "learning rates and the step schedule")
    add_option(optimizer, OptimizerConfig, "sparse")
    add_option(optimizer, OptimizerConfig, "dense")
    add_option(optimizer, OptimizerConfig, "sparse_lr", type=positive_float)
    add_option(optimizer, OptimizerConfig, "dense_lr", type=positive_float)
    add_option(optimizer, OptimizerConfig, "base_batch_size", type=positive)
    add_option(optimizer, OptimizerConfig, "warmup_steps",
               type=non_negative)
    add_option(optimizer, LoopConfig, "steps", type=positive,
               default=_JOB.loop.steps)
    add_option(optimizer, LoopConfig, "steps_per_closure", type=positive,
               default=_JOB.loop.steps_per_closure)
    add_option(optimizer, JobConfig, "epochs", type=positive_float)
    add_option(optimizer, StrategyConfig, "grad_accum_steps", type=positive)

    cluster = p.add_argument_group("cluster")
    add_option(cluster, StrategyConfig, "kind")
    add_option(cluster, JobConfig, "workers", type=positive)
    add_option(cluster, JobConfig, "ps", type=positive)
    cluster.add_argument("--cluster", default=None,
                         help="coordinate an existing cluster (JSON cluster "
                         "spec or TF_CONFIG file); TF_CONFIG naming this task "
                         "chief also does (default: start a local cluster)")
    partition = option_of(field_named(JobConfig, "partition")).strategies
    add_option(cluster, PartitionConfig, "kind", strategies=partition)
    add_option(cluster, PartitionConfig, "shards", type=positive,
               strategies=partition)
    add_option(cluster, StrategyConfig, "collective")
    add_option(cluster, StrategyConfig, "memory_fraction",
               type=positive_fraction)
    add_option(cluster, StrategyConfig, "cpu_replicas", type=positive)
    plan_commands.add_ps_memory_flag(cluster)
    add_cluster_flags(cluster)
    add_allow_exposed_flag(cluster)

    reliability = p.add_argument_group("reliability")
    add_reliability_flags(reliability)
    add_checkpoint_flags(reliability)
    warm = p.add_argument_group(
        "warm start", "start from another run's checkpoint (a new workdir)")
    add_option(warm, JobConfig, "warm_start")
    add_option(warm, JobConfig, "reset_optimizer")
    follow = p.add_argument_group(
        "follow a partitioned log", "test, then train each new partition "
        "(--data is then not given)")
    add_option(follow, FollowConfig, "dir")
    add_option(follow, FollowConfig, "once")
    add_option(follow, FollowConfig, "until")
    add_option(follow, FollowConfig, "poll_seconds", type=positive_float)
    add_breakdown_flags(p.add_argument_group(
        "evaluation breakdown", "GAUC and per-slice metrics of each eval"))

    metrics_flags.add_metrics_flags(p.add_argument_group("monitoring"))
    output = p.add_argument_group("output")
    add_json_flag(output)
    add_option(output, JobConfig, "workdir", default="runs/default")
    add_option(output, LoopConfig, "log_every", type=positive,
               default=_JOB.loop.log_every)
    add_option(output, LoopConfig, "eval_every", type=non_negative,
               default=_JOB.loop.eval_every)
    add_option(output, JobConfig, "export")
    add_option(output, JobConfig, "plots")
    p.set_defaults(run=_cmd_train)

    p = sub.add_parser("advise",
                       help="measure compute vs all-reduce vs PS round trip "
                       "and recommend a strategy")
    model = p.add_argument_group("model")
    model.add_argument("--spec", default="criteo",
                       help="preset (criteo, movielens) or spec file")
    add_model_flag(model)
    add_option(model, InputConfig, "batch_size", type=positive,
               help="rows of one replica's (worker's) step")
    measure = p.add_argument_group("measurement")
    add_option(measure, StrategyConfig, "memory_fraction",
               type=positive_fraction,
               help="size guard: share of one device's memory the "
               "replicated tables + slots may use, in (0, 1]")
    measure.add_argument("--repeats", type=positive, default=5,
                         help="timed repetitions per measurement (median)")
    add_json_flag(p.add_argument_group("output"))
    p.set_defaults(run=_cmd_advise)

    p = sub.add_parser("server", help="run one PS or worker role (blocks)",
                       description="Run one PS or worker role from TF_CONFIG "
                       "(or --cluster FILE --role --index) and block.")
    p.add_argument("--cluster", default=None,
                   help="cluster spec JSON file (default: TF_CONFIG)")
    p.add_argument("--role", choices=("ps", "worker"), default=None,
                   help="this task's role, with --cluster")
    p.add_argument("--index", type=non_negative, default=None,
                   help="this task's index in its role, with --cluster")
    add_cluster_flags(p)
    p.set_defaults(run=_cmd_server)
    add_data_server_command(sub)


def add_checkpoint_flags(group) -> None:
    """Registers the checkpoint options on ``group``."""
    add_option(group, LoopConfig, "checkpoint_every", type=non_negative,
               default=_JOB.loop.checkpoint_every)
    add_option(group, LoopConfig, "delta_every", type=non_negative)
    add_option(group, LoopConfig, "full_every", type=non_negative)
    add_option(group, JobConfig, "keep_checkpoints", type=positive)
    add_option(group, LoopConfig, "keep_best")
    add_option(group, LoopConfig, "early_stop_patience", type=non_negative)
    add_option(group, JobConfig, "checkpoint_writers")


def add_reliability_flags(group) -> None:
    """Restart budgets, watchdog, connect timeout, grace period."""
    for role in ("coordinator", "worker", "ps", "data_service"):
        add_option(group, RestartLimits, role, type=non_negative)
    add_option(group, RestartLimits, "refill_after",
               type=non_negative_float)
    add_option(group, SupervisorConfig, "restart_workers")
    add_option(group, JobConfig, "stall_timeout", type=non_negative_float)
    add_option(group, JobConfig, "connect_timeout", type=positive_float)
    add_option(group, JobConfig, "grace_period", type=non_negative_float)


def supervisor_config(args: argparse.Namespace):
    """The :class:`SupervisorConfig` of ``psrec train``'s arguments."""
    return option_values(args, SupervisorConfig,
                         limits=option_values(args, RestartLimits),
                         stall_timeout=args.stall_timeout or None,
                         grace_period=args.grace_period)
