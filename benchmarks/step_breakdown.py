"""Where a training step's time goes: one process and a PS worker.

The ``psrec bench`` workload (13 dense + 26 categorical features into one
shared table of ``26 x buckets x dim``, DCN-v2 2 cross layers + MLP
256-128-1, Adagrad, batch 1024, synthetic batches made by tf.data) timed
as cumulative sub-functions. Each stage is one ``tf.function(iterator)``
running ``--steps`` iterations of (next batch, then the stage's work, under
``strategy.run``) and timing itself with ``tf.timestamp`` where it runs:

=================  =====================================================
stage              work per iteration
=================  =====================================================
input              the next batch (generated and prefetched by tf.data)
dedupe             + ``tf.unique`` of the batch's 26 x 1024 ids
lookup             + the embedding lookups (dedupe, gather, split)
forward_backward   + the whole forward pass and the gradients
sparse_apply       + the table optimizer's update
dense_apply        + the dense optimizer's update
step_no_guard      psrec's train function with a step that applies every
                   update unchecked (+ the loop's loss and row counts)
step               psrec's train function and step (+ the non-finite guard)
step_old_guard     the same with the per-gradient check of before
dense_only         (one process) the same towers alone on random inputs
check_old/new      (one process) the guard's check alone, on one step's
                   gradients: the old per-gradient one and the new one
=================  =====================================================

The pieces are differences of successive stages (``lookup - dedupe`` is
the lookups, ``step - step_no_guard`` the guard), taken within each repeat
and then their median. One process uses the ``one-device`` strategy; the
PS worker is one closure at a time on worker 0 of an in-process cluster of
``--workers`` workers and ``--ps`` PS (as ``psrec bench``), so its lookups
and applies include their round trips: "RPC wait" is that piece on the PS
worker minus the same piece in one process.

Stages run interleaved, ``--repeats`` rounds (the order rotates every
round); each figure is the median over rounds, with the spread (min-max).
The guard A/B (old per-gradient check vs the one-scalar check) is the
median over rounds of ``step_old_guard / step``; the dense-only ceiling is
the median of ``dense_only / step`` in throughput.

    python benchmarks/step_breakdown.py                  # both, table
    python benchmarks/step_breakdown.py --only one --repeats 7 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

STAGES = ("input", "dedupe", "lookup", "forward_backward", "sparse_apply",
          "dense_apply", "step_no_guard", "step", "step_old_guard")
PIECES = (  # (row, stage, previous stage)
    ("input (next batch)", "input", None),
    ("id de-duplication", "dedupe", "input"),
    ("lookups (gather, split)", "lookup", "dedupe"),
    ("dense forward/backward (+ lookup grads)", "forward_backward", "lookup"),
    ("sparse apply", "sparse_apply", "forward_backward"),
    ("dense apply", "dense_apply", "sparse_apply"),
    ("train loop bookkeeping", "step_no_guard", "dense_apply"),
    ("non-finite guard (now)", "step", "step_no_guard"),
    ("non-finite guard (before)", "step_old_guard", "step_no_guard"),
)


def old_finite_flag(grads, loss=None):
    """The guard's check before issue 22: is_finite + reduce_all per
    gradient, and the loss apart (kept here for the A/B)."""
    import tensorflow as tf
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(
        g.values if isinstance(g, tf.IndexedSlices) else g))
        for g in grads if g is not None])
    if loss is not None:
        finite = tf.logical_and(finite, tf.math.is_finite(loss))
    return finite


def _old_guard_step(trainer):
    """A second ``TrainStep`` on the same model and optimizers whose
    functions are traced with the old check."""
    from psrec.ps_cluster.training import step as step_module
    new = trainer.step
    old = step_module.TrainStep(new.model, new.sparse_optimizer,
                                new.dense_optimizer, new.label,
                                loss_scale=new.loss_scale,
                                prepare_table_grads=new._prepare)  # noqa: SLF001

    def call(batches):
        saved = step_module.finite_flag
        step_module.finite_flag = old_finite_flag
        try:  # runs while the function is traced
            return old(batches)
        finally:
            step_module.finite_flag = saved
    return call


def _unguarded_step(trainer):
    """A ``TrainStep`` on the same model and optimizers that applies every
    update unchecked (what the guard costs is ``step - step_no_guard``)."""
    import tensorflow as tf

    from psrec.ps_cluster.training.step import TrainStep

    class Unguarded(TrainStep):
        def _apply_if_finite(self, table_grads, dense_grads, tables, dense,
                             loss):
            ps = isinstance(tf.distribute.get_strategy(),
                            tf.distribute.ParameterServerStrategy)
            if not ps:
                table_grads, dense_grads = tf.distribute.get_replica_context(
                ).all_reduce("SUM", [table_grads, dense_grads])
            self.sparse_optimizer.apply_gradients(
                zip(table_grads, tables), experimental_aggregate_gradients=ps)
            self.dense_optimizer.apply_gradients(
                zip(dense_grads, dense), experimental_aggregate_gradients=ps)
            return tf.constant(True)

    new = trainer.step
    return Unguarded(new.model, new.sparse_optimizer, new.dense_optimizer,
                     new.label, prepare_table_grads=new._prepare)  # noqa: SLF001


def _stage_functions(strategy, trainer, steps: int,
                     wanted: tuple[str, ...]) -> dict:
    import tensorflow as tf

    from psrec.ps_cluster.training.step import make_train_function
    model, step = trainer.model, trainer.step
    tables, dense = model.embedding_variables(), model.dense_variables()
    names = [f.name for f in trainer.spec.categorical]
    label = step.label
    ps = isinstance(strategy, tf.distribute.ParameterServerStrategy)

    def grads_of(batch):
        with tf.GradientTape() as tape:
            loss = step.batch_loss(batch)
        grads = tape.gradient(loss, tables + dense)
        return loss, grads[:len(tables)], grads[len(tables):]

    def forced(grads):
        return [g.values if isinstance(g, tf.IndexedSlices) else g
                for g in grads if g is not None]

    def work(stage):
        def run(batch):
            if stage == "input":
                return tf.reduce_sum(batch[label])
            if stage == "dedupe":
                ids = tf.concat([tf.reshape(batch[n], [-1]) for n in names],
                                0)
                return tf.cast(tf.size(tf.unique(ids)[0]), tf.float32)
            if stage == "lookup":
                embeddings, _ = model.sparse_arch(batch)
                return tf.add_n([tf.reduce_sum(e[:1]) for e in embeddings])
            loss, table_grads, dense_grads = grads_of(batch)
            ops = forced(table_grads + dense_grads)
            if stage in ("sparse_apply", "dense_apply"):
                if not ps:  # as TrainStep: all-reduced, then applied
                    context = tf.distribute.get_replica_context()
                    table_grads, dense_grads = context.all_reduce(
                        "SUM", [table_grads, dense_grads])
                ops = [step.sparse_optimizer.apply_gradients(
                    zip(table_grads, tables),
                    experimental_aggregate_gradients=ps)]
            if stage == "dense_apply":
                ops.append(step.dense_optimizer.apply_gradients(
                    zip(dense_grads, dense),
                    experimental_aggregate_gradients=ps))
            with tf.control_dependencies(ops):
                return tf.identity(loss)
        return run

    def looped(stage):
        body = work(stage)

        @tf.function
        def function(iterator):
            began = tf.timestamp()
            with tf.control_dependencies([began]):
                total = tf.constant(0.0)
            for _ in tf.range(steps):
                value = strategy.run(body, args=(next(iterator),))
                total += strategy.reduce("SUM", value, axis=None)
            with tf.control_dependencies([total]):
                return tf.timestamp() - began
        return function

    functions = {stage: looped(stage) for stage in STAGES[:6]
                 if stage in wanted}
    for stage, one_step in (("step", step),
                            ("step_no_guard", _unguarded_step(trainer)),
                            ("step_old_guard", _old_guard_step(trainer))):
        if stage in wanted:
            functions[stage] = _seconds_of(make_train_function(
                strategy, one_step, steps))
    return functions


def _check_functions(strategy, trainer, steps: int, iterator) -> dict:
    """The guard's check alone, old and new, ``steps`` times on one
    step's gradients and loss (computed once)."""
    import tensorflow as tf

    from psrec.ps_cluster.training.step import finite_flag
    model, step = trainer.model, trainer.step
    variables = model.embedding_variables() + model.dense_variables()

    @tf.function
    def gradients(iterator):
        def run(batch):
            with tf.GradientTape() as tape:
                loss = step.batch_loss(batch)
            return loss, tape.gradient(loss, variables)
        return strategy.run(run, args=(next(iterator),))

    loss, grads = gradients(iterator)

    def looped(flag):
        @tf.function
        def function():
            began = tf.timestamp()
            with tf.control_dependencies([began]):
                finite = tf.constant(True)
            for i in tf.range(steps):  # the loss moves: nothing is hoisted
                finite = tf.logical_and(finite, flag(
                    grads, loss + tf.cast(i, tf.float32)))
            with tf.control_dependencies([finite]):
                return tf.timestamp() - began
        return lambda: float(function())
    return {"check_old": looped(old_finite_flag),
            "check_new": looped(finite_flag)}


