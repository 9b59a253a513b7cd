"""Training throughput of a dynamic table vs a hashed table of equal rows.

The ``psrec bench`` workload (13 dense + 26 categorical features, DCN-v2,
Adagrad, synthetic batches generated on the workers, in-process cluster)
with its one shared table either ``mode: hashed`` (``26 x buckets`` rows,
ids folded into each feature's range) or ``mode: dynamic`` with
``capacity = 26 x buckets`` (raw ids, admitted at the first sight,
maintenance every ``--maintenance-every`` steps). The synthetic ids of the
two runs are the same numbers, so the dynamic table ends up using about as
many rows as the hashed one has.

One run (prints a JSON line)::

    python benchmarks/dynamic_throughput.py run --mode dynamic --ps 2

A B A B rounds in one session (each run its own process; ``--python`` picks
another checkout's interpreter, e.g. a version before a change, so runs of
both interleave)::

    python benchmarks/dynamic_throughput.py rounds --rounds 2 \\
        --python .venv/bin/python --python ../old/.venv/bin/python

Ratios dynamic / hashed are taken within a round (absolute figures swing
on a shared machine), then their median.

Interleaved in ONE process (one in-process cluster, three trainers on it:
hashed, dynamic, and dynamic with the two-step lookup of before the fused
one -- ``DynamicTable.gathers_from`` answering False while its functions
are traced); each round trains every trainer ``--steps`` more steps, in an
order that rotates, so a burst of load elsewhere falls on all three::

    python benchmarks/dynamic_throughput.py interleaved --rounds 6 --steps 100
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time

_NUM_DENSE, _NUM_SPARSE = 13, 26


def _spec(mode: str, buckets: int, dim: int, maintenance_every: int):
    from psrec.features.spec.spec import FeatureSpec
    rows = buckets * _NUM_SPARSE
    table = {"name": "categorical", "dim": dim}
    if mode == "dynamic":
        table.update(mode="dynamic", capacity=rows, admit_threshold=1,
                     maintenance_every=maintenance_every)
        extra = {"dtype": "int64"}
    else:
        table["rows"] = rows
        extra = {"hash_buckets": buckets}
    return FeatureSpec.from_dict({
        "name": "bench", "label": {"name": "label"}, "tables": [table],
        "dense": [{"name": f"I{i}"} for i in range(_NUM_DENSE)],
        "categorical": [
            {"name": f"C{j}", "table": "categorical", **extra,
             **({"row_offset": j * buckets} if mode == "hashed" else {})}
            for j in range(_NUM_SPARSE)]})


def _dataset_fn(spec, batch_size: int, buckets: int):
    """``psrec bench``'s synthetic batches; feature ``j``'s ids are
    ``j * buckets + U[0, buckets)`` in both modes."""
    from psrec.launch.job.bench import synthetic_dataset_fn
    return synthetic_dataset_fn(
        spec, batch_size, True, buckets=buckets,
        offsets=[j * buckets for j in range(_NUM_SPARSE)])


def _timed_maintenance() -> list[float]:
    """Makes every maintenance add its seconds to the returned list (the
    join before it is not counted)."""
    from psrec.ps_cluster.training import maintenance as dynamic_maintenance
    seconds: list[float] = []
    call = dynamic_maintenance.Maintainer.__call__

    def timed(self, step: int) -> None:
        began = time.perf_counter()
        call(self, step)
        seconds.append(time.perf_counter() - began)

    dynamic_maintenance.Maintainer.__call__ = timed
    return seconds


def _cluster(args: argparse.Namespace):
    """The in-process cluster's strategy and the optimizers of every run."""
    from psrec.models.optim.config import OptimizerConfig
    from psrec.ps_cluster.cluster.in_process import in_process_cluster
    from psrec.ps_cluster.cluster.partition_config import PartitionConfig
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    strategy = build_ps_strategy(in_process_cluster(args.workers, args.ps),
                                 PartitionConfig())
    return strategy, OptimizerConfig(sparse="adagrad", dense="adagrad",
                                     sparse_lr=0.05, dense_lr=0.05,
                                     base_batch_size=args.batch_size,
                                     warmup_steps=0)


def _run(args: argparse.Namespace) -> dict:
    """One measured run: a warm-up, then ``--steps`` timed steps."""
    from psrec.runtime import configure_environment
    configure_environment()
    maintenance = _timed_maintenance()
    from psrec.data.input.config import InputConfig
    from psrec.models.ranking.config import model_config
    from psrec.ps_cluster.training.config import LoopConfig
    from psrec.ps_cluster.training.trainer import Trainer
    spec = _spec(args.mode, args.buckets, args.dim, args.maintenance_every)
    strategy, optimizer = _cluster(args)
    trainer = Trainer(strategy, spec, model_config("dcn"), optimizer,
                      InputConfig(batch_size=args.batch_size))
    dataset_fn = _dataset_fn(spec, args.batch_size, args.buckets)
    per = args.steps_per_closure
    trainer.train(dataset_fn, LoopConfig(steps=args.warmup,
                                         steps_per_closure=per,
                                         checkpoint_every=0))
    maintenance.clear()
    began = time.perf_counter()
    trainer.train(dataset_fn, LoopConfig(steps=args.warmup + args.steps,
                                         steps_per_closure=per,
                                         checkpoint_every=0))
    seconds = time.perf_counter() - began
    out = {"mode": args.mode, "ps": args.ps, "workers": args.workers,
           "buckets": args.buckets, "steps": args.steps,
           "seconds": round(seconds, 2),
           "maintenance_seconds": round(sum(maintenance), 2),
           "examples_per_sec": round(args.steps * args.batch_size / seconds,
                                     1)}
    tables = getattr(trainer.model.sparse_arch, "dynamic_tables", {})
    for table in tables.values():
        stats = table.stats()
        out.update(rows_used=stats["rows_used"], pending=stats["pending"])
    return out


