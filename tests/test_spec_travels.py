"""The spec travels with the data (``spec.yaml`` beside ``manifest.json``,
picked by :func:`spec_for`), and time-ordered splits: ``--order-by``,
``--eval-files`` and MovieLens ingested in time order."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.convert.split import OrderColumnError
from psrec.data.format.manifest import MANIFEST_NAME
from psrec.data.format.manifest import SPEC_FILE_NAME
from psrec.data.format.manifest import Manifest
from psrec.data.format.manifest import ManifestError
from psrec.data.format.manifest import spec_for
from psrec.data.ingest.movielens import ingest_movielens
from psrec.data.input.dataset import make_eval_dataset
from psrec.errors import ConfigError
from psrec.features import FeatureSpec
from psrec.features import criteo
from psrec.features import movielens
from psrec.features.spec.spec import ID_COLUMN
from psrec.launch.cli.main import main
from tests._forbid import Reached
from tests._forbid import forbid
from tests._shared import MOVIELENS_DIR
from tests._shared import shared_data

COLORS = ["red", "green", "blue"]


def _tiny_spec_file(folder: Path) -> Path:
    """A spec with a vocabulary given by a path relative to the spec."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "colors.txt").write_text("\n".join(COLORS) + "\n")
    spec = {"name": "tiny", "label": {"name": "click"},
            "tables": [{"name": "ids", "rows": 64, "dim": 4}],
            "dense": [{"name": "price"}],
            "categorical": [
                {"name": "color", "table": "ids",
                 "vocabulary_file": "colors.txt"},
                {"name": "user", "table": "ids", "hash_buckets": 32,
                 "row_offset": 8}]}
    path = folder / "tiny.yaml"
    path.write_text(json.dumps(spec))
    return path


def _tiny_parquet(path: Path, rows: int, seed: int, ts=None) -> Path:
    rng = np.random.default_rng(seed)
    columns = {
        "click": pa.array(rng.integers(0, 2, rows), pa.int64()),
        "price": pa.array(rng.random(rows)),
        "color": pa.array(rng.choice(COLORS, rows).tolist()),
        "user": pa.array(rng.integers(0, 100, rows).astype(str).tolist()),
    }
    if ts is not None:
        columns["ts"] = pa.array(ts)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def _ids(manifest: Manifest, spec: FeatureSpec, split: str) -> np.ndarray:
    files = manifest.files(split)
    if not files:
        return np.zeros([0], np.int64)
    return np.concatenate([
        batch[ID_COLUMN].numpy() for batch in make_eval_dataset(
            files, spec, 1000, manifest.block_rows)])


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """Data converted with a spec loaded by a relative path (so its
    vocabulary path is relative to the working folder)."""
    monkeypatch.chdir(tmp_path)
    _tiny_spec_file(Path("specs"))
    spec = FeatureSpec.load("specs/tiny.yaml")
    assert not Path(spec.categorical[0].vocabulary_file).is_absolute()
    _tiny_parquet(tmp_path / "in" / "a.parquet", 300, seed=1)
    report = convert([tmp_path / "in" / "a.parquet"], spec, tmp_path / "out",
                     ConversionOptions(shards=2, eval_fraction=0.2,
                                       block_rows=32))
    return tmp_path / "out", report.manifest


# -- item 1: convert saves the spec ---------------------------------------------


def test_convert_saves_the_spec_beside_the_manifest_and_names_it(tiny):
    out, manifest = tiny
    record = json.loads((out / MANIFEST_NAME).read_text())
    assert record["spec_file"] == SPEC_FILE_NAME == "spec.yaml"
    loaded = Manifest.load(out)
    assert loaded.spec_file == SPEC_FILE_NAME
    saved = loaded.load_spec()
    assert saved.fingerprint() == record["spec_hash"]
    assert saved.name == "tiny" and [f.name for f in saved.categorical] == [
        "color", "user"]
    # The vocabulary resolves from any folder: its path was made absolute.
    vocabulary = saved.categorical[0].vocabulary_file
    assert Path(vocabulary).is_absolute()
    os.chdir(out)
    assert Manifest.load(".").load_spec().categorical[0].vocabulary() == COLORS


