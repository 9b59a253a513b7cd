"""``psrec export --table-dtype float16|int8``: tables stored as float16 or
per-row int8 (codes, scale, bias) in the SavedModel and dequantized on
lookup. The int8 code's error bound per row; a real run (a hashed and a
dynamic table, wide tables) trained by ``psrec train`` and exported three
ways scores held-out rows, through plain ``tf.saved_model.load``, within
1e-2 of the float32 export with the same AUC (to 0.001), from smaller
table variables; the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.errors import ConfigError
from psrec.features.spec.presets import movielens_retrieval
from psrec.features.spec.spec import FeatureSpec
from psrec.launch.cli.main import main
from psrec.launch.job.config import JobConfig
from psrec.launch.job.export import export_checkpoint
from psrec.models.embedding.quantize import dequantize_rows
from psrec.models.embedding.quantize import quantize_rows
from psrec.models.embedding.quantize import storage_dtype
from psrec.models.retrieval.config import RetrievalConfig
from psrec.models.serving.config import ExportConfig
from psrec.models.serving.versions import resolve
from tests._client import client_inputs

SPEC = FeatureSpec.from_dict({
    "name": "quantize", "label": {"name": "label"},
    "tables": [{"name": "hashed", "dim": 8},
               {"name": "items", "dim": 8, "mode": "dynamic",
                "capacity": 300, "maintenance_every": 10}],
    "dense": [{"name": "x", "transform": "log1p"}],
    "categorical": [
        {"name": "city", "table": "hashed", "hash_buckets": 200},
        {"name": "user", "table": "hashed", "dtype": "int64",
         "hash_buckets": 300, "row_offset": 200},
        {"name": "item", "table": "items", "dtype": "int64"}]})
DTYPES = ("float32", "float16", "int8")


# -- the int8 code ------------------------------------------------------------------


def test_int8_rows_round_trip_within_half_a_level():
    rng = np.random.default_rng(0)
    rows = np.concatenate([
        rng.normal(0, 0.05, (200, 16)),          # trained-table scale
        rng.uniform(-30, 70, (50, 16)),          # wide, off-centre
        np.full((1, 16), 0.25),                  # constant: scale 0
        np.zeros((1, 16)),
        np.array([[-1.0] + [1.0] * 15]),         # the extremes exactly
    ]).astype(np.float32)
    codes, scale, bias = quantize_rows(rows)
    assert codes.dtype == np.int8 and codes.shape == rows.shape
    assert scale.shape == bias.shape == (len(rows), 1)
    back = dequantize_rows(codes, scale, bias).numpy()
    spread = rows.max(1) - rows.min(1)
    bound = spread / 255 / 2 + 1e-6 * np.maximum(1.0, np.abs(rows).max(1))
    error = np.abs(back - rows).max(1)
    assert np.all(np.isfinite(back))
    assert np.all(error <= bound), (error - bound).max()
    assert scale[250, 0] == 0 and scale[251, 0] == 0
    np.testing.assert_array_equal(back[250:252], rows[250:252])  # exact
    assert codes.min() == -128 and codes.max() == 127  # all 256 codes used
    # Not trivially exact: the code is coarser than float32.
    assert error[:250].max() > 1e-4


def test_rows_narrower_than_three_values_are_float16_under_int8():
    assert storage_dtype("int8", 1) == "float16"  # the wide tables
    assert storage_dtype("int8", 2) == "float16"
    assert storage_dtype("int8", 3) == "int8"
    assert storage_dtype("float16", 1) == "float16"
    assert storage_dtype("float32", 16) == "float32"


# -- a real export ------------------------------------------------------------------


def _table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    city = rng.integers(0, 40, rows)
    user = rng.integers(0, 200, rows)
    item = rng.integers(0, 150, rows)
    x = rng.gamma(2.0, 3.0, rows)
    signal = (city % 3 == 0) + 0.8 * (item % 4 == 0) + (x > 6)
    label = (rng.random(rows) < 0.1 + 0.25 * signal).astype(np.int64)
    return pa.table({"label": pa.array(label, pa.int64()),
                     "x": pa.array(x, pa.float64()),
                     "city": pa.array([f"c{c}" for c in city]),
                     "user": pa.array(user, pa.int64()),
                     "item": pa.array(item, pa.int64())})


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A deepfm (wide tables, a dynamic table) trained 60 steps by ``psrec
    train``, exported by ``psrec export`` with each table dtype; the
    held-out raw rows."""
    root = tmp_path_factory.mktemp("quantize")
    train = root / "raw" / "train.parquet"
    train.parent.mkdir()
    pq.write_table(_table(4000, 0), train)
    data = convert([train], SPEC, root / "data", ConversionOptions(
        shards=1, eval_fraction=0.1, block_rows=64)).manifest
    spec_file = SPEC.save(root / "spec.yaml")
    assert main(["train", "--strategy", "one-device", "--spec",
                 str(spec_file), "--model", "deepfm", "--data",
                 str(data.root), "--batch-size", "64", "--steps", "60",
                 "--steps-per-closure", "10", "--sparse-lr", "0.3",
                 "--dense-lr", "0.02", "--warmup-steps", "0", "--workdir",
                 str(root / "run"), "--no-export"]) == 0
    folders = {}
    for dtype in DTYPES:
        out = root / f"export-{dtype}"
        assert main(["export", str(root / "run" / "checkpoints"), "--out",
                     str(out), "--table-dtype", dtype]) == 0
        folders[dtype] = resolve(str(out)).path
    return folders, _table(3000, 1), root / "run" / "checkpoints"


