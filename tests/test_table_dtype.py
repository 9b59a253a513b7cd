"""16-bit tables (``TableConfig.dtype``, ``psrec train --table-dtype``): the
spec field and its flag default; each sparse optimizer's float32 row update
equals its own float32 kernel; stochastic rounding keeps updates that
round-to-nearest loses; a bfloat16 table trains under PS as a bfloat16
variable on its PS with float32 slots, is planned at its variables' bytes
and restores by value into another sharding; a warm start from float32
casts; a dynamic table's reset rows are cast; the export serves float32
scores equal to the model's (and quantizes a 16-bit table)."""

from __future__ import annotations

import types

import numpy as np
import pytest
import tensorflow as tf

from psrec.errors import ConfigError
from psrec.features.spec.presets import criteo
from psrec.features.spec.spec import FeatureSpec
from psrec.models.optim.optimizers import make_optimizer
from psrec.models.optim.rounding import stochastic_round
from tests._ps_helpers import RESHARD_MODEL
from tests._ps_helpers import RESHARD_SPEC_ARGS
from tests._ps_helpers import random_dataset_fn
from tests._shared import refused_spec

SPARSE = ("adagrad", "rowwise_adagrad", "ftrl", "sgd")
TABLE = "categorical"  # the criteo preset's one table
TABLE_KEY = f"model/sparse_arch/{TABLE}/.ATTRIBUTES/VARIABLE_VALUE"


# -- the spec and the flag --------------------------------------------------------


def test_a_table_dtype_is_a_spec_field_with_the_flag_as_its_default():
    spec = criteo(buckets=10, dim=4)
    data = spec.to_dict()
    assert "dtype" not in data["tables"][0]  # unset: the old form
    data["tables"][0]["dtype"] = "bfloat16"
    own = FeatureSpec.from_dict(data)
    assert own.tables[0].storage == "bfloat16"
    assert own.fingerprint() == spec.fingerprint()  # not the data's
    # The flag fills unset tables only; float32 keeps the spec as it is.
    assert spec.with_table_dtype("float32") is spec
    assert spec.with_table_dtype("bfloat16").tables[0].dtype == "bfloat16"
    data["tables"][0]["dtype"] = "float32"  # a table's own dtype wins
    pinned = FeatureSpec.from_dict(data)
    assert pinned.with_table_dtype("bfloat16").tables[0].dtype == "float32"
    assert own.tables[0].bytes == spec.tables[0].bytes // 2
    data["tables"][0]["dtype"] = "int8"
    with pytest.raises(ConfigError, match="`dtype` = 'int8' is not allowed"):
        FeatureSpec.from_dict(data)


def test_a_float16_table_is_refused_in_one_line_naming_why(tmp_path, capsys):
    """TensorFlow cannot read part of a float16 tensor from a checkpoint
    (every restore on PS reads parts): a run could save and never resume,
    so a spec's float16 table is refused before anything runs, exit 2."""
    from psrec.launch.cli.main import main
    data = criteo(buckets=10, dim=4).to_dict()
    data["tables"][0]["dtype"] = "float16"
    err, path = refused_spec(data, tmp_path, capsys)
    assert ("`dtype` = 'float16' is not allowed: TensorFlow's checkpoint "
            "reader cannot read part of a float16 tensor") in err, err
    assert str(path) in err and "'bfloat16'" in err, err
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--table-dtype", "float16", "--data", str(tmp_path)])
    assert exit_.value.code == 2


def test_the_train_flag_resolves_into_the_job_spec_and_mirrored_refuses():
    from psrec.launch.job.config import JobConfig
    from psrec.launch.job.config import StrategyConfig
    job = JobConfig(spec=criteo(buckets=10, dim=4), table_dtype="bfloat16")
    assert {t.storage for t in job.spec.tables} == {"bfloat16"}
    assert JobConfig.from_dict(job.to_dict()).spec == job.spec
    with pytest.raises(ConfigError, match="16-bit tables train under"):
        JobConfig(spec=job.spec, strategy=StrategyConfig(kind="mirrored"))


# -- the update --------------------------------------------------------------------