def _seconds_of(train):
    import tensorflow as tf

    @tf.function
    def function(iterator):
        return train(iterator)[2]  # seconds, measured where it ran
    return function


def _dense_only(steps: int, batch: int):
    """``../shared/bench/dense_only.py`` fp32 (the same DCN-v2 + MLP towers
    on 429 random inputs, Adagrad), timed like the stages."""
    import tensorflow as tf
    import tensorflow_recommenders as tfrs
    import tf_keras
    cross = [tfrs.layers.dcn.Cross() for _ in range(2)]
    mlp = tf_keras.Sequential([
        tf_keras.layers.Dense(256, activation="relu"),
        tf_keras.layers.Dense(128, activation="relu"),
        tf_keras.layers.Dense(1)])
    x0 = tf.random.uniform([batch, 429])
    y = tf.zeros([batch])
    optimizer = tf_keras.optimizers.legacy.Adagrad(0.05)

    def one():
        with tf.GradientTape() as tape:
            x = x0
            for layer in cross:
                x = layer(x0, x)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                y, tf.squeeze(mlp(x), -1)))
        variables = ([v for c in cross for v in c.trainable_variables]
                     + mlp.trainable_variables)
        optimizer.apply_gradients(zip(tape.gradient(loss, variables),
                                      variables))
        return loss

    @tf.function
    def function(_iterator=None):
        began = tf.timestamp()
        with tf.control_dependencies([began]):
            total = tf.constant(0.0)
        for _ in tf.range(steps):
            total += one()
        with tf.control_dependencies([total]):
            return tf.timestamp() - began
    return function


