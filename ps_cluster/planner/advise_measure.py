"""The timings of ``psrec advise`` (:mod:`psrec.ps_cluster.planner.advise`).

Three timings, each the median of a few repetitions after a warm-up:

* ``T_compute`` -- one training step (forward, backward, optimizer update)
  of the model on one device at the per-replica batch, with synthetic ids;
  tables larger than :data:`MAX_MEASURED_IDS` ids per feature are measured
  on a smaller copy (the step's compute does not depend on table rows);
* ``T_allreduce`` -- what the mirrored path moves per update: an all-reduce
  of the dense gradient and an all-gather of the table gradients' slices
  (``ids x dim`` values + ids per replica), between 2 replicas (2 GPUs
  when there are, else 2 logical CPU devices -- in a subprocess, since the
  CPU split must precede TensorFlow's device setup);
* ``T_ps`` -- one worker step's parameter-server traffic on an in-process
  loopback cluster (1 worker + 1 PS, in a subprocess): gather the batch's
  rows, read the dense weights, push a sparse Adagrad update of the rows
  and a dense update.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from typing import Any
from typing import Callable

from psrec.errors import DataError
from psrec.features.spec.spec import FeatureSpec
from psrec.models.optim.config import OptimizerConfig
from psrec.models.optim.sizing import proxy_spec
from psrec.models.ranking.config import ModelConfig

MAX_MEASURED_IDS = 100_000  # ids per feature in the compute measurement
MAX_PS_ROWS = 1_000_000  # table rows of the PS round-trip measurement


class AdviseError(DataError):
    """A measurement subprocess failed or timed out."""


def _median_seconds(run: Callable[[], Any], repeats: int,
                    steps: int = 1) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        times.append((time.perf_counter() - began) / steps)
    return statistics.median(times)


def synthetic_batch(spec: FeatureSpec, rows: int, seed: int = 0):
    """A batch in the model's input format with uniform random ids."""
    import tensorflow as tf

    from psrec.features.spec.spec import DENSE_COLUMN
    batch = {spec.label.name: tf.cast(tf.random.stateless_uniform(
        [rows], [seed, 1]) < 0.3, tf.float32)}
    if spec.dense:
        batch[DENSE_COLUMN] = tf.random.stateless_uniform(
            [rows, len(spec.dense)], [seed, 2], maxval=10.0)
    for i, feature in enumerate(spec.categorical):
        shape = [rows, feature.max_length] if feature.multi_hot else [rows]
        batch[feature.name] = feature.row_offset + tf.random.stateless_uniform(
            shape, [seed, 3 + i], maxval=feature.num_ids, dtype=tf.int64)
    return batch


def measure_compute(spec: FeatureSpec, model: ModelConfig, batch_size: int,
                    optimizer: OptimizerConfig = OptimizerConfig(),
                    repeats: int = 5, steps: int = 5) -> float:
    """Median seconds of one training step on the default device: psrec's
    own train function (:mod:`psrec.ps_cluster.training.step`), fed one batch."""
    import tensorflow as tf

    from psrec.models.build import build_model
    from psrec.models.optim.config import DEFAULT_GROUP
    from psrec.models.optim.optimizers import build_optimizers
    from psrec.models.optim.optimizers import build_table_optimizers
    from psrec.ps_cluster.training.step import TrainStep
    from psrec.ps_cluster.training.step import make_train_function
    if any((f.hash_buckets or 0) > MAX_MEASURED_IDS
           for f in spec.categorical):
        spec = proxy_spec(spec, MAX_MEASURED_IDS)
    net = build_model(spec, model)
    _, dense = build_optimizers(optimizer, batch_size)
    groups, tables = build_table_optimizers(optimizer, batch_size,
                                            spec.tables, single_writer=True)
    batches = tf.data.Dataset.from_tensors(
        synthetic_batch(spec, batch_size)).repeat()
    iterator = iter(batches)
    train = make_train_function(
        tf.distribute.get_strategy(),
        TrainStep(net, groups[DEFAULT_GROUP], dense, spec.label.name,
                  table_optimizers=tables), steps)
    for _ in range(2):  # trace + warm up
        train(iterator)[0].numpy()
    return _median_seconds(lambda: train(iterator)[0].numpy(), repeats,
                           steps)


def _run_helper(kind: str, args: dict[str, Any], timeout: float
                ) -> dict[str, Any]:
    from psrec.runtime import role_environment
    command = [sys.executable, "-P", "-m", "psrec.ps_cluster.planner.advise_measure",
               kind, json.dumps(args)]
    try:
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=timeout, env=role_environment(),
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise AdviseError(f"the {kind} measurement did not finish within "
                          f"{timeout:.0f} s.") from None
    lines = [line for line in done.stdout.splitlines()
             if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.splitlines()[-15:])
        raise AdviseError(f"the {kind} measurement failed (exit "
                          f"{done.returncode}):\n{tail}")
    return json.loads(lines[-1])


def gradient_traffic(spec: FeatureSpec, model: ModelConfig,
                     batch_size: int, dense_parameters: int
                     ) -> dict[str, int]:
    """What one replica exchanges per update: dense floats, and table
    slices (ids of the batch x width) per table width."""
    ids = {}
    wide = model.wide_tables(spec)
    for table in spec.tables:
        count = batch_size * sum(f.max_length for f in spec.categorical
                                 if f.table == table.name)
        ids[table.dim] = ids.get(table.dim, 0) + count
        if table.name in wide:
            ids[1] = ids.get(1, 0) + count
    return {"dense": dense_parameters,
            "slices": {str(dim): rows for dim, rows in ids.items()}}


