"""Giant-table support that needs no giant table: the restore check reads one
block of rows at a time and writes nothing (``ps_cluster.checkpoint.verify``),
and tables are initialised in blocks of rows on their PS
(``models.embedding.table_init``) with the distribution of their initializer.

Runs on the session's in-process cluster (2 PS), with blocks made small so a
tiny table spans many of them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager.polymorphic_function import polymorphic_function

from psrec.data.input.config import InputConfig
from psrec.features.spec.presets import criteo
from psrec.models.embedding import sparse_arch as embedding
from psrec.models.embedding import table_init
from psrec.models.embedding.sparse_arch import SparseArch
from psrec.models.ranking.config import ModelConfig
from psrec.progress import SILENT
from psrec.progress import set_default_progress
from psrec.ps_cluster.checkpoint import save as checkpoint_save
from psrec.ps_cluster.checkpoint import verify as checkpoint_verify
from psrec.ps_cluster.checkpoint.keeper import CheckpointKeeper
from psrec.ps_cluster.checkpoint.keeper import RestoreError
from psrec.ps_cluster.checkpoint.keeper import compare_with_checkpoint
from psrec.ps_cluster.checkpoint.keeper import shape_mismatches
from psrec.ps_cluster.cluster.partition_config import PartitionConfig
from psrec.ps_cluster.cluster.strategy import build_ps_strategy
from psrec.ps_cluster.training.trainer import Trainer
from tests.test_progress import Recorder

pytestmark = [pytest.mark.cluster]

SPEC = criteo(buckets=300, dim=8)  # one 7,800-row table
TABLE = "model/sparse_arch/categorical/.ATTRIBUTES/VARIABLE_VALUE"
SLOT = ("model/sparse_arch/categorical/.OPTIMIZER_SLOT/sparse_optimizer/"
        "accumulator/.ATTRIBUTES/VARIABLE_VALUE")


@pytest.fixture(scope="module")
def trainer(ps_cluster, tmp_path_factory):
    return Trainer(build_ps_strategy(ps_cluster, PartitionConfig(kind="fixed")),
                   SPEC, ModelConfig(interaction="concat", top_mlp=(8,)),
                   input_config=InputConfig(batch_size=32),
                   checkpoint_dir=tmp_path_factory.mktemp("streamed"))


@pytest.fixture(scope="module")
def saved(trainer) -> str:
    return trainer.save()


@pytest.fixture
def no_temp_writes(tmp_path, monkeypatch):
    """An empty temporary folder that must stay empty, small blocks, and a
    ``Checkpoint.write`` that fails if anything still calls it. (AutoGraph
    may put the module of a function it converts there: that one file is
    allowed, no folder and nothing else.)"""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(checkpoint_verify, "BLOCK_BYTES", 1000 * 8 * 4)

    def refuse(*args, **kwargs):
        raise AssertionError("the restore check wrote a checkpoint")

    monkeypatch.setattr(tf.train.Checkpoint, "write", refuse)
    yield scratch
    assert [name for name in os.listdir(scratch)
            if not name.startswith("__autograph_generated_file")] == []


def _shards(variable) -> list:
    return list(getattr(variable, "variables", [variable]))


def test_a_changed_row_of_one_shard_is_found_without_temp_files(
        trainer, saved, no_temp_writes, monkeypatch):
    path = saved
    table = trainer.model.sparse_arch.tables["categorical"]
    shards = _shards(table)
    assert len(shards) == 2 and all("/job:ps/" in s.device for s in shards)
    assert compare_with_checkpoint(trainer.checkpoint, path) == []

    # One row, in the last block of the second shard's accumulator.
    slot = trainer.sparse_optimizer.get_slot(shards[1], "accumulator")
    row = int(slot.shape[0]) - 1
    saved = slot[row].numpy()
    table_init.assign_rows(slot, row, tf.constant([saved + 1.0]))
    assert compare_with_checkpoint(trainer.checkpoint, path) == [SLOT]
    assert compare_with_checkpoint(trainer.checkpoint, path,
                                   on_tasks=True) == [SLOT]  # on each PS
    assert compare_with_checkpoint(trainer.checkpoint, path,
                                   model_only=True) == []
    # A model row: found in model-only checks too.
    before = shards[0][5].numpy()
    table_init.assign_rows(shards[0], 5, tf.constant([before * 2 + 1]))
    assert compare_with_checkpoint(trainer.checkpoint, path,
                                   model_only=True) == [TABLE]

    reads = []
    real_read = checkpoint_verify.read_rows
    monkeypatch.setattr(checkpoint_verify, "read_rows", lambda *a: (
        reads.append(a[-1]), real_read(*a))[1])
    assert trainer.keeper.restore(path) == path  # restores and proves it
    # The PS tasks see the folder: each reads its own rows (no block goes
    # through the coordinator), except the coordinator's own variables.
    assert {d.split("/device")[0] for d in reads} == {
        "/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1",
        "/job:chief/replica:0/task:0"}
    assert sum("/job:ps/" in d for d in reads) > 20
    assert np.array_equal(slot[row].numpy(), saved)
    assert np.array_equal(shards[0][5].numpy(), before)
    assert compare_with_checkpoint(trainer.checkpoint, path) == []


def test_a_checkpoint_of_other_shapes_is_listed_without_temp_files(
        ps_cluster, trainer, saved, tmp_path, no_temp_writes):
    path = saved
    other = Trainer(build_ps_strategy(ps_cluster, PartitionConfig()),
                    criteo(buckets=300, dim=4),
                    ModelConfig(interaction="concat", top_mlp=(8,)),
                    input_config=InputConfig(batch_size=32),
                    checkpoint_dir=tmp_path / "other")
    assert TABLE in shape_mismatches(other.checkpoint, path)
    assert SLOT in shape_mismatches(other.checkpoint, path)
    with pytest.raises(RestoreError, match="categorical"):
        other.keeper.restore(path)


def test_a_checkpoint_of_two_shards_restores_into_one_in_blocks(
        ps_cluster, trainer, tmp_path, monkeypatch):
    table = trainer.model.sparse_arch.tables["categorical"]
    rng = np.random.default_rng(0)
    for shard in _shards(table):  # values no fresh model has
        slot = trainer.sparse_optimizer.get_slot(shard, "accumulator")
        for variable in (shard, slot):
            table_init.assign_rows(variable, 0, tf.constant(
                rng.random(variable.shape, np.float32)))
    path = CheckpointKeeper(tmp_path / "a", trainer.checkpoint).save(7)
    monkeypatch.setattr(checkpoint_verify, "BLOCK_BYTES", 1000 * 8 * 4)
    copies = []
    real_copy = checkpoint_verify.copy_rows
    monkeypatch.setattr(checkpoint_verify, "copy_rows",
                        lambda *a: (copies.append(a[1]), real_copy(*a)))

    one = Trainer(build_ps_strategy(ps_cluster,
                                    PartitionConfig(kind="fixed", shards=1)),
                  SPEC, ModelConfig(interaction="concat", top_mlp=(8,)),
                  input_config=InputConfig(batch_size=32),
                  checkpoint_dir=tmp_path / "b")
    assert len(_shards(one.model.sparse_arch.tables["categorical"])) == 1
    monkeypatch.setattr(checkpoint_verify, "PROGRESS_BYTES", 1)
    recorder = Recorder()
    one.keeper.restore(path, progress=recorder)
    assert TABLE in copies and SLOT in copies  # streamed, not TF's restore
    state = sum(t.dtype.size * int(np.prod(t.shape)) for t in
                checkpoint_verify.live_tensors(one.checkpoint).values())
    assert [(t.label, t.total, t.unit, t.done, t.closed)
            for t in recorder.tasks] == [("restore", state, "bytes", state,
                                          True),
                                         ("verify", state, "bytes", state,
                                          True)]
    reader = tf.train.load_checkpoint(path)
    restored = one.model.sparse_arch.tables["categorical"]
    assert np.array_equal(restored.numpy(), reader.get_tensor(TABLE))
    assert np.array_equal(
        one.sparse_optimizer.get_slot(restored, "accumulator").numpy(),
        reader.get_tensor(SLOT))


def test_live_keys_are_the_saved_keys(trainer, tmp_path):
    path = trainer.checkpoint.write(str(tmp_path / "keys"))
    saved, _ = checkpoint_verify.saved_tensors(path)
    live = checkpoint_verify.live_tensors(trainer.checkpoint)
    assert set(live) == set(saved)
    assert {k: list(v.shape) for k, v in live.items()} == saved


@pytest.mark.parametrize("kind, scale", [("uniform", 0.05),
                                         ("truncated_normal", 0.1)])
def test_tables_are_filled_in_blocks_with_their_distribution(
        ps_cluster, monkeypatch, kind, scale):
    monkeypatch.setattr(table_init, "BLOCK_BYTES", 4096 * 8 * 4)  # 4k rows
    writes = []
    real_assign = table_init.assign_rows
    monkeypatch.setattr(table_init, "assign_rows",
                        lambda v, start, value: (writes.append(start),
                                                 real_assign(v, start, value)))
    spec = criteo(buckets=2000, dim=8)
    spec = dataclasses.replace(spec, tables=(dataclasses.replace(
        spec.tables[0], initializer=kind, scale=scale),))
    strategy = build_ps_strategy(ps_cluster, PartitionConfig(kind="fixed"))
    with strategy.scope():
        arch = SparseArch(spec)
    table = arch.tables["categorical"]
    shards = _shards(table)
    assert [s.device[-len("task:0/device:CPU:0"):] for s in shards] == [
        "task:0/device:CPU:0", "task:1/device:CPU:0"]
    values = np.concatenate([s.numpy() for s in shards])
    assert len(writes) == 14  # 26,000 rows per shard: 7 blocks each
    assert values.shape == (52_000, 8)
    blocks = values[:4096 * 3]  # blocks differ from one another
    assert not np.array_equal(blocks[:4096], blocks[4096:8192])
    assert np.unique(values, axis=0).shape[0] == values.shape[0]
    if kind == "uniform":  # U(-s, s): mean 0, std s/sqrt(3)
        assert values.min() >= -scale and values.max() <= scale
        assert values.min() < -0.99 * scale and values.max() > 0.99 * scale
        assert abs(values.std() - scale / np.sqrt(3)) < 0.01 * scale
    else:  # N(0, s) truncated at 2s: std 0.8796 s
        assert np.abs(values).max() <= 2 * scale + 1e-6
        assert abs(values.std() - 0.8796 * scale) < 0.01 * scale
    assert abs(values.mean()) < 0.01 * scale
    # Every shard is filled, also the second PS's.
    unfilled = [np.flatnonzero(~s.numpy().any(axis=1)) for s in shards]
    assert [len(rows) for rows in unfilled] == [0, 0], [
        (len(rows), rows[:3], rows[-3:]) for rows in unfilled]
    # A large table reports its rows (here: "large" from 1 row).
    monkeypatch.setattr(table_init, "PROGRESS_ROWS", 1)
    recorder = Recorder()
    table_init.fill_table(table, embedding._initializer(  # noqa: SLF001
        spec.tables[0]), label="init categorical", progress=recorder)
    assert [(t.label, t.total, t.done, t.closed) for t in recorder.tasks] == [
        ("init categorical", 52_000, 52_000, True)]


def test_an_eager_lookup_gathers_per_shard(ps_cluster):
    # 3 uneven shards (2,609 / 2,609 / 2,608 rows): the eager lookup on the
    # shard list must split rows as the strategy did.
    spec = criteo(buckets=301, dim=4)
    strategy = build_ps_strategy(ps_cluster,
                                 PartitionConfig(kind="fixed", shards=3))
    with strategy.scope():
        arch = SparseArch(spec)
    table = arch.tables["categorical"]
    assert [int(s.shape[0]) for s in _shards(table)] == [2609, 2609, 2608]
    full = np.concatenate([s.numpy() for s in _shards(table)])
    ids = np.array([[0, 2608], [2609, 5217], [5218, 7825]], np.int64)
    rows = embedding._lookup(table, tf.constant(ids))  # noqa: SLF001
    assert np.array_equal(rows.numpy(), full[ids])


def _save_devices(monkeypatch) -> list[str]:
    """Records the device of every ``SaveV2`` op TensorFlow's saver builds
    (each save is traced again, so the wrapper is seen)."""
    from tensorflow.python.ops import io_ops
    devices = []
    real_save = io_ops.save_v2

    def save_v2(*args, **kwargs):
        op = real_save(*args, **kwargs)
        devices.append(getattr(op, "device", "eager"))
        return op

    monkeypatch.setattr(io_ops, "save_v2", save_v2)
    return devices


def test_each_ps_writes_its_own_shards_and_the_save_reports_bytes(
        ps_cluster, trainer, tmp_path, monkeypatch):
    # The in-process cluster is all on localhost: every task shares the
    # folder, so no tensor is sent to the coordinator to be written.
    assert trainer.keeper.tasks_write
    devices = _save_devices(monkeypatch)
    monkeypatch.setattr(checkpoint_save, "PROGRESS_BYTES", 1)
    recorder = Recorder()
    set_default_progress(recorder)
    try:
        path = trainer.save()
    finally:
        set_default_progress(SILENT)
    assert sorted(d.split("/device")[0] for d in devices) == [
        "/job:chief/replica:0/task:0", "/job:ps/replica:0/task:0",
        "/job:ps/replica:0/task:1"]
    state = sum(checkpoint_verify.tensor_bytes(t) for t in
                checkpoint_verify.live_tensors(trainer.checkpoint).values())
    assert [(t.label, t.total, t.unit, t.done, t.closed)
            for t in recorder.tasks] == [("save", state, "bytes", state, True)]
    assert compare_with_checkpoint(trainer.checkpoint, path) == []

    # Coordinator-written (a folder the tasks may not share): every SaveV2
    # on the coordinator, the same keys and values.
    devices.clear()
    keeper = CheckpointKeeper(tmp_path / "coordinator", trainer.checkpoint)
    assert not keeper.tasks_write
    other = keeper.save(int(trainer.progress.step.numpy()))
    assert devices and {d.split("/device")[0] for d in devices} == {
        "/job:chief/replica:0/task:0"}
    assert checkpoint_verify.saved_tensors(other)[0] == (
        checkpoint_verify.saved_tensors(path)[0])
    assert compare_with_checkpoint(trainer.checkpoint, other) == []
    strategy = build_ps_strategy(ps_cluster, PartitionConfig())
    assert checkpoint_save.tasks_share_folder(strategy, tmp_path)
    assert not checkpoint_save.tasks_share_folder(strategy, "ram://x/ckpt")


def test_progress_goes_to_the_default_only_for_large_state(
        ps_cluster, trainer, monkeypatch):
    recorder = Recorder()
    set_default_progress(recorder)
    try:
        path = trainer.save()  # small: nothing reported
        assert trainer.keeper.restore(path) == path
        strategy = build_ps_strategy(ps_cluster, PartitionConfig())
        with strategy.scope():
            SparseArch(SPEC)
        assert recorder.tasks == []
        # "Large" from 1 row / 1 byte: init, restore and its check report.
        monkeypatch.setattr(table_init, "PROGRESS_ROWS", 1)
        monkeypatch.setattr(checkpoint_verify, "PROGRESS_BYTES", 1)
        with strategy.scope():
            SparseArch(SPEC)
        assert trainer.keeper.restore(path) == path
    finally:
        set_default_progress(SILENT)
    rows = SPEC.tables[0].rows
    assert [(t.label, t.unit, t.done == t.total, t.closed)
            for t in recorder.tasks] == [
        ("init categorical", "rows", True, True),
        ("restore", "bytes", True, True), ("verify", "bytes", True, True)]
    assert recorder.tasks[0].total == rows


def test_repeated_saves_log_no_retracing_warning(trainer, tmp_path,
                                                 monkeypatch):
    """Every save of PS-placed variables makes a new tf.function inside
    TensorFlow (by design); its retracing detector, fresh here so that the
    saves of earlier tests do not matter, warned from the fifth save on."""
    monkeypatch.setattr(polymorphic_function,
                        "_frequent_tracing_detector_manager",
                        polymorphic_function._FrequentTracingDetectorManager())
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = tf.get_logger()
    logger.addHandler(handler)
    try:
        keeper = CheckpointKeeper(tmp_path / "ckpt", trainer.checkpoint,
                                  strategy=trainer.strategy)
        assert keeper.tasks_write  # as in training: each PS writes
        for step in range(1, 9):
            keeper.save(step)
        # Other warnings still pass (the filter is gone after the save).
        logger.warning("psrec-probe: triggered tf.function retracing")
    finally:
        logger.removeHandler(handler)
    messages = [r.getMessage() for r in records]
    assert not [m for m in messages if "MultiDeviceSaver" in m], messages
    assert "psrec-probe: triggered tf.function retracing" in messages
    assert keeper.latest.endswith("ckpt-8")
