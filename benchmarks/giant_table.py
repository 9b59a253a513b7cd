"""Giant-table benchmark: peak memory of the PS processes, initialisation,
training, checkpoint save and restore of one N-row x 16 table.

Starts a local cluster (``psrec server`` processes via ``LocalCluster``:
``--ps`` PS and ``--workers`` workers on loopback, no network namespace, so
the ports are reachable from this host while it runs), builds psrec's own
``Trainer`` with one table of ``--rows`` rows x ``--dim`` (the Criteo layout:
26 features of ``rows / 26`` buckets, DCN-v2, Adagrad: table + accumulator
slot are the training state), trains ``--steps`` steps on synthetic batches
(``psrec bench``'s generator), saves a checkpoint, restores it (with the
by-value verification of every row) and verifies it once more on its own.

Prints per phase the peak RSS (``VmHWM`` of ``/proc/<pid>/status``) of each
PS process, of the coordinator (this process) and of the workers; the
training state bytes each PS holds, the ratio peak / state; init, train,
save, restore and verify seconds, checkpoint bytes and bytes/s. One JSON
line on stdout, a table on stderr.

``--old-init`` creates the tables the way psrec did before (the random
initializer's full value materialised on the PS) for a before/after in the
same setup. Before a large run check the memory: state = rows x dim x 4
bytes x 2 (table + Adagrad), per PS state / ps, plus the coordinator's copy
during save and restore (see docs/benchmarks.md).

    .venv/bin/python benchmarks/giant_table.py --rows 100000000 --ps 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from psrec.features.spec.columns import TABLE_DTYPES
from psrec.features.spec.columns import TABLE_OPTIMIZERS
from psrec.runtime import configure_environment


def _status(pid: int | str) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in bytes."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0]) * 1024
    return found


def _snapshot(roles: dict[str, int]) -> dict[str, dict[str, int]]:
    return {name: _status(pid) for name, pid in roles.items()}


def _state_bytes(checkpoint) -> dict[str, int]:
    """Bytes of every variable the checkpoint saves, by PS task (and
    ``other`` for the coordinator's own variables)."""
    from psrec.ps_cluster.checkpoint.verify import live_tensors
    per = {}
    for tensor in live_tensors(checkpoint).values():
        for variable, _ in tensor.shards:
            device = variable.device
            key = (f"ps{device.split('task:')[1].split('/')[0]}"
                   if "/job:ps/" in device else "other")
            per[key] = per.get(key, 0) + (
                variable.dtype.size * variable.shape.num_elements())
    return per


def _files_bytes(prefix: str) -> int:
    folder = Path(prefix).parent
    return sum(p.stat().st_size for p in folder.iterdir()
               if p.name.startswith(Path(prefix).name + "."))


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000_000,
                        help="table rows (rounded down to a multiple of 26)")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--ps", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--workdir", default=None,
                        help="checkpoint and log folder (default: a new "
                             "temporary folder, removed at the end)")
    parser.add_argument("--no-checkpoint", action="store_true",
                        help="skip save, restore and verify")
    parser.add_argument("--checkpoint-writers",
                        choices=("auto", "tasks", "coordinator"),
                        default="auto",
                        help="psrec train's option: tasks (each PS writes, "
                             "reads and checks its own shards), coordinator "
                             "(every tensor goes through the coordinator, "
                             "which writes them all: about 2x the state "
                             "there), auto (tasks here: a local cluster)")
    parser.add_argument("--coordinator-writes", dest="checkpoint_writers",
                        action="store_const", const="coordinator",
                        help="= --checkpoint-writers coordinator (the "
                             "README's earlier commands)")
    parser.add_argument("--table-dtype", default="float32",
                        choices=tuple(TABLE_DTYPES),
                        help="the table's dtype (psrec train --table-dtype)")
    parser.add_argument("--optimizer", default="adagrad",
                        choices=TABLE_OPTIMIZERS,
                        help="the table's optimizer (--sparse-optimizer)")
    parser.add_argument("--old-init", action="store_true",
                        help="initialise tables as before (full random "
                             "value materialised on the PS)")
    return parser.parse_args(argv)


