"""Tests for data.convert: Parquet -> sharded block TFRecords + manifest.

Values read back through the real input path (``make_eval_dataset``) are
compared with an independent computation from the Parquet input.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from psrec.data.convert.checks import SchemaError
from psrec.data.convert.convert import BadDataError
from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.convert.writer import QUARANTINE_NAME
from psrec.data.format.manifest import MANIFEST_NAME
from psrec.data.format.manifest import Manifest
from psrec.data.format.manifest import ManifestError
from psrec.data.ingest.criteo import ingest_criteo
from psrec.data.ingest.synthetic import synthetic_table
from psrec.data.input.dataset import make_eval_dataset
from psrec.features import criteo
from psrec.features import movielens
from psrec.features.spec.spec import DENSE_COLUMN
from psrec.features.spec.spec import ID_COLUMN
from tests._shared import CRITEO_SAMPLE
from tests._shared import shared_data

REPO = Path(__file__).resolve().parents[1]
CRITEO_SAMPLE_ROWS = 10_390


def _read_back(manifest: Manifest, spec, splits=("train", "eval")) -> dict:
    """All rows of the given splits, concatenated, sorted by example id."""
    parts: dict[str, list[np.ndarray]] = {}
    for split in splits:
        files = manifest.files(split)
        if not files:
            continue
        for batch in make_eval_dataset(files, spec, 1000, manifest.block_rows):
            for name, value in batch.items():
                parts.setdefault(name, []).append(value.numpy())
    rows = {name: np.concatenate(values) for name, values in parts.items()}
    order = np.argsort(rows[ID_COLUMN], kind="stable")
    return {name: value[order] for name, value in rows.items()}


def _hash_ids(values: list, buckets: int, offset: int) -> np.ndarray:
    """Independent id computation: FarmHash bucket of the string + offset."""
    strings = np.array(["" if v is None else str(v) for v in values], object)
    return tf.strings.to_hash_bucket_fast(strings, buckets).numpy() + offset


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _shard_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.tfrecord"))


# -- real Criteo rows, end to end ------------------------------------------------


def test_criteo_sample_ingest_convert_parse_back_equals_parquet(tmp_path):
    source = shared_data(CRITEO_SAMPLE)
    ingested = ingest_criteo([source], tmp_path / "parquet")
    assert ingested.rows == CRITEO_SAMPLE_ROWS
    parquet = ingested.files[0]
    spec = criteo(buckets=1000)

    report = convert([parquet], spec, tmp_path / "out", ConversionOptions(
        shards=3, eval_fraction=0.1, block_rows=128))
    assert report.bad_rows == 0 and report.quarantine is None
    assert report.rows_read == CRITEO_SAMPLE_ROWS
    eval_rows = round(CRITEO_SAMPLE_ROWS * 0.1)
    assert report.rows_written == {"train": CRITEO_SAMPLE_ROWS - eval_rows,
                                   "eval": eval_rows}
    manifest = Manifest.load(tmp_path / "out")
    manifest.verify(spec.fingerprint())
    assert len(manifest.files("train")) == 3
    assert len(manifest.files("eval")) == 3

    got = _read_back(manifest, spec)
    # Every row exactly once over train + eval, ids = row numbers.
    np.testing.assert_array_equal(got[ID_COLUMN],
                                  np.arange(CRITEO_SAMPLE_ROWS))
    # The tail split puts the last 10% of the rows in eval.
    eval_ids = np.concatenate([
        b[ID_COLUMN].numpy() for b in make_eval_dataset(
            manifest.files("eval"), spec, 1000, manifest.block_rows)])
    np.testing.assert_array_equal(
        np.sort(eval_ids), np.arange(CRITEO_SAMPLE_ROWS - eval_rows,
                                     CRITEO_SAMPLE_ROWS))

    table = pq.read_table(parquet)
    label = table.column("label").to_numpy()
    assert set(np.unique(label)) == {0, 1}
    np.testing.assert_array_equal(got["label"], label.astype(np.float32))

    dense = np.stack([
        np.nan_to_num(table.column(f"I{i}").to_numpy(zero_copy_only=False)
                      .astype(np.float64), nan=0.0)
        for i in range(1, 14)], axis=1).astype(np.float32)
    assert (dense < 0).any(), "the sample has negative counts"
    assert table.column("I1").null_count > 0, "the sample has missing counts"
    np.testing.assert_array_equal(got[DENSE_COLUMN], dense)

    for index in range(26):
        name = f"C{index + 1}"
        expected = _hash_ids(table.column(name).to_pylist(), 1000,
                             index * 1000)
        np.testing.assert_array_equal(got[name], expected, err_msg=name)
        assert got[name].min() >= index * 1000
        assert got[name].max() < (index + 1) * 1000


def test_movielens_multi_hot_padding_truncation_and_threshold(tmp_path):
    spec = movielens()
    table = synthetic_table(spec, 3000, seed=1)
    genres = table.column("genres").to_pylist()
    long_list = [f"g{i}" for i in range(9)]
    genres[5] = long_list          # longer than max_length = 6
    genres[7] = None               # missing list -> all padding
    genres[11] = ["only"]          # one value + 5 pads
    table = table.set_column(table.schema.get_field_index("genres"),
                             "genres", pa.array(genres, pa.list_(pa.string())))
    path = tmp_path / "ml.parquet"
    pq.write_table(table, path)

    report = convert([path], spec, tmp_path / "out",
                     ConversionOptions(shards=2, block_rows=100,
                                       eval_fraction=0))
    assert report.truncated_lists == {"genres": 1}
    assert report.bad_rows == 0
    got = _read_back(report.manifest, spec, splits=("train",))
    np.testing.assert_array_equal(got[ID_COLUMN], np.arange(3000))

    assert got["genres"].shape == (3000, 6)
    expected = np.full((3000, 6), -1, np.int64)
    for row, values in enumerate(genres):
        kept = (values or [])[:6]
        if kept:
            expected[row, :len(kept)] = _hash_ids(kept, 64, 0)
    np.testing.assert_array_equal(got["genres"], expected)
    assert (got["genres"][7] == -1).all()
    assert (got["genres"][11][1:] == -1).all()
    np.testing.assert_array_equal(got["genres"][5],
                                  _hash_ids(long_list[:6], 64, 0))

    rating = table.column("rating").to_numpy()
    np.testing.assert_array_equal(got["rating"],
                                  (rating >= 4).astype(np.float32))
    assert 0 < got["rating"].mean() < 1
    age = table.column("age").to_numpy(zero_copy_only=False)
    assert np.isnan(age).any()
    np.testing.assert_allclose(
        got[DENSE_COLUMN][:, 0],
        np.where(np.isnan(age), 34.05, age).astype(np.float32))
    # int64 ids hash through their decimal string; offsets within tables.
    np.testing.assert_array_equal(
        got["user_id"], _hash_ids(table.column("user_id").to_pylist(), 2000, 0))
    np.testing.assert_array_equal(
        got["zip"], _hash_ids(table.column("zip").to_pylist(), 1000, 72))


# -- schema drift ------------------------------------------------------------------


def _small_criteo_table(rows: int = 300, seed: int = 0) -> pa.Table:
    return synthetic_table(criteo(buckets=1000), rows, seed=seed)


def _replace(table: pa.Table, name: str, array: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, array)


def test_missing_column_raises_schema_error_naming_file_and_column(tmp_path):
    path = tmp_path / "no_c5.parquet"
    pq.write_table(_small_criteo_table().drop_columns(["C5"]), path)
    with pytest.raises(SchemaError) as error:
        convert([path], criteo(buckets=1000), tmp_path / "out")
    message = str(error.value)
    assert str(path) in message and "'C5'" in message and "missing" in message


@pytest.mark.parametrize("column, array", [
    ("C1", pa.array(np.arange(300, dtype=np.int64))),
    ("I1", pa.array([str(i) for i in range(300)])),
    ("label", pa.array(["0"] * 300)),
], ids=["C1-int64", "I1-string", "label-string"])
def test_wrong_column_type_raises_schema_error_naming_file_and_column(
        tmp_path, column, array):
    path = tmp_path / f"bad_{column}.parquet"
    pq.write_table(_replace(_small_criteo_table(), column, array), path)
    with pytest.raises(SchemaError) as error:
        convert([path], criteo(buckets=1000), tmp_path / "out")
    message = str(error.value)
    assert str(path) in message and repr(column) in message
    assert str(array.type) in message


def test_extra_columns_are_ignored_and_reported(tmp_path):
    table = _small_criteo_table()
    table = table.append_column("note", pa.array(["x"] * 300))
    table = table.append_column("score", pa.array(np.ones(300)))
    path = tmp_path / "extra.parquet"
    pq.write_table(table, path)
    plain = tmp_path / "plain.parquet"
    pq.write_table(_small_criteo_table(), plain)
    report = convert([path, plain], criteo(buckets=1000), tmp_path / "out",
                     ConversionOptions(shards=1, eval_fraction=0))
    assert report.extra_columns == {str(path): ("note", "score")}
    assert report.rows_written["train"] == 600
    assert "note, score" in report.summary()


def test_second_file_bad_schema_writes_nothing(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(_small_criteo_table(), good)
    bad = tmp_path / "bad.parquet"
    pq.write_table(_small_criteo_table().drop_columns(["I13"]), bad)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(SchemaError, match="'I13'") as error:
        convert([good, bad], criteo(buckets=1000), out)
    assert str(bad) in str(error.value)
    assert list(out.iterdir()) == []
    # A missing output folder is not even created.
    with pytest.raises(SchemaError):
        convert([good, bad], criteo(buckets=1000), tmp_path / "never")
    assert not (tmp_path / "never").exists()


# -- bad rows ------------------------------------------------------------------------


def _table_with_bad_rows(rows: int, seed: int) -> tuple[pa.Table, dict]:
    """A synthetic Criteo table with exactly 1% bad rows.

    Returns the table and {row: reason} of the injected rows.
    """
    table = _small_criteo_table(rows, seed)
    rng = np.random.default_rng(seed)
    positions = np.sort(rng.choice(rows, rows // 100, replace=False))
    kinds = np.arange(len(positions)) % 4
    label = table.column("label").to_numpy().astype(np.int64)
    label_null = np.zeros(rows, bool)
    i3 = table.column("I3").to_numpy(zero_copy_only=False).astype(np.float64)
    i7 = table.column("I7").to_numpy(zero_copy_only=False).astype(np.float64)
    i3_null = np.isnan(i3)
    i7_null = np.isnan(i7)
    reasons = {}
    for position, kind in zip(positions.tolist(), kinds.tolist()):
        if kind == 0:
            label_null[position] = True
            reasons[position] = "null in required field 'label'"
        elif kind == 1:
            label[position] = 2
            reasons[position] = "label 'label' = 2 is not 0/1"
        elif kind == 2:
            i3[position], i3_null[position] = np.nan, False
            reasons[position] = "non-finite value in 'I3'"
        else:
            i7[position] = np.inf if position % 2 else -np.inf
            i7_null[position] = False
            reasons[position] = "non-finite value in 'I7'"
    table = _replace(table, "label", pa.array(label, mask=label_null))
    # NaN is a value here (not a null): from_pandas=False keeps it.
    table = _replace(table, "I3", pa.array(i3, mask=i3_null))
    table = _replace(table, "I7", pa.array(i7, mask=i7_null))
    return table, reasons


def test_bad_rows_are_quarantined_with_file_row_and_reason(tmp_path):
    spec = criteo(buckets=1000)
    tables = [_table_with_bad_rows(3000, seed=1), _table_with_bad_rows(2000,
                                                                       seed=2)]
    paths = []
    for index, (table, _) in enumerate(tables):
        paths.append(str(tmp_path / f"part{index}.parquet"))
        pq.write_table(table, paths[-1])
    injected = sum(len(reasons) for _, reasons in tables)
    assert injected == 50  # exactly 1% of 5000

    report = convert(paths, spec, tmp_path / "out", ConversionOptions(
        shards=2, block_rows=64, batch_rows=700, max_bad_fraction=0.02,
        eval_fraction=0))
    assert report.bad_rows == injected
    assert report.rows_read == 5000
    assert report.rows_written == {"train": 5000 - injected, "eval": 0}
    assert report.manifest.bad_rows == injected
    assert report.quarantine == str(tmp_path / "out" / QUARANTINE_NAME)

    quarantine = pq.read_table(report.quarantine).to_pylist()
    assert len(quarantine) == injected
    got = {(q["source_file"], q["row"]): q["reason"] for q in quarantine}
    expected = {(path, row): reason
                for path, (_, reasons) in zip(paths, tables)
                for row, reason in reasons.items()}
    assert got == expected
    expected_counts: dict[str, int] = {}
    for reason in expected.values():
        expected_counts[reason] = expected_counts.get(reason, 0) + 1
    assert report.bad_reasons == expected_counts
    # The quarantined record is the original row.
    first = next(q for q in quarantine if q["source_file"] == paths[0])
    original = tables[0][0].slice(first["row"], 1).to_pylist()[0]
    assert json.loads(first["record"])["C1"] == original["C1"]

    # The ids written are exactly the good rows' global row numbers.
    bad_ids = {row + (3000 if path == paths[1] else 0)
               for path, row in expected}
    ids = _read_back(report.manifest, spec, splits=("train",))[ID_COLUMN]
    np.testing.assert_array_equal(
        ids, np.array(sorted(set(range(5000)) - bad_ids)))


def test_too_many_bad_rows_raises_and_publishes_nothing(tmp_path):
    table, reasons = _table_with_bad_rows(3000, seed=3)
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path)
    out = tmp_path / "out"
    with pytest.raises(BadDataError) as error:
        convert([path], criteo(buckets=1000), out,
                ConversionOptions(shards=2))  # default max_bad_fraction 0.001
    assert f"{len(reasons)} of 3000 rows" in str(error.value)
    assert not (out / MANIFEST_NAME).exists()
    leftovers = sorted(p.name for p in out.iterdir())
    assert leftovers == [QUARANTINE_NAME]  # no shard, no temporary file
    assert pq.read_table(out / QUARANTINE_NAME).num_rows == len(reasons)


# -- interrupted conversion ------------------------------------------------------------


def _write_big_criteo(path: Path, rows: int) -> None:
    """``rows`` rows quickly: one synthetic chunk repeated."""
    chunk = _small_criteo_table(50_000, seed=4)
    pq.write_table(pa.concat_tables([chunk] * (rows // 50_000)), path)


def _bytes_written(paths) -> int:
    total = 0
    for path in paths:
        try:
            total += path.stat().st_size
        except FileNotFoundError:  # renamed meanwhile: the run completed
            pass
    return total


@pytest.mark.slow
def test_killed_conversion_leaves_no_final_names_and_rerun_is_identical(
        tmp_path):
    spec = criteo(buckets=1000)
    spec_path = spec.save(tmp_path / "spec.yaml")
    source = tmp_path / "big.parquet"
    rows = 400_000
    _write_big_criteo(source, rows)
    out = tmp_path / "out"
    out.mkdir()
    final_names = [f"train-{i:05d}-of-00004.tfrecord" for i in range(4)]

    command = [sys.executable, "-m", "psrec", "convert", str(source),
               "--spec", str(spec_path), "--out", str(out), "--shards", "4",
               "--block-rows", "64", "--eval-fraction", "0"]
    log_path = tmp_path / "convert.log"
    log = open(log_path, "wb")  # a file, not a pipe: the child never blocks
    process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and process.poll() is None:
            # Kill once rows are being written to the temporary shards.
            if _bytes_written(out.glob(".train-*.tmp")) > 0:
                process.send_signal(signal.SIGKILL)
                break
            time.sleep(0.002)
        else:
            process.kill()
            process.wait()
            pytest.fail(
                "the conversion finished (or never started writing) before it "
                f"could be killed; rc={process.returncode}, output: "
                f"{log_path.read_text(errors='replace')[-2000:]}; use more "
                "rows.")
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
    assert process.returncode == -signal.SIGKILL
    assert list(out.glob(".train-*.tmp")), "it was killed mid-way"
    assert not (out / MANIFEST_NAME).exists()
    for name in final_names:
        assert not (out / name).exists(), name
    assert not list(out.glob("*.tfrecord"))

    options = ConversionOptions(shards=4, block_rows=64, eval_fraction=0)
    again = convert([source], spec, out, options)
    fresh = convert([source], spec, tmp_path / "fresh", options)
    assert again.rows_written["train"] == rows
    assert sorted(p.name for p in _shard_files(out)) == final_names
    assert not list(out.glob(".*.tmp*")), "stale temporaries are removed"
    for name in final_names:
        assert _sha256(out / name) == _sha256(tmp_path / "fresh" / name), name
    assert again.manifest.root != fresh.manifest.root
    assert again.manifest.to_dict() == fresh.manifest.to_dict()
    assert Manifest.load(out).to_dict() == Manifest.load(
        tmp_path / "fresh").to_dict()
    Manifest.load(out).verify(spec.fingerprint())


def test_reconversion_with_fewer_shards_removes_stale_shards(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(_small_criteo_table(1000), path)
    spec = criteo(buckets=1000)
    out = tmp_path / "out"
    convert([path], spec, out, ConversionOptions(shards=4, block_rows=32,
                                                 eval_fraction=0))
    assert len(_shard_files(out)) == 4
    report = convert([path], spec, out, ConversionOptions(
        shards=2, block_rows=32, eval_fraction=0))
    assert [p.name for p in _shard_files(out)] == [
        "train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]
    assert Manifest.load(out).to_dict() == report.manifest.to_dict()
    assert os.path.getsize(out / MANIFEST_NAME) > 0


# -- what the manifest knows: positives; the no-eval warning ----------------------


def test_manifest_counts_positives_per_split_of_written_rows(tmp_path):
    """Thresholded labels (rating >= 4), tail split; a quarantined positive
    row is not counted."""
    spec = movielens()
    table = synthetic_table(spec, 2000, seed=4)
    rating = table.column("rating").to_numpy()
    user = table.column("user_id").to_pylist()
    bad = int(np.flatnonzero(rating[:1500] >= 4)[0])
    user[bad] = None  # a required field: the row is quarantined
    table = _replace(table, "user_id", pa.array(user, pa.int64()))
    pq.write_table(table, tmp_path / "ml.parquet")
    report = convert([tmp_path / "ml.parquet"], spec, tmp_path / "out",
                     ConversionOptions(shards=2, eval_fraction=0.25,
                                       block_rows=64, max_bad_fraction=0.01))
    assert report.bad_rows == 1
    positive = rating >= 4
    positive[bad] = False
    expected = {"train": int(positive[:1500].sum()),
                "eval": int(positive[1500:].sum())}
    manifest = Manifest.load(tmp_path / "out")
    assert manifest.positives == expected == report.manifest.positives
    assert 0 < expected["train"] < 1499 and 0 < expected["eval"] < 500
    assert manifest.positive_rate("train") == expected["train"] / 1499
    assert manifest.positive_rate("eval") == expected["eval"] / 500
    got = _read_back(manifest, spec, splits=("eval",))
    assert got["rating"].sum() == expected["eval"]


def test_positives_of_a_hash_split_match_the_parquet_labels(tmp_path):
    table = _small_criteo_table(3000, seed=5)
    pq.write_table(table, tmp_path / "in.parquet")
    spec = criteo(buckets=1000)
    manifest = convert([tmp_path / "in.parquet"], spec, tmp_path / "out",
                       ConversionOptions(shards=3, eval_fraction=0.3,
                                         split_mode="hash")).manifest
    label = table.column("label").to_numpy()
    for split in ("train", "eval"):
        ids = _read_back(manifest, spec, splits=(split,))[ID_COLUMN]
        assert len(ids) == manifest.rows(split) > 0
        assert manifest.positives[split] == int(label[ids].sum())
        assert manifest.positive_rate(split) == pytest.approx(
            label[ids].mean(), abs=1e-12)


def test_manifest_without_positives_still_loads(tmp_path):
    """A manifest written before positives (label means) were recorded:
    positives (label means) None."""
    pq.write_table(_small_criteo_table(), tmp_path / "in.parquet")
    spec = criteo(buckets=1000)
    convert([tmp_path / "in.parquet"], spec, tmp_path / "out",
            ConversionOptions(eval_fraction=0))
    path = tmp_path / "out" / MANIFEST_NAME
    data = json.loads(path.read_text())
    assert data["positives"]["eval"] == 0
    assert data["label_means"] == {}  # no `mse` label
    del data["positives"], data["label_means"]
    path.write_text(json.dumps(data))
    manifest = Manifest.load(tmp_path / "out")
    assert manifest.positives is None and manifest.label_means is None
    assert manifest.positive_rate("train") is None
    assert manifest.rows("train") == 300
    manifest.verify(spec.fingerprint())
    with pytest.raises(ManifestError, match="'test' is not one of"):
        manifest.positive_rate("test")


def test_conversion_without_eval_rows_warns(tmp_path):
    pq.write_table(_small_criteo_table(10), tmp_path / "in.parquet")
    spec = criteo(buckets=1000)
    report = convert([tmp_path / "in.parquet"], spec, tmp_path / "none",
                     ConversionOptions(eval_fraction=0))
    [warning] = report.warnings
    assert "no eval split" in warning and "--eval-fraction 0" in warning
    assert report.to_dict()["warnings"] == [warning]
    tiny = convert([tmp_path / "in.parquet"], spec, tmp_path / "tiny",
                   ConversionOptions(eval_fraction=0.01))
    assert tiny.rows_written["eval"] == 0
    assert len(tiny.warnings) == 1
    assert "--eval-fraction 0.01 of 10 rows" in tiny.warnings[0]
    held_out = convert([tmp_path / "in.parquet"], spec, tmp_path / "held",
                       ConversionOptions(eval_fraction=0.2))
    assert held_out.rows_written["eval"] == 2 and held_out.warnings == ()


def test_convert_command_prints_the_warning_on_stderr(tmp_path, capsys):
    from psrec.launch.cli.main import main
    pq.write_table(synthetic_table(movielens(), 200, seed=2),
                   tmp_path / "ml.parquet")
    args = ["convert", str(tmp_path / "ml.parquet"), "--spec", "movielens",
            "--shards", "2", "--no-progress"]  # stderr: only the warning
    assert main(args + ["--out", str(tmp_path / "a"), "--eval-fraction",
                        "0"]) == 0
    captured = capsys.readouterr()
    [line] = captured.err.strip().splitlines()
    assert line.startswith("warning: no eval split") and "--eval-fraction" \
        in line
    assert "warning" not in captured.out
    assert main(args + ["--out", str(tmp_path / "b"), "--json",
                        "--eval-fraction", "0"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["warnings"] == [line.removeprefix("warning: ")]
    assert captured.err.strip() == line
    assert main(args + ["--out", str(tmp_path / "c"), "--eval-fraction",
                        "0.2"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "eval" in captured.out


@pytest.mark.parametrize("name, command", [
    ("clicks.csv.gz", "`psrec ingest csv`"),
    ("train.libsvm", "`psrec ingest libfm`"),
    ("events.jsonl", "`psrec ingest jsonl`"),
    ("dump.bin", "`psrec ingest csv|libfm|jsonl|criteo|movielens`"),
])
def test_non_parquet_input_names_the_file_and_the_ingest_to_run(
        tmp_path, name, command):
    path = tmp_path / name
    path.write_bytes(b"a,b\n1,2\n")
    from psrec.errors import ConfigError
    with pytest.raises(ConfigError) as caught:
        convert([path], criteo(buckets=10, dim=4), tmp_path / "out")
    message = str(caught.value)
    assert str(path) in message and "is not a Parquet file" in message
    assert f"run {command} on it first" in message


def test_a_conversion_that_names_no_split_holds_out_the_default_share(
        tmp_path, capsys):
    """No --eval-fraction, no --eval-files: the last 10% of the rows are
    the eval split, and the summary says so; 0 still means none."""
    from psrec.launch.cli.main import main
    pq.write_table(_small_criteo_table(), tmp_path / "in.parquet")
    report = convert([tmp_path / "in.parquet"], criteo(buckets=1000),
                     tmp_path / "out")
    assert report.rows_written == {"train": 270, "eval": 30}
    assert report.warnings == ()
    assert report.split.startswith("10% of the rows: the last rows")
    assert "default" in report.split
    assert main(["convert", str(tmp_path / "in.parquet"), "--spec", "criteo",
                 "--out", str(tmp_path / "cli"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "eval split: 10% of the rows: the last rows (--split tail); the " \
        "default held-out share" in out
    named = convert([tmp_path / "in.parquet"], criteo(buckets=1000),
                    tmp_path / "named", ConversionOptions(eval_fraction=0.2))
    assert "default" not in named.split
    none = convert([tmp_path / "in.parquet"], criteo(buckets=1000),
                   tmp_path / "none", ConversionOptions(eval_fraction=0))
    assert (none.rows_written["eval"], none.split) == (0, "")