def traffic_bytes(traffic: dict[str, Any]) -> int:
    """Bytes of :func:`gradient_traffic`: float32 values + int64 ids."""
    return 4 * traffic["dense"] + sum(
        rows * (4 * int(dim) + 8) for dim, rows in traffic["slices"].items())


def measure_allreduce(traffic: dict[str, Any], repeats: int = 5,
                      timeout: float = 180.0) -> tuple[float, str]:
    """Median seconds of one update's all-reduce + all-gathers between two
    replicas (in a subprocess); returns ``(seconds, devices)``."""
    out = _run_helper("allreduce", {"traffic": traffic, "repeats": repeats},
                      timeout)
    return float(out["seconds"]), str(out["devices"])


def measure_ps(spec: FeatureSpec, traffic: dict[str, Any],
               repeats: int = 5, timeout: float = 180.0) -> float:
    """Median seconds of one worker step's PS round trip (subprocess)."""
    rows = min(MAX_PS_ROWS, max(t.rows for t in spec.tables))
    out = _run_helper("ps", {"traffic": traffic, "rows": rows,
                             "repeats": repeats}, timeout)
    return float(out["seconds"])


# -- measurement subprocesses ----------------------------------------------------


def _helper_allreduce(args: dict[str, Any]) -> dict[str, Any]:
    import tensorflow as tf
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) >= 2:
        devices = ["/gpu:0", "/gpu:1"]
    else:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        devices = ["/cpu:0", "/cpu:1"]
    strategy = tf.distribute.MirroredStrategy(devices)
    traffic = args["traffic"]

    def replica():
        ctx = tf.distribute.get_replica_context()
        out = [ctx.all_reduce("SUM", tf.ones([max(1, traffic["dense"])]))]
        for dim, rows in traffic["slices"].items():
            out.append(ctx.all_gather(tf.ones([rows, int(dim)]), axis=0))
            out.append(ctx.all_gather(tf.ones([rows], tf.int64), axis=0))
        return [tf.reduce_sum(tf.cast(o[:1], tf.float32)) for o in out]

    step = tf.function(lambda: strategy.run(replica))
    for _ in range(2):
        tf.nest.map_structure(lambda v: v.numpy(), strategy.experimental_local_results(step()))
    seconds = _median_seconds(lambda: tf.nest.map_structure(
        lambda v: v.numpy(), strategy.experimental_local_results(step())),
        args["repeats"])
    return {"seconds": seconds, "devices": "2 x " + devices[0][1:4].upper()}


def _helper_ps(args: dict[str, Any]) -> dict[str, Any]:
    import tensorflow as tf
    import tf_keras

    from psrec.models.embedding.sparse_arch import table_creation_scope
    from psrec.ps_cluster.cluster.in_process import in_process_cluster
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    traffic, rows, steps = args["traffic"], int(args["rows"]), 10
    strategy = build_ps_strategy(in_process_cluster(1, 1))
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        with table_creation_scope():
            tables = {dim: tf.Variable(tf.zeros([rows, int(dim)]))
                      for dim in traffic["slices"]}
        dense = tf.Variable(tf.zeros([max(1, traffic["dense"])]))
        optimizer = tf_keras.optimizers.legacy.Adagrad(0.01)
        shards = [v for t in tables.values()
                  for v in getattr(t, "variables", [t])]
        optimizer._create_all_weights(shards + [dense])  # noqa: SLF001

    def step(i: int):
        grads, total = [], tf.constant(0.0)
        for dim, table in tables.items():
            ids = tf.random.stateless_uniform(
                [traffic["slices"][dim]], [i, 7], maxval=rows, dtype=tf.int64)
            unique, _ = tf.unique(ids)
            looked = tf.nn.embedding_lookup(table, unique)
            total += tf.reduce_sum(looked[:1])
            shard = getattr(table, "variables", [table])[0]  # one PS
            grads.append((tf.IndexedSlices(
                looked, unique, tf.shape(shard, out_type=tf.int64)), shard))
        total += tf.reduce_sum(dense[:1])
        grads.append((tf.ones_like(dense) * 1e-3, dense))
        optimizer.apply_gradients(grads)
        return total

    @tf.function
    def closure():
        total = tf.constant(0.0)
        for i in range(steps):
            total += strategy.run(step, args=(i,))
        return total

    def run():
        coordinator.schedule(closure)
        coordinator.join()

    for _ in range(2):
        run()
    return {"seconds": _median_seconds(run, args["repeats"], steps)}


def _helper_main(argv: list[str]) -> int:
    from psrec.runtime import configure_environment
    configure_environment()
    kind, args = argv[0], json.loads(argv[1])
    helpers = {"allreduce": _helper_allreduce, "ps": _helper_ps}
    if kind not in helpers:
        print(f"unknown measurement {kind!r}; use {', '.join(helpers)}",
              file=sys.stderr)
        return 2
    print(json.dumps(helpers[kind](args)), flush=True)
    return 0


if __name__ == "__main__":
    import os
    code = _helper_main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)  # in-process gRPC servers cannot be shut down