def _phases(args: argparse.Namespace, workdir: Path, roles: dict,
            local) -> dict:
    import tensorflow as tf

    from psrec.data.input.config import InputConfig
    from psrec.features.spec.presets import criteo
    from psrec.launch.job import bench
    from psrec.models.embedding import sparse_arch as embedding
    from psrec.models.optim.config import OptimizerConfig
    from psrec.models.ranking.config import model_config
    from psrec.ps_cluster.checkpoint.keeper import CheckpointKeeper
    from psrec.ps_cluster.checkpoint.keeper import compare_with_checkpoint
    from psrec.ps_cluster.cluster.partition_config import PartitionConfig
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    from psrec.ps_cluster.planner.plan import plan_partition
    from psrec.ps_cluster.training.config import LoopConfig
    from psrec.ps_cluster.training.trainer import Trainer
    from psrec.ps_cluster.training.trainer import table_checkpoint_keys

    if args.old_init:
        embedding.fills_in_blocks = lambda initializer: False
    spec = criteo(buckets=args.rows // 26, dim=args.dim).with_table_dtype(
        args.table_dtype)
    optimizer = OptimizerConfig(sparse=args.optimizer, dense="adagrad",
                                sparse_lr=0.05, dense_lr=0.05,
                                base_batch_size=args.batch_size,
                                warmup_steps=0)
    strategy = build_ps_strategy(local.cluster,
                                 PartitionConfig(kind="fixed"))
    out = {"rows": spec.tables[0].rows, "dim": args.dim, "ps": args.ps,
           "workers": args.workers, "old_init": args.old_init,
           "table_dtype": args.table_dtype, "optimizer": args.optimizer,
           "checkpoint_writers": args.checkpoint_writers,
           "memory": {"idle": _snapshot(roles)}}
    began = time.perf_counter()
    trainer = Trainer(strategy, spec, model_config("dcn"), optimizer,
                      InputConfig(batch_size=args.batch_size))
    out["init_s"] = round(time.perf_counter() - began, 2)
    out["memory"]["init"] = _snapshot(roles)
    out["state_bytes"] = _state_bytes(trainer.checkpoint)
    planned = plan_partition(spec, model_config("dcn"), args.ps, optimizer,
                             PartitionConfig(kind="fixed"),
                             dense_parameters=0)
    out["planned_table_bytes"] = {  # tables and slots, per PS
        f"ps{ps}": sum(s.total_bytes for s in planned.shards_on(ps))
        for ps in range(args.ps)}

    dataset_fn = bench.synthetic_dataset_fn(
        spec, args.batch_size, True)
    began = time.perf_counter()
    trainer.train(dataset_fn, LoopConfig(steps=args.steps,
                                         steps_per_closure=10,
                                         checkpoint_every=0))
    seconds = time.perf_counter() - began
    out["train_s"] = round(seconds, 2)
    out["examples_per_sec"] = round(
        args.steps * args.batch_size * args.workers / seconds, 1)
    out["memory"]["train"] = _snapshot(roles)
    if args.no_checkpoint:
        return out
    began = time.perf_counter()  # with the probe of the folder (tasks)
    keeper = CheckpointKeeper(
        workdir / "checkpoints", trainer.checkpoint,
        optimizers={"sparse_optimizer": trainer.sparse_optimizer,
                    "dense_optimizer": trainer.dense_optimizer},
        tables=table_checkpoint_keys(trainer.model), max_to_keep=1,
        strategy=strategy, writers=args.checkpoint_writers)
    out["keeper_s"] = round(time.perf_counter() - began, 3)
    out["tasks_write"] = keeper.tasks_write
    began = time.perf_counter()
    path = keeper.save(args.steps)
    out["save_s"] = round(time.perf_counter() - began, 2)
    out["checkpoint_bytes"] = _files_bytes(path)
    out["memory"]["save"] = _snapshot(roles)
    began = time.perf_counter()
    keeper.restore(path)
    out["restore_s"] = round(time.perf_counter() - began, 2)
    out["memory"]["restore"] = _snapshot(roles)
    began = time.perf_counter()
    bad = compare_with_checkpoint(trainer.checkpoint, path)
    out["verify_s"] = round(time.perf_counter() - began, 2)
    out["verify_differs"] = bad
    out["memory"]["verify"] = _snapshot(roles)
    for phase in ("save", "restore", "verify"):
        out[f"{phase}_bytes_per_s"] = round(
            out["checkpoint_bytes"] / max(out[f"{phase}_s"], 1e-9))
    del tf
    return out


