"""``psrec export --split`` and ``--delta-since``, ``psrec apply-delta``.

A deepfm run (a hashed table with a multi-hot feature, a dynamic table
small enough to evict, wide tables) trained by ``psrec train`` and exported
by ``psrec export``: a plain-TF client (``tf.saved_model.load`` and
pyarrow, no psrec) goes raw rows -> ``keys`` -> rows gathered from the
Parquet dump -> dense model and gets the all-in-one export's scores to
1e-6; a delta published between two checkpoints holds exactly the rows
that differ (and the ids evicted), and base + delta applied is, byte for
byte, the full split export at the later step; the refusals."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.features.spec.spec import FeatureSpec
from psrec.launch.cli.main import main
from psrec.models.serving.versions import resolve
from tests._client import client_inputs

pytestmark = pytest.mark.slow

SPEC = FeatureSpec.from_dict({
    "name": "split", "label": {"name": "label"},
    "tables": [{"name": "hashed", "dim": 8},
               {"name": "items", "dim": 8, "mode": "dynamic",
                "capacity": 60, "maintenance_every": 5}],
    "dense": [{"name": "x", "transform": "log1p"}],
    "categorical": [
        {"name": "city", "table": "hashed", "hash_buckets": 200},
        {"name": "user", "table": "hashed", "dtype": "int64",
         "hash_buckets": 300, "row_offset": 200},
        {"name": "tags", "table": "hashed", "hash_buckets": 100,
         "row_offset": 500, "max_length": 3},
        {"name": "item", "table": "items", "dtype": "int64"}]})


def _rows(rows: int, seed: int, items: int, narrow: bool = False
          ) -> pa.Table:
    """Raw rows; ``narrow``: a few cities and users only (the run's last
    10 steps read these, so most table rows stay as they were)."""
    rng = np.random.default_rng(seed)
    city = rng.integers(0, 5 if narrow else 40, rows)
    user = rng.integers(0, 20 if narrow else 200, rows)
    item = rng.integers(0, items, rows)
    x = rng.gamma(2.0, 3.0, rows)
    tags = [[f"t{t}" for t in rng.integers(0, 30, rng.integers(0, 5))]
            for _ in range(rows)]
    signal = (city % 3 == 0) + 0.8 * (item % 4 == 0) + (x > 6)
    label = (rng.random(rows) < 0.1 + 0.25 * signal).astype(np.int64)
    return pa.table({"label": pa.array(label, pa.int64()),
                     "x": pa.array(x, pa.float64()),
                     "city": pa.array([f"c{c}" for c in city]),
                     "user": pa.array(user, pa.int64()),
                     "tags": pa.array(tags, pa.list_(pa.string())),
                     "item": pa.array(item, pa.int64())})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run (checkpoints at steps 20 and 30; its last 10 steps read
    few cities, users and items), its exports: ``all`` (all-in-one, step 30),
    ``S/1`` (split, step 20), ``S/2`` (delta on 1, step 30), ``S/3``
    (delta on 2, the same step: nothing changed), ``F/1`` (split, step
    30)."""
    root = tmp_path_factory.mktemp("split")
    (root / "raw").mkdir()
    pq.write_table(pa.concat_tables([_rows(1280, 0, 150),
                                     _rows(640, 1, 20, narrow=True)]),
                   root / "raw" / "train.parquet")
    data = convert([root / "raw" / "train.parquet"], SPEC, root / "data",
                   ConversionOptions(shards=1, block_rows=64)).manifest
    spec_file = SPEC.save(root / "spec.yaml")
    assert main(["train", "--strategy", "one-device", "--spec",
                 str(spec_file), "--model", "deepfm", "--data",
                 str(data.root), "--batch-size", "64", "--steps", "30",
                 "--steps-per-closure", "10", "--sparse-lr", "0.3",
                 "--dense-lr", "0.02", "--warmup-steps", "0",
                 "--checkpoint-every", "10", "--eval-every", "0",
                 "--workdir", str(root / "run"),
                 "--no-export"]) == 0
    checkpoints = str(root / "run" / "checkpoints")
    for args in (["--out", str(root / "S"), "--split", "--checkpoint",
                  "ckpt-20"],
                 ["--out", str(root / "S"), "--split", "--delta-since", "1",
                  "--json"],
                 ["--out", str(root / "S"), "--split", "--delta-since", "2"],
                 ["--out", str(root / "F"), "--split"],
                 ["--out", str(root / "all")]):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert main(["export", checkpoints, "--checkpoint", "latest",
                         *args] if "--checkpoint" not in args else
                        ["export", checkpoints, *args]) == 0, args
        if "--json" in args:
            (root / "delta.json").write_text(printed.getvalue())
    return root


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def _dump(folder: Path, table: str) -> dict[int, np.ndarray]:
    """``key -> vector`` of a table file, read with pyarrow alone."""
    data = pq.read_table(folder / "tables" / f"{table}.parquet")
    assert set(data.column("table").to_pylist()) <= {table}
    vectors = data.column("vector").to_pylist()
    return {k: np.asarray(v, np.float32) for k, v in
            zip(data.column("key").to_pylist(), vectors)}