@pytest.mark.parametrize("name", SPARSE)
def test_the_float32_row_update_equals_the_optimizer_s_own_kernel(name):
    """``_update_rows`` (what a 16-bit table runs, in float32) on rows and
    slots gathered from a float32 variable equals the optimizer's fused
    float32 update of that variable."""
    rng = np.random.default_rng(1)
    table = tf.Variable(rng.normal(size=(6, 4)).astype(np.float32))
    optimizer = make_optimizer(name, 0.3)
    optimizer._create_all_weights([table])  # noqa: SLF001
    rows = tf.constant([1, 4, 5])
    for step in range(3):  # slots away from their initial values first
        grad = rng.normal(size=(3, 4)).astype(np.float32)
        before = tf.gather(table, rows)
        slots = {s: tf.gather(optimizer.get_slot(table, s), rows)
                 for s in optimizer.get_slot_names()}
        coefficients = optimizer._fallback_apply_state(  # noqa: SLF001
            table.device, tf.float32)
        want, want_slots = optimizer._update_rows(  # noqa: SLF001
            before, tf.constant(grad), slots, coefficients)
        optimizer.apply_gradients([(tf.IndexedSlices(
            tf.constant(grad), rows, tf.constant([6, 4])), table)])
        np.testing.assert_allclose(tf.gather(table, rows).numpy(),
                                   want.numpy(), rtol=2e-5, atol=1e-6)
        for slot, value in want_slots.items():
            np.testing.assert_allclose(
                tf.gather(optimizer.get_slot(table, slot), rows).numpy(),
                value.numpy(), rtol=2e-5, atol=1e-6)
        assert not np.allclose(want.numpy(), before.numpy())


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
def test_stochastic_rounding_keeps_updates_round_to_nearest_loses(dtype):
    """100 SGD steps of +1e-4 on a 16-bit table of ones: each step is below
    half a unit at 1 (bfloat16 2**-8, float16 2**-11), so round-to-nearest
    would leave 1.0; stochastic rounding moves the mean to 1.01."""
    table = tf.Variable(tf.ones([500, 8], dtype))
    optimizer = make_optimizer("sgd", 1.0)
    optimizer._create_all_weights([table])  # noqa: SLF001

    @tf.function
    def train():
        for _ in tf.range(100):
            optimizer.apply_gradients([(tf.IndexedSlices(
                tf.fill([500, 8], tf.constant(-1e-4, dtype)), tf.range(500),
                tf.constant([500, 8])), table)])
    train()
    values = tf.cast(table, tf.float64).numpy()
    assert table.dtype == dtype
    assert abs(values.mean() - 1.01) < 1e-3, values.mean()
    assert float(tf.cast(tf.cast(1.0 + 1e-4, dtype), tf.float32)) == 1.0
    # Unbiased on negative and tiny values too, and exact values stay.
    seed = tf.constant([3, 4], tf.int64)
    for value in (-2.5 - 1e-3, 3e-6, 1e-3):
        rounded = stochastic_round(tf.fill([100_000], value), dtype, seed)
        assert rounded.dtype == dtype
        mean = float(tf.reduce_mean(tf.cast(rounded, tf.float64)))
        assert abs(mean - value) < 2e-3 * abs(value), (value, mean)
    exact = tf.constant([1.0, -0.5, 0.0, 2.0 ** -20])
    np.testing.assert_array_equal(
        tf.cast(stochastic_round(exact, dtype, seed), tf.float32), exact)


def test_a_dynamic_table_s_reset_rows_are_cast_to_its_dtype():
    from psrec.models.dynamic.table import reset_rows
    shards = [tf.Variable(tf.zeros([3, 4], tf.bfloat16)),
              tf.Variable(tf.zeros([2, 4], tf.bfloat16))]
    optimizer = make_optimizer("adagrad", 0.1)
    optimizer._create_all_weights(shards)  # noqa: SLF001
    reset_rows(types.SimpleNamespace(variables=shards), np.array([1, 4]),
               tf.fill([2, 4], 0.3), optimizer)
    assert shards[0].dtype == tf.bfloat16
    assert float(tf.cast(shards[1][1, 0], tf.float32)) == pytest.approx(
        0.3, abs=2e-3)
    assert optimizer.get_slot(shards[1], "accumulator").dtype == tf.float32


