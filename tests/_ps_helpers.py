"""Shared helpers of the cluster tests, and a small CLI for the work that
needs its own process (another in-process cluster shape, a clean SavedModel
load).

Run as ``python -m tests._ps_helpers COMMAND ...`` from the repository root
(:func:`run_helper` does that, with a timeout). Commands:

* ``reshard --ps N [--train-to DIR [--delta]] [--restore CKPT ...]
  [--chain CKPT_DIR] --out DIR``: starts
  an in-process cluster of 1 worker + N PS, optionally trains a few steps and
  saves into DIR, then restores each CKPT in turn and dumps every restored
  full table, every slot of its optimizer and a dense kernel as ``.npy``
  under DIR (the spec of :func:`reshard_spec`: tables on their own
  optimizers); ``--delta``: after training, a delta checkpoint of changed
  rows and the state it holds; ``--chain CKPT_DIR``: then restores that
  folder's latest full checkpoint and its deltas, and dumps them.
* ``serve --model DIR --spec JSON --parquet FILE --rows N --out DIR``: loads
  a SavedModel in a fresh process without any cluster, runs
  ``serving_default`` on the first N raw Parquet rows and writes the
  probabilities and the signature.

Every command ends with ``os._exit`` after flushing: in-process gRPC servers
cannot be stopped, so the process does not wait on them at shutdown.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from psrec.runtime import configure_environment
from psrec.runtime import role_environment

configure_environment()

import numpy as np  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import tensorflow as tf  # noqa: E402

from psrec.features.spec.presets import criteo  # noqa: E402
from psrec.features.spec.spec import DENSE_COLUMN  # noqa: E402
from psrec.features.spec.spec import ID_COLUMN  # noqa: E402
from psrec.features.spec.spec import FeatureSpec  # noqa: E402
from psrec.models.ranking.config import ModelConfig  # noqa: E402
from tests._proc import REPO  # noqa: E402

# The shared in-process cluster and data of the pytest process (conftest.py).
CLUSTER_WORKERS = 2
CLUSTER_PS = 2
SMALL_CRITEO = {"buckets": 200, "dim": 8}
SYNTHETIC_ROWS = 20_000

# -- subprocesses ---------------------------------------------------------------
# (``psrec`` runs and pid helpers: tests/_proc.py)


def run_helper(args: Sequence[str], timeout: float
               ) -> subprocess.CompletedProcess:
    """Runs ``python -m tests._ps_helpers ARGS`` (killed after ``timeout``
    seconds: ``subprocess.run`` kills the child before raising)."""
    result = subprocess.run(
        [sys.executable, "-m", "tests._ps_helpers", *map(str, args)],
        cwd=REPO, env=role_environment(), capture_output=True, text=True,
        timeout=timeout, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise AssertionError(
            f"helper {list(args)} exited with {result.returncode}:\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
    return result


# -- graph inspection -------------------------------------------------------------

_CALL_ATTRS = {
    "While": ("cond", "body"), "StatelessWhile": ("cond", "body"),
    "If": ("then_branch", "else_branch"),
    "StatelessIf": ("then_branch", "else_branch"),
    "PartitionedCall": ("f",), "StatefulPartitionedCall": ("f",),
}
_FIRST_INPUT_IS_PREDICATE = ("If", "StatelessIf", "Case", "StatelessCase")


def _source(name: str) -> str:
    """The node or argument an input string refers to."""
    return name.split(":")[0]


def resource_uses(concrete_function, handles: dict[str, tf.Variable]
                  ) -> collections.Counter:
    """Counts ``(op type, key)`` for every op that consumes the handle of
    one of ``handles`` (key -> variable), following the handle through
    ``Identity`` ops and into nested functions (while bodies, conditionals,
    function calls) of the graph's library.

    Raises:
      AssertionError: when a variable is not captured by the function.
    """
    graph = concrete_function.graph
    roots = {}
    for key, variable in handles.items():
        matches = [internal for external, internal in graph.captures
                   if external is variable.handle]
        assert matches, f"{key} ({variable.name}) is not captured by the graph"
        for internal in matches:
            roots[internal.op.name] = key
    graph_def = graph.as_graph_def()
    library = {f.signature.name: f for f in graph_def.library.function}
    counts: collections.Counter = collections.Counter()

    def visit(nodes, aliases: dict[str, str], depth: int = 0) -> None:
        assert depth < 50, "function nesting too deep"
        aliases = dict(aliases)
        changed = True
        while changed:  # handles passed through Identity ops
            changed = False
            for node in nodes:
                if (node.op == "Identity" and node.name not in aliases
                        and node.input and _source(node.input[0]) in aliases):
                    aliases[node.name] = aliases[_source(node.input[0])]
                    changed = True
        for node in nodes:
            inputs = [_source(i) for i in node.input if not i.startswith("^")]
            hits = [(j, aliases[s]) for j, s in enumerate(inputs)
                    if s in aliases]
            if not hits:
                continue
            for _, key in hits:
                counts[(node.op, key)] += 1
            callees = []
            for attr in _CALL_ATTRS.get(node.op, ()):
                callees.append(node.attr[attr].func.name)
            if node.op in ("Case", "StatelessCase"):
                callees += [f.name for f in node.attr["branches"].list.func]
            if node.op in library:
                callees.append(node.op)
            offset = 1 if node.op in _FIRST_INPUT_IS_PREDICATE else 0
            for callee in callees:
                function = library[callee]
                args = function.signature.input_arg
                visit(function.node_def,
                      {args[j - offset].name: key for j, key in hits
                       if 0 <= j - offset < len(args)}, depth + 1)

    visit(graph_def.node, roots)
    return counts


def uses_by_op(counts: collections.Counter, key: str) -> dict[str, int]:
    return {op: n for (op, k), n in counts.items() if k == key}


# -- data -------------------------------------------------------------------------


def raw_rows(parquet: str | Path, spec: FeatureSpec, rows: int
             ) -> dict[str, np.ndarray]:
    """The first ``rows`` rows of a Parquet file as serving input: dense
    float32 with NaN for nulls, categorical values in the spec's raw dtype
    (nulls as "" or -1; multi-hot lists padded to the longest with those)."""
    table = pq.read_table(parquet, columns=[
        f.name for f in spec.dense + spec.categorical]).slice(0, rows)
    raw = {}
    for feature in spec.dense:
        column = table.column(feature.name)
        values = pc.cast(column, "float64").to_numpy(zero_copy_only=False)
        null = pc.is_null(column).to_numpy(zero_copy_only=False)
        raw[feature.name] = np.where(null, np.nan, values).astype(np.float32)
    for feature in spec.categorical:
        pad = -1 if feature.dtype == "int64" else ""
        values = table.column(feature.name).to_pylist()
        if feature.multi_hot:
            width = max(1, max(len(v or []) for v in values))
            values = [list(v or []) + [pad] * (width - len(v or []))
                      for v in values]
        else:
            values = [pad if v is None else v for v in values]
        raw[feature.name] = np.array(
            values, np.int64 if feature.dtype == "int64" else object)
    return raw


def read_split(manifest, spec: FeatureSpec, split: str,
               batch_size: int = 1024) -> dict[str, np.ndarray]:
    """Every row of a converted split, eagerly, as numpy arrays."""
    from psrec.data.input.dataset import make_eval_dataset
    parts = collections.defaultdict(list)
    for batch in make_eval_dataset(manifest.files(split), spec, batch_size,
                                   manifest.block_rows):
        for name, value in batch.items():
            parts[name].append(value.numpy())
    return {name: np.concatenate(values) for name, values in parts.items()}


def random_dataset_fn(spec: FeatureSpec, batch_size: int):
    """Seeded random batches in the decoded-record format (no files)."""
    def dataset_fn(context: tf.distribute.InputContext | None = None):
        pipeline = tf.cast(context.input_pipeline_id if context else 0,
                           tf.int64)

        def batch(i):
            seed = tf.stack([i, pipeline])
            out = {DENSE_COLUMN: tf.random.stateless_uniform(
                [batch_size, len(spec.dense)], seed=seed, maxval=5.0),
                   ID_COLUMN: tf.zeros([batch_size], tf.int64)}
            label_logit = tf.zeros([batch_size])
            for j, feature in enumerate(spec.categorical):
                ids = tf.random.stateless_uniform(
                    [batch_size], seed=seed + j + 1, maxval=feature.hash_buckets,
                    dtype=tf.int64)
                label_logit += tf.cast(ids % 3, tf.float32) - 1.0
                out[feature.name] = ids + feature.row_offset
            out[spec.label.name] = tf.cast(
                tf.random.stateless_uniform([batch_size], seed=seed - 1)
                < tf.sigmoid(label_logit), tf.float32)
            return out

        return tf.data.Dataset.range(2 ** 62).map(batch).prefetch(2)

    return dataset_fn


def synthetic_rows(spec: FeatureSpec, rows: int, seed: int = 0
                   ) -> dict[str, np.ndarray]:
    """Seeded decoded rows (dense, ids with their row offsets, a label with
    some signal) as numpy arrays: input for :func:`in_order_dataset_fn`."""
    rng = np.random.default_rng(seed)
    dense = rng.uniform(0, 5, (rows, len(spec.dense))).astype(np.float32)
    data = {DENSE_COLUMN: dense}
    signal = dense[:, 0] - 2.5
    for feature in spec.categorical:
        ids = rng.integers(0, feature.hash_buckets, rows)
        data[feature.name] = (ids + feature.row_offset).astype(np.int64)
        signal += (ids % 3 == 0) * 0.5
    data[spec.label.name] = (rng.uniform(size=rows)
                             < 1 / (1 + np.exp(-signal))).astype(np.float32)
    return data


def in_order_dataset_fn(data: dict[str, np.ndarray], global_batch: int):
    """Consecutive rows in order: replica r of a step reads rows
    [r*b, (r+1)*b) of the step's global batch (b = global / replicas), so
    any replica count sees the same global batches."""
    def dataset_fn(context: tf.distribute.InputContext | None = None):
        rows = (context.get_per_replica_batch_size(global_batch)
                if context else global_batch)
        return tf.data.Dataset.from_tensor_slices(data).batch(
            rows, drop_remainder=True).repeat()
    return dataset_fn


# -- reshard ------------------------------------------------------------------------

RESHARD_SPEC_ARGS = {"buckets": 50, "dim": 4}
RESHARD_MODEL = ModelConfig(interaction="concat", top_mlp=(8,))
KERNEL_KEY = "model/over_arch/out/kernel/.ATTRIBUTES/VARIABLE_VALUE"
#: The reshard spec's tables: which of the small Criteo spec's 26 features
#: each takes, and what it names beside its dim. The first names nothing
#: (the flag's Adagrad); the others their own optimizer (FTRL at its own
#: rate; SGD has no slot).
RESHARD_TABLES = {"categorical": (0, {}),
                  "second": (7, {"optimizer": "rowwise_adagrad"}),
                  "third": (13, {"optimizer": "ftrl", "lr": 0.05}),
                  "fourth": (20, {"optimizer": "sgd"})}


def reshard_spec() -> FeatureSpec:
    """The reshard commands' spec: the small Criteo one with its features
    spread over the tables of ``RESHARD_TABLES``."""
    data = criteo(**RESHARD_SPEC_ARGS).to_dict()
    for name, (first, _) in RESHARD_TABLES.items():
        for feature in data["categorical"][first:]:
            feature["table"] = name
    for feature in data["categorical"]:
        del feature["row_offset"]  # laid out again
    data["tables"] = [{"name": name, "dim": RESHARD_SPEC_ARGS["dim"],
                       **named} for name, (_, named) in
                      RESHARD_TABLES.items()]
    return FeatureSpec.from_dict(data)


def table_state_keys(trainer) -> dict[str, list]:
    """Checkpoint key -> the shard variables of every table and of every
    slot of its optimizer."""
    state = {}
    for name, table in trainer.model.sparse_arch.tables.items():
        shards = list(getattr(table, "variables", [table]))
        state[f"model/sparse_arch/{name}/.ATTRIBUTES/VARIABLE_VALUE"] = shards
        optimizer = trainer.table_optimizers[name.removesuffix("__wide")]
        group = next(g for g, o in trainer.sparse_optimizers.items()
                     if o is optimizer)
        for slot in optimizer.get_slot_names():
            state[f"model/sparse_arch/{name}/.OPTIMIZER_SLOT/{group}/{slot}/"
                  ".ATTRIBUTES/VARIABLE_VALUE"] = [
                optimizer.get_slot(s, slot) for s in shards]
    return state


def _dump(trainer, state: dict, out: Path, label: str) -> dict[str, str]:
    """Every table, slot and the kernel of the live state, as ``.npy``
    files under ``out``; key -> file."""
    dump = {key: tf.concat([s.read_value() for s in shards], 0).numpy()
            for key, shards in state.items()}
    dump[KERNEL_KEY] = trainer.model.over_arch.out.kernel.numpy()
    files = {}
    for j, (key, value) in enumerate(dump.items()):
        files[key] = str(out / f"{label}-{j}.npy")
        np.save(files[key], value)
    return files


def _change_rows(trainer, state: dict) -> None:
    """Every 7th row of each table (and of its slots) changed by +1 and
    flagged, as a step's sparse update would: a delta's content."""
    for prefix in trainer.changes.flags:
        table = next(k for k in state if k.startswith(prefix + "/.ATTR"))
        total = sum(int(s.shape[0]) for s in state[table])
        rows = np.arange(3, total, 7)
        for key in [k for k in state if k.startswith(prefix + "/")]:
            first = 0
            for shard in state[key]:
                size = int(shard.shape[0])
                local = rows[(rows >= first) & (rows < first + size)] - first
                shard.scatter_add(tf.IndexedSlices(
                    tf.ones([local.size, shard.shape[1]], shard.dtype),
                    tf.constant(local, tf.int64)))
                first += size
        trainer.changes.mark_rows(prefix, rows)


def _reshard(args: argparse.Namespace) -> dict:
    from psrec.data.input.config import InputConfig
    from psrec.models.optim.config import OptimizerConfig
    from psrec.ps_cluster.cluster.in_process import in_process_cluster
    from psrec.ps_cluster.cluster.partition_config import PartitionConfig
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    from psrec.ps_cluster.training.config import LoopConfig
    from psrec.ps_cluster.training.trainer import Trainer
    spec = reshard_spec()
    cluster = in_process_cluster(1, args.ps)
    trainer = Trainer(
        build_ps_strategy(cluster, PartitionConfig(kind="fixed")), spec,
        RESHARD_MODEL,
        OptimizerConfig(sparse=args.optimizer, sparse_lr=0.1, dense_lr=0.01,
                        base_batch_size=64, warmup_steps=0),
        InputConfig(batch_size=64),
        checkpoint_dir=(args.train_to or args.chain
                        or Path(args.out) / "unused"),
        track_changes=args.delta)
    state = table_state_keys(trainer)
    report = {"shards": {key: [[s.device, list(s.shape)] for s in shards]
                         for key, shards in state.items()},
              "dumps": []}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.train_to:
        result = trainer.train(random_dataset_fn(spec, 64), LoopConfig(
            steps=args.steps, steps_per_closure=5, checkpoint_every=0))
        report["checkpoint"] = result.checkpoint
    if args.delta:  # a delta after the last (full) save, and what it holds
        _change_rows(trainer, state)
        trainer.progress.step.assign_add(1)
        report["delta"] = trainer.save_delta()
        report["after_delta"] = _dump(trainer, state, out, "delta")
    for i, path in enumerate(args.restore or ()):
        trainer.keeper.restore(path)
        report["dumps"].append({"checkpoint": path,
                                "files": _dump(trainer, state, out, str(i))})
    if args.chain:  # the latest full checkpoint of DIR and its deltas
        path = trainer.keeper.restore()
        report["chain"] = {"checkpoint": path,
                           "files": _dump(trainer, state, out, "chain")}
    return report


# -- serving ----------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> dict:
    spec = FeatureSpec.from_dict(json.loads(Path(args.spec).read_text()))
    loaded = tf.saved_model.load(args.model)
    signature = loaded.signatures["serving_default"]
    _, inputs = signature.structured_input_signature
    raw = raw_rows(args.parquet, spec, args.rows)
    outputs = signature(**{k: tf.constant(v) for k, v in raw.items()})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "probability.npy", outputs["probability"].numpy())
    np.save(out / "logit.npy", outputs["logit"].numpy())
    return {
        "inputs": {name: [s.dtype.name, s.shape.as_list()]
                   for name, s in inputs.items()},
        "outputs": sorted(outputs),
        "devices": sorted({d.name for d in tf.config.list_logical_devices()}),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tests._ps_helpers")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("reshard")
    p.add_argument("--ps", type=int, required=True)
    p.add_argument("--train-to", default=None)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--optimizer", default="adagrad")  # --sparse-optimizer
    p.add_argument("--restore", nargs="*", default=[])
    p.add_argument("--delta", action="store_true")  # after --train-to
    p.add_argument("--chain", default=None)  # DIR: restore full + deltas
    p.add_argument("--out", required=True)
    p.set_defaults(run=_reshard)
    p = sub.add_parser("serve")
    p.add_argument("--model", required=True)
    p.add_argument("--spec", required=True, help="spec JSON file")
    p.add_argument("--parquet", required=True)
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(run=_serve)
    args = parser.parse_args(argv)
    code = 0
    try:
        print("RESULT " + json.dumps(args.run(args)), flush=True)
    except BaseException:  # noqa: BLE001 -- reported, then a hard exit
        import traceback
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def helper_result(completed: subprocess.CompletedProcess) -> dict:
    """The JSON a helper command printed on its ``RESULT`` line."""
    for line in completed.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(f"no RESULT line in:\n{completed.stdout[-3000:]}")


if __name__ == "__main__":
    main()


def untrained_checkpoint_and_data(root: Path):
    """A checkpoint of an untrained small model (dlrm, with its job.json)
    in ``root/checkpoints`` and a converted data set of the same spec (600
    rows, a quarter eval): ``(checkpoints, manifest)``."""
    from psrec.data.convert.convert import ConversionOptions
    from psrec.data.convert.convert import convert
    from psrec.data.ingest.synthetic import write_synthetic_parquet
    from psrec.launch.job.config import JobConfig
    from psrec.models.build import build_model
    from psrec.models.ranking.config import model_config
    from psrec.ps_cluster.checkpoint.keeper import CheckpointKeeper
    spec = criteo(buckets=100)
    config = model_config("dlrm")
    model = build_model(spec, config)
    checkpoints = root / "checkpoints"
    CheckpointKeeper(checkpoints, tf.train.Checkpoint(model=model)).save(1)
    JobConfig(spec=spec, model_name="dlrm", model=config).write(checkpoints)
    paths = write_synthetic_parquet(spec, root / "parquet", 600, files=1)
    report = convert(paths, spec, root / "tfr",
                     ConversionOptions(shards=2, eval_fraction=0.25,
                                       block_rows=32))
    return checkpoints, report.manifest
