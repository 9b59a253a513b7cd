"""Training-side ``psrec`` commands: train, server, eval, export, bench."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from psrec.launch.argtypes import non_negative
from psrec.launch.argtypes import positive
from psrec.launch.argtypes import positive_fraction
from psrec.launch.cli import UsageError
from psrec.models.config import MODEL_PRESETS

EXIT_OK = 0
MODEL_NAMES = tuple(MODEL_PRESETS)


def _existing_cluster(args: argparse.Namespace):
    """The cluster to coordinate, from --cluster or TF_CONFIG; None means
    start a local one."""
    from psrec.ps_cluster.spec import REMOTE_WARNING
    from psrec.ps_cluster.spec import ClusterSpec
    from psrec.ps_cluster.spec import TFConfig
    if args.cluster:
        data = json.loads(Path(args.cluster).read_text())
        config = (TFConfig.from_dict(data) if "cluster" in data
                  else TFConfig(ClusterSpec.from_dict(data), None))
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


def _job_config(args: argparse.Namespace):
    from psrec.data.dataset import InputConfig
    from psrec.features.presets import resolve_spec
    from psrec.launch.job import JobConfig
    from psrec.launch.job import SyntheticData
    from psrec.models.config import model_config
    from psrec.models.optim import OptimizerConfig
    from psrec.ps_cluster.partitioning import PartitionConfig
    from psrec.ps_cluster.train_loop import LoopConfig
    overrides = {}
    if args.cross_low_rank:
        overrides["cross_low_rank"] = args.cross_low_rank
    return JobConfig(
        workdir=Path(args.workdir), spec=resolve_spec(args.spec),
        model_name=args.model, model=model_config(args.model, **overrides),
        optimizer=OptimizerConfig(
            sparse_lr=args.sparse_lr, dense_lr=args.dense_lr,
            base_batch_size=args.base_batch_size,
            warmup_steps=args.warmup_steps),
        input=InputConfig(batch_size=args.batch_size, seed=args.seed),
        loop=LoopConfig(steps=args.steps,
                        steps_per_closure=args.steps_per_closure,
                        log_every=args.log_every, eval_every=args.eval_every,
                        checkpoint_every=args.checkpoint_every),
        partition=PartitionConfig(kind=args.partitioner,
                                  shards=args.table_shards),
        data=Path(args.data) if args.data else None,
        synthetic=SyntheticData(rows=args.synthetic_rows, seed=args.seed),
        workers=args.workers, ps=args.ps, export=not args.no_export,
        verify_checksums=not args.no_verify_checksums,
        max_corrupt_records=args.max_corrupt_records,
        keep_checkpoints=args.keep_checkpoints,
        stall_timeout=args.stall_timeout or None)


def _cmd_train_mirrored(args: argparse.Namespace) -> int:
    """``--strategy mirrored|multi-worker-mirrored`` (launch.mirrored_job)."""
    from psrec.launch.mirrored_job import MirroredOptions
    from psrec.launch.mirrored_job import run_mirrored_job
    if args.cluster:
        raise UsageError(
            f"`--cluster` is for --strategy ps; with --strategy "
            f"{args.strategy} each worker reads its own TF_CONFIG (see "
            "`psrec tf-config`), and without TF_CONFIG psrec starts "
            "--workers local workers.")
    options = MirroredOptions(
        strategy=args.strategy, collective=args.collective,
        sync_batch_norm=args.sync_batch_norm,
        mixed_precision=args.mixed_precision,
        grad_accum_steps=args.grad_accum_steps,
        memory_fraction=args.memory_fraction,
        cpu_replicas=args.cpu_replicas, allow_remote=args.allow_remote)
    worker = args.strategy == "multi-worker-mirrored" and bool(
        os.environ.get("TF_CONFIG", "").strip())
    summary = run_mirrored_job(_job_config(args), options)
    if summary is not None:
        print(summary.text(), flush=True)
    if worker:  # MultiWorkerMirroredStrategy's server cannot be shut down
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_OK)
    return EXIT_OK


def _cmd_advise(args: argparse.Namespace) -> int:
    from psrec.features.presets import resolve_spec
    from psrec.ps_cluster.advise import advise
    advice = advise(resolve_spec(args.spec), args.model,
                    batch_size=args.batch_size,
                    memory_fraction=args.memory_fraction,
                    repeats=args.repeats,
                    log=None if args.json else (
                        lambda text: print(text, file=sys.stderr,
                                           flush=True)))
    if args.json:
        print(json.dumps(advice.to_dict()), flush=True)
    else:
        print(advice.text(), flush=True)
    return EXIT_OK


def _cmd_train(args: argparse.Namespace) -> int:
    from psrec.launch.job import prepare_data
    from psrec.launch.job import record_verified
    from psrec.launch.job import run_job
    from psrec.launch.local import LocalCluster
    from psrec.launch.supervisor import SupervisorConfig
    from psrec.launch.supervisor import supervise
    if getattr(args, "strategy", "ps") != "ps":
        return _cmd_train_mirrored(args)
    cluster = _existing_cluster(args)
    config = _job_config(args)
    if cluster is not None:  # coordinate it; an orchestrator restarts us
        print(run_job(config, cluster, data_verified=args.data_verified)
              .text(), flush=True)
        return EXIT_OK
    # Local: check the data once, before any server starts, then supervise
    # the roles and the coordinator (which reruns this command with
    # --cluster and --data-verified, after every restart too).
    record_verified(config, prepare_data(config))
    local = LocalCluster(config.workers, config.ps,
                         log_dir=Path(config.workdir) / "logs")
    return supervise(local, args.argv + ["--data-verified"], SupervisorConfig(
        max_restarts=args.max_restarts,
        restart_workers=not args.no_restart_workers), config.workdir)


def _cmd_server(args: argparse.Namespace) -> int:
    from psrec.ps_cluster.server import start_server
    from psrec.ps_cluster.spec import ClusterSpec
    from psrec.ps_cluster.spec import TaskInfo
    from psrec.ps_cluster.spec import TFConfig
    if args.cluster_json or args.cluster:
        text = args.cluster_json or Path(args.cluster).read_text()
        data = json.loads(text)
        cluster = ClusterSpec.from_dict(data.get("cluster", data))
        if args.role is None or args.index is None:
            raise UsageError("give --role and --index with a cluster spec.")
        task = TaskInfo(args.role, args.index)
    else:
        config = TFConfig.from_env()
        if config is None or config.task is None:
            raise UsageError(
                "no task to run: set TF_CONFIG (see `psrec tf-config`) or give "
                "--cluster FILE --role ps|worker --index N.")
        cluster, task = config.cluster, config.task
    cluster.validate(strategy="ps", allow_remote=args.allow_remote)
    server = start_server(cluster, task)
    print(f"psrec server: {task.type}:{task.index} serving "
          f"{cluster.address_of(task)} (pid {os.getpid()})", flush=True)
    server.join()
    return EXIT_OK


def _cmd_export(args: argparse.Namespace) -> int:
    from psrec.launch.exporting import export_checkpoint
    print(export_checkpoint(args.checkpoint_dir, args.out))
    return EXIT_OK


def _cmd_eval(args: argparse.Namespace) -> int:
    from psrec.data.manifest import Manifest
    from psrec.launch.exporting import evaluate_checkpoint
    result = evaluate_checkpoint(args.checkpoint_dir, Manifest.load(args.data),
                                 split=args.split)
    print(result.summary())
    return EXIT_OK


def _cmd_bench(args: argparse.Namespace) -> int:
    from psrec.launch.bench import BenchConfig
    from psrec.launch.bench import run_bench
    result = run_bench(BenchConfig(
        model=args.model, workers=args.workers, ps=args.ps,
        batch_size=args.batch_size, buckets=args.buckets, dim=args.dim,
        steps=args.steps, steps_per_closure=args.steps_per_closure,
        single_process=args.single_process))
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        print("\n".join(f"{k}: {v}" for k, v in result.items()), flush=True)
    # In-process gRPC servers cannot be shut down; leave without waiting.
    sys.stdout.flush()
    os._exit(EXIT_OK)


def _add_workload_flags(p: argparse.ArgumentParser, steps: int) -> None:
    """Model, cluster shape and step flags shared by train and bench."""
    p.add_argument("--model", choices=MODEL_NAMES, default="dcn")
    p.add_argument("--workers", type=positive, default=2)
    p.add_argument("--ps", type=positive, default=1)
    p.add_argument("--steps", type=positive, default=steps)
    p.add_argument("--steps-per-closure", type=positive, default=10)
    p.add_argument("--batch-size", type=positive, default=1024)


def _add_cluster_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-remote", action="store_true",
                   help="permit non-loopback hosts; TF gRPC servers accept "
                   "unauthenticated, unencrypted connections on all "
                   "interfaces: isolated networks only")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Registers the training-side sub-commands."""

    p = sub.add_parser("train", help="train on a local or existing PS cluster")
    p.add_argument("--workdir", default="runs/default")
    p.add_argument("--spec", default="criteo",
                   help="preset (criteo, movielens) or spec file")
    p.add_argument("--data", default=None,
                   help="manifest of converted data (default: generate the "
                   "embedded synthetic data)")
    p.add_argument("--synthetic-rows", type=positive, default=250_000)
    _add_workload_flags(p, steps=400)
    p.add_argument("--cross-low-rank", type=positive, default=None)
    p.add_argument("--cluster", default=None,
                   help="coordinate an existing cluster (JSON cluster spec or "
                   "TF_CONFIG file); TF_CONFIG naming this task chief also "
                   "does")
    p.add_argument("--base-batch-size", type=positive, default=1024)
    p.add_argument("--sparse-lr", type=float, default=0.05)
    p.add_argument("--dense-lr", type=float, default=0.001)
    p.add_argument("--warmup-steps", type=non_negative, default=100)
    p.add_argument("--eval-every", type=non_negative, default=0)
    p.add_argument("--checkpoint-every", type=non_negative, default=200)
    p.add_argument("--log-every", type=positive, default=50)
    p.add_argument("--partitioner", choices=("min-size", "fixed", "max-size"),
                   default="min-size")
    p.add_argument("--table-shards", type=positive, default=None,
                   help="shards per table (default: one per PS task)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-export", action="store_true")
    p.add_argument("--max-restarts", type=non_negative, default=3,
                   help="restarts of workers/PS/coordinator allowed (local)")
    p.add_argument("--no-restart-workers", action="store_true",
                   help="keep training on the remaining workers instead")
    p.add_argument("--stall-timeout", type=float, default=900.0,
                   help="seconds without progress before the watchdog dumps "
                   "stacks and exits retryable (138); 0 disables")
    p.add_argument("--max-corrupt-records", type=non_negative, default=0,
                   help="skip up to N corrupted records (counted, reported); "
                   "default: refuse corrupted data")
    p.add_argument("--keep-checkpoints", type=positive, default=3)
    p.add_argument("--data-verified", action="store_true",
                   help=argparse.SUPPRESS)  # set by the supervisor
    p.add_argument("--no-verify-checksums", action="store_true",
                   help="check shard presence and size but not sha256")
    p.add_argument("--strategy",
                   choices=("ps", "mirrored", "multi-worker-mirrored"),
                   default="ps",
                   help="ps: parameter servers (tables sharded); mirrored: "
                   "all local GPUs/CPU replicas, all-reduce; "
                   "multi-worker-mirrored: workers from TF_CONFIG (or "
                   "--workers local ones); see `psrec advise`")
    p.add_argument("--collective", choices=("auto", "ring", "nccl"),
                   default="auto",
                   help="all-reduce implementation (mirrored strategies)")
    p.add_argument("--sync-batch-norm", action="store_true",
                   help="batch norm in the MLP towers with statistics "
                   "all-reduced across replicas (mirrored strategies)")
    p.add_argument("--mixed-precision", action="store_true",
                   help="mixed_float16 on GPU, mixed_bfloat16 on CPU; "
                   "float32 logits and loss (mirrored strategies)")
    p.add_argument("--grad-accum-steps", type=positive, default=1,
                   help="micro-batches of --batch-size per update "
                   "(mirrored strategies)")
    p.add_argument("--memory-fraction", type=positive_fraction, default=0.5,
                   help="size guard: replicated tables + optimizer slots "
                   "may use this share of one device's memory")
    p.add_argument("--cpu-replicas", type=positive, default=None,
                   help="--strategy mirrored without GPUs: split the CPU "
                   "into N logical devices (N replicas)")
    _add_cluster_flags(p)
    p.set_defaults(run=_cmd_train)

    p = sub.add_parser("advise",
                       help="measure compute vs all-reduce vs PS round trip "
                       "and recommend a strategy")
    p.add_argument("--spec", default="criteo",
                   help="preset (criteo, movielens) or spec file")
    p.add_argument("--model", choices=MODEL_NAMES, default="dcn")
    p.add_argument("--batch-size", type=positive, default=1024,
                   help="rows of one replica's (worker's) step")
    p.add_argument("--memory-fraction", type=positive_fraction, default=0.5)
    p.add_argument("--repeats", type=positive, default=5)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_cmd_advise)

    p = sub.add_parser("server", help="run one PS or worker role (blocks)")
    p.add_argument("--cluster", default=None, help="cluster spec JSON file")
    p.add_argument("--cluster-json", default=None, help=argparse.SUPPRESS)
    p.add_argument("--role", choices=("ps", "worker"), default=None)
    p.add_argument("--index", type=int, default=None)
    _add_cluster_flags(p)
    p.set_defaults(run=_cmd_server)

    p = sub.add_parser("export", help="checkpoint dir -> serving SavedModel")
    p.add_argument("checkpoint_dir")
    p.add_argument("--out", required=True)
    p.set_defaults(run=_cmd_export)

    p = sub.add_parser("eval", help="AUC/logloss of a checkpoint")
    p.add_argument("checkpoint_dir")
    p.add_argument("--data", required=True, help="manifest of converted data")
    p.add_argument("--split", choices=("train", "eval"), default="eval")
    p.set_defaults(run=_cmd_eval)

    p = sub.add_parser("bench", help="training throughput (examples/s)")
    _add_workload_flags(p, steps=300)
    p.add_argument("--buckets", type=positive, default=100_000)
    p.add_argument("--dim", type=positive, default=16)
    p.add_argument("--single-process", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_cmd_bench)