def test_a_table_s_own_optimizer_trains_its_16_bit_table(tmp_path):
    """A spec table naming its own optimizer (FTRL, per-table optimizers)
    and ``dtype: bfloat16`` trains one-device: a bfloat16 variable, its
    FTRL slots float32 and moved, its rows moved."""
    import dataclasses

    from psrec.data.input.config import InputConfig
    from psrec.models.optim.config import OptimizerConfig
    from psrec.ps_cluster.training.config import LoopConfig
    from psrec.ps_cluster.training.trainer import Trainer
    spec = criteo(**RESHARD_SPEC_ARGS)
    spec = dataclasses.replace(spec, tables=(dataclasses.replace(
        spec.tables[0], optimizer="ftrl", dtype="bfloat16"),))
    trainer = Trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), spec,
                      RESHARD_MODEL, OptimizerConfig(
                          sparse_lr=0.1, base_batch_size=64, warmup_steps=0),
                      InputConfig(batch_size=64))
    table = trainer.model.sparse_arch.tables[TABLE]
    optimizer = trainer.table_optimizers[TABLE]
    start = table.numpy().astype(np.float32)
    trainer.train(random_dataset_fn(spec, 64), LoopConfig(
        steps=5, steps_per_closure=5, checkpoint_every=0))
    assert table.dtype == tf.bfloat16 and optimizer is not (
        trainer.sparse_optimizer)
    # One device: nothing else writes its tables (PS: test_table_optimizers).
    assert all(o._single_writer  # noqa: SLF001
               for o in trainer.sparse_optimizers.values())
    slots = {name: optimizer.get_slot(table, name)
             for name in optimizer.get_slot_names()}
    assert sorted(slots) == ["accumulator", "linear"]
    assert {slot.dtype for slot in slots.values()} == {tf.float32}
    assert np.any(slots["linear"].numpy() != 0)
    assert np.mean(np.any(table.numpy().astype(np.float32) != start,
                          axis=1)) > 0.5


# -- under PS ----------------------------------------------------------------------


SPEC16 = criteo(**RESHARD_SPEC_ARGS).with_table_dtype("bfloat16")


@pytest.fixture(scope="module")
def trained(ps_cluster, tmp_path_factory):
    """A bfloat16 table (deepfm-free: RESHARD_MODEL) trained 10 steps with
    row-wise Adagrad on the session's 2-PS cluster, 3 fixed shards,
    checkpointed."""
    from psrec.data.input.config import InputConfig
    from psrec.models.optim.config import OptimizerConfig
    from psrec.ps_cluster.cluster.partition_config import PartitionConfig
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    from psrec.ps_cluster.training.config import LoopConfig
    from psrec.ps_cluster.training.trainer import Trainer
    root = tmp_path_factory.mktemp("table-dtype")
    partition = PartitionConfig(kind="fixed", shards=3)
    optimizer = OptimizerConfig(sparse="rowwise_adagrad", sparse_lr=0.1,
                                dense_lr=0.01, base_batch_size=64,
                                warmup_steps=0)
    trainer = Trainer(build_ps_strategy(ps_cluster, partition), SPEC16,
                      RESHARD_MODEL, optimizer, InputConfig(batch_size=64),
                      checkpoint_dir=root / "ckpt")
    shards = list(trainer.model.sparse_arch.tables[TABLE].variables)
    start = np.concatenate([s.numpy() for s in shards]).astype(np.float32)
    result = trainer.train(random_dataset_fn(SPEC16, 64), LoopConfig(
        steps=10, steps_per_closure=5, checkpoint_every=0))
    return trainer, shards, start, result.checkpoint, optimizer, partition


@pytest.mark.cluster
def test_a_bfloat16_table_trains_on_its_ps_with_float32_slots(trained):
    trainer, shards, start, checkpoint, _, _ = trained
    assert len({s.device for s in shards}) == 2  # both PS
    optimizer = trainer.sparse_optimizer
    for shard in shards:
        assert shard.dtype == tf.bfloat16
        slot = optimizer.get_slot(shard, "accumulator")
        assert (slot.dtype, slot.device) == (tf.float32, shard.device)
        assert tuple(slot.shape) == (shard.shape[0], 1)
    now = np.concatenate([s.numpy() for s in shards]).astype(np.float32)
    assert np.mean(np.any(now != start, axis=1)) > 0.5  # rows trained
    saved = tf.train.load_checkpoint(checkpoint)
    assert saved.get_variable_to_dtype_map()[TABLE_KEY] == tf.bfloat16
    np.testing.assert_array_equal(
        saved.get_tensor(TABLE_KEY).astype(np.float32), now)