def _rounds(run_stage: dict, repeats: int, steps: int) -> dict:
    """Per stage, the ms per step of every round (stages interleaved, the
    order rotated each round); one warm-up call each first."""
    order = list(run_stage)
    for name in order:
        run_stage[name]()
    times: dict[str, list[float]] = {name: [] for name in order}
    for index in range(repeats):
        shift = index % len(order)
        for name in order[shift:] + order[:shift]:
            times[name].append(1000 * run_stage[name]() / steps)
        print(f"  round {index + 1}/{repeats}", file=sys.stderr, flush=True)
    return times


def bench_trainer(args, ps: bool, precision: str = "float32",
                  strategy=None):
    """``(strategy, trainer, dataset_fn)``: psrec's trainer of the ``psrec
    bench`` workload (``--model``, ``--buckets``, ``--dim``,
    ``--batch-size``) at ``precision``, on one device or (``ps``) an
    in-process cluster of ``--workers`` workers and ``--ps`` PS, or on
    ``strategy`` when given (one cluster per process), and its synthetic
    batches."""
    from psrec.data.input.config import InputConfig
    from psrec.launch.job.bench import synthetic_dataset_fn
    from psrec.launch.job.bench import workload
    from psrec.launch.job.config import BenchConfig
    from psrec.ps_cluster.cluster.in_process import in_process_cluster
    from psrec.ps_cluster.cluster.partition_config import PartitionConfig
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    from psrec.ps_cluster.cluster.strategy import build_replicated_strategy
    from psrec.ps_cluster.training.trainer import Trainer
    config = BenchConfig(model=args.model, buckets=args.buckets,
                         dim=args.dim, batch_size=args.batch_size)
    if strategy is None:
        strategy = (build_ps_strategy(
            in_process_cluster(args.workers, args.ps), PartitionConfig())
            if ps else build_replicated_strategy("one-device"))
    spec, model_cfg, optimizer_cfg = workload(config)
    trainer = Trainer(strategy, spec, model_cfg, optimizer_cfg,
                      InputConfig(batch_size=args.batch_size),
                      precision=precision)
    return strategy, trainer, synthetic_dataset_fn(spec, args.batch_size, ps)


