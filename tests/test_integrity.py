"""Pre-training data checks: split disjointness, record-level scans,
bounded repair of corrupted shards, watchdog and exit-code policy."""

import dataclasses
import io
import shutil

import pytest
import tensorflow as tf

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.format.manifest import ManifestError
from psrec.data.format.repair import masked_crc
from psrec.data.format.repair import scan_records
from psrec.data.ingest.synthetic import write_synthetic_parquet
from psrec.data.input.integrity import SplitOverlapError
from psrec.data.input.integrity import check_disjoint_splits
from psrec.data.input.integrity import repair_corrupted_shards
from psrec.errors import is_retryable
from psrec.features import criteo
from psrec.ps_cluster.training.watchdog import EXIT_RETRYABLE
from psrec.ps_cluster.training.watchdog import Watchdog


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    spec = criteo(buckets=100, dim=4)
    files = write_synthetic_parquet(spec, root / "pq", 3000, files=1)
    return convert(files, spec, root / "tfr", ConversionOptions(
        shards=2, eval_fraction=0.2, block_rows=64)).manifest


def _copy(manifest, dst):
    shutil.copytree(manifest.root, dst)
    from psrec.data.format.manifest import Manifest
    return Manifest.load(dst)


def test_disjoint_splits_pass_and_count_eval_rows(manifest):
    assert check_disjoint_splits(manifest) == manifest.rows("eval") == 600


def test_eval_shard_overlapping_train_is_refused(manifest, tmp_path):
    copy = _copy(manifest, tmp_path / "tfr")
    train = copy.shards["train"][0]
    leaky = dataclasses.replace(copy, shards={
        "train": copy.shards["train"],
        "eval": copy.shards["eval"] + (train,)})
    with pytest.raises(SplitOverlapError, match=r"in both the train and the "
                       r"eval split"):
        check_disjoint_splits(leaky)


def test_masked_crc_matches_tensorflow_framing(tmp_path):
    path = tmp_path / "r.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(b"hello")
    data = path.read_bytes()
    assert int.from_bytes(data[8:12], "little") == masked_crc(data[:8])
    assert int.from_bytes(data[-4:], "little") == masked_crc(b"hello")


def _flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_scan_counts_exactly_the_corrupted_records(tmp_path):
    path = tmp_path / "r.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(50):
            writer.write(bytes([i]) * 100)
    record = 12 + 100 + 4
    _flip(path, 3 * record + 12 + 50)   # data of record 3
    _flip(path, 40 * record + 12 + 10)  # data of record 40
    repaired = tmp_path / "fixed.tfrecord"
    scan = scan_records(path, repaired)
    assert (scan.good, scan.corrupted, scan.unreadable_from) == (48, 2, None)
    kept = [r.numpy()[0] for r in tf.data.TFRecordDataset(str(repaired))]
    assert kept == [i for i in range(50) if i not in (3, 40)]


def test_truncated_file_reports_where_framing_breaks(tmp_path):
    path = tmp_path / "r.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for _ in range(10):
            writer.write(b"x" * 100)
    path.write_bytes(path.read_bytes()[:-50])
    scan = scan_records(path)
    assert scan.good == 9 and scan.unreadable_from == 9 * 116


def test_repair_is_bounded_and_names_the_file(manifest, tmp_path):
    copy = _copy(manifest, tmp_path / "tfr")
    shard = copy.root / copy.shards["train"][1].file
    _flip(shard, 12 + 40)  # data of the first record
    with pytest.raises(ManifestError, match=r"train-00001-of-00002.*sha256"):
        repair_corrupted_shards(copy, tmp_path / "rep", 0)
    fixed, report = repair_corrupted_shards(copy, tmp_path / "rep", 1)
    assert report.skipped == 1
    assert fixed.files("train")[1].startswith(str(tmp_path / "rep"))
    assert fixed.files("train")[0] == copy.files("train")[0]
    clean, none = repair_corrupted_shards(manifest, tmp_path / "x", 5)
    assert none is None and clean is manifest


def test_watchdog_fires_with_stacks_and_retryable_code(monkeypatch):
    codes = []
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    dog = Watchdog(0.3, lambda: "2 closures in flight", exit=codes.append)
    dog.fire(0.5)
    assert codes == [EXIT_RETRYABLE] and is_retryable(EXIT_RETRYABLE)
    assert "2 closures in flight" in err.getvalue()


def test_watchdog_does_not_fire_while_beating():
    codes = []
    dog = Watchdog(1.0, lambda: "", exit=codes.append).start()
    import time
    for _ in range(8):
        time.sleep(0.2)
        dog.beat()
    dog.stop()
    assert codes == [] and not dog.fired


def test_exit_code_policy_follows_kubeflow():
    assert all(is_retryable(c) for c in (130, 137, 138, 143, -9))
    assert not any(is_retryable(c) for c in (0, 1, 2, 126, 127, 139))