def _rounds(args: argparse.Namespace) -> None:
    """A B A B: per round every interpreter runs hashed then dynamic."""
    pythons = args.python or [sys.executable]
    ratios: dict[str, list[float]] = {p: [] for p in pythons}
    common = ["--ps", str(args.ps), "--workers", str(args.workers),
              "--buckets", str(args.buckets), "--steps", str(args.steps),
              "--warmup", str(args.warmup),
              "--maintenance-every", str(args.maintenance_every)]
    for _ in range(args.rounds):
        for python in pythons:
            rates = {}
            for mode in ("hashed", "dynamic"):
                done = subprocess.run(
                    [python, __file__, "run", "--mode", mode, *common],
                    capture_output=True, text=True, check=False)
                lines = [x for x in done.stdout.splitlines()
                         if "examples_per_sec" in x]
                if done.returncode or not lines:
                    sys.exit(f"{python} {mode} failed:\n"
                             f"{done.stderr[-3000:]}")
                result = json.loads(lines[-1]) | {"python": python}
                print(json.dumps(result), flush=True)
                rates[mode] = result["examples_per_sec"]
            ratios[python].append(rates["dynamic"] / rates["hashed"])
    for python, values in ratios.items():
        print(json.dumps({"python": python, "dynamic/hashed": [
            round(v, 3) for v in values],
            "median": round(statistics.median(values), 3)}))


@contextlib.contextmanager
def _two_step():
    """Inside, dynamic tables look rows up in two steps (the map lookup's
    rows back on the worker, then the gather), as before the fused lookup:
    what a train function traced inside runs."""
    from psrec.models.dynamic.table import DynamicTable
    saved = DynamicTable.gathers_from
    DynamicTable.gathers_from = lambda self, variable: False
    try:
        yield
    finally:
        DynamicTable.gathers_from = saved


def _interleaved(args: argparse.Namespace) -> None:
    """hashed, dynamic (fused) and dynamic (two-step) trainers on one
    cluster, ``--steps`` steps each per round, the order rotating."""
    from psrec.runtime import configure_environment
    configure_environment()
    from psrec.data.input.config import InputConfig
    from psrec.models.ranking.config import model_config
    from psrec.ps_cluster.training.config import LoopConfig
    from psrec.ps_cluster.training.trainer import Trainer
    strategy, optimizer = _cluster(args)

    def loop(steps: int) -> LoopConfig:
        return LoopConfig(steps=steps, steps_per_closure=args.steps_per_closure,
                          checkpoint_every=0)

    runs = {}
    for name, mode in (("hashed", "hashed"), ("dynamic", "dynamic"),
                       ("two_step", "dynamic")):
        spec = _spec(mode, args.buckets, args.dim, args.maintenance_every)
        trainer = Trainer(strategy, spec, model_config("dcn"), optimizer,
                          InputConfig(batch_size=args.batch_size))
        dataset_fn = _dataset_fn(spec, args.batch_size, args.buckets)
        with _two_step() if name == "two_step" else contextlib.nullcontext():
            trainer.train(dataset_fn, loop(args.warmup))  # traced here
        runs[name] = (trainer, dataset_fn)
    seconds = {name: [] for name in runs}
    names = list(runs)
    for index in range(args.rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            trainer, dataset_fn = runs[name]
            began = time.perf_counter()
            trainer.train(dataset_fn, loop(args.warmup
                                           + (index + 1) * args.steps))
            seconds[name].append(time.perf_counter() - began)
        print(json.dumps({"round": index + 1, "examples_per_sec": {
            name: round(args.steps * args.batch_size / s[-1], 1)
            for name, s in seconds.items()}}), flush=True)

    def ratio(top: str, bottom: str) -> dict:
        values = [b / t for t, b in zip(seconds[top], seconds[bottom])]
        return {"per_round": [round(v, 3) for v in values],
                "median": round(statistics.median(values), 3),
                "min": round(min(values), 3), "max": round(max(values), 3)}
    print(json.dumps({"dynamic/hashed": ratio("dynamic", "hashed"),
                      "two_step/hashed": ratio("two_step", "hashed"),
                      "dynamic/two_step": ratio("dynamic", "two_step")}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("run", "rounds", "interleaved"))
    parser.add_argument("--mode", choices=("hashed", "dynamic"),
                        default="dynamic")
    parser.add_argument("--ps", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--buckets", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--steps-per-closure", type=int, default=10)
    parser.add_argument("--maintenance-every", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--python", action="append",
                        help="interpreter(s) to run (default: this one)")
    args = parser.parse_args()
    if args.what == "run":
        print(json.dumps(_run(args)), flush=True)
    elif args.what == "interleaved":
        _interleaved(args)
    else:
        _rounds(args)


if __name__ == "__main__":
    main()
