"""Per-table sparse optimizers (issue 22 §1): a table's ``optimizer`` and
``lr`` in the spec, the flags for the tables that name none.

A spec of four tables on four optimizers (FTRL at its own rate, row-wise
Adagrad and SGD on bfloat16 tables, the flags' Adagrad on a float32 one)
trains on the shared in-process cluster (2 workers, 2 PS): each table's
slots are its optimizer's, float32, on its shards' PS, and the optimizers
keep their PS path (not ``single_writer``); the planner's bytes are the
variables' bytes; the checkpoint names each group's optimizer; a restore
into another shard count is exact by value. A warm start into a spec where
one table changed optimizer re-initialises that table's slots (one line) and
carries the others' by value -- across a renamed group too; ``psrec train
--warm-start`` reads the source's optimizer flags from its ``job.json``. A
dynamic table's reset rows get fresh slots of its own optimizer. An unknown
optimizer name is one line with a suggestion, exit 2.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from psrec.data.input.config import InputConfig
from psrec.features.spec.spec import FeatureSpec
from psrec.models.optim.config import OptimizerConfig
from psrec.models.optim.config import table_groups
from psrec.models.optim.config import table_row_bytes
from psrec.models.ranking.config import ModelConfig
from psrec.models.ranking.config import model_config
from psrec.ps_cluster.cluster.partition_config import PartitionConfig
from tests._shared import refused_spec

SPEC = {
    "name": "tabopt", "label": {"name": "label"},
    "tables": [{"name": "users", "dim": 8, "optimizer": "ftrl", "lr": 0.05,
                "dtype": "bfloat16"},
               {"name": "items", "dim": 4, "optimizer": "rowwise_adagrad",
                "dtype": "bfloat16"},
               {"name": "tags", "dim": 4},
               {"name": "shops", "dim": 4, "optimizer": "sgd",
                "dtype": "bfloat16"}],
    "dense": [{"name": "price", "transform": "log1p"}],
    "categorical": [{"name": "user", "table": "users", "hash_buckets": 300},
                    {"name": "item", "table": "items", "hash_buckets": 200},
                    {"name": "tag", "table": "tags", "hash_buckets": 50},
                    {"name": "shop", "table": "shops", "hash_buckets": 60}]}
FLAGS = OptimizerConfig(sparse_lr=0.1, dense_lr=0.01, base_batch_size=64,
                        warmup_steps=0)  # --sparse-optimizer adagrad
# Small towers, and wide twins: trained by their table's optimizer.
MODEL = ModelConfig(interaction="concat", wide=True, top_mlp=(8,))
BATCH, STEPS = 64, 4
INITIAL = 0.1  # every accumulator's initial_accumulator_value
# table -> (keras class, slot names, slot width: None = the table's dim)
EXPECTED = {"users": ("Ftrl", ["accumulator", "linear"], None),
            "items": ("RowwiseAdagrad", ["accumulator"], 1),
            "tags": ("Adagrad", ["accumulator"], None),
            "shops": ("SGD", [], None)}
GROUPS = {"users": "sparse_optimizer_ftrl_lr0p05",
          "items": "sparse_optimizer_rowwise_adagrad",
          "tags": "sparse_optimizer",
          "shops": "sparse_optimizer_sgd"}


def _spec(**changes) -> FeatureSpec:
    data = json.loads(json.dumps(SPEC))
    for table in data["tables"]:
        table.update(changes.get(table["name"], {}))
    return FeatureSpec.from_dict(data)


def _shards(variable) -> list:
    return list(getattr(variable, "variables", [variable]))


def _slot_key(table: str, group: str, slot: str) -> str:
    return (f"model/sparse_arch/{table}/.OPTIMIZER_SLOT/{group}/{slot}/"
            ".ATTRIBUTES/VARIABLE_VALUE")


def _full_slot(trainer, table: str, slot: str) -> np.ndarray:
    optimizer = trainer.table_optimizers[table.removesuffix("__wide")]
    return np.concatenate([optimizer.get_slot(s, slot).numpy() for s in
                           _shards(trainer.model.sparse_arch.tables[table])])


# -- the spec ------------------------------------------------------------------


def test_a_table_names_its_optimizer_and_rate_and_others_keep_their_form():
    spec = _spec()
    users, items, tags, _ = spec.tables
    assert (users.optimizer, users.lr) == ("ftrl", 0.05)
    assert (items.optimizer, items.lr) == ("rowwise_adagrad", None)
    assert FeatureSpec.from_dict(spec.to_dict()) == spec
    saved = {t["name"]: t for t in spec.to_dict()["tables"]}
    assert saved["users"]["optimizer"] == "ftrl"
    assert saved["users"]["lr"] == 0.05 and "lr" not in saved["items"]
    # A table that names neither is saved as before (same fingerprint).
    assert set(saved["tags"]) == {"name", "rows", "dim", "initializer",
                                  "scale"}
    groups = table_groups(spec.tables, FLAGS)
    assert {t: g.name for t, g in groups.items()} == GROUPS
    assert [(g.optimizer, g.lr) for g in groups.values()] == [
        ("ftrl", 0.05), ("rowwise_adagrad", 0.1), ("adagrad", 0.1),
        ("sgd", 0.1)]
    # The flag's optimizer at another rate is a group of its own.
    flagged = table_groups(_spec(tags={"lr": 0.3}).tables, FLAGS)
    assert flagged["tags"].name == "sparse_optimizer_adagrad_lr0p3"


def test_an_unknown_optimizer_is_one_line_with_a_suggestion(tmp_path,
                                                            capsys):
    data = json.loads(json.dumps(SPEC))
    data["tables"][1]["optimizer"] = "rowwise_adagard"
    err, path = refused_spec(data, tmp_path, capsys)
    assert str(path) in err and "table 'items': `optimizer` = " \
        "'rowwise_adagard' is not allowed" in err, err
    assert "did you mean 'rowwise_adagrad'?" in err, err


# -- under PS ------------------------------------------------------------------------


def _ps_trainer(cluster, partition: PartitionConfig, checkpoints):
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    from psrec.ps_cluster.training.trainer import Trainer
    return Trainer(build_ps_strategy(cluster, partition), _spec(), MODEL,
                   FLAGS, InputConfig(batch_size=BATCH),
                   checkpoint_dir=checkpoints)


@pytest.fixture(scope="module")
def trained(ps_cluster, tmp_path_factory):
    from psrec.ps_cluster.training.config import LoopConfig
    from tests._ps_helpers import random_dataset_fn
    root = tmp_path_factory.mktemp("tabopt")
    trainer = _ps_trainer(ps_cluster, PartitionConfig(kind="fixed"),
                          root / "checkpoints")
    result = trainer.train(random_dataset_fn(trainer.spec, BATCH),
                           LoopConfig(steps=STEPS, steps_per_closure=2,
                                      checkpoint_every=0))
    assert result.step == STEPS and result.checkpoint is not None
    return trainer, result.checkpoint, root


@pytest.mark.cluster
@pytest.mark.slow  # the shared training fixture (>10 s on 2 cores)
def test_each_table_trains_with_its_optimizer_beside_its_shards(trained):
    trainer, _, _ = trained
    assert len(trainer.sparse_optimizers) == 4  # one per (optimizer, lr)
    assert trainer.table_optimizers["users"].learning_rate.base_lr == 0.05
    for name, variable in trainer.model.sparse_arch.tables.items():
        table = name.removesuffix("__wide")
        kind, slots, width = EXPECTED[table]
        optimizer = trainer.table_optimizers[table]
        assert type(optimizer).__name__ == kind, name
        assert not optimizer._single_writer  # noqa: SLF001 (workers race)
        shards = _shards(variable)
        assert {s.device for s in shards} == {
            f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(2)}
        for shard in shards:
            assert shard.dtype == _spec().table(table).storage, name
            assert optimizer.get_slot_names() == slots
            for slot in slots:
                value = optimizer.get_slot(shard, slot)
                assert value.dtype == tf.float32, (name, slot)
                assert value.device == shard.device, (name, slot)
                assert tuple(value.shape) == (
                    shard.shape[0], width or shard.shape[1]), (name, slot)
            for other in trainer.sparse_optimizers.values():
                if other is not optimizer:  # no other optimizer's slots
                    with pytest.raises(KeyError):
                        other.get_slot(shard, "accumulator")
        if not slots:  # SGD
            continue
        # Training moved the slots of the rows it touched.
        accumulator = _full_slot(trainer, name, "accumulator")
        assert np.any(accumulator != INITIAL), name
        if table == "users":
            assert np.any(_full_slot(trainer, name, "linear") != 0.0)


@pytest.mark.cluster
@pytest.mark.slow  # the shared training fixture (>10 s on 2 cores)
def test_the_plan_s_bytes_are_the_variables_bytes(trained):
    from psrec.ps_cluster.planner.plan import plan_partition
    from psrec.ps_cluster.planner.plan import plan_text
    trainer, _, _ = trained
    result = plan_partition(trainer.spec, MODEL, 2, FLAGS,
                            PartitionConfig(kind="fixed"))
    assert [t.name for t in result.tables] == list(
        trainer.model.sparse_arch.tables)
    text = plan_text(result)
    for planned in result.tables:
        table = planned.name.removesuffix("__wide")
        optimizer = trainer.table_optimizers[table]
        assert planned.optimizer == (_spec().table(table).optimizer
                                     or FLAGS.sparse)
        shards = _shards(trainer.model.sparse_arch.tables[planned.name])
        values = slots = 0
        for shard, planned_shard in zip(shards, planned.shards, strict=True):
            assert shard.device.endswith(f"task:{planned_shard.ps}"
                                         "/device:CPU:0")
            shard_slots = sum(
                4 * optimizer.get_slot(shard, s).shape.num_elements()
                for s in optimizer.get_slot_names())
            shard_bytes = shard.dtype.size * shard.shape.num_elements()
            assert planned_shard.bytes == shard_bytes, planned.name
            assert planned_shard.slot_bytes == shard_slots, planned.name
            values += shard_bytes
            slots += shard_slots
        assert planned.row_bytes * planned.rows == values + slots
        row = [line for line in text.splitlines()
               if line.split()[:1] == [planned.name] and planned.optimizer
               in line]
        assert row and f"{planned.row_bytes:,}" in row[0].split(), (
            planned.name, text)
    # What `psrec advise` shows per table is the plan's.
    assert {name: (optimizer, size) for name, optimizer, size
            in table_row_bytes(trainer.spec.tables, FLAGS)} == {
        t.name: (t.optimizer, t.row_bytes) for t in result.tables
        if not t.name.endswith("__wide")}


def test_advise_shows_each_table_s_optimizer_and_bytes_per_row():
    from psrec.models.optim.sizing import DeviceMemory
    from psrec.models.optim.sizing import SizeEstimate
    from psrec.ps_cluster.planner.advise import Advice
    from psrec.ps_cluster.planner.advise import Measurements
    advice = Advice(
        "tabopt", "dlrm", 64, SizeEstimate(1, 1, 1, 1),
        DeviceMemory("CPU", 1 << 30, "test"), 0.5, 0.3,
        Measurements(1.0, 0.1, 0.1, 1, 2, "2 x CPU"), "ps", (), 1.0,
        tables=table_row_bytes(_spec().tables, FLAGS))
    # users: 8 bfloat16 values (2 bytes) + FTRL's 2 x 8 float32 (4 bytes);
    # items: 4 bfloat16 + 1 float32 per row; tags: 4 + 4, float32; shops:
    # 4 bfloat16 values, SGD keeps no slot.
    assert ("  tables (optimizer, bytes/row with slots): users ftrl 80, "
            "items rowwise_adagrad 12, tags adagrad 32, shops sgd 8") in \
        advice.summary().splitlines()


@pytest.mark.cluster
@pytest.mark.slow  # the shared training fixture (>10 s on 2 cores)
def test_the_checkpoint_names_each_group_and_restores_resharded_by_value(
        ps_cluster, trained):
    trainer, path, root = trained
    reader = tf.train.load_checkpoint(path)
    keys = dict(tf.train.list_variables(path))
    for table, group in GROUPS.items():
        for slot in EXPECTED[table][1]:
            assert _slot_key(table, group, slot) in keys, (table, slot)
            assert np.array_equal(reader.get_tensor(
                _slot_key(table, group, slot)),
                _full_slot(trainer, table, slot))
    # 3 shards a table where the checkpoint has 2: TensorFlow's restore
    # leaves resharded slots behind; the keeper's by-value check repairs
    # and proves them.
    other = _ps_trainer(ps_cluster, PartitionConfig(kind="fixed", shards=3),
                        root / "other")
    assert len(_shards(other.model.sparse_arch.tables["users"])) == 3
    other.keeper.restore(path)
    for table, group in GROUPS.items():
        for name in (table, table + "__wide"):
            for slot in EXPECTED[table][1]:
                key = _slot_key(name, group, slot)
                assert np.array_equal(_full_slot(other, name, slot),
                                      reader.get_tensor(key)), key
            values = np.concatenate([s.numpy() for s in _shards(
                other.model.sparse_arch.tables[name])])
            assert np.array_equal(values, reader.get_tensor(
                f"model/sparse_arch/{name}/.ATTRIBUTES/VARIABLE_VALUE"))


@pytest.mark.cluster
@pytest.mark.slow  # the shared training fixture (>10 s on 2 cores)
def test_a_warm_start_re_initialises_the_slots_of_a_changed_optimizer(
        trained):
    from psrec.ps_cluster.checkpoint.warm_plan import plan_warm_start
    from psrec.ps_cluster.training.trainer import Trainer
    _, path, _ = trained
    reader = tf.train.load_checkpoint(path)
    # items: row-wise Adagrad -> Adagrad; users: FTRL at another rate (its
    # optimizer's checkpoint name changes, its slots carry over).
    spec = _spec(items={"optimizer": "adagrad"}, users={"lr": 0.02})
    target = Trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), spec, MODEL,
                     FLAGS, InputConfig(batch_size=BATCH))
    result = target.warm_start(path, plan_warm_start(_spec(), spec, FLAGS,
                                                     FLAGS))
    assert [line for line in result.lines if "optimizer" in line] == [
        "warm start: table 'items' optimizer rowwise_adagrad -> adagrad: "
        "its optimizer slots are re-initialised"], result.lines
    assert result.summary.endswith(
        "optimizer slots carried (re-initialised for 1 table(s) whose "
        "optimizer changed: items)"), result.summary
    assert target.table_optimizers["items"] is target.sparse_optimizer
    for name, dim in (("items", 4), ("items__wide", 1)):
        fresh = _full_slot(target, name, "accumulator")  # Adagrad's now
        assert fresh.shape == (200, dim) and np.all(fresh == INITIAL), name
    for name in ("users", "users__wide", "tags", "tags__wide"):
        table = name.removesuffix("__wide")
        for slot in EXPECTED[table][1]:
            saved = reader.get_tensor(_slot_key(name, GROUPS[table], slot))
            assert np.array_equal(_full_slot(target, name, slot), saved), (
                name, slot)
    assert "sparse_optimizer_ftrl_lr0p02" in target.sparse_optimizers


@pytest.mark.cluster
@pytest.mark.slow  # the shared training fixture (>10 s on 2 cores)
def test_a_resume_with_a_changed_table_optimizer_is_refused(trained):
    from psrec.ps_cluster.checkpoint.keeper import RestoreError
    from psrec.ps_cluster.training.trainer import Trainer
    _, path, root = trained
    resumed = Trainer(tf.distribute.OneDeviceStrategy("/cpu:0"),
                      _spec(users={"optimizer": "adagrad", "lr": None}),
                      MODEL, FLAGS, InputConfig(batch_size=BATCH),
                      checkpoint_dir=root / "checkpoints")
    with pytest.raises(RestoreError) as error:
        resumed.restore()
    message = str(error.value)
    assert _slot_key("users", "sparse_optimizer", "accumulator") in message
    assert "--warm-start" in message and "table optimizer" in message


def test_a_dynamic_table_s_reset_rows_get_its_own_optimizer_s_slots():
    from psrec.ps_cluster.training.maintenance import dynamic_maintainer
    from psrec.ps_cluster.training.trainer import Trainer
    data = json.loads(json.dumps(SPEC))
    data["tables"][0] = {"name": "users", "dim": 8, "mode": "dynamic",
                         "capacity": 40, "optimizer": "ftrl"}
    data["categorical"][0] = {"name": "user", "table": "users"}
    spec = FeatureSpec.from_dict(data)
    trainer = Trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), spec,
                      model_config("dlrm"), FLAGS,
                      InputConfig(batch_size=BATCH))
    ftrl = trainer.table_optimizers["users"]
    [shard] = _shards(trainer.model.sparse_arch.tables["users"])
    for slot in ("accumulator", "linear"):
        ftrl.get_slot(shard, slot).assign(tf.fill(shard.shape, 9.0))
    rows = np.array([3, 17])
    dynamic_maintainer(trainer).reset("users", rows)
    accumulator = ftrl.get_slot(shard, "accumulator").numpy()
    linear = ftrl.get_slot(shard, "linear").numpy()
    assert np.all(accumulator[rows] == INITIAL) and np.all(linear[rows] == 0)
    others = np.setdiff1d(np.arange(41), rows)
    assert np.all(accumulator[others] == 9.0) and np.all(linear[others] == 9)


def test_a_warm_source_s_optimizer_flags_come_from_its_job_json(tmp_path):
    """``psrec train --warm-start``'s plan compares each table's optimizer
    with the source run's: its spec and its ``--sparse-optimizer`` (the
    ``job.json`` beside its checkpoints)."""
    from psrec.launch.job.config import JobConfig
    from psrec.launch.job.warm_start import check_source
    source = JobConfig(workdir=tmp_path / "a", spec=_spec(),
                       optimizer=OptimizerConfig(sparse="sgd"))
    folder = tmp_path / "a" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps(source.to_dict()))
    (folder / "ckpt-5.index").write_bytes(b"")
    (folder / "checkpoint").write_text('model_checkpoint_path: "ckpt-5"\n')
    config = JobConfig(workdir=tmp_path / "b", spec=_spec(), optimizer=FLAGS)
    plan = check_source(config, str(tmp_path / "a")).plan
    # tags names no optimizer: sgd there, the flag's adagrad here.
    assert plan.optimizer_changes() == [("tags", "sgd", "adagrad")]
    assert plan.lines() == ["warm start: table 'tags' optimizer sgd -> "
                            "adagrad: its optimizer slots are re-initialised"]