def _one_process(args) -> dict:
    strategy, trainer, dataset_fn = bench_trainer(args, ps=False)
    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    functions = _stage_functions(strategy, trainer, args.steps,
                                 args.stages)
    run_stage = {name: (lambda f=f: float(f(iterator)))
                 for name, f in functions.items()}
    if "check_new" in args.stages:
        run_stage.update(_check_functions(strategy, trainer, args.steps,
                                          iterator))
    if "dense_only" in args.stages:
        dense_only = _dense_only(args.steps, args.batch_size)
        run_stage["dense_only"] = lambda: float(dense_only())
    return _rounds(run_stage, args.repeats, args.steps)


def _ps_worker(args) -> dict:
    strategy, trainer, dataset_fn = bench_trainer(args, ps=True)
    coordinator = trainer.coordinator
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    functions = _stage_functions(strategy, trainer, args.steps,
                                 args.stages)

    def scheduled(function):
        def run() -> float:
            value = coordinator.schedule(function, args=(iterator,))
            coordinator.join()  # one closure at a time: one busy worker
            return float(value.fetch())
        return run
    return _rounds({name: scheduled(f) for name, f in functions.items()},
                   args.repeats, args.steps)


def _stat(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 4),
            "min": round(min(values), 4), "max": round(max(values), 4)}


def _summary(times: dict) -> dict:
    """Medians and spreads of the stages, of the pieces (differences
    within a round) and of the ratios."""
    rounds = len(next(iter(times.values())))
    out = {"rounds": rounds,
           "stages_ms": {k: _stat(v) for k, v in times.items()},
           "pieces_ms": {}}
    for row, stage, previous in PIECES:
        if stage in times and (previous is None or previous in times):
            out["pieces_ms"][row] = _stat([
                times[stage][i] - (times[previous][i] if previous else 0.0)
                for i in range(rounds)])

    def ratios(key, top, bottom, minus=0.0):
        if top in times and bottom in times:
            out[key] = _stat([times[top][i] / times[bottom][i] - minus
                              for i in range(rounds)])
    ratios("guard_ab_new_over_old_throughput", "step_old_guard", "step")
    ratios("guard_cost_now", "step", "step_no_guard", 1.0)
    ratios("guard_cost_before", "step_old_guard", "step_no_guard", 1.0)
    ratios("psrec_over_dense_only", "dense_only", "step")
    return out


