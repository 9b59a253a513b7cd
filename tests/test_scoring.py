"""``psrec score``: raw Parquet rows -- nulls, ``""``/-1 and multi-hot lists
included -- scored by an exported model (trained for a few steps with
``psrec train``, exported with ``psrec export``) give exactly what the
SavedModel's serving function gives for the same rows sent as a serving
client sends them, in input order, over several files and batches."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.launch.cli.main import main
from psrec.models.serving.scoring import score_files
from psrec.models.serving.versions import resolve
from tests._client import client_inputs
from tests._client import mixed_spec

SPEC = mixed_spec("scoring")
ROWS_PER_FILE = (150, 90)  # two input files


def _table(rows: int, seed: int) -> pa.Table:
    """Raw rows with nulls, "" and -1 in single values and in lists, null
    and empty lists, and a label that depends on the features."""
    rng = np.random.default_rng(seed)

    def maybe(value, pad):
        return rng.choice(np.array([value, None, pad], object),
                          p=[0.75, 0.15, 0.10])

    city = [maybe(f"c{rng.integers(8)}", "") for _ in range(rows)]
    user = [maybe(int(rng.integers(30)), -1) for _ in range(rows)]
    tags = [None if rng.random() < 0.1 else [
        maybe(f"t{rng.integers(10)}", "") for _ in range(rng.integers(6))]
        for _ in range(rows)]
    codes = [None if rng.random() < 0.1 else [
        maybe(int(rng.integers(20)), -1) for _ in range(rng.integers(6))]
        for _ in range(rows)]
    price = rng.gamma(2.0, 3.0, rows)
    signal = np.array([c in ("c1", "c2") for c in city]) + (price > 6)
    label = (rng.random(rows) < 0.15 + 0.35 * signal).astype(np.int64)
    return pa.table({
        "label": pa.array(label, pa.int64()),
        "price": pa.array([None if i % 6 == 1 else p
                           for i, p in enumerate(price)], pa.float64()),
        "city": pa.array(city, pa.string()),
        "user": pa.array(user, pa.int64()),
        "tags": pa.array(tags, pa.list_(pa.string())),
        "codes": pa.array(codes, pa.list_(pa.int64())),
        "item": pa.array([f"item-{seed}-{i}" for i in range(rows)]),
    })


def _client_inputs(table: pa.Table) -> dict[str, np.ndarray]:
    """Every list padded to the longest of the whole table (wider than any
    one scoring batch's)."""
    return client_inputs(table, SPEC)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A dlrm trained 30 steps by ``psrec train`` on the converted rows,
    exported by ``psrec export``; the raw files and the tables in them."""
    root = tmp_path_factory.mktemp("scoring")
    tables = [_table(rows, seed) for seed, rows in enumerate(ROWS_PER_FILE)]
    files = []
    for i, table in enumerate(tables):
        files.append(root / "raw" / f"part-{i}.parquet")
        files[-1].parent.mkdir(exist_ok=True)
        pq.write_table(table, files[-1])
    data = convert(files, SPEC, root / "data", ConversionOptions(
        shards=1, eval_fraction=0.2, block_rows=16)).manifest
    spec_file = SPEC.save(root / "spec.yaml")
    assert main(["train", "--strategy", "one-device", "--spec",
                 str(spec_file), "--model", "dlrm", "--data", str(data.root),
                 "--batch-size", "32", "--steps", "30", "--steps-per-closure",
                 "5", "--sparse-lr", "0.5", "--dense-lr", "0.05",
                 "--warmup-steps", "0", "--workdir", str(root / "run"),
                 "--no-export"]) == 0
    export = root / "export"
    assert main(["export", str(root / "run" / "checkpoints"), "--out",
                 str(export)]) == 0
    return export, files, tables


def _direct(export, tables) -> dict[str, np.ndarray]:
    """The SavedModel's own outputs for the rows, file after file."""
    signature = tf.saved_model.load(resolve(str(export)).path).signatures[
        "serving_default"]
    parts = [signature(**{k: tf.constant(v) for k, v in
                          _client_inputs(table).items()}) for table in tables]
    return {k: np.concatenate([p[k].numpy() for p in parts])
            for k in ("probability", "logit")}


def test_scores_equal_the_saved_model_on_the_same_rows(exported, tmp_path):
    export, files, tables = exported
    report = score_files(export, files, tmp_path / "scores.parquet",
                         batch_rows=7)  # many batches, some across nulls
    scores = pq.read_table(tmp_path / "scores.parquet")
    assert scores.column_names == ["row", "label", "probability", "logit"]
    assert report.rows == scores.num_rows == sum(ROWS_PER_FILE)
    assert scores.column("row").to_pylist() == list(range(report.rows))
    labels = np.concatenate([t.column("label").to_numpy() for t in tables])
    np.testing.assert_array_equal(scores.column("label").to_numpy(), labels)

    expected = _direct(export, tables)
    probability = scores.column("probability").to_numpy()
    assert np.std(probability) > 1e-3  # rows told apart: order is checked
    np.testing.assert_allclose(probability, expected["probability"],
                               rtol=0, atol=1e-6)
    np.testing.assert_allclose(scores.column("logit").to_numpy(),
                               expected["logit"], rtol=0, atol=1e-5)
    assert report.mean_probability == pytest.approx(probability.mean(),
                                                    abs=1e-6)


def test_files_are_scored_in_the_order_given(exported, tmp_path):
    export, files, tables = exported
    score_files(export, files[::-1], tmp_path / "reversed.parquet")
    reversed_scores = pq.read_table(tmp_path / "reversed.parquet")
    expected = _direct(export, tables[::-1])["probability"]
    np.testing.assert_allclose(
        reversed_scores.column("probability").to_numpy(), expected,
        rtol=0, atol=1e-6)


def test_a_missing_or_mistyped_column_is_named_with_its_file(exported,
                                                             tmp_path):
    export, files, tables = exported
    without = tmp_path / "no_city.parquet"
    pq.write_table(tables[0].drop(["city"]), without)
    with pytest.raises(ConfigError, match=r"no_city\.parquet: column 'city' "
                       "required by the exported model is missing"):
        score_files(export, [without], tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()

    text_user = tmp_path / "text_user.parquet"
    pq.write_table(tables[0].set_column(
        3, "user", pa.array(["1"] * tables[0].num_rows)), text_user)
    with pytest.raises(ConfigError, match=r"text_user\.parquet: column "
                       "'user' has type string, the exported model takes an "
                       "integer column"):
        score_files(export, [text_user], tmp_path / "out.parquet")
    with pytest.raises(ConfigError, match="'rating' required by "
                       "--label/--keep is missing"):
        score_files(export, files, tmp_path / "out.parquet",
                    label="rating")


def test_a_label_that_does_not_fit_the_first_file_is_named(exported,
                                                           tmp_path):
    export, files, tables = exported
    worded = tmp_path / "worded.parquet"
    pq.write_table(tables[1].set_column(
        0, "label", pa.array(["yes"] * tables[1].num_rows)), worded)
    with pytest.raises(DataError, match=r"worded\.parquet: .*yes"):
        score_files(export, [files[0], worded], tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()


def test_unlabelled_rows_are_scored_without_a_label(exported, tmp_path):
    export, files, tables = exported
    unlabelled = tmp_path / "new_rows.parquet"
    pq.write_table(tables[1].drop(["label"]), unlabelled)
    score_files(export, [unlabelled], tmp_path / "new.parquet")
    scores = pq.read_table(tmp_path / "new.parquet")
    assert scores.column_names == ["row", "probability", "logit"]
    np.testing.assert_allclose(scores.column("probability").to_numpy(),
                               _direct(export, tables[1:])["probability"],
                               rtol=0, atol=1e-6)


def test_the_exports_own_label_column_is_copied(exported, tmp_path):
    """``psrec export`` records the label column; score copies it without
    ``--label`` (here renamed, as for MovieLens's ``rating``)."""
    export, _, tables = exported
    info = json.loads((export / "1" / "psrec_export.json").read_text())
    assert info["label"] == "label"
    copy = tmp_path / "export"
    shutil.copytree(export / "1", copy)  # an unversioned SavedModel folder
    (copy / "psrec_export.json").write_text(json.dumps(
        dict(info, label="clicked")))
    table = tables[0].rename_columns(
        ["clicked" if c == "label" else c for c in tables[0].column_names])
    pq.write_table(table, tmp_path / "rows.parquet")
    score_files(copy, [tmp_path / "rows.parquet"], tmp_path / "s.parquet")
    scores = pq.read_table(tmp_path / "s.parquet")
    assert scores.column_names == ["row", "clicked", "probability", "logit"]
    assert scores.column("clicked").to_pylist() == \
        tables[0].column("label").to_pylist()


def test_cli_writes_csv_with_kept_columns(exported, tmp_path, capsys):
    export, files, tables = exported
    out = tmp_path / "scores.csv"
    assert main(["score", str(export), str(files[0].parent), "--out",
                 str(out), "--keep", "item", "--batch-rows", "64",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == sum(ROWS_PER_FILE)
    assert report["columns"] == ["row", "label", "item", "probability",
                                 "logit"]
    scores = pacsv.read_csv(out)
    assert scores.column_names == report["columns"]
    items = sum((t.column("item").to_pylist() for t in tables), [])
    assert scores.column("item").to_pylist() == items
    np.testing.assert_allclose(scores.column("probability").to_numpy(),
                               _direct(export, tables)["probability"],
                               rtol=0, atol=1e-6)

    assert main(["score", str(export), str(files[0]), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"scored {ROWS_PER_FILE[0]} rows of 1 file" in text


def test_cli_error_is_one_line_with_exit_2(exported, tmp_path, capsys):
    export, _, tables = exported
    without = tmp_path / "no_tags.parquet"
    pq.write_table(tables[0].drop(["tags"]), without)
    assert main(["score", str(export), str(without), "--out",
                 str(tmp_path / "s.parquet")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "no_tags.parquet: column 'tags' required" in err[0]
    assert main(["score", str(tmp_path), str(without), "--out",
                 str(tmp_path / "s.parquet")]) == 2
    assert "is not an exported model" in capsys.readouterr().err


def test_a_corrupted_input_is_named_and_leaves_no_output(exported, tmp_path):
    from psrec.data.convert.inputs import CorruptParquetError
    export, _, tables = exported
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.concat_tables([tables[0]] * 40), path,
                   write_page_checksum=True, row_group_size=len(tables[0]))
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 4, len(data) // 2, 97):  # pages of every
        data[i] ^= 0x5A                                 # column
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptParquetError, match=str(path)):
        score_files(export, [path], tmp_path / "scores.parquet")
    assert not (tmp_path / "scores.parquet").exists()
