"""The sharding planner (``psrec plan``, ``psrec train --ps-memory``): its
arithmetic on hand-computed cases, its shards and placement against the
real variables of an in-process cluster, and the refusal (exit 2)."""

import json

import pytest

from psrec.features.spec.presets import criteo
from psrec.features.spec.presets import movielens
from psrec.models.optim.config import OptimizerConfig
from psrec.models.optim.sizing import estimate_replicated_bytes
from psrec.models.ranking.config import model_config
from psrec.ps_cluster.cluster.partition_config import PartitionConfig
from psrec.ps_cluster.planner.plan import PsMemoryError
from psrec.ps_cluster.planner.plan import check_plan
from psrec.ps_cluster.planner.plan import plan
from psrec.ps_cluster.planner.plan import plan_partition

# movielens(dim=16): user 2000, item 4000, genre 64, user_attr 1072 rows.
MOVIELENS_ROWS = {"user": 2000, "item": 4000, "genre": 64, "user_attr": 1072}


def _shards(result):
    """``name -> [(rows, ps), ...]`` of every table variable."""
    return {t.name: [(s.rows, s.ps) for s in t.shards] for t in result.tables}


def test_fixed_shards_split_rows_div_style_and_place_them_round_robin():
    """3 shards per table on 2 PS: the first ``rows % 3`` shards get a row
    more; the strategy's variable counter runs on across tables, from 3
    (the Keras model's step counters come first)."""
    result = plan(movielens(), model_config("dlrm"), 2, shards=3,
                  partitioner="fixed", dense_parameters=0)
    assert _shards(result) == {
        "user": [(667, 1), (667, 0), (666, 1)],
        "item": [(1334, 0), (1333, 1), (1333, 0)],
        "genre": [(22, 1), (21, 0), (21, 1)],
        "user_attr": [(358, 0), (357, 1), (357, 0)]}
    # Adagrad: one table-sized slot; float32: 4 bytes a value.
    ps0 = 4 * 16 * (667 + 1334 + 1333 + 21 + 358 + 357)
    ps1 = 4 * 16 * (667 + 666 + 1333 + 22 + 21 + 357)
    assert result.ps_bytes == [2 * ps0, 2 * ps1]
    assert result.max_ps_bytes == 2 * ps0
    assert [s.row_offset for s in result.tables[1].shards] == [0, 1334, 2667]
    largest = result.largest_shard
    assert (largest.table, largest.index, largest.total_bytes) == (
        "item", 0, 2 * 4 * 16 * 1334)


def test_min_size_keeps_small_tables_whole_and_wide_tables_follow_theirs():
    """Under the train default (min-size, 256 KiB) every movielens table
    (<= 256,000 bytes) stays whole; DeepFM adds a [rows, 1] wide table after
    each, which takes the next PS."""
    result = plan(movielens(), model_config("deepfm"), 3, optimizer="ftrl",
                  dense_parameters=0)
    names = list(MOVIELENS_ROWS)
    assert [t.name for t in result.tables] == [
        n + suffix for n in names for suffix in ("", "__wide")]
    assert [s.ps for t in result.tables for s in t.shards] == [
        (3 + i) % 3 for i in range(8)]
    for table in result.tables:
        (shard,) = table.shards
        dim = 1 if table.name.endswith("__wide") else 16
        assert shard.rows == MOVIELENS_ROWS[table.name.split("__")[0]]
        assert shard.slot_bytes == 2 * shard.bytes == 2 * 4 * dim * shard.rows


def test_min_size_splits_a_big_table_and_sums_match_the_size_estimate():
    spec = criteo(buckets=6_000, dim=16)  # one 156,000 x 16 table
    model = model_config("deepfm")
    result = plan(spec, model, 4, dense_parameters=1000)
    assert _shards(result) == {
        "categorical": [(39_000, (3 + i) % 4) for i in range(4)],
        # 156,000 x 1 x 4 bytes / 256 KiB = 2.38: TF rounds up, 3 shards,
        # the strategy's variables 7 to 9.
        "categorical__wide": [(52_000, 3), (52_000, 0), (52_000, 1)]}
    size = estimate_replicated_bytes(spec, model, OptimizerConfig(),
                                     dense_parameters=1000)
    assert sum(t.bytes for t in result.tables) == size.table_bytes
    assert sum(t.slot_bytes for t in result.tables) == size.table_slot_bytes
    # Dense weights and their Adam slots (2) on every PS.
    assert result.dense_bytes == size.dense_bytes + size.dense_slot_bytes
    assert sum(result.ps_bytes) == (size.table_bytes + size.table_slot_bytes
                                    + 4 * result.dense_bytes)


def test_sgd_has_no_slots():
    result = plan(criteo(buckets=100, dim=4), model_config("dlrm"), 1,
                  optimizer="sgd", dense_parameters=0)
    assert result.ps_bytes == [4 * 4 * 2600]