@pytest.mark.cluster
def test_the_plan_counts_the_bfloat16_variables_bytes(trained):
    from psrec.ps_cluster.planner.plan import plan_partition
    trainer, shards, _, _, optimizer, partition = trained
    plan = plan_partition(SPEC16, RESHARD_MODEL, 2, optimizer, partition,
                          dense_parameters=0)
    table = next(t for t in plan.tables if t.name == TABLE)
    opt = trainer.sparse_optimizer
    assert [s.bytes for s in table.shards] == [
        v.dtype.size * v.shape.num_elements() for v in shards]
    assert [s.slot_bytes for s in table.shards] == [
        sum(opt.get_slot(v, n).dtype.size * opt.get_slot(v, n).shape
            .num_elements() for n in opt.get_slot_names()) for v in shards]
    assert table.bytes == 2 * SPEC16.table(TABLE).rows * 4  # 2 bytes x dim


@pytest.mark.cluster
def test_a_bfloat16_checkpoint_restores_by_value_into_one_shard(trained,
                                                                tmp_path):
    """The 3-shard checkpoint restores (checked by value) into a one-device
    trainer of one shard; a bfloat16 run warm-started from a float32 run
    gets the float32 table cast (one line says so) and its float32 slots."""
    from psrec.data.input.config import InputConfig
    from psrec.ps_cluster.checkpoint.warm_plan import plan_warm_start
    from psrec.ps_cluster.training.trainer import Trainer
    _, _, _, checkpoint, optimizer, _ = trained
    slot_key = TABLE_KEY.replace(
        "/.ATTRIBUTES", "/.OPTIMIZER_SLOT/sparse_optimizer/accumulator"
        "/.ATTRIBUTES")

    def trainer(spec, workdir):
        return Trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), spec,
                       RESHARD_MODEL, optimizer, InputConfig(batch_size=64),
                       checkpoint_dir=workdir)

    def state(run):
        table = run.model.sparse_arch.tables[TABLE]
        slot = run.sparse_optimizer.get_slot(table, "accumulator")
        return table, slot

    saved = tf.train.load_checkpoint(checkpoint)
    one = trainer(SPEC16, tmp_path / "one")
    assert one.keeper.restore(checkpoint) == checkpoint
    table, slot = state(one)
    np.testing.assert_array_equal(table.numpy(), saved.get_tensor(TABLE_KEY))
    np.testing.assert_array_equal(slot.numpy(), saved.get_tensor(slot_key))
    # A float32 run with values bfloat16 cannot hold, saved ...
    source = trainer(criteo(**RESHARD_SPEC_ARGS), tmp_path / "f32")
    values = np.random.default_rng(2).normal(
        size=table.shape).astype(np.float32)
    state(source)[0].assign(values)
    state(source)[1].assign(saved.get_tensor(slot_key))
    path = source.save()
    # ... warm-starts the bfloat16 run: cast by round-to-nearest.
    fresh = trainer(SPEC16, tmp_path / "bf16")
    result = fresh.warm_start(path, plan_warm_start(
        criteo(**RESHARD_SPEC_ARGS), SPEC16))
    assert (f"table {TABLE}: float32 in the source, carried cast to "
            "bfloat16 (round to nearest)") in result.lines
    table, slot = state(fresh)
    assert (table.dtype, slot.dtype) == (tf.bfloat16, tf.float32)
    np.testing.assert_array_equal(
        table.numpy(), tf.cast(values, tf.bfloat16).numpy())
    assert not np.array_equal(table.numpy().astype(np.float32), values)
    np.testing.assert_array_equal(slot.numpy(), saved.get_tensor(slot_key))


# -- the export --------------------------------------------------------------------


