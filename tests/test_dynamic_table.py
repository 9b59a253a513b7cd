"""Dynamic, collisionless embedding tables (``mode: dynamic``) on the shared
in-process cluster (2 workers + 2 PS): placement of the maps on PS tasks,
admission at the threshold (never before), LFU and TTL eviction with reset
rows and optimizer slots, many concurrent closures, training through the
trainer's loop, checkpoint round trip, reshard (another shard count),
``psrec embeddings stats``, export, the planner and the spec.

One PS Trainer is built for the module; the tables ``lfu``, ``ttl`` and
``pool`` are driven directly (closures that read ids as a train step does,
then the coordinator's maintenance), ``big`` is trained by the loop.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.ingest.synthetic import write_synthetic_parquet
from psrec.data.input.config import InputConfig
from psrec.features.spec.columns import CategoricalFeature
from psrec.features.spec.columns import SpecError
from psrec.features.spec.columns import TableConfig
from psrec.features.spec.presets import criteo
from psrec.features.spec.spec import FeatureSpec
from psrec.features.transforms.ops import CategoricalEncoder
from psrec.launch.cli.main import main
from psrec.launch.job.config import JobConfig
from psrec.models.build import build_model
from psrec.models.dynamic.shards import ShardLayout
from psrec.models.dynamic.table import DynamicTable
from psrec.models.dynamic.table import parts
from psrec.models.embedding.sparse_arch import _lookup
from psrec.models.optim.config import OptimizerConfig
from psrec.models.ranking.config import ModelConfig
from psrec.models.ranking.config import ModelConfigError
from psrec.models.retrieval.config import check_no_dynamic_tables
from psrec.models.serving.export import export_saved_model
from psrec.ps_cluster.checkpoint.save import save_options
from psrec.ps_cluster.checkpoint.verify import differing_keys
from psrec.ps_cluster.cluster.partition_config import PartitionConfig
from psrec.ps_cluster.cluster.strategy import build_ps_strategy
from psrec.ps_cluster.planner.plan import dynamic_table_bytes
from psrec.ps_cluster.planner.plan import plan
from psrec.ps_cluster.training.config import LoopConfig
from psrec.ps_cluster.training.maintenance import Maintainer
from psrec.ps_cluster.training.trainer import Trainer

pytestmark = pytest.mark.cluster

INITIAL_ACCUMULATOR = 0.1  # Adagrad's, models.optim
MODEL = ModelConfig(interaction="concat", top_mlp=(8,), wide=True)


def _spec_dict() -> dict:
    def dynamic(name: str, capacity: int, **more) -> dict:
        return {"name": name, "dim": 4, "mode": "dynamic",
                "capacity": capacity, "maintenance_every": 10, **more}
    return {
        "name": "dynamic", "label": {"name": "label"},
        "tables": [{"name": "hashed", "dim": 4},
                   dynamic("lfu", 2), dynamic("ttl", 2, evict="ttl",
                                                ttl_steps=5),
                   dynamic("pool", 64),
                   dynamic("big", 300, admit_threshold=3)],
        "dense": [{"name": "x", "transform": "log1p"}],
        "categorical": [
            {"name": "h", "table": "hashed", "hash_buckets": 50},
            {"name": "a", "table": "lfu", "dtype": "int64"},
            {"name": "b", "table": "ttl", "dtype": "int64"},
            {"name": "c", "table": "pool", "dtype": "int64"},
            {"name": "item", "table": "big"}]}


SPEC = FeatureSpec.from_dict(_spec_dict())


@pytest.fixture(scope="module")
def trainer(ps_cluster, tmp_path_factory) -> Trainer:
    strategy = build_ps_strategy(ps_cluster, PartitionConfig(kind="fixed"))
    return Trainer(strategy, SPEC, MODEL, OptimizerConfig(),
                   InputConfig(batch_size=64),
                   checkpoint_dir=tmp_path_factory.mktemp("dynamic-ckpt"))


def _table(trainer, name):
    return trainer.model.sparse_arch.dynamic_tables[name]


def _read(trainer, name: str, *batches) -> list[np.ndarray]:
    """Schedules one closure per batch of ids that reads them as a train
    step does (counting unknown ids); returns the rows they read."""
    table = _table(trainer, name)

    @tf.function
    def read(ids):
        return table.rows(ids, training=True)

    values = [trainer.coordinator.schedule(read, args=(
        tf.constant(ids, tf.int64),)) for ids in batches]
    trainer.coordinator.join()
    return [v.fetch() for v in values]


def _maintain(trainer, name: str, step: int):
    """The coordinator's maintenance of one table (as the loop runs it)."""
    done = _table(trainer, name).maintain(step)
    if done.rows.size:
        Maintainer(trainer.model.sparse_arch,
                   trainer.sparse_optimizer).reset(name, done.rows)
    return done


