"""Delta checkpoints on the shared in-process cluster (2 workers + 2 PS): the
loop's schedule of full and delta saves and the compaction, a delta holding
exactly the rows trained since the previous save (with their slots, and a
dynamic table's admissions), a full checkpoint plus its chain restoring what
a full save at the same step restores, by value, after a PS lost its state,
and broken or cut-off chains.

One Trainer trains a hashed and a dynamic table for 25
steps: full saves at 5 (no base yet), 20 and 25 (the end), deltas at 10 and
15. At each boundary the live state is kept; at 15 the checkpoint folder is
copied (the chain ckpt-5 + delta-10 + delta-15) and a full checkpoint of the
same state is written beside it.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tensorflow as tf

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.ingest.synthetic import write_synthetic_parquet
from psrec.data.input.config import InputConfig
from psrec.errors import ConfigError
from psrec.features.spec.spec import FeatureSpec
from psrec.models.optim.config import OptimizerConfig
from psrec.models.ranking.config import ModelConfig
from psrec.ps_cluster.checkpoint.delta import DeltaChainError
from psrec.ps_cluster.checkpoint.keeper import CheckpointKeeper
from psrec.ps_cluster.checkpoint.keeper import compare_with_checkpoint
from psrec.ps_cluster.checkpoint.verify import live_tensors
from psrec.ps_cluster.cluster.partition_config import PartitionConfig
from psrec.ps_cluster.cluster.strategy import build_ps_strategy
from psrec.ps_cluster.training.config import LoopConfig
from psrec.ps_cluster.training.trainer import Trainer

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# No hidden ReLU layer: a row an example looks up gets a non-zero gradient
# (a dead ReLU would give it an exact zero: an update that writes the row
# unchanged, which the delta holds but a value comparison cannot see).
MODEL = ModelConfig(interaction="concat", top_mlp=())
SPEC = FeatureSpec.from_dict({
    "name": "delta", "label": {"name": "label"},
    "tables": [{"name": "hashed", "dim": 4},
               {"name": "big", "dim": 4, "mode": "dynamic",
                "capacity": 300, "admit_threshold": 3,
                "maintenance_every": 5}],
    "dense": [{"name": "x", "transform": "log1p"}],
    "categorical": [{"name": "h", "table": "hashed", "hash_buckets": 400},
                    {"name": "item", "table": "big"}]})
HASHED = "model/sparse_arch/hashed"
BIG = "model/sparse_arch/big"
VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"
SLOT = "/.OPTIMIZER_SLOT/sparse_optimizer/accumulator" + VALUE
RESUMES = "progress/resumes" + VALUE
LOOP = LoopConfig(steps=25, steps_per_closure=5, delta_every=5,
                  full_every=20, checkpoint_every=0)


def _trainer(cluster, directory) -> Trainer:
    return Trainer(build_ps_strategy(cluster, PartitionConfig(kind="fixed")),
                   SPEC, MODEL, OptimizerConfig(), InputConfig(batch_size=64),
                   checkpoint_dir=directory, track_changes=True)


def _values(trainer) -> dict[str, np.ndarray]:
    """Every checkpoint key's live value (the tables are tiny)."""
    return {key: np.concatenate([v.numpy().reshape(-1, *v.shape[1:])
                                 for v, _ in live.shards]) if live.shape
            else live.shards[0][0].numpy()
            for key, live in live_tensors(trainer.checkpoint).items()}


@pytest.fixture(scope="module")
def run(ps_cluster, tmp_path_factory):
    """The trainer after its 25 steps, the paths its boundaries saved, the
    live state at each boundary and the copies made at step 15."""
    root = tmp_path_factory.mktemp("delta")
    paths = write_synthetic_parquet(SPEC, root / "parquet", 2000, files=1,
                                    seed=3)
    manifest = convert(paths, SPEC, root / "tfrecord",
                       ConversionOptions(shards=2, eval_fraction=0.0)
                       ).manifest
    trainer = _trainer(ps_cluster, root / "checkpoints")
    saved, states = [], {}

    def boundary(step, _eval, path):
        saved.append(path)
        states[step] = _values(trainer)
        if step == 15:  # the chain as it is now, and a full save of it
            shutil.copytree(root / "checkpoints", root / "at-15")
            states["full-15"] = CheckpointKeeper(
                root / "full-15", trainer.checkpoint).save(15)

    trainer.train(trainer.dataset_fn(manifest), LOOP, on_boundary=boundary)
    return trainer, saved, states, root


@pytest.fixture(scope="module")
def restarted(run, ps_cluster):
    """A second trainer on the copy made at step 15: a job restarted after
    a PS loss (fresh variables)."""
    return _trainer(ps_cluster, run[3] / "at-15")


def test_the_loop_saves_full_then_deltas_and_compacts_them(run):
    trainer, saved, _, root = run
    names = [path.rstrip("/").rsplit("/", 1)[1] for path in saved]
    # 5: no base yet, full; 20: --full-every; 25: the end, always full.
    assert names == ["ckpt-5", "delta-10", "delta-15", "ckpt-20",
                     "ckpt-25"]
    assert sorted(p.name for p in (root / "at-15" / "deltas").iterdir()) == [
        "delta-10", "delta-15"]
    # ckpt-20 compacted the deltas of ckpt-5: none is left.
    assert list((root / "checkpoints" / "deltas").iterdir()) == []
    assert trainer.keeper.latest_link == trainer.keeper.latest


