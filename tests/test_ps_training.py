"""PS training on the shared in-process cluster (2 workers + 2 PS): table
sharding and placement, sparse lookups in the traced graph, learning, exact
evaluation, verified checkpoints and at-least-once step accounting.

One PS Trainer is built for the module (plus one for the config-mismatch
restore); training runs once, in the ``trained`` fixture.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute.sharded_variable import ShardedVariable

from psrec.data.input.config import InputConfig
from psrec.features.spec.presets import criteo
from psrec.features.spec.spec import ID_COLUMN
from psrec.models.build import build_model
from psrec.models.optim.config import OptimizerConfig
from psrec.models.ranking.config import ModelConfig
from psrec.models.ranking.model import example_batch
from psrec.ps_cluster.checkpoint.keeper import CheckpointKeeper
from psrec.ps_cluster.checkpoint.keeper import RestoreError
from psrec.ps_cluster.cluster.partition_config import PartitionConfig
from psrec.ps_cluster.cluster.strategy import build_ps_strategy
from psrec.ps_cluster.training.config import LoopConfig
from psrec.ps_cluster.training.step import make_train_function
from psrec.ps_cluster.training.trainer import Trainer
from tests._ps_helpers import CLUSTER_PS
from tests._ps_helpers import CLUSTER_WORKERS
from tests._ps_helpers import read_split
from tests._ps_helpers import resource_uses
from tests._ps_helpers import uses_by_op

pytestmark = pytest.mark.cluster

# Wide & Deep (concat + first-order tables): two sharded tables per step.
MODEL = ModelConfig(interaction="concat", top_mlp=(32,), wide=True)
OPTIMIZER = OptimizerConfig(sparse_lr=0.2, dense_lr=0.003,
                            base_batch_size=256, warmup_steps=10)
BATCH = 256
STEPS = 150
STEPS_PER_CLOSURE = 10
# Measured on this data (buckets=200, dim=8, 16,000 train rows): AUC
# 0.65-0.67 after 150 steps (the generator's own logit reaches 0.85; the
# prior gives 0.5).
MIN_AUC = 0.61
TABLE = "categorical"
PS_DEVICES = {f"/job:ps/replica:0/task:{i}/device:CPU:0"
              for i in range(CLUSTER_PS)}


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ps-training-ckpt")


@pytest.fixture(scope="module")
def trainer(ps_cluster, small_criteo_spec, ckpt_dir) -> Trainer:
    # "fixed": one shard per PS task for every table; a partitioner applied
    # to all variables would also split the dense kernels (checked below).
    return _ps_trainer(ps_cluster, small_criteo_spec, ckpt_dir)


def _ps_trainer(cluster, spec, ckpt_dir) -> Trainer:
    strategy = build_ps_strategy(cluster, PartitionConfig(kind="fixed"))
    return Trainer(strategy, spec, MODEL, OPTIMIZER,
                   InputConfig(batch_size=BATCH), checkpoint_dir=ckpt_dir)


@dataclasses.dataclass
class Trained:
    result: object
    losses: list[float]
    steps: list[int]


@pytest.fixture(scope="module")
def trained(trainer, criteo_data) -> Trained:
    manifest, _ = criteo_data
    losses, steps = [], []
    result = trainer.train(
        trainer.dataset_fn(manifest),
        LoopConfig(steps=STEPS, steps_per_closure=STEPS_PER_CLOSURE,
                   checkpoint_every=0),
        eval_manifest=manifest,
        on_progress=lambda step, loss, n: (steps.append(step),
                                           losses.append(loss)))
    return Trained(result, losses, steps)


def _shards(variable) -> list:
    return list(getattr(variable, "variables", [variable]))


def _full(variable) -> np.ndarray:
    return tf.concat([s.read_value() for s in _shards(variable)], 0).numpy()


# -- placement ---------------------------------------------------------------------


def test_cluster_shape(ps_cluster):
    assert (ps_cluster.num_workers, ps_cluster.num_ps) == (CLUSTER_WORKERS,
                                                           CLUSTER_PS)


def test_tables_are_sharded_across_every_ps(trainer, small_criteo_spec):
    tables = trainer.model.sparse_arch.tables
    assert set(tables) == {TABLE, TABLE + "__wide"}
    for name, table in tables.items():
        config = small_criteo_spec.table(TABLE)
        assert isinstance(table, ShardedVariable), name
        shards = table.variables
        assert len(shards) == CLUSTER_PS
        assert {s.device for s in shards} == PS_DEVICES
        assert sum(s.shape[0] for s in shards) == config.rows
        assert all(s.shape[1] == (1 if name.endswith("__wide") else config.dim)
                   for s in shards)
        assert table.shape == (config.rows,
                               1 if name.endswith("__wide") else config.dim)
    # The sparse optimizer trains exactly the shard variables.
    assert [id(v) for v in trainer.model.embedding_variables()] == [
        id(s) for t in tables.values() for s in t.variables]


def test_dense_variables_are_whole_on_a_ps(trainer):
    dense = trainer.model.dense_variables()
    assert dense
    for variable in dense:
        assert not isinstance(variable, ShardedVariable), variable.name
        assert "/part_" not in variable.name, variable.name
        assert variable.device in PS_DEVICES, (variable.name, variable.device)
    kernel = trainer.model.over_arch.hidden[0].kernel
    width = 13 + 26 * 8  # dense features + 26 embeddings of width 8
    assert tuple(kernel.shape) == (width, 32)
    assert kernel.device in PS_DEVICES
    # Both PS tasks hold some dense variables (round-robin placement).
    assert {v.device for v in dense} == PS_DEVICES


# -- the traced graph reads only the rows it needs ----------------------------


def _table_handles(trainer, names=None) -> dict:
    return {f"{name}/{i}": shard
            for name, table in trainer.model.sparse_arch.tables.items()
            if names is None or name in names
            for i, shard in enumerate(table.variables)}


def test_lookup_gathers_from_each_shard_and_never_reads_a_table(
        trainer, small_criteo_spec):
    handles = _table_handles(trainer)
    signature = {name: tf.TensorSpec([None, *value.shape[1:]], value.dtype)
                 for name, value in example_batch(small_criteo_spec).items()}
    lookup = tf.function(lambda batch: trainer.model.sparse_arch(batch))
    uses = resource_uses(lookup.get_concrete_function(signature), handles)
    for key in handles:  # exactly one gather per shard of each table
        assert uses_by_op(uses, key) == {"ResourceGather": 1}, key
    gathers = [k for (op, k) in uses.elements() if op == "ResourceGather"
               and k.startswith(TABLE + "/")]
    assert len(gathers) == len(trainer.model.sparse_arch.tables[TABLE].variables)

    # The check itself sees a full read: a lookup through the dense tensor
    # reads every shard whole and gathers nothing from the variables.
    table = trainer.model.sparse_arch.tables[TABLE]
    full_read = tf.function(
        lambda ids: tf.gather(tf.convert_to_tensor(table), ids))
    bad = resource_uses(full_read.get_concrete_function(
        tf.TensorSpec([None], tf.int64)), _table_handles(trainer, [TABLE]))
    for key in _table_handles(trainer, [TABLE]):
        assert uses_by_op(bad, key) == {"ReadVariableOp": 1}


def test_train_function_updates_tables_sparsely(trainer, small_criteo_spec):
    handles = _table_handles(trainer)
    batch = dict(example_batch(small_criteo_spec, 4))
    batch[small_criteo_spec.label.name] = tf.zeros([4])
    iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
    # The very function the ClosureExecutor schedules on the workers.
    closure = make_train_function(trainer.strategy, trainer.step, 3)
    uses = resource_uses(closure.get_concrete_function(iterator), handles)
    for key in handles:
        ops = uses_by_op(uses, key)
        ops.pop("While", None)  # the steps loop passes the handle in
        ops.pop("If", None)  # so does the all-finite check around the update
        # One gather per shard per step, one sparse Adagrad update, and no
        # op that reads or writes the whole shard.
        assert ops == {"ResourceGather": 1,
                       "ResourceSparseApplyAdagradV2": 1}, (key, ops)


# -- learning and evaluation --------------------------------------------------------


def test_loss_falls_and_eval_auc_beats_chance(trained):
    losses = trained.losses
    assert trained.steps == list(range(STEPS_PER_CLOSURE, STEPS + 1,
                                       STEPS_PER_CLOSURE))
    first, last = np.mean(losses[:3]), np.mean(losses[-3:])
    print(f"loss first 3 closures {first:.4f}, last 3 {last:.4f}; eval "
          f"{trained.result.eval}")
    assert np.all(np.isfinite(losses))
    assert last < first - 0.03, losses
    assert trained.result.eval is not None
    assert trained.result.eval.auc > MIN_AUC, trained.result.eval


def test_eval_counts_every_example_exactly_once(trainer, trained, criteo_data,
                                                small_criteo_spec):
    manifest, _ = criteo_data
    result = trainer.evaluate(manifest, batch_size=300)  # not a block multiple
    rows = read_split(manifest, small_criteo_spec, "eval")
    ids = rows[ID_COLUMN]
    assert len(ids) == manifest.rows("eval") == 4_000
    assert len(np.unique(ids)) == len(ids)
    assert set(ids.tolist()) == set(range(16_000, 20_000))  # the tail split
    assert result.count == manifest.rows("eval")
    assert result.id_sum == int(ids.sum())
    assert result.positives == float(rows[small_criteo_spec.label.name].sum())
    # The same model and data give the same metrics whatever the batching.
    assert result.auc == pytest.approx(trained.result.eval.auc, abs=1e-3)


def test_executed_steps_are_at_least_the_scheduled_steps(trainer, trained):
    result = trained.result
    assert result.step == STEPS
    assert result.executed_steps >= STEPS
    assert trainer.executed_steps >= STEPS
    assert int(trainer.sparse_optimizer.iterations.numpy()) >= STEPS
    # Every closure that reached the coordinator counted its examples once.
    assert result.examples == STEPS * BATCH
    assert int(trainer.progress.step.numpy()) == STEPS


# -- checkpoints ---------------------------------------------------------------------


def _snapshot(trainer) -> dict[str, np.ndarray]:
    values = {}
    for name, table in trainer.model.sparse_arch.tables.items():
        values[f"table/{name}"] = _full(table)
        values[f"accumulator/{name}"] = np.concatenate([
            trainer.sparse_optimizer.get_slot(s, "accumulator").numpy()
            for s in table.variables])
    for variable in trainer.model.dense_variables():
        values[f"dense/{variable.name}"] = variable.numpy()
        for slot in ("m", "v"):
            values[f"{slot}/{variable.name}"] = (
                trainer.dense_optimizer.get_slot(variable, slot).numpy())
    values["sparse/iter"] = trainer.sparse_optimizer.iterations.numpy()
    values["dense/iter"] = trainer.dense_optimizer.iterations.numpy()
    values["progress/step"] = trainer.progress.step.numpy()
    values["progress/examples"] = trainer.progress.examples.numpy()
    return values


def _perturb(trainer) -> None:
    rng = np.random.default_rng(1)

    def scramble(variable) -> None:
        variable.assign(rng.normal(size=variable.shape).astype(
            variable.dtype.as_numpy_dtype))

    for table in trainer.model.sparse_arch.tables.values():
        for shard in table.variables:
            scramble(shard)
            scramble(trainer.sparse_optimizer.get_slot(shard, "accumulator"))
    for variable in trainer.model.dense_variables():
        scramble(variable)
        for slot in ("m", "v"):
            scramble(trainer.dense_optimizer.get_slot(variable, slot))
    trainer.sparse_optimizer.iterations.assign(12345)
    trainer.dense_optimizer.iterations.assign(12345)
    trainer.progress.step.assign(7)
    trainer.progress.examples.assign(7)


def test_checkpoint_round_trip_is_bit_identical(trainer, trained):
    path = trainer.save()
    assert path == trainer.keeper.latest
    before = _snapshot(trainer)
    _perturb(trainer)
    perturbed = _snapshot(trainer)
    changed = [k for k in before if not np.array_equal(before[k], perturbed[k])]
    assert set(changed) == set(before)  # every value really was overwritten

    assert trainer.restore() == path
    after = _snapshot(trainer)
    assert set(after) == set(before)
    differ = [k for k in before if not np.array_equal(before[k], after[k])]
    assert differ == []

    # ... and equal to the tensors stored in the checkpoint itself.
    reader = tf.train.load_checkpoint(path)
    model = trainer.model
    expected = {
        f"model/sparse_arch/{TABLE}/.ATTRIBUTES/VARIABLE_VALUE":
            after[f"table/{TABLE}"],
        f"model/sparse_arch/{TABLE}__wide/.ATTRIBUTES/VARIABLE_VALUE":
            after[f"table/{TABLE}__wide"],
        f"model/sparse_arch/{TABLE}/.OPTIMIZER_SLOT/sparse_optimizer/"
        "accumulator/.ATTRIBUTES/VARIABLE_VALUE": after[f"accumulator/{TABLE}"],
        "model/over_arch/hidden/0/kernel/.ATTRIBUTES/VARIABLE_VALUE":
            model.over_arch.hidden[0].kernel.numpy(),
        "model/over_arch/out/kernel/.ATTRIBUTES/VARIABLE_VALUE":
            model.over_arch.out.kernel.numpy(),
        "model/over_arch/out/kernel/.OPTIMIZER_SLOT/dense_optimizer/m/"
        ".ATTRIBUTES/VARIABLE_VALUE": trainer.dense_optimizer.get_slot(
            model.over_arch.out.kernel, "m").numpy(),
        "model/wide_dense/kernel/.ATTRIBUTES/VARIABLE_VALUE":
            model.wide_dense.kernel.numpy(),
        "dense_optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE": after["dense/iter"],
        "progress/step/.ATTRIBUTES/VARIABLE_VALUE": after["progress/step"],
    }
    for key, value in expected.items():
        assert np.array_equal(reader.get_tensor(key), value), key
    assert int(after["progress/step"]) == STEPS


def test_checkpoint_of_another_config_is_a_restore_error(
        ps_cluster, trainer, trained, ckpt_dir):
    path = trainer.keeper.latest
    assert path is not None
    # Another embedding width: every table (and the kernel above it) has
    # another shape. Restoring must name them, not fail inside TensorFlow.
    other = _ps_trainer(ps_cluster, criteo(buckets=200, dim=4), ckpt_dir)
    with pytest.raises(RestoreError) as error:
        other.restore()
    message = str(error.value)
    assert f"model/sparse_arch/{TABLE}/.ATTRIBUTES/VARIABLE_VALUE" in message
    assert "model/over_arch/hidden/0/kernel" in message
    assert int(other.progress.resumes.numpy()) == 0

    # A model without the wide part: the checkpoint's wide tables have no
    # counterpart, which the by-value check reports (no cluster needed).
    narrow = build_model(trainer.spec, dataclasses.replace(MODEL, wide=False))
    keeper = CheckpointKeeper(ckpt_dir, tf.train.Checkpoint(model=narrow))
    with pytest.raises(RestoreError, match=f"{TABLE}__wide"):
        keeper.restore(path, model_only=True)