def _mapping(table) -> dict[int, int]:
    keys, rows = table.map.export()
    return dict(zip(keys.numpy().tolist(), rows.numpy().tolist()))


def _rows_of(trainer, name: str) -> np.ndarray:
    return tf.concat(trainer.model.sparse_arch.tables[name].variables,
                     0).numpy()


def _accumulators(trainer, name: str) -> np.ndarray:
    optimizer = trainer.sparse_optimizer
    return np.concatenate([optimizer.get_slot(s, "accumulator").numpy()
                           for s in trainer.model.sparse_arch.tables[
                               name].variables])


def _statistics(shard) -> tuple:
    return (shard.row_ids, shard.freq, shard.last_seen)


def _row_ids(table) -> np.ndarray:
    return tf.concat(parts(table.row_ids), 0).numpy()


def _check_shards(table) -> None:
    """Each map shard holds only rows of its own range, one id per row, as
    ``row_ids`` says."""
    row_ids = _row_ids(table)
    for shard in table.shards():
        keys, rows = (t.numpy() for t in shard.map.export())
        assert ((rows >= shard.first_row)
                & (rows < shard.first_row + shard.row_ids.shape[0])).all()
        assert (row_ids[rows] == keys).all()
    rows = table.map.export()[1].numpy()
    assert len(set(rows.tolist())) == rows.size == np.count_nonzero(
        row_ids >= 0)


def test_map_shards_live_with_their_embedding_shards(trainer):
    for table in SPEC.tables:
        if not table.dynamic:
            continue
        dynamic = _table(trainer, table.name)
        embedding = trainer.model.sparse_arch.tables[table.name].variables
        assert len(dynamic.shards()) == len(embedding) == 2
        for shard, part in zip(dynamic.shards(), embedding):
            assert part.device.startswith("/job:ps/")
            assert shard.map.resource_handle.device == part.device
            assert shard.counts.resource_handle.device == part.device
            # The row statistics too (the strategy would place them round
            # robin over the PS tasks): maintenance reads them where they
            # are.
            assert {v.device for v in _statistics(shard)} == {part.device}
        assert {v.device for v in (dynamic.clock, dynamic.admitted,
                                   dynamic.evicted)} == {embedding[0].device}
    assert len({p.device for p in embedding}) == 2  # both PS tasks


def test_admission_only_at_the_threshold(trainer):
    # `big` admits after 3 sightings; 2 leave no trace in the map.
    first = _read(trainer, "big", [101, 101], [102])
    assert all((rows == 300).all() for rows in first)  # the default row
    _maintain(trainer, "big", 0)
    assert 101 not in _mapping(_table(trainer, "big"))
    assert _read(trainer, "big", [101])[0].tolist() == [300]
    done = _maintain(trainer, "big", 0)
    mapping = _mapping(_table(trainer, "big"))
    assert done.admitted == 1 and 102 not in mapping
    assert _read(trainer, "big", [101, 102])[0].tolist() == [
        mapping[101], 300]