def _delta_rows(folder, table: str, key: str, trainer
                ) -> tuple[np.ndarray, np.ndarray]:
    """Global rows and values of ``key`` (cut like ``table``) in a delta:
    shard k's rows are in the bundle of the PS task that holds it."""
    parts = json.loads((folder / "manifest.json").read_text())["parts"]
    rows, values, first = [], [], 0
    for k, shard in enumerate(live_tensors(trainer.checkpoint)[
            table + VALUE].shards):
        bundle = parts[f"{table}/part_{k}"]["file"]
        assert bundle == "rows-ps-" + shard[0].device.split("task:")[1][0]
        reader = tf.train.load_checkpoint(str(folder / bundle))
        rows.append(reader.get_tensor(f"{table}/part_{k}/rows") + first)
        values.append(reader.get_tensor(f"{key}/part_{k}"))
        first += int(shard[0].shape[0])
    return np.concatenate(rows), np.concatenate(values)


def _changed(before: np.ndarray, after: np.ndarray) -> set[int]:
    return set(np.flatnonzero((before != after).reshape(len(before), -1)
                              .any(axis=1)).tolist())


def test_a_delta_holds_exactly_the_rows_trained_since_the_last_save(run):
    trainer, _, states, root = run
    folder = root / "at-15" / "deltas" / "delta-15"
    before, after = states[10], states[15]
    rows, values = _delta_rows(folder, HASHED, HASHED + VALUE, trainer)
    trained = _changed(before[HASHED + VALUE], after[HASHED + VALUE]) | (
        _changed(before[HASHED + SLOT], after[HASHED + SLOT]))
    assert 0 < len(trained) < len(after[HASHED + VALUE])
    assert sorted(rows.tolist()) == sorted(trained)  # no more, no less
    assert np.array_equal(values, after[HASHED + VALUE][rows])
    _, slots = _delta_rows(folder, HASHED, HASHED + SLOT, trainer)
    assert np.array_equal(slots, after[HASHED + SLOT][rows])
    # The dynamic table: its trained and admitted rows, with their ids.
    rows, ids = _delta_rows(folder, BIG, "model/sparse_arch/dynamic_tables/"
                            "big/row_ids" + VALUE, trainer)
    table = after[BIG + VALUE]
    changed = _changed(before[BIG + VALUE], table)
    assert changed <= set(rows.tolist()) <= changed | {300}  # + default
    assert np.array_equal(ids, after["model/sparse_arch/dynamic_tables/big/"
                                     "row_ids" + VALUE][rows])


def test_a_full_checkpoint_and_its_deltas_restore_the_full_save_after_a_ps_loss(
        run, restarted):
    _, _, states, root = run
    trainer = restarted
    # The lost PS (task 1) comes back with fresh variables: overwrite them.
    for live in live_tensors(trainer.checkpoint).values():
        for variable, _ in live.shards:
            if "task:1" in variable.device and variable.dtype.is_floating:
                variable.assign(tf.fill(variable.shape, tf.constant(
                    7.0, variable.dtype)))
    path = trainer.restore()  # verified by value, delta by delta
    assert path.endswith("deltas/delta-15")
    assert trainer.keeper.latest.endswith("ckpt-5")
    assert int(trainer.progress.step.numpy()) == 15  # not the full's 5
    # Everything a full save at step 15 holds -- tables, slots, dense
    # weights, optimizer counters, the step, the dynamic maps and counts.
    # (The restart is counted: ``resumes`` is one more than saved.)
    assert compare_with_checkpoint(trainer.checkpoint, states["full-15"]
                                   ) == [RESUMES]
    assert int(trainer.progress.resumes.numpy()) == 1
    assert all(np.array_equal(value, states[15][key])
               for key, value in _values(trainer).items() if key != RESUMES)


def test_a_broken_chain_is_refused_naming_the_missing_delta(run, tmp_path):
    copy = tmp_path / "checkpoints"
    shutil.copytree(run[3] / "at-15", copy)
    shutil.rmtree(copy / "deltas" / "delta-10")
    keeper = CheckpointKeeper(copy, run[0].checkpoint)
    with pytest.raises(DeltaChainError, match=r"delta-15/manifest.json was "
                       r"taken after delta-10.*delta-10/manifest.json is "
                       r"missing") as refused:
        keeper.restore()
    assert refused.value.exit_code == 1 and "\n" not in str(refused.value)


def test_a_damaged_delta_is_refused_naming_its_file(run, tmp_path):
    copy = tmp_path / "checkpoints"
    shutil.copytree(run[3] / "at-15", copy)
    data = next((copy / "deltas" / "delta-10").glob("rows-ps-1.data-*"))
    data.write_bytes(data.read_bytes()[:-4])
    with pytest.raises(DeltaChainError, match=f"{data}"):
        CheckpointKeeper(copy, run[0].checkpoint).chain()


def test_a_delta_cut_off_before_its_manifest_is_no_link(run, tmp_path):
    copy = tmp_path / "checkpoints"
    shutil.copytree(run[3] / "at-15", copy)
    (copy / "deltas" / "delta-15" / "manifest.json").unlink()
    keeper = CheckpointKeeper(copy, run[0].checkpoint)
    assert keeper.latest_link.endswith("deltas/delta-10")
    assert keeper.remove_stale_deltas() == ["delta-15"]  # a resume does
    assert not (copy / "deltas" / "delta-15").exists()


@pytest.mark.parametrize("fields, words", [
    ({"full_every": 20}, "needs `LoopConfig.delta_every`"),
    ({"delta_every": 15, "full_every": 40}, "multiple of"),
    ({"delta_every": 10, "checkpoint_every": 0}, "positive multiple")])
def test_the_save_schedule_is_checked(fields, words):
    with pytest.raises(ConfigError, match=words):
        LoopConfig(**fields)
