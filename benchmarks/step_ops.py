"""Where a training step's time goes, op by op (the TensorFlow profiler).

``step_breakdown.py`` times cumulative sub-functions; this traces psrec's
own train function on the ``psrec bench`` workload (13 dense + 26
categorical features into one shared table of ``26 x buckets x dim``,
DCN-v2, Adagrad, batch 1024) with the TensorFlow profiler's host tracer
and sums the time of each op type over ``--steps`` steps: ms per step,
the op's executions per step and its share of the step's wall time. Op
times overlap where ops run in parallel, so the shares can add up to more
than 100%.

``--where one``: one process (the ``one-device`` strategy). ``--where ps``:
one closure on worker 0 of an in-process cluster (``--workers`` workers,
``--ps`` PS); the PS servers run in this process, so their ops (the
gathers and the sparse applies) are traced too.

    python benchmarks/step_ops.py --where one --rounds 3
    python benchmarks/step_ops.py --where ps --rounds 3 --json
    python benchmarks/step_ops.py --precision float32,mixed_bfloat16

``--precision`` takes several Keras policies: one trainer each, their
rounds interleaved, and the throughput ratio of each to the first per
round (the A/B of ``--mixed-precision``, bfloat16 towers on CPU).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import statistics
import sys
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _trainer(args, precision: str):
    """The bench workload's trainer at ``precision`` and a function running
    ``--steps`` steps once (returns their seconds when they are done)."""
    import tensorflow as tf
    from step_breakdown import bench_trainer

    from psrec.ps_cluster.training.step import make_train_function
    ps = args.where == "ps"
    strategy, trainer, dataset_fn = bench_trainer(
        args, ps, precision, getattr(args, "strategy", None))
    args.strategy = strategy  # one cluster per process
    train = make_train_function(strategy, trainer.step, args.steps)
    if not ps:
        iterator = iter(strategy.distribute_datasets_from_function(
            dataset_fn))
        return lambda: float(train(iterator)[2])
    coordinator = trainer.coordinator
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    def scheduled() -> float:
        value = coordinator.schedule(train, args=(iterator,))
        coordinator.join()  # one closure at a time
        return float(tf.nest.flatten(value.fetch())[2])
    return scheduled


def _op_times(logdir: str) -> dict[str, tuple[float, int]]:
    """Per op type: total milliseconds and executions in the trace."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    path = sorted(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True))[-1]
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    totals, counts = collections.Counter(), collections.Counter()
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        names = plane.event_metadata
        for line in plane.lines:
            for event in line.events:
                name = names[event.metadata_id].name
                # Executed ops are "node name:OpType"; function calls and
                # the runtime's own events ("ExecutorState::Process") are
                # left out.
                if (":" not in name or "::" in name
                        or name.startswith("__inference")):
                    continue
                kind = name.rsplit(":", 1)[-1]
                totals[kind] += event.duration_ps / 1e9
                counts[kind] += 1
    return {k: (totals[k], counts[k]) for k in totals}


def _profiled(run) -> tuple[float, dict]:
    """``run()``'s seconds and op times, traced by the profiler."""
    import tensorflow as tf
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(
            logdir, tf.profiler.experimental.ProfilerOptions(
                host_tracer_level=2))
        seconds = run()
        tf.profiler.experimental.stop()
        return seconds, _op_times(logdir)


def _summary(walls: list[float], ops: dict, rounds: int) -> dict:
    table = {}
    for kind, values in ops.items():
        values += [(0.0, 0.0, 0.0)] * (rounds - len(values))
        table[kind] = {
            "ms_per_step": round(statistics.median(v[0] for v in values), 2),
            "per_step": round(statistics.median(v[1] for v in values), 1),
            "share": round(statistics.median(v[2] for v in values), 3),
            "share_min": round(min(v[2] for v in values), 3),
            "share_max": round(max(v[2] for v in values), 3)}
    return {"step_ms": round(statistics.median(walls), 1),
            "step_ms_min": round(min(walls), 1),
            "step_ms_max": round(max(walls), 1),
            "ops": dict(sorted(table.items(),
                               key=lambda kv: -kv[1]["ms_per_step"]))}


def _rounds(args) -> dict:
    """Per precision, the step's wall time and op times over the rounds
    (precisions interleaved, the order rotating)."""
    precisions = args.precision.split(",")
    runs = {p: _trainer(args, p) for p in precisions}
    for run in runs.values():  # traced and warm
        run()
        run()
    walls = {p: [] for p in precisions}
    ops = {p: collections.defaultdict(list) for p in precisions}
    for index in range(args.rounds):
        shift = index % len(precisions)
        for precision in precisions[shift:] + precisions[:shift]:
            seconds, found = _profiled(runs[precision])
            wall = 1000 * seconds / args.steps
            walls[precision].append(wall)
            for kind, (ms, count) in found.items():
                ops[precision][kind].append(
                    (ms / args.steps, count / args.steps,
                     ms / args.steps / wall))
            print(f"  round {index + 1}/{args.rounds} {precision}: "
                  f"{wall:.1f} ms/step", file=sys.stderr, flush=True)
    result = {"where": args.where, "rounds": args.rounds,
              "steps": args.steps,
              "precisions": {p: _summary(walls[p], ops[p], args.rounds)
                             for p in precisions}}
    first = precisions[0]
    for other in precisions[1:]:  # throughput of other / first, per round
        ratios = [a / b for a, b in zip(walls[first], walls[other])]
        result[f"{other}/{first}"] = {
            "per_round": [round(r, 3) for r in ratios],
            "median": round(statistics.median(ratios), 3)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--where", choices=("one", "ps"), default="one")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ps", type=int, default=1)
    parser.add_argument("--buckets", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--model", default="dcn",
                        help="psrec's model (the bench workload's DCN-v2 "
                        "unless given)")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--precision", default="float32",
                        help="comma-separated Keras policies, each its own "
                        "trainer, interleaved (float32,mixed_bfloat16: the "
                        "A/B of --mixed-precision on CPU)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = _rounds(args)
    if args.json:
        print(json.dumps(result))
        return
    for precision, found in result["precisions"].items():
        print(f"{args.where}, {precision}: step {found['step_ms']} ms "
              f"[{found['step_ms_min']} to {found['step_ms_max']}], median "
              f"of {args.rounds} rounds of {args.steps} steps")
        print("| op | ms per step | runs per step | share of the step "
              "[min to max] |")
        print("|---|---|---|---|")
        for kind, row in list(found["ops"].items())[:args.top]:
            print(f"| {kind} | {row['ms_per_step']:.2f} | "
                  f"{row['per_step']:g} | {row['share']:.1%} "
                  f"[{row['share_min']:.1%} to {row['share_max']:.1%}] |")
    for key, value in result.items():
        if "/" in key:
            print(f"throughput {key}: per round {value['per_round']}, "
                  f"median {value['median']}")


if __name__ == "__main__":
    main()