def test_lfu_evicts_the_coldest_row_and_resets_it(trainer):
    _read(trainer, "lfu", [1] * 5, [2])
    _maintain(trainer, "lfu", 10)
    mapping = _mapping(_table(trainer, "lfu"))
    assert sorted(mapping) == [1, 2]
    cold = mapping[2]
    variable = trainer.model.sparse_arch.tables["lfu"]
    marked = np.full([3, 4], 7.0, np.float32)
    for shard, part in zip(variable.variables, np.split(marked, np.cumsum(
            [s.shape[0] for s in variable.variables])[:-1])):
        shard.assign(part)
        trainer.sparse_optimizer.get_slot(shard, "accumulator").assign(
            np.full_like(part, 9.0))
    _read(trainer, "lfu", [3, 3, 3])  # seen more than id 2's row
    done = _maintain(trainer, "lfu", 20)
    mapping = _mapping(_table(trainer, "lfu"))
    assert (done.admitted, done.evicted) == (1, 1)
    assert mapping == {1: mapping[1], 3: cold}
    rows, slots = _rows_of(trainer, "lfu"), _accumulators(trainer, "lfu")
    assert not np.allclose(rows[cold], 7.0)  # re-initialised
    assert np.allclose(slots[cold], INITIAL_ACCUMULATOR)
    assert np.allclose(rows[mapping[1]], 7.0)  # the hot row is kept
    assert np.allclose(slots[mapping[1]], 9.0)
    _read(trainer, "lfu", [4])  # colder than every row: waits
    assert _maintain(trainer, "lfu", 30).admitted == 0
    assert 4 not in _mapping(_table(trainer, "lfu"))


def test_ttl_evicts_rows_not_seen_for_ttl_steps(trainer):
    _read(trainer, "ttl", [1, 2])
    _maintain(trainer, "ttl", 10)
    _maintain(trainer, "ttl", 18)  # the clock moves on
    _read(trainer, "ttl", [1, 5])  # id 1 read at step 18, id 2 at 10
    done = _maintain(trainer, "ttl", 20)
    mapping = _mapping(_table(trainer, "ttl"))
    assert (done.admitted, done.evicted) == (1, 1)
    assert set(mapping) == {1, 5}
    assert np.allclose(_accumulators(trainer, "ttl")[mapping[5]],
                       INITIAL_ACCUMULATOR)


def test_concurrent_closures_never_share_a_row(trainer):
    rng = np.random.default_rng(0)
    for step in range(10, 60, 10):
        _read(trainer, "pool", *[rng.integers(0, 200, 30)
                                 for _ in range(20)])
        _maintain(trainer, "pool", step)
        # at most `capacity` ids wait: the least seen are forgotten
        assert _table(trainer, "pool").counts.size().numpy() <= 64
    table = _table(trainer, "pool")
    mapping = _mapping(table)
    row_ids = _row_ids(table)
    assert len(mapping) == 64 == np.count_nonzero(row_ids >= 0)
    assert len(set(mapping.values())) == len(mapping)
    assert all(row_ids[row] == key for key, row in mapping.items())
    _check_shards(table)  # each shard admitted into its own rows
    assert [s["rows_used"] for s in table.stats()["shards"]] == [33, 31]