def _table(results: dict, batch: int) -> str:
    columns = list(results)
    lines = ["| piece (ms per step, median [min-max]) | "
             + " | ".join(columns) + " |",
             "|---|" + "---|" * len(columns)]

    def cell(stat, digits=2):
        return (f"{stat['median']:.{digits}f} [{stat['min']:.{digits}f}"
                f" to {stat['max']:.{digits}f}]")

    def piece(column, row):
        found = results[column]["pieces_ms"].get(row)
        return cell(found) if found else "-"

    for row, _, _ in PIECES:
        lines.append(f"| {row} | " + " | ".join(
            piece(c, row) for c in columns) + " |")
    rpc = ("lookups (gather, split)", "sparse apply", "dense apply")
    if {"ps worker", "one process"} <= set(results) and all(
            r in results[c]["pieces_ms"] for r in rpc for c in columns):
        one, ps = (results[c]["pieces_ms"] for c in ("one process",
                                                     "ps worker"))
        wait = sum(ps[r]["median"] - one[r]["median"] for r in rpc)
        lines.append("| RPC wait (PS - one process: lookups + applies) | "
                     + " | ".join("-" if c == "one process" else
                                  f"{wait:.2f}" for c in columns) + " |")
    if all("step" in results[c]["stages_ms"] for c in columns):
        lines.append("| **step** | " + " | ".join(
            cell(results[c]["stages_ms"]["step"]) for c in columns) + " |")
        lines.append("| ex/s (step) | " + " | ".join(
            f"{1000 * batch / results[c]['stages_ms']['step']['median']:,.0f}"
            for c in columns) + " |")
    lines.append("| ex/s (dense-only ceiling) | " + " | ".join(
        f"{1000 * batch / results[c]['stages_ms']['dense_only']['median']:,.0f}"
        if "dense_only" in results[c]["stages_ms"] else "-"
        for c in columns) + " |")
    for key, label in (("guard_cost_now",
                        "guard cost now (step / no guard - 1)"),
                       ("guard_cost_before", "guard cost before"),
                       ("guard_ab_new_over_old_throughput",
                        "guard A/B: new / old throughput"),
                       ("psrec_over_dense_only",
                        "psrec / dense-only ceiling (throughput)")):
        lines.append(f"| {label} | " + " | ".join(
            cell(results[c][key], 3) if key in results[c] else "-"
            for c in columns) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("one", "ps"), default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20,
                        help="iterations per stage call")
    parser.add_argument("--model", default="dcn",
                        help="psrec's model (dcn: the dense-only ceiling's "
                        "towers, ../shared/bench/dense_only.py)")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--buckets", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ps", type=int, default=1)
    parser.add_argument("--stages", type=lambda text: tuple(text.split(",")),
                        default=STAGES + ("dense_only", "check_old",
                                          "check_new"),
                        help="comma-separated subset, e.g. "
                        "step_no_guard,step,step_old_guard (the guard A/B)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    began = time.time()
    if args.only is None:  # each in its own process (a cluster needs a
        results = {}       # fresh TensorFlow context)
        for only in ("one", "ps"):
            rest = [a for a in (argv if argv is not None else sys.argv[1:])
                    if a != "--json"]
            done = subprocess.run([sys.executable, __file__, "--only", only,
                                   "--json", *rest], check=True,
                                  stdout=subprocess.PIPE, text=True)
            results.update(json.loads(done.stdout.splitlines()[0]))
    else:
        from psrec.runtime import configure_environment
        configure_environment()
        key = "one process" if args.only == "one" else "ps worker"
        print(f"{key} ...", file=sys.stderr, flush=True)
        measure = _one_process if args.only == "one" else _ps_worker
        results = {key: _summary(measure(args))}
    if args.json:
        print(json.dumps(results))
    print(_table(results, args.batch_size))
    print(f"({time.time() - began:.0f} s, {args.repeats} rounds of "
          f"{args.steps} steps per stage, batch {args.batch_size})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