def _client_scores(folder: Path, raw: dict[str, np.ndarray]) -> np.ndarray:
    """What a serving system does with a split bundle, as documented: raw
    features -> keys -> rows of the key-value store -> dense model."""
    manifest = _manifest(folder)
    model = tf.saved_model.load(str(folder / manifest["model"]))
    keys = model.signatures["keys"](**{k: tf.constant(v)
                                       for k, v in raw.items()})
    store = {name: _dump(folder, name) for name in manifest["tables"]}
    inputs = {"x": tf.constant(raw["x"])}
    for feature, info in manifest["features"].items():
        ids = keys[feature].numpy()
        tables = {feature: info["table"]}
        if info["wide_table"]:
            tables[feature + "__wide"] = info["wide_table"]
        for name, table in tables.items():
            entry, rows = manifest["tables"][table], store[table]
            missing = (rows[entry["default_key"]] if entry["mode"] ==
                       "dynamic" else np.zeros(entry["dim"], np.float32))
            inputs[name] = tf.constant(np.array(
                [rows.get(int(k), missing) for k in ids.reshape(-1)],
                np.float32).reshape(ids.shape + (entry["dim"],)))
        if info["max_length"] > 1:
            inputs[feature + "__keys"] = tf.constant(ids)
    return model.signatures["serving_default"](**inputs)[
        "probability"].numpy()


def test_split_serving_scores_equal_the_all_in_one_export(run):
    rows = _rows(600, 7, 150)
    raw = client_inputs(rows, SPEC)
    whole = tf.saved_model.load(resolve(str(run / "all")).path)
    expected = whole.signatures["serving_default"](
        **{k: tf.constant(v) for k, v in raw.items()})["probability"].numpy()
    assert np.std(expected) > 1e-2  # trained: rows told apart
    split = _client_scores(run / "F" / "1", raw)
    np.testing.assert_allclose(split, expected, rtol=0, atol=1e-6)
    # Unseen item ids read the dynamic table's default row (key -2).
    manifest = _manifest(run / "F" / "1")
    assert manifest["tables"]["items"]["mode"] == "dynamic"
    assert -2 in _dump(run / "F" / "1", "items")
    # The dense SavedModel holds no table: no variable of 600 or 61 rows.
    reader = tf.train.load_checkpoint(
        str(run / "F" / "1" / "model" / "variables" / "variables"))
    shapes = reader.get_variable_to_shape_map().values()
    assert not [s for s in shapes if s and s[0] in (600, 61)]
    assert manifest["step"] == 30 and manifest["kind"] == "full"
    assert manifest["tables"]["hashed"]["rows"] == 600
    for name, entry in manifest["files"].items():
        assert (run / "F" / "1" / name).stat().st_size == entry["bytes"]