def test_spec_file_is_written_before_the_manifest(tmp_path, monkeypatch):
    seen = []
    original = Manifest.write

    def write(self):
        seen.append((self.root / SPEC_FILE_NAME).is_file())
        return original(self)

    monkeypatch.setattr(Manifest, "write", write)
    spec = criteo(buckets=100)
    path = tmp_path / "in.parquet"
    from psrec.data.ingest.synthetic import synthetic_table
    pq.write_table(synthetic_table(spec, 200, seed=0), path)
    convert([path], spec, tmp_path / "out", ConversionOptions(shards=1))
    assert seen == [True]


def test_older_manifest_without_spec_file_still_loads(tiny):
    out, _ = tiny
    record = json.loads((out / MANIFEST_NAME).read_text())
    del record["spec_file"]
    (out / MANIFEST_NAME).write_text(json.dumps(record))
    manifest = Manifest.load(out)
    assert manifest.spec_file is None and manifest.load_spec() is None
    # No preset has this hash: the spec must be given.
    with pytest.raises(ConfigError, match="--spec FILE"):
        spec_for(manifest, None)
    given = spec_for(manifest, str(out / SPEC_FILE_NAME))
    assert given.fingerprint() == manifest.spec_hash


def test_older_preset_manifest_resolves_to_the_preset(tmp_path):
    spec = movielens()
    path = tmp_path / "in.parquet"
    from psrec.data.ingest.synthetic import synthetic_table
    pq.write_table(synthetic_table(spec, 100, seed=0), path)
    convert([path], spec, tmp_path / "out", ConversionOptions(shards=1))
    record = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    del record["spec_file"]
    (tmp_path / "out" / MANIFEST_NAME).write_text(json.dumps(record))
    assert spec_for(Manifest.load(tmp_path / "out"), None) == spec


def test_a_changed_spec_file_is_refused(tiny):
    out, _ = tiny
    path = out / SPEC_FILE_NAME
    path.write_text(path.read_text().replace("rows: 64", "rows: 65"))
    with pytest.raises(ManifestError, match="changed after the conversion"):
        spec_for(Manifest.load(out), None)


# -- item 2: the data's spec is the default ------------------------------------


def test_spec_for_uses_the_data_spec_and_accepts_the_same_override(tiny):
    out, manifest = tiny
    assert spec_for(manifest, None).fingerprint() == manifest.spec_hash
    # The spec file given by its relative path (as at conversion) matches.
    same = spec_for(manifest, "specs/tiny.yaml")
    assert same.fingerprint() == manifest.spec_hash
    assert spec_for(None, None) == criteo()
    assert spec_for(None, "movielens") == movielens()


def test_spec_for_refuses_another_spec_naming_both(tiny):
    out, manifest = tiny
    with pytest.raises(ConfigError) as info:
        spec_for(manifest, "criteo")
    message = str(info.value)
    assert info.value.exit_code == 2
    assert "`--spec` = 'criteo'" in message
    assert f"'criteo' ({criteo().fingerprint()[:12]})" in message
    assert f"'tiny' ({manifest.spec_hash[:12]})" in message
    assert "drop --spec" in message