def test_min_ps_is_the_smallest_count_that_fits():
    spec = criteo(buckets=10_000, dim=16)  # 16.64 MB table + 16.64 MB slots
    model = model_config("dlrm")
    table = 2 * 4 * 16 * 260_000
    result = plan(spec, model, 1, ps_memory=table // 3 + 100,
                  dense_parameters=0)
    assert not result.fits and result.min_ps == 3
    assert plan(spec, model, 3, ps_memory=table // 3 + 100,
                dense_parameters=0).fits
    # 2 fixed shards cannot go below half the table per PS.
    fixed = plan(spec, model, 1, shards=2, partitioner="fixed",
                 ps_memory=table // 3 + 100, dense_parameters=0)
    assert fixed.min_ps is None
    with pytest.raises(PsMemoryError, match="no PS count up to 1024 fits"):
        check_plan(fixed)
    with pytest.raises(PsMemoryError, match=r"use --ps 3 \(or raise"):
        check_plan(result)


def test_min_ps_is_the_first_count_that_fits_not_a_threshold():
    """Round-robin placement of several tables is not monotonic in the PS
    count: here 4 PS fit and 5 do not (on 5, user, item and user_attr all
    put a shard on PS 3 and on PS 4, while PS 0 gets only the wide tables),
    so ``min_ps`` is found by trying each count from 1."""
    spec, model = movielens(dim=64), model_config("deepfm")
    plans = [plan(spec, model, n, optimizer="ftrl", ps_memory=1_600_000,
                  dense_parameters=0) for n in range(1, 7)]
    assert [p.fits for p in plans] == [False, False, False, True, False, True]
    assert {p.min_ps for p in plans} == {4}
    assert plans[4].max_ps_bytes > plans[3].max_ps_bytes


def test_bad_arguments_are_config_errors():
    from psrec.errors import ConfigError
    spec = criteo(buckets=10, dim=4)
    for kwargs in ({"optimizer": "adam"}, {"partitioner": "even"},
                   {"shards": 0}):
        with pytest.raises(ConfigError):
            plan(spec, model_config("dlrm"), 2, dense_parameters=0, **kwargs)
    with pytest.raises(ConfigError, match="`ps` = 0"):
        plan(spec, model_config("dlrm"), 0, dense_parameters=0)


@pytest.mark.cluster
@pytest.mark.parametrize("partition, sparse", [
    (PartitionConfig(kind="fixed", shards=3), "adagrad"),
    (PartitionConfig(kind="min-size", min_shard_bytes=64 << 10), "adagrad"),
    (PartitionConfig(kind="fixed", shards=3), "rowwise_adagrad"),
    (PartitionConfig(kind="fixed", shards=3), "ftrl"),
    (PartitionConfig(kind="fixed", shards=3), "sgd")])
def test_plan_matches_the_real_variables_on_an_in_process_cluster(
        ps_cluster, partition, sparse):
    """The Trainer's table shards, and their optimizer slots, have the
    shapes and PS tasks the plan gives, and the plan's slot bytes are the
    slot variables' (2 PS: with min-size at 64 KiB, genre and the wide
    tables stay whole, which shifts the round-robin of the next tables;
    row-wise Adagrad's slot is ``[shard_rows, 1]`` beside its shard)."""
    from psrec.models.embedding.sparse_arch import table_variables
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    from psrec.ps_cluster.training.trainer import Trainer
    spec, model = movielens(), model_config("deepfm")
    optimizer = OptimizerConfig(sparse=sparse)
    trainer = Trainer(build_ps_strategy(ps_cluster, partition), spec, model,
                      optimizer)
    expected = plan_partition(spec, model, 2, optimizer, partition)
    assert len({len(t.shards) for t in expected.tables}) > 1 or (
        partition.kind == "fixed")
    for table in expected.tables:
        shards = table_variables(trainer.model.sparse_arch.tables[table.name])
        assert [tuple(v.shape) for v in shards] == [
            (s.rows, s.dim) for s in table.shards], table.name
        assert [v.device for v in shards] == [
            f"/job:ps/replica:0/task:{s.ps}/device:CPU:0"
            for s in table.shards], table.name
        opt = trainer.sparse_optimizer
        for variable, shard in zip(shards, table.shards):
            slots = [opt.get_slot(variable, name)
                     for name in opt.get_slot_names()]
            assert {s.device for s in slots} <= {variable.device}
            row_wise = sparse == "rowwise_adagrad"
            assert [tuple(s.shape) for s in slots] == [
                (shard.rows, 1 if row_wise else shard.dim)] * len(slots)
            assert len(slots) == {"sgd": 0, "ftrl": 2}.get(sparse, 1)
            assert shard.slot_bytes == sum(
                4 * s.shape.num_elements() for s in slots), table.name


@pytest.mark.cluster
def test_a_two_tower_model_is_planned_as_built(ps_cluster):
    """The retrieval task's model (its candidate tables' wide twins: the
    candidate bias; tower MLPs as its dense part) places its tables as the
    plan says."""
    from psrec.features.spec.presets import movielens_retrieval
    from psrec.models.build import build_model
    from psrec.models.embedding.sparse_arch import table_variables
    from psrec.models.ranking.model import count_parameters
    from psrec.models.retrieval.config import RetrievalConfig
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    spec, config = movielens_retrieval(), RetrievalConfig()
    strategy = build_ps_strategy(ps_cluster, PartitionConfig())
    with strategy.scope():
        model = build_model(spec, config)
    expected = plan(spec, config, 2)
    assert [t.name for t in expected.tables] == [
        "user", "item", "item__wide", "genre", "genre__wide", "user_attr"]
    assert sorted(model.sparse_arch.tables) == sorted(
        t.name for t in expected.tables)
    for table in expected.tables:
        shards = table_variables(model.sparse_arch.tables[table.name])
        assert [(tuple(v.shape), v.device) for v in shards] == [
            ((s.rows, s.dim), f"/job:ps/replica:0/task:{s.ps}/device:CPU:0")
            for s in table.shards], table.name
    # Tower weights and their Adam slots.
    assert expected.dense_bytes == 3 * 4 * count_parameters(model)["dense"]


def _write_cluster(path, num_ps: int):
    path.write_text(json.dumps({
        "worker": ["127.0.0.1:1"],
        "ps": [f"127.0.0.1:{2 + i}" for i in range(num_ps)]}))
    return path


def _three_ps_budget(capsys) -> int:
    """The most one of 3 PS holds for the default criteo spec and dlrm
    (``psrec plan --json``): a budget that 2 PS exceed."""
    from psrec.launch.cli.main import main
    assert main(["plan", "--ps", "3", "--model", "dlrm", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [len(t["shards"]) for t in data["tables"]] == [3]
    assert data["ps_memory"] is None and data["fits"] is True
    return data["max_ps_bytes"]


def test_plan_command_refuses_over_budget_with_the_smallest_ps_count(capsys):
    from psrec.launch.cli.main import main
    budget = _three_ps_budget(capsys)
    code = main(["plan", "--ps", "1", "--model", "dlrm", "--ps-memory",
                 str(budget), "--json"])
    out, err = capsys.readouterr()
    assert code == 2
    data = json.loads(out)
    assert data["fits"] is False and data["min_ps"] == 3
    assert data["max_ps_bytes"] == data["ps_bytes"][0] > budget
    assert err.count("\n") == 1 and err.startswith("psrec plan: error: PS 0")
    assert "smallest PS count that fits is 3: use --ps 3" in err
    assert main(["plan", "--ps", "3", "--model", "dlrm", "--ps-memory",
                 str(budget)]) == 0
    out = capsys.readouterr().out
    shard_rows = out.split("table shards:")[1]
    assert shard_rows.count("categorical ") == 3 and "fits" in out


def test_train_refuses_before_connecting_to_any_server(capsys, tmp_path):
    """``--cluster`` names 2 PS that do not exist: the check uses the
    cluster's PS count and exits 2 before any connection is tried."""
    from psrec.launch.cli.main import main
    budget = _three_ps_budget(capsys)
    code = main(["train", "--cluster", str(_write_cluster(
        tmp_path / "cluster.json", 2)), "--model", "dlrm", "--ps-memory",
        str(budget), "--workdir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "PS 0 of 2 would hold" in err and "use --ps 3" in err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_ps_memory_is_refused_outside_the_ps_strategy(capsys, tmp_path):
    from psrec.launch.cli.main import main
    code = main(["train", "--strategy", "one-device", "--ps-memory", "8GiB",
                 "--workdir", str(tmp_path)])
    assert code == 2
    assert "`--ps-memory` has no effect" in capsys.readouterr().err


@pytest.mark.parametrize("text,size", [
    ("8GiB", 8 << 30), ("512MiB", 512 << 20), ("4Gi", 4 << 30),
    ("2G", 2_000_000_000), ("1.5gib", 3 << 29), ("1000", 1000)])
def test_sizes_parse_binary_and_decimal_units(text, size):
    from psrec.launch.cli.argtypes import byte_size
    assert byte_size(text) == size


@pytest.mark.parametrize("text", ["0", "-1", "GiB", "8XB", "nan", "1e400"])
def test_bad_sizes_are_one_line_usage_errors(capsys, text):
    from psrec.launch.cli.main import main
    with pytest.raises(SystemExit) as stop:
        main(["plan", "--ps", "1", "--ps-memory", text])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--ps-memory" in err and repr(text) in err


def test_train_check_passes_a_fitting_budget_with_a_status_line(capsys):
    from psrec.launch.cli.plan import check_ps_memory
    from psrec.launch.job.config import JobConfig
    from psrec.launch.job.config import StrategyConfig
    check_ps_memory(JobConfig(ps=2))  # no budget: no plan, no line
    assert capsys.readouterr().err == ""
    check_ps_memory(JobConfig(strategy=StrategyConfig(ps_memory=1 << 30),
                              ps=2))
    err = capsys.readouterr().err
    assert err.startswith("psrec train: PS memory plan: at most ")
    assert err.endswith("on one of 2 PS (--ps-memory 1 GiB)\n")