def test_maintenance_runs_on_the_tables_ps(trainer, monkeypatch):
    """The selection is ops on the table's PS: the coordinator launches it
    and gets the rows given out (O(admitted)) and a count, never the
    pending counts, ``row_ids``, ``freq`` or ``last_seen``."""
    table = _table(trainer, "pool")
    if np.count_nonzero(_row_ids(table) >= 0) < 64:  # run alone: fill it
        _read(trainer, "pool", *[list(range(start, start + 50))
                                 for start in range(3000, 3200, 50)])
        _maintain(trainer, "pool", 60)
    # full: admitting means evicting
    assert np.count_nonzero(_row_ids(table) >= 0) == 64
    function = table._compiled.maintain.get_concrete_function(
        tf.TensorSpec([], tf.int64))
    graph = function.graph
    nodes = [(op.type, op.device) for op in graph.get_operations()] + [
        (node.op, node.device) for f in graph._functions.values()
        for node in f.definition.node_def]
    devices = {s.device for s in table.shards()}
    elsewhere = {t for t, device in nodes if device not in devices}
    assert elsewhere <= {"Placeholder", "Identity", "NoOp"}  # plumbing
    # per shard: the rows it gave out, the number it evicted
    assert [(o.dtype, o.shape.as_list()) for o in function.outputs] == [
        (tf.int64, [None])] * 2 + [(tf.int32, [])] * 2
    eager_reads = []

    def guard(cls, name, watched):
        original = getattr(cls, name)

        def wrapped(self, *args, **kwargs):
            if tf.executing_eagerly() and any(self is w for w in watched):
                eager_reads.append(name)
            return original(self, *args, **kwargs)
        monkeypatch.setattr(cls, name, wrapped)

    shards = table.shards()
    variables = [v for s in shards for v in _statistics(s)]
    for name in ("numpy", "read_value", "value", "_read_variable_op"):
        guard(type(shards[0].freq), name, variables)
    guard(type(shards[0].counts), "export",
          [t for s in shards for t in (s.map, s.counts)])
    _read(trainer, "pool", [1000 + i for i in range(8) for _ in range(100)])
    done = _maintain(trainer, "pool", 70)
    assert eager_reads == []
    assert done.admitted == done.evicted == done.rows.size == 8
    assert sorted(_mapping(table)[1000 + i] for i in range(8)) == sorted(
        done.rows.tolist())
    _check_shards(table)


def test_workers_count_ids_on_the_shards_ps(trainer):
    """A train step's pending counts are read, summed and written on each
    shard's PS, and its row statistics scattered there: the ids go there
    once, no lookup result comes back to the worker to be sent out
    again."""
    table = _table(trainer, "pool")
    graph = tf.function(lambda ids: table.rows(ids, training=True)
                        ).get_concrete_function(
                            tf.TensorSpec([None], tf.int64)).graph
    devices = {tf.DeviceSpec.from_string(s.device) for s in table.shards()}

    def device(op):
        return tf.DeviceSpec.from_string(op.device)

    inserts = [op for op in graph.get_operations()
               if op.type == "LookupTableInsertV2"]
    assert {device(op) for op in inserts} == devices
    for op in inserts:  # the summed counts are computed where they go
        assert device(op.inputs[2].op) == device(op)
    scatters = [op for op in graph.get_operations()
                if op.type.startswith("ResourceScatter")]
    assert len(scatters) == 4 and {device(op) for op in scatters} == devices


@pytest.fixture(scope="module")
def trained(trainer, tmp_path_factory):
    """``big`` trained by the loop (maintained every 10 steps) on data
    converted with the dynamic spec."""
    root = tmp_path_factory.mktemp("dynamic-data")
    paths = write_synthetic_parquet(SPEC, root / "parquet", 2000, files=1,
                                    seed=1)
    manifest = convert(paths, SPEC, root / "tfrecord",
                       ConversionOptions(shards=2, eval_fraction=0.0)
                       ).manifest
    before = _rows_of(trainer, "big")
    loop = LoopConfig(steps=20, steps_per_closure=5, checkpoint_every=0)
    result = trainer.train(trainer.dataset_fn(manifest), loop)
    return result, before, paths


def test_training_admits_and_never_trains_the_default_row(trainer, trained):
    result, before, _ = trained
    stats = _table(trainer, "big").stats()
    assert result.step == 20 and stats["admitted"] > 20
    after = _rows_of(trainer, "big")
    assert np.array_equal(after[300], before[300])  # default row untouched
    assert stats["rows_used"] + stats["rows_free"] == 300


