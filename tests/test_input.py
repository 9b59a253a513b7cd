"""Tests for data.dataset (input functions), data.audit and corrupted shards."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.format.manifest import Manifest
from psrec.data.format.manifest import ManifestError
from psrec.data.format.records import CorruptRecordError
from psrec.data.format.records import corruption_named
from psrec.data.ingest.synthetic import write_synthetic_parquet
from psrec.data.input.audit import audit_shards
from psrec.data.input.config import InputConfig
from psrec.data.input.dataset import NotEnoughShardsError
from psrec.data.input.dataset import make_eval_dataset
from psrec.data.input.dataset import make_train_dataset_fn
from psrec.data.input.dataset import shard_files
from psrec.features import criteo
from psrec.features.spec.spec import DENSE_COLUMN
from psrec.features.spec.spec import ID_COLUMN

SPEC = criteo(buckets=1000)
ROWS = 6000


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Manifest:
    """6000 synthetic rows: 6 train shards (4800 rows), 2 eval shards."""
    root = tmp_path_factory.mktemp("input")
    paths = write_synthetic_parquet(SPEC, root / "parquet", ROWS, files=2,
                                    seed=7)
    report = convert(paths, SPEC, root / "out", ConversionOptions(
        shards=6, eval_fraction=0.2, eval_shards=2, block_rows=64))
    assert report.rows_written == {"train": 4800, "eval": 1200}
    return report.manifest


def _context(pipelines: int = 1, pipeline: int = 0, replicas: int = 1):
    return tf.distribute.InputContext(num_input_pipelines=pipelines,
                                      input_pipeline_id=pipeline,
                                      num_replicas_in_sync=replicas)


def _ids(dataset) -> np.ndarray:
    return np.concatenate([b[ID_COLUMN].numpy() for b in dataset])


# -- training input ---------------------------------------------------------------


def test_every_training_batch_has_the_per_replica_batch_size(converted):
    fn = make_train_dataset_fn(converted, SPEC, InputConfig(batch_size=300))
    # 300 is not a multiple of block_rows (64); the stream repeats forever.
    for batch in fn(_context(replicas=1)).take(40):
        assert batch[ID_COLUMN].shape == (300,)
        assert batch[DENSE_COLUMN].shape == (300, 13)
        assert batch["label"].shape == (300,)
        assert batch["C26"].shape == (300,)
    # Two replicas in sync: each replica's batch is half the global batch.
    fn = make_train_dataset_fn(converted, SPEC, InputConfig(batch_size=256))
    sizes = {int(b[ID_COLUMN].shape[0])
             for b in fn(_context(pipelines=2, pipeline=1, replicas=2)).take(30)}
    assert sizes == {128}


def test_training_rows_stay_aligned_across_columns(converted):
    """Shuffling must move every column of a row together."""
    eval_rows = {}
    for batch in make_eval_dataset(converted.files("train"), SPEC, 1000, 64):
        for i, c1, dense in zip(batch[ID_COLUMN].numpy(),
                                batch["C1"].numpy(),
                                batch[DENSE_COLUMN].numpy()):
            eval_rows[int(i)] = (int(c1), dense.tobytes())
    fn = make_train_dataset_fn(converted, SPEC, InputConfig(batch_size=500))
    batch = next(iter(fn(_context())))
    for i, c1, dense in zip(batch[ID_COLUMN].numpy(), batch["C1"].numpy(),
                            batch[DENSE_COLUMN].numpy()):
        assert eval_rows[int(i)] == (int(c1), dense.tobytes())


def test_seeded_shuffle_is_deterministic_and_seed_dependent(converted):
    def first_ids(seed: int) -> np.ndarray:
        fn = make_train_dataset_fn(converted, SPEC,
                                   InputConfig(batch_size=256, seed=seed))
        return next(iter(fn(_context())))[ID_COLUMN].numpy()

    first = first_ids(11)
    np.testing.assert_array_equal(first, first_ids(11))
    assert not np.array_equal(first, first_ids(12))
    # Rows are shuffled, not read in file order.
    assert not np.array_equal(first, np.sort(first))
    assert len(np.unique(first)) == 256


def test_one_epoch_of_training_input_reads_each_row_once(converted):
    fn = make_train_dataset_fn(converted, SPEC, InputConfig(batch_size=500),
                               epochs=1)
    ids = _ids(fn(_context()))
    assert len(ids) == 4800
    assert len(np.unique(ids)) == 4800


def test_eval_dataset_yields_every_eval_id_exactly_once(converted):
    files = converted.files("eval")
    ids = _ids(make_eval_dataset(files, SPEC, 100, converted.block_rows))
    assert len(ids) == 1200
    np.testing.assert_array_equal(np.sort(ids), np.arange(4800, 6000))
    # Batches are full except possibly the last one.
    sizes = [int(b[ID_COLUMN].shape[0])
             for b in make_eval_dataset(files, SPEC, 500, converted.block_rows)]
    assert sizes == [500, 500, 200]


def test_eval_dataset_works_inside_tf_function(converted):
    files = converted.files("eval")

    @tf.function
    def count(file_names):
        total = tf.constant(0, tf.int64)
        for batch in make_eval_dataset(file_names, SPEC, 256, 64):
            total += tf.reduce_sum(tf.ones_like(batch[ID_COLUMN]))
        return total

    assert int(count(tf.constant(files))) == 1200


# -- file sharding and the audit --------------------------------------------------------


def test_shard_files_assigns_disjoint_files():
    files = [f"f{i}" for i in range(6)]
    parts = [shard_files(files, 3, i) for i in range(3)]
    assert parts == [["f0", "f3"], ["f1", "f4"], ["f2", "f5"]]


def test_audit_over_three_pipelines_has_no_overlap_and_full_coverage(
        converted):
    report = audit_shards(converted, SPEC, 3, batch_size=512)
    assert report.overlap == 0
    assert report.coverage == 1.0
    assert report.distinct == 4800 == converted.rows("train")
    assert sum(report.counts) == converted.rows("train")
    assert len(report.counts) == 3 and min(report.counts) > 0
    assert report.ok
    assert "overlap: 0" in report.summary() and "OK" in report.summary()
    eval_report = audit_shards(converted, SPEC, 2, split="eval")
    assert eval_report.ok and sum(eval_report.counts) == 1200


def test_fewer_files_than_pipelines_says_how_many_shards_to_convert(
        converted):
    with pytest.raises(NotEnoughShardsError) as error:
        shard_files(converted.files("train"), 8, 0)
    assert "6 shard file(s)" in str(error.value)
    assert "--shards 8" in str(error.value)
    with pytest.raises(NotEnoughShardsError, match="--shards 8"):
        audit_shards(converted, SPEC, 8)
    fn = make_train_dataset_fn(converted, SPEC, InputConfig(batch_size=64))
    with pytest.raises(NotEnoughShardsError, match="--shards 7"):
        fn(_context(pipelines=7, pipeline=0))


# -- corrupted shards --------------------------------------------------------------------


def _copy(manifest: Manifest, dest: Path) -> Manifest:
    shutil.copytree(manifest.root, dest)
    return Manifest.load(dest)


def _drain(files: list[str]) -> int:
    rows = 0
    with corruption_named(files):
        for batch in make_eval_dataset(files, SPEC, 512, 64):
            rows += int(batch[ID_COLUMN].shape[0])
    return rows


def test_flipped_byte_raises_corrupt_record_error_naming_file(
        converted, tmp_path):
    manifest = _copy(converted, tmp_path / "copy")
    files = manifest.files("train")
    assert _drain(files) == 4800
    victim = Path(files[2])
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))

    with pytest.raises(CorruptRecordError) as error:
        _drain(files)
    assert error.value.path == str(victim)
    assert str(victim) in str(error.value)
    with pytest.raises(ManifestError, match="sha256"):
        manifest.verify()
    with pytest.raises(CorruptRecordError) as error:
        audit_shards(manifest, SPEC, 3)
    assert str(victim) in str(error.value)


def test_truncated_shard_raises_corrupt_record_error_naming_file(
        converted, tmp_path):
    manifest = _copy(converted, tmp_path / "copy")
    files = manifest.files("train")
    victim = Path(files[4])
    data = victim.read_bytes()
    victim.write_bytes(data[:len(data) - 100])

    with pytest.raises(CorruptRecordError) as error:
        _drain(files)
    assert error.value.path == str(victim)
    assert str(victim) in str(error.value)
    with pytest.raises(ManifestError, match="truncated"):
        manifest.verify(checksums=False)
    with pytest.raises(CorruptRecordError) as error:
        audit_shards(manifest, SPEC, 2)
    assert str(victim) in str(error.value)