def _scores(folder: str, rows: pa.Table) -> np.ndarray:
    signature = tf.saved_model.load(folder).signatures["serving_default"]
    inputs = {k: tf.constant(v) for k, v in client_inputs(rows, SPEC).items()}
    return signature(**inputs)["probability"].numpy()


def _auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """The exact ROC AUC (Mann-Whitney; no ties among these scores)."""
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    positives = labels == 1
    n_pos, n_neg = positives.sum(), (~positives).sum()
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2)
                 / (n_pos * n_neg))


#: Rows of the spec's tables (the dynamic one: capacity + the default row).
TABLE_ROWS = (500, 301)


def _variables(folder: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``checkpoint key -> (dtype, shape)`` of the table variables (2-D,
    a table's rows: values, codes, scales, biases) of a SavedModel, read
    from its ``variables/`` as a checkpoint."""
    reader = tf.train.load_checkpoint(f"{folder}/variables/variables")
    dtypes = reader.get_variable_to_dtype_map()
    return {key: (dtypes[key].name, tuple(shape)) for key, shape in
            reader.get_variable_to_shape_map().items()
            if len(shape) == 2 and shape[0] in TABLE_ROWS}


def _bytes(variables) -> int:
    return sum(tf.as_dtype(dtype).size * int(np.prod(shape))
               for dtype, shape in variables.values())


def test_quantized_exports_score_as_the_float32_export(exports):
    folders, rows, _ = exports
    labels = rows.column("label").to_numpy()
    base = _scores(folders["float32"], rows)
    assert np.std(base) > 1e-2  # a trained model: rows told apart
    auc = _auc(labels, base)
    assert auc > 0.6
    for dtype in ("float16", "int8"):
        scores = _scores(folders[dtype], rows)
        assert np.abs(scores - base).max() <= 1e-2, dtype
        assert 0 < np.abs(scores - base).max()  # really another table
        assert abs(_auc(labels, scores) - auc) <= 1e-3, dtype


def test_quantized_tables_are_what_the_variables_hold(exports):
    folders, _, _ = exports
    tables = {d: _variables(folders[d]) for d in DTYPES}
    # float32: the [rows, 8] tables and the [rows, 1] wide tables.
    f32 = {shape for dtype, shape in tables["float32"].values()
           if dtype == "float32"}
    assert {(500, 8), (301, 8), (500, 1), (301, 1)} <= f32
    # float16: every table a float16 variable, no float32 table left.
    shapes16 = {(dtype, shape) for dtype, shape in tables["float16"].values()}
    assert shapes16 == {("float16", s) for s in f32}
    assert not {("float32", s) for s in ((500, 8), (301, 8))} & shapes16
    # int8: codes, per-row scale and bias; the wide tables float16.
    shapes8 = {(dtype, shape) for dtype, shape in tables["int8"].values()}
    assert {("int8", (500, 8)), ("int8", (301, 8)), ("float32", (500, 1)),
            ("float32", (301, 1)), ("float16", (500, 1)),
            ("float16", (301, 1))} <= shapes8
    assert not {("float32", (500, 8)), ("float32", (301, 8))} & shapes8
    table_bytes = {d: _bytes(tables[d]) for d in DTYPES}
    assert table_bytes["int8"] < 0.6 * table_bytes["float32"]
    assert table_bytes["float16"] < 0.6 * table_bytes["float32"]
    on_disk = {d: _folder_bytes(folders[d]) for d in DTYPES}
    for dtype in ("float16", "int8"):  # the folder shrinks by the tables
        saved = table_bytes["float32"] - table_bytes[dtype]
        assert on_disk["float32"] - on_disk[dtype] >= 0.8 * saved, dtype
    info = json.loads(open(f"{folders['int8']}/psrec_export.json").read())
    assert info["table_dtype"] == "int8"
    assert info["tables"] == {"hashed": "int8", "items": "int8",
                              "hashed__wide": "float16",
                              "items__wide": "float16"}


def _folder_bytes(folder: str) -> int:
    """Bytes of a SavedModel's ``variables/`` folder."""
    return sum(p.stat().st_size for p in (Path(folder) / "variables").iterdir())


def test_unseen_dynamic_ids_read_the_default_row_in_an_int8_export(exports):
    folders, rows, _ = exports
    unseen = rows.slice(0, 4).set_column(
        4, "item", pa.array([10**9 + i for i in range(4)], pa.int64()))
    unseen = unseen.set_column(
        2, "city", pa.array(["c1"] * 4)).set_column(
        3, "user", pa.array([7] * 4, pa.int64())).set_column(
        1, "x", pa.array([2.0] * 4, pa.float64()))
    scores = _scores(folders["int8"], unseen)
    assert np.all(scores == scores[0])  # one default row for all four
    assert abs(scores[0] - _scores(folders["float32"], unseen)[0]) <= 1e-2


# -- refusals -----------------------------------------------------------------------


def test_an_unknown_table_dtype_is_refused_by_the_parser(exports, capsys):
    _, _, checkpoints = exports
    with pytest.raises(SystemExit) as exit_info:
        main(["export", str(checkpoints), "--out", "/nonexistent/x",
              "--table-dtype", "int4"])
    assert exit_info.value.code == 2
    assert "--table-dtype: invalid choice: 'int4'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="ExportConfig.table_dtype"):
        ExportConfig(table_dtype="int4")


def test_a_retrieval_run_refuses_a_table_dtype_in_one_line(tmp_path, capsys):
    checkpoints = tmp_path / "run" / "checkpoints"
    JobConfig(spec=movielens_retrieval(), model_name="dcn",
              retrieval=RetrievalConfig()).write(checkpoints)
    assert main(["export", str(checkpoints), "--out", str(tmp_path / "out"),
                 "--table-dtype", "int8"]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert "`--table-dtype` = int8" in error
    assert "retrieval run" in error and "drop `--table-dtype`" in error
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="retrieval run"):
        export_checkpoint(checkpoints, tmp_path / "out",
                          config=ExportConfig(table_dtype="float16"))