def test_checkpoint_round_trip_and_reshard(trainer, trained, ps_cluster,
                                          tmp_path):
    result, _, _ = trained
    table = _table(trainer, "big")
    saved = (_mapping(table), table.stats())
    _read(trainer, "big", [999_999] * 5)  # changed after the save
    _maintain(trainer, "big", 50)
    assert trainer.restore() == result.checkpoint  # verified by value
    assert (_mapping(table), table.stats()) == saved
    # Resharded: 3 shards of each table instead of one per PS task.
    strategy = build_ps_strategy(ps_cluster, PartitionConfig(kind="fixed",
                                                             shards=3))
    other = Trainer(strategy, SPEC, MODEL, OptimizerConfig(),
                    InputConfig(batch_size=64), checkpoint_dir=tmp_path)
    assert len(other.model.sparse_arch.tables["big"].variables) == 3
    other.keeper.restore(result.checkpoint)  # verified by value, slots too
    moved = _table(other, "big")
    assert (_mapping(moved), _totals(moved)) == (saved[0], _totals(table))
    assert np.array_equal(_rows_of(other, "big"), _rows_of(trainer, "big"))
    assert np.array_equal(_accumulators(other, "big"),
                          _accumulators(trainer, "big"))
    # Each pair went to the shard owning its row, each pending id to the
    # shard counting it; the 3 shards then admit into their own rows.
    _check_shards(moved)
    for k, shard in enumerate(moved.shards()):
        keys = shard.counts.export()[0].numpy()
        assert (keys % 3 == k).all()
    fresh = [3_000_000 + k for k in range(3)]  # one per shard
    moved.rows(tf.constant(fresh * 3, tf.int64), training=True)
    done = moved.maintain(60)
    _check_shards(moved)
    rows = _mapping(moved)
    starts = [s.first_row for s in moved.shards()] + [301]
    assert done.admitted == 3 and all(
        starts[k] <= rows[i] < starts[k + 1] for k, i in enumerate(fresh))


def _totals(table) -> dict:
    return {k: v for k, v in table.stats().items() if k != "shards"}


def test_an_empty_map_survives_a_sliced_save(tmp_path):
    """A save cut into slices drops empty tensors: with every id admitted
    the pending table is empty, and its restore must still find it."""
    config = TableConfig("t", dim=2, mode="dynamic", capacity=4)
    layout = ShardLayout((3, 2), (None, None))
    table = DynamicTable(config, layout)
    table.rows(tf.constant([5, 8], tf.int64), training=True)
    assert table.maintain(10).admitted == 2
    assert int(table.counts.size().numpy()) == 0
    path = tf.train.Checkpoint(table=table).save(
        str(tmp_path / "c"), options=save_options(False))
    other = DynamicTable(config, ShardLayout((5,), (None,)))
    other.rows(tf.constant([9], tf.int64), training=True)  # to be replaced
    root = tf.train.Checkpoint(table=other)
    root.restore(path).assert_consumed()
    assert _mapping(other) == _mapping(table)
    assert int(other.counts.size().numpy()) == 0
    assert differing_keys(root, path, None) == []


def test_the_fused_lookup_reads_and_trains_as_map_then_gather():
    """``embed`` (the map lookup and the gather together on each shard)
    returns the rows, values and gradients, and records the counts and
    statistics, of ``rows`` followed by a lookup (the two-step path):
    ids in both shards, repeated, unknown and padding."""
    config = TableConfig("t", dim=3, mode="dynamic", capacity=8)
    layout = ShardLayout((5, 4), (None, None))  # as the strategy cuts 9
    start = tf.random.stateless_uniform([9, 3], seed=(1, 2))
    pieces = [tf.Variable(start[:5]), tf.Variable(start[5:])]
    variable = tf.__internal__.distribute.ShardedVariable(pieces)
    fused, two_step = (DynamicTable(config, layout) for _ in range(2))
    for table in (fused, two_step):
        table.rows(tf.constant([11, 12, 13, 14, 15], tf.int64),
                   training=True)
        assert table.maintain(1).admitted == 5
    assert fused.gathers_from(variable)
    assert all(s.map.size() > 0 for s in fused.shards())  # both shards
    ids = tf.constant([[13, 99, 11, 12], [-1, 13, 15, 14]], tf.int64)
    weights = tf.random.stateless_normal([2, 4, 3], seed=(3, 4))
    with tf.GradientTape(persistent=True) as tape:
        embedded, rows = fused.embed(variable, ids, training=True)
        expected_rows = two_step.rows(ids, training=True)
        expected = DynamicTable.drop_default_gradient(
            _lookup(variable, expected_rows), expected_rows, 8)
        losses = [tf.reduce_sum(e * weights) for e in (embedded, expected)]
    assert np.array_equal(rows.numpy(), expected_rows.numpy())
    assert (rows.numpy() == 8).sum() == 2  # 99 and the padding: default
    assert np.array_equal(embedded.numpy(), expected.numpy())
    grads = [[tf.convert_to_tensor(g).numpy()
              for g in tape.gradient(loss, pieces)] for loss in losses]
    for got, want in zip(*grads):
        assert np.array_equal(got, want)
    assert not grads[0][1][-1].any()  # the default row is not trained
    assert np.count_nonzero(np.abs(np.concatenate(grads[0])).sum(1)) == 5
    for got, want in zip(fused.shards(), two_step.shards()):
        for a, b in zip(_statistics(got), _statistics(want)):
            assert np.array_equal(a.numpy(), b.numpy())
    assert _mapping(fused) == _mapping(two_step)
    assert [sorted(zip(*(t.numpy().tolist() for t in m.export())))
            for m in (fused.counts, two_step.counts)] == [[(99, 1)]] * 2