def test_a_bfloat16_model_exports_float32_scores_equal_to_its_own(tmp_path):
    """The all-in-one SavedModel of a deepfm with bfloat16 tables (wide
    twins too) keeps them bfloat16 and serves float32 probabilities equal
    to the model's; the tables' gradients are float32; ``--table-dtype
    int8`` quantizes the bfloat16 rows."""
    import pyarrow as pa

    from psrec.models.build import build_model
    from psrec.models.embedding.quantize import quantize_tables
    from psrec.models.ranking.config import model_config
    from psrec.models.serving.export import ServingModule
    from psrec.models.serving.export import export_saved_model
    from tests._client import client_inputs
    from tests._client import mixed_spec
    spec = mixed_spec("dtype").with_table_dtype("bfloat16")
    model = build_model(spec, model_config("deepfm", init_scale=0.3))
    assert {v.dtype for v in model.embedding_variables()} == {tf.bfloat16}
    rng = np.random.default_rng(3)
    rows = 64
    table = pa.table({
        "label": pa.array(np.zeros(rows, np.int64)),
        "price": pa.array(rng.gamma(2.0, 3.0, rows)),
        "city": pa.array([f"c{i}" for i in rng.integers(0, 40, rows)]),
        "user": pa.array(rng.integers(0, 40, rows)),
        "tags": pa.array([[f"t{i}" for i in rng.integers(0, 9, 2)]
                          for _ in range(rows)]),
        "codes": pa.array([list(rng.integers(0, 9, 3)) for _ in range(rows)])})
    raw = {k: tf.constant(v) for k, v in client_inputs(table, spec).items()}
    batch = ServingModule(model, spec).model_batch(raw)
    with tf.GradientTape() as tape:
        expected = tf.sigmoid(model(batch))
        loss = tf.reduce_sum(expected)
    # The lookup's gradient stays float32 (the update is float32 through).
    assert [g.values.dtype for g in tape.gradient(
        loss, model.embedding_variables())] == [tf.float32] * 2
    folder = export_saved_model(model, spec, tmp_path / "export")
    served = tf.saved_model.load(folder).signatures["serving_default"](
        **raw)["probability"]
    reader = tf.train.load_checkpoint(f"{folder}/variables/variables")
    assert {reader.get_variable_to_dtype_map()[key] for key, shape
            in reader.get_variable_to_shape_map().items()
            if len(shape) == 2 and shape[0] == 200} == {tf.bfloat16}
    assert served.dtype == tf.float32
    assert np.std(expected.numpy()) > 1e-3  # rows told apart
    np.testing.assert_allclose(served.numpy(), expected.numpy(), rtol=0,
                               atol=1e-6)
    stored = quantize_tables(model.sparse_arch, "int8")["ids"]
    values = tf.cast(model.sparse_arch.tables["ids"], tf.float32).numpy()
    back = stored.gather(tf.range(200)).numpy()
    spread = values.max(1, keepdims=True) - values.min(1, keepdims=True)
    assert stored.dtype == "int8"
    assert np.all(np.abs(back - values) <= spread / 255 / 2 + 1e-6)


@pytest.mark.parametrize("name", SPARSE)
def test_a_single_writer_s_whole_row_update_equals_the_fused_kernel(name):
    """``single_writer=True`` (every strategy but PS) updates a float32
    table by gathering its rows and writing them back whole; with repeated
    ids in the gradient, over several steps, the table and its slots equal
    the fused kernel's (``single_writer=False``) -- and the rows path is the
    one taken, except by SGD, whose own one-scatter update is faster."""
    rng = np.random.default_rng(2)
    start = rng.normal(size=(7, 4)).astype(np.float32)
    tables, optimizers = [], []
    for single_writer in (False, True):
        tables.append(tf.Variable(start))
        optimizers.append(make_optimizer(name, 0.3, single_writer=single_writer))
        optimizers[-1]._create_all_weights([tables[-1]])  # noqa: SLF001
    rows = tf.constant([1, 4, 1, 6, 4])  # duplicates are summed first
    taken = []
    original = optimizers[1]._apply_rows  # noqa: SLF001
    optimizers[1]._apply_rows = (  # noqa: SLF001
        lambda *args: taken.append(1) or original(*args))
    for _ in range(3):
        grad = tf.constant(rng.normal(size=(5, 4)).astype(np.float32))
        for table, optimizer in zip(tables, optimizers):
            optimizer.apply_gradients([(tf.IndexedSlices(
                grad, rows, tf.constant([7, 4])), table)])
    assert taken == ([] if name == "sgd" else [1, 1, 1])
    np.testing.assert_allclose(tables[1].numpy(), tables[0].numpy(),
                               rtol=2e-5, atol=1e-6)
    assert not np.allclose(tables[1].numpy(), start)
    np.testing.assert_array_equal(tables[1].numpy()[[0, 2, 3, 5]],
                                  start[[0, 2, 3, 5]])
    for slot in optimizers[0].get_slot_names():
        np.testing.assert_allclose(
            optimizers[1].get_slot(tables[1], slot).numpy(),
            optimizers[0].get_slot(tables[0], slot).numpy(),
            rtol=2e-5, atol=1e-6)