def _ratios(out: dict) -> dict:
    final = list(out["memory"].values())[-1]
    ratios = {}
    for name, state in out["state_bytes"].items():
        if name in final and state:
            ratios[name] = round(final[name]["VmHWM"] / state, 3)
            ratios[name + "_after_init"] = round(
                out["memory"]["init"][name]["VmHWM"] / state, 3)
            ratios[name + "_over_idle"] = round(
                (final[name]["VmHWM"] - out["memory"]["idle"][name]["VmRSS"])
                / state, 3)
    return ratios


def _table(out: dict) -> str:
    gib = 2 ** 30
    lines = [f"rows {out['rows']:,} x {out['dim']}, {out['ps']} PS, "
             f"{out['workers']} worker(s), {out['table_dtype']} table, "
             f"{out['optimizer']}, old_init={out['old_init']}, "
             f"checkpoint writers {out['checkpoint_writers']}",
             "peak RSS (VmHWM, GiB) after each phase:",
             "role          idle  init  train  save  restore  verify"]
    for role in out["memory"]["idle"]:
        cells = [out["memory"][p][role]["VmHWM"] / gib
                 for p in ("idle", "init", "train", "save", "restore",
                           "verify") if p in out["memory"]]
        lines.append(f"{role:<12}" + "".join(f"{c:6.2f}" for c in cells))
    state = {k: round(v / gib, 3) for k, v in out["state_bytes"].items()}
    planned = {k: round(v / gib, 3)
               for k, v in out["planned_table_bytes"].items()}
    lines.append(f"training state (GiB): {state}; planned tables + slots "
                 f"(GiB): {planned}; ratios {out['ratios']}")
    lines.append(f"init {out['init_s']} s; train {out['train_s']} s "
                 f"({out['examples_per_sec']:,} ex/s)")
    if "save_s" not in out:
        return "\n".join(lines)
    lines.append(
        f"save {out['save_s']} s "
        f"({out['save_bytes_per_s'] / 2**20:,.0f} MiB/s); restore "
        f"{out['restore_s']} s incl. verify; verify {out['verify_s']} s "
        f"({out['verify_bytes_per_s'] / 2**20:,.0f} MiB/s); checkpoint "
        f"{out['checkpoint_bytes'] / gib:.2f} GiB")
    return "\n".join(lines)


def _check_memory(args: argparse.Namespace) -> None:
    """Refuses a run the free memory cannot hold: the state, every
    process's TensorFlow (~0.6 GiB each) and, with ``--checkpoint-writers
    coordinator``, the coordinator's copy of the state while TensorFlow
    saves (~2x)."""
    from psrec.models.optim.config import row_bytes
    state = (args.rows // 26) * 26 * row_bytes(
        args.optimizer, args.dim, 2 if args.table_dtype != "float32" else 4)
    coordinator = args.checkpoint_writers == "coordinator"
    need = state * (3.1 if coordinator else 1.1) + (
        args.ps + args.workers + 1) * 0.6 * 2**30
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            available = int(line.split()[1]) * 1024
            if need > available:
                sys.exit(f"giant_table: needs about {need / 2**30:.1f} GiB, "
                         f"{available / 2**30:.1f} GiB available; use fewer "
                         "--rows or --no-checkpoint.")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    _check_memory(args)
    configure_environment()
    from psrec.launch.local.cluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="psrec-giant-",
                                     dir=args.workdir) as tmp:
        workdir = Path(tmp)
        with LocalCluster(args.workers, args.ps, log_dir=workdir / "logs",
                          allow_exposed=True) as local:
            if local.exposed:
                print(local.exposed_warning(), file=sys.stderr)
            roles = {"coordinator": os.getpid()}
            for task, process in sorted(local.processes.items(),
                                        key=lambda item: item[0].name):
                roles[f"{task.type}{task.index}"] = process.pid
            out = _phases(args, workdir, roles, local)
        out["ratios"] = _ratios(out)
    print(_table(out), file=sys.stderr)
    print(json.dumps(out), flush=True)
    return 1 if out.get("verify_differs") else 0


if __name__ == "__main__":
    sys.exit(main())