def test_a_delta_holds_the_changed_rows_and_applies_to_the_full_export(
        run, tmp_path):
    base, delta, full = run / "S" / "1", run / "S" / "2", run / "F" / "1"
    manifest = _manifest(delta)
    assert manifest["kind"] == "delta" and manifest["step"] == 30
    assert manifest["base"]["version"] == 1
    assert manifest["base"]["step"] == 20
    for table, entry in manifest["tables"].items():
        old, new = _dump(base, table), _dump(full, table)
        differ = {k for k, v in new.items()
                  if k not in old or not np.array_equal(old[k], v)}
        shipped = _dump(delta, table)
        assert set(shipped) == differ, table
        for key in differ:
            np.testing.assert_array_equal(shipped[key], new[key])
        assert entry["delta_rows"] == len(differ) == (
            entry["changed"] + entry["admitted"])
        if entry["mode"] == "dynamic":
            deleted = pq.read_table(delta / entry["deleted_file"])
            assert set(deleted.column("key").to_pylist()) == set(old) - set(
                new)
    printed = json.loads((run / "delta.json").read_text())  # --json
    assert printed["version"] == 2 and printed["step"] == 30
    assert printed["split"]["base"]["version"] == 1
    assert printed["split"]["tables"]["hashed"] == {
        k: manifest["tables"]["hashed"][k] for k in
        ("rows", "delta_rows", "changed", "admitted", "deleted")}
    hashed = manifest["tables"]["hashed"]
    assert 0 < hashed["delta_rows"] < hashed["rows"] / 2  # not all changed
    items = manifest["tables"]["items"]
    assert items["deleted"] > 0 and items["admitted"] > 0  # evictions
    # Applied (without TensorFlow) = the full export at step 30, byte for byte.
    code = ("import sys; from psrec.launch.cli.main import main; "
            f"rc = main(['apply-delta', {str(base)!r}, {str(delta)!r}, "
            f"'--out', {str(tmp_path / 'kv')!r}]); "
            "assert 'tensorflow' not in sys.modules; sys.exit(rc)")
    done = subprocess.run([sys.executable, "-P", "-c", code],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    applied = tmp_path / "kv" / "2"
    assert f"{applied} (full split version 2, step 30)" in done.stdout
    mine, theirs = _manifest(applied), _manifest(full)
    for table in theirs["tables"]:
        name = f"tables/{table}.parquet"
        assert mine["files"][name] == theirs["files"][name], table
    assert mine["tables"] == theirs["tables"]
    assert mine["applied"] == [1, 2] and mine["kind"] == "full"
    assert _client_scores(applied, client_inputs(
        _rows(50, 9, 150), SPEC)).shape == (50,)
    # A delta of a delta (nothing changed since) applies to the version
    # applied before, as to a chain of both deltas.
    empty = _manifest(run / "S" / "3")
    assert empty["base"] == {"version": 2, "step": 30,
                             "checkpoint": manifest["checkpoint"]}
    assert {e["delta_rows"] for e in empty["tables"].values()} == {0}
    for argv, out in (([str(applied)], "kv2"),
                      ([str(base), str(delta)], "kv3")):
        assert main(["apply-delta", *argv, str(run / "S" / "3"), "--out",
                     str(tmp_path / out)]) == 0
        again = _manifest(tmp_path / out / "3")
        assert again["tables"] == theirs["tables"]
        for table in theirs["tables"]:
            name = f"tables/{table}.parquet"
            assert again["files"][name] == theirs["files"][name], table


def test_refusals_in_one_line(run, tmp_path, capsys):
    base, delta, full = run / "S" / "1", run / "S" / "2", run / "F" / "1"

    def refused(argv, code, *words):
        assert main(argv) == code
        error = capsys.readouterr().err.strip()
        assert len(error.splitlines()) == 1, error
        for word in words:
            assert word in error, error

    refused(["apply-delta", str(full), str(delta), "--out",
             str(tmp_path / "o")], 2, "delta on version 1 (step 20, ",
            f"not on {full}")
    refused(["apply-delta", str(delta), str(delta), "--out",
             str(tmp_path / "o")], 2, "BASE_DIR must be a full")
    refused(["export", str(run / "run" / "checkpoints"), "--out",
             str(run / "S"), "--delta-since", "1"], 2, "--split")
    refused(["export", str(run / "run" / "checkpoints"), "--out",
             str(run / "S"), "--split", "--delta-since", "7"], 2,
            "is not a split export version")
    refused(["export", str(run / "run" / "checkpoints"), "--out",
             str(run / "S"), "--split", "--table-dtype", "int8"], 2,
            "`--table-dtype` = int8", "drop `--table-dtype`")
    refused(["predict", "--model", str(run / "S"), "--data",
             str(run / "raw" / "train.parquet"), "--out",
             str(tmp_path / "p.parquet")], 2, f"{run / 'S' / '3'} is a split "
            "export", "without --split")
    assert not (tmp_path / "o").exists()
    assert sorted(p.name for p in (run / "S").iterdir()) == ["1", "2", "3"]
    # A damaged copy of the base: bad data (exit 1), nothing published.
    damaged = tmp_path / "damaged"
    (damaged / "tables").mkdir(parents=True)
    for path in base.rglob("*"):
        if path.is_file():
            target = damaged / path.relative_to(base)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    table = damaged / "tables" / "hashed.parquet"
    data = bytearray(table.read_bytes())
    data[100] ^= 0xFF
    table.write_bytes(bytes(data))
    refused(["apply-delta", str(damaged), str(delta), "--out",
             str(tmp_path / "o")], 1, "hashed.parquet", "damaged")
    assert not (tmp_path / "o").exists()


def test_apply_delta_reads_and_publishes_on_an_object_store(run):
    """ram:// (a store without a folder rename, reached through
    tf.io.gfile): the applied version is copied into place, manifest
    last, and equals the full export."""
    store = "ram://split-apply"
    for version in ("1", "2"):
        source = run / "S" / version
        for path in source.rglob("*"):
            if path.is_file():
                target = f"{store}/in/{version}/{path.relative_to(source)}"
                tf.io.gfile.makedirs(target.rsplit("/", 1)[0])
                tf.io.gfile.copy(str(path), target)
    assert main(["apply-delta", f"{store}/in/1", f"{store}/in/2", "--out",
                 f"{store}/out"]) == 0
    assert tf.io.gfile.listdir(f"{store}/out") == ["2"]  # no temporary
    applied = json.loads(tf.io.gfile.GFile(
        f"{store}/out/2/manifest.json").read())
    full = _manifest(run / "F" / "1")
    assert applied["tables"] == full["tables"]
    for table in full["tables"]:
        name = f"tables/{table}.parquet"
        assert applied["files"][name] == full["files"][name]