def test_embeddings_stats_reads_the_checkpoint_files(trainer, trained,
                                                    capsys, tmp_path):
    result, _, _ = trained
    assert main(["embeddings", "stats", result.checkpoint, "--shards", "2",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    tables = {t["name"]: t for t in report["tables"]}
    assert sorted(tables) == ["big", "lfu", "pool", "ttl"]
    big, live = tables["big"], _table(trainer, "big")
    row_ids = _row_ids(live)
    assert big["rows_used"] == np.count_nonzero(row_ids >= 0) > 0
    assert big["capacity"] == 300 and big["rows_free"] == np.count_nonzero(
        row_ids == -1)
    assert [s["pending"] for s in big["shards"]] == [
        s["pending"] for s in live.stats()["shards"]]
    assert (big["admitted"], big["evicted"], big["pending"]) == (
        int(live.admitted.numpy()), int(live.evicted.numpy()),
        int(live.counts.size().numpy()))
    assert [s["rows_used"] for s in big["shards"]] == [
        np.count_nonzero(row_ids[:151] >= 0),
        np.count_nonzero(row_ids[151:] >= 0)]
    assert tables["pool"]["rows_free"] == 0
    # No job.json beside it: one shard; with the run's (psrec train writes
    # it): the shards the partitioner cut.
    assert main(["embeddings", "stats", result.checkpoint, "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [s["rows"] for s in report["tables"][0]["shards"]] == [301]
    JobConfig(workdir=tmp_path, spec=SPEC, model=MODEL, ps=2,
              partition=PartitionConfig(kind="fixed")).write(
                  trainer.checkpoint_dir)
    assert main(["embeddings", "stats", result.checkpoint, "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [s["rows"] for s in report["tables"][0]["shards"]] == [
        v.shape[0] for v in trainer.model.sparse_arch.tables["big"].variables]


def test_export_maps_unseen_ids_to_the_default_row(trainer, trained,
                                                   tmp_path):
    result, _, paths = trained
    model = build_model(SPEC, MODEL)
    tf.train.Checkpoint(model=model).restore(result.checkpoint
                                             ).expect_partial()
    mapping = _mapping(_table(trainer, "big"))
    export_saved_model(model, SPEC, tmp_path / "model")
    serve = tf.saved_model.load(str(tmp_path / "model")).signatures[
        "serving_default"]
    values = pq.read_table(paths[0], columns=["item"]).column(0).to_pylist()
    ids = CategoricalEncoder(SPEC).encode("item", tf.constant(values))
    known = tf.constant(next(v for v, i in zip(values, ids.numpy().tolist())
                             if i in mapping))

    def probability(item: tf.Tensor) -> float:
        raw = {"x": tf.constant([1.0]), "h": tf.constant(["q"]),
               "a": tf.constant([1], tf.int64),
               "b": tf.constant([1], tf.int64),
               "c": tf.constant([1], tf.int64), "item": tf.reshape(item, [1])}
        return float(serve(**raw)["probability"][0])

    unseen = [probability(tf.constant(v)) for v in ("never-1", "never-2")]
    assert unseen[0] == unseen[1]
    assert probability(known) != unseen[0]


def test_spec_reports_every_dynamic_problem_at_once():
    data = _spec_dict()
    data["tables"][1] = {"name": "lfu", "dim": 4, "mode": "dynamic",
                         "admit_threshold": 0, "evict": "ttl",
                         "maintenance_every": -1}
    data["tables"][0]["capacity"] = 5
    with pytest.raises(SpecError) as error:
        FeatureSpec.from_dict(data)
    text = "\n".join(error.value.problems)
    for part in ("`capacity` applies only to `mode` = 'dynamic'",
                 "needs `capacity`", "`admit_threshold` = 0",
                 "`maintenance_every` = -1", "needs `ttl_steps`"):
        assert part in text
    with pytest.raises(SpecError, match="`mode` = 'lru'"):
        TableConfig("t", dim=4, mode="lru")
    with pytest.raises(SpecError, match="takes no `hash_buckets`"):
        CategoricalFeature("x", table="t", hash_buckets=3, raw_ids=True)
    with pytest.raises(ModelConfigError,
                       match=r"\(lfu, ttl, pool, big\).*rows by id"):
        check_no_dynamic_tables(SPEC)  # two-tower retrieval: hashed only


def test_raw_ids_are_64_bit_fingerprints_and_hashed_specs_unchanged():
    encoder = CategoricalEncoder(SPEC)
    ids = encoder.encode("item", tf.constant(["a", "b", ""])).numpy()
    assert len(set(ids)) == 3 and ids.max() > 2 ** 40  # not folded
    seven = encoder.encode("a", tf.constant([7], tf.int64)).numpy()
    assert seven == encoder.encode("a", tf.constant(["7"])).numpy()
    assert seven != encoder.encode("c", tf.constant([7], tf.int64)).numpy()
    data = _spec_dict()  # a feature sharing item's rows: item's ids
    data["categorical"].append({"name": "seen", "share": "item"})
    shared = FeatureSpec.from_dict(data)
    assert shared.categorical[-1].raw_ids
    shared_encoder = CategoricalEncoder(shared)
    assert (shared_encoder.encode("seen", tf.constant(["a"])).numpy()
            == ids[0])
    saved = FeatureSpec.from_dict(SPEC.to_dict())
    assert saved == SPEC and saved.table("big").rows == 301
    preset = criteo(buckets=10, dim=4).to_dict()
    assert all("mode" not in t for t in preset["tables"])
    assert all("raw_ids" not in f for f in preset["categorical"])


def test_planner_counts_the_map_shards_where_they_live(trainer):
    hashed = _spec_dict()
    for table in hashed["tables"][1:]:
        table.update(mode="hashed", rows=table["capacity"] + 1)
        for key in ("capacity", "evict", "ttl_steps", "maintenance_every",
                    "admit_threshold"):
            table.pop(key, None)
    for feature in hashed["categorical"][1:]:
        feature["hash_buckets"] = 2
    plain = plan(FeatureSpec.from_dict(hashed), MODEL, 2,
                 partitioner="fixed")
    dynamic = plan(SPEC, MODEL, 2, partitioner="fixed")
    # Each shard's maps and statistics on the PS task of its embedding
    # shard, as the trainer (same partitioning) placed them.
    want = [0, 0]
    for name, table in trainer.model.sparse_arch.dynamic_tables.items():
        for shard, part in zip(table.shards(), trainer.model.sparse_arch
                               .tables[name].variables):
            want[int(part.device.split("task:")[1][0])] += (
                dynamic_table_bytes(int(part.shape[0])))
    assert [d - p for d, p in zip(dynamic.ps_bytes, plain.ps_bytes)] == want
    assert min(want) > 0  # spread over both PS tasks
    assert dynamic_table_bytes(300) >= 300 * (2 * 16 + 3 * 8)