def test_train_uses_the_data_spec_and_refuses_a_conflicting_one(
        tiny, tmp_path, monkeypatch, capsys):
    out, manifest = tiny
    seen = forbid(monkeypatch)  # stops before any work
    base = ["train", "--workdir", str(tmp_path / "run"), "--data", str(out)]
    with pytest.raises(Reached):
        main(base)
    assert seen[0].spec.fingerprint() == manifest.spec_hash
    assert main(base + ["--spec", "movielens"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "'movielens' (" in err and "'tiny' (" in err
    assert "drop --spec" in err and "Traceback" not in err
    assert len(seen) == 1


def test_audit_shards_refuses_a_conflicting_spec(tiny, capsys):
    out, _ = tiny
    assert main(["audit-shards", str(out), "--pipelines", "2"]) == 0
    capsys.readouterr()
    assert main(["audit-shards", str(out), "--pipelines", "2", "--spec",
                 "criteo"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "drop --spec" in err


# -- item 4: MovieLens in time order -------------------------------------------


def test_movielens_tail_split_holds_the_most_recent_ratings(tmp_path):
    report = ingest_movielens(shared_data(MOVIELENS_DIR), tmp_path / "pq")
    spec = movielens()
    manifest = convert(report.files, spec, tmp_path / "out",
                       ConversionOptions(shards=2, eval_fraction=0.2,
                                         block_rows=512)).manifest
    timestamps = pq.read_table(report.files[0],
                               columns=["timestamp"]).column(0).to_numpy()
    eval_ids = _ids(manifest, spec, "eval")
    assert len(eval_ids) == manifest.rows("eval") == 20_000
    is_eval = np.zeros(len(timestamps), bool)
    is_eval[eval_ids] = True
    assert timestamps[is_eval].min() >= timestamps[~is_eval].max()


# -- item 3: --order-by and --eval-files ---------------------------------------


def test_order_by_puts_the_last_values_in_eval(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = FeatureSpec.load(_tiny_spec_file(Path("specs")))
    rng = np.random.default_rng(7)
    ts = [rng.integers(0, 50, 150), rng.integers(0, 50, 250)]  # with ties
    files = [_tiny_parquet(tmp_path / "in" / f"{i}.parquet", len(t), i,
                           ts=t) for i, t in enumerate(ts)]
    report = convert(files, spec, tmp_path / "out", ConversionOptions(
        shards=2, eval_fraction=0.25, block_rows=16, order_by="ts"))
    manifest = report.manifest
    assert not report.extra_columns  # ts orders the split: not "ignored"
    assert manifest.split == {"mode": "tail", "eval_fraction": 0.25,
                              "order_by": "ts"}
    values = np.concatenate(ts)
    # Independent: the last 100 of a stable sort by (ts, row id).
    expected = np.lexsort((np.arange(400), values))[300:]
    eval_ids = _ids(manifest, spec, "eval")
    assert sorted(eval_ids.tolist()) == sorted(expected.tolist())
    train_ids = _ids(manifest, spec, "train")
    assert len(train_ids) == 300 and not set(train_ids) & set(eval_ids)
    assert values[eval_ids].min() >= values[train_ids].max()


def test_order_by_refuses_nulls_and_missing_columns(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = FeatureSpec.load(_tiny_spec_file(Path("specs")))
    path = _tiny_parquet(tmp_path / "a.parquet", 20, 0,
                         ts=[None] + list(range(19)))
    options = ConversionOptions(eval_fraction=0.2, order_by="ts")
    with pytest.raises(OrderColumnError, match="null .* in 1 rows"):
        convert([path], spec, tmp_path / "out", options)
    with pytest.raises(ConfigError, match="not a column of"):
        convert([path], spec, tmp_path / "out", ConversionOptions(
            eval_fraction=0.2, order_by="when"))
    with pytest.raises(ConfigError, match="order_by"):
        ConversionOptions(eval_fraction=0.0, order_by="ts")
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


def test_eval_files_sends_matching_inputs_to_eval(tmp_path, monkeypatch,
                                                   capsys):
    monkeypatch.chdir(tmp_path)
    spec_file = _tiny_spec_file(Path("specs"))
    for name, rows in (("day-1", 120), ("day-2", 80), ("day-3", 50)):
        _tiny_parquet(tmp_path / "in" / f"{name}.parquet", rows, rows)
    out = tmp_path / "out"
    assert main(["convert", "in", "--spec", str(spec_file), "--out",
                 str(out), "--shards", "2", "--eval-files", "day-3*",
                 "--json"]) == 0
    manifest = Manifest.load(out)
    assert manifest.rows("eval") == 50 and manifest.rows("train") == 200
    assert manifest.split["mode"] == "files"
    assert manifest.split["eval_files"] == "day-3*"
    spec = manifest.load_spec()
    assert sorted(_ids(manifest, spec, "eval").tolist()) == list(
        range(200, 250))
    capsys.readouterr()
    assert main(["convert", "in", "--spec", str(spec_file), "--out",
                 str(out), "--eval-files", "day-9*"]) == 2
    assert "matches none of the 3 inputs" in capsys.readouterr().err
    assert main(["convert", "in", "--spec", str(spec_file), "--out",
                 str(out), "--eval-files", "day-3*", "--eval-fraction",
                 "0.1"]) == 2
    err = capsys.readouterr().err  # the CLI names the flags, not the fields
    assert "`--eval-files`" in err and "`--eval-fraction`" in err, err
