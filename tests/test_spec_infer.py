"""``psrec spec infer``: a spec inferred from Parquet statistics, written as
commented YAML, that loads and converts the same files without bad rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.infer.infer import InferOptions
from psrec.data.infer.infer import embedding_dim
from psrec.data.infer.infer import infer_spec
from psrec.data.infer.stats import DistinctCounter
from psrec.data.ingest.criteo import ingest_criteo
from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.features.spec.presets import resolve_spec
from psrec.launch.cli.main import main
from tests._shared import CRITEO_SAMPLE
from tests._shared import shared_data

ROWS = 3000
TAGS = ("a", "b", "c", "d", "e", "f")


def _table(seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 6, ROWS)
    spend = rng.pareto(1.0, ROWS) * 10
    return pa.table({
        "click": pa.array(rng.integers(0, 2, ROWS), pa.int64()),
        "spend": pa.array(np.where(rng.random(ROWS) < 0.1, None, spend),
                          pa.float64()),
        "score": pa.array(rng.normal(5.0, 2.0, ROWS)),
        "country": pa.array([("de", "fr", "us", "jp")[i]
                             for i in rng.integers(0, 4, ROWS)]),
        "query": pa.array([f"q{i}" for i in rng.integers(0, 1500, ROWS)]),
        "user_id": pa.array(np.arange(ROWS), pa.int64()),
        "version": pa.array(["v1"] * ROWS),
        "tags": pa.array([list(rng.choice(TAGS, k)) for k in lengths],
                         pa.list_(pa.string())),
        "rating": pa.array(rng.integers(1, 6, ROWS), pa.int64()),
    })


@pytest.fixture
def parquet(tmp_path: Path) -> tuple[list[str], pa.Table]:
    table = _table()
    paths = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    pq.write_table(table.slice(0, 2000), paths[0])
    pq.write_table(table.slice(2000), paths[1])
    return paths, table


def _by_name(features) -> dict:
    return {f.name: f for f in features}


def test_infer_decides_each_column(parquet, tmp_path):
    paths, table = parquet
    out = tmp_path / "spec" / "inferred.yaml"
    report = infer_spec(paths, "click", out, InferOptions(exclude=["rating"]))
    spec = resolve_spec(str(out))
    assert spec.label.name == "click" and spec.label.threshold is None
    dense = _by_name(spec.dense)
    assert set(dense) == {"spend", "score"}
    assert dense["spend"].transform == "log1p"
    score = table.column("score").to_numpy()
    assert dense["score"].transform == "standardize"
    assert dense["score"].mean == pytest.approx(score.mean(), rel=1e-5)
    assert dense["score"].std == pytest.approx(score.std(), rel=1e-5)
    categorical = _by_name(spec.categorical)
    assert set(categorical) == {"country", "query", "tags"}
    assert categorical["country"].vocabulary() == ["de", "fr", "jp", "us"]
    assert (out.parent / "vocab" / "country.txt").is_file()
    assert categorical["tags"].vocabulary() == list(TAGS)
    lengths = [len(v) for v in table.column("tags").to_pylist()]
    assert categorical["tags"].max_length == math.ceil(
        np.quantile(lengths, 0.95))
    distinct = len(set(table.column("query").to_pylist()))
    assert categorical["query"].hash_buckets == 1 << math.ceil(
        math.log2(2 * distinct))
    # A table per width, its features laid out one after the other.
    offsets: dict[str, int] = {}
    for feature in spec.categorical:
        assert feature.row_offset == offsets.get(feature.table, 0)
        offsets[feature.table] = feature.row_offset + feature.num_ids
    assert {t.name: t.rows for t in spec.tables} == offsets
    assert set(report.skipped) == {"user_id", "version", "rating"}
    assert "id-like" in report.skipped["user_id"]
    assert "constant" in report.skipped["version"]
    text = out.read_text()
    assert text.startswith("# Feature spec inferred by psrec from 3000 rows")
    assert "# Left out:\n#   user_id: id-like" in text
    assert f"# string, {distinct} distinct, 0.0% null" in text
    assert "heavy-tailed" in text and "95th percentile length" in text


def test_inferred_spec_converts_without_bad_rows(parquet, tmp_path, capsys):
    paths, _ = parquet
    out = tmp_path / "inferred.yaml"
    assert main(["spec", "infer", *paths, "--label", "click", "--out",
                 str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["file"] == str(out) and result["rows"] == ROWS
    assert result["vocabularies"] == ["vocab/country.txt", "vocab/tags.txt"]
    # The command is recorded in the header; the label is 0/1.
    assert f"# Command: psrec spec infer {paths[0]}" in out.read_text()
    report = convert(paths, resolve_spec(str(out)), tmp_path / "shards",
                     ConversionOptions(eval_fraction=0))
    assert report.bad_rows == 0
    assert report.rows_written["train"] == ROWS


def test_label_other_than_01_needs_a_threshold(parquet, tmp_path, capsys):
    paths, _ = parquet
    out = tmp_path / "s.yaml"
    assert main(["spec", "infer", *paths, "--label", "rating", "--out",
                 str(out)]) == 2
    assert "--label-threshold" in capsys.readouterr().err
    assert not out.exists()
    assert main(["spec", "infer", *paths, "--label", "rating",
                 "--label-threshold", "4", "--out", str(out)]) == 0
    spec = resolve_spec(str(out))
    assert spec.label.name == "rating" and spec.label.threshold == 4
    # click (0/1 ints, 2 distinct) becomes a small categorical code.
    assert _by_name(spec.categorical)["click"].dtype == "int64"
    assert convert(paths, spec, tmp_path / "shards").bad_rows == 0


def test_flags_cap_buckets_skip_vocabularies_and_exclude(parquet, tmp_path):
    paths, _ = parquet
    out = tmp_path / "s.yaml"
    report = infer_spec(paths, "click", out, InferOptions(
        max_buckets=256, vocab_max=0, exclude=["score", "rating"]))
    spec = resolve_spec(str(out))
    categorical = _by_name(spec.categorical)
    assert categorical["query"].hash_buckets == 256
    assert categorical["country"].hash_buckets == 8
    assert report.vocabularies == [] and not (tmp_path / "vocab").exists()
    assert "score" not in _by_name(spec.dense)
    assert report.skipped["score"] == "--exclude"
    assert "capped by --max-buckets" in out.read_text()


@pytest.mark.parametrize("kwargs, needle", [
    ({"label": "nope"}, "is not a column"),
    ({"label": "click", "exclude": ["ghost"]}, "names no column"),
    ({"label": "click", "out_name": "s.json"}, "must be a .yaml"),
])
def test_bad_arguments_are_config_errors(parquet, tmp_path, kwargs, needle):
    paths, _ = parquet
    out = tmp_path / kwargs.pop("out_name", "s.yaml")
    with pytest.raises(ConfigError, match=needle):
        infer_spec(paths, out=out, options=InferOptions(
            exclude=kwargs.pop("exclude", ())), **kwargs)


def test_a_string_label_is_a_data_error_naming_the_fix(parquet, tmp_path):
    paths, _ = parquet
    with pytest.raises(DataError, match=r"must name an integer.*--types "
                       r"country=int64"):
        infer_spec(paths, "country", tmp_path / "s.yaml")


def test_distinct_count_falls_back_to_an_estimate():
    counter = DistinctCounter(cap=1000)
    values = [f"v{i}" for i in range(50_000)]
    for start in range(0, len(values), 5000):
        counter.add(values[start:start + 5000] + values[:100])
    assert not counter.is_exact
    assert counter.count == pytest.approx(50_000, rel=0.1)
    exact = DistinctCounter(cap=1000)
    exact.add(values[:900] + values[:900])
    assert exact.is_exact and exact.count == 900


def test_estimated_distinct_count_is_noted(parquet, tmp_path):
    paths, _ = parquet
    out = tmp_path / "s.yaml"
    infer_spec(paths, "click", out, exact_cap=100)
    text = out.read_text()
    assert "(estimated) distinct" in text
    # Estimated counts cannot feed a vocabulary: country (4 values) still
    # does, query (> cap) is hashed.
    categorical = _by_name(resolve_spec(str(out)).categorical)
    assert categorical["country"].vocabulary_file is not None
    assert categorical["query"].hash_buckets is not None


def test_spec_preset_still_works_and_rejects_infer_arguments(tmp_path,
                                                              capsys):
    out = tmp_path / "criteo.yaml"
    assert main(["spec", "criteo", "--out", str(out)]) == 0
    assert resolve_spec(str(out)).name == "criteo"
    capsys.readouterr()
    assert main(["spec", "criteo", "--label", "x"]) == 2
    assert "spec infer" in capsys.readouterr().err
    assert main(["spec", "infer", "--label", "click", "--out",
                 str(tmp_path / "s.yaml")]) == 2
    assert "Parquet" in capsys.readouterr().err


def test_criteo_sample_infers_and_converts(tmp_path):
    ingested = ingest_criteo([shared_data(CRITEO_SAMPLE)], tmp_path / "pq")
    files = sorted(str(p) for p in (tmp_path / "pq").glob("*.parquet"))
    assert files, ingested
    out = tmp_path / "criteo-inferred.yaml"
    report = infer_spec(files, "label", out)
    spec = resolve_spec(str(out))
    columns = pq.read_schema(files[0]).names
    decided = (set(report.dense) | set(report.categorical)
               | set(report.skipped))
    assert decided == set(columns) - {"label"}
    # I1..I13 are counts: numbers, but I10 (6 values: a code).
    ints = {f"I{i}" for i in range(1, 14)}
    assert set(report.dense) == ints - {"I10"}
    assert set(report.categorical) & ints == {"I10"}
    assert any(f.transform == "log1p" for f in spec.dense)
    assert {f.name for f in spec.categorical} >= {"C1", "C6", "C9"}
    result = convert(files, spec, tmp_path / "shards",
                     ConversionOptions(eval_fraction=0))
    assert result.bad_rows == 0
    assert result.rows_written["train"] == ingested.rows


def test_time_columns_become_hour_and_weekday_sources(tmp_path):
    """Epoch seconds, epoch milliseconds and Avazu-style YYMMDDHH ints are
    sources of derived hour/weekday features, not dense numbers."""
    import datetime

    rng = np.random.default_rng(5)
    rows = 400
    seconds = rng.integers(1_400_000_000, 1_420_000_000, rows)
    utc = datetime.timezone.utc
    hours = [int(datetime.datetime.fromtimestamp(int(s), utc)
                 .strftime("%y%m%d%H")) for s in seconds]
    pq.write_table(pa.table({
        "label": pa.array(rng.integers(0, 2, rows)),
        "timestamp": pa.array(seconds),
        "created_at": pa.array(seconds * 1000 + 7),
        "hour": pa.array(hours),
        "count": pa.array(rng.integers(0, 200, rows)),  # not a time
    }), tmp_path / "log.parquet")
    infer_spec([tmp_path / "log.parquet"], "label", tmp_path / "spec.yaml")
    spec = resolve_spec(str(tmp_path / "spec.yaml"))
    derived = {d.name: (d.kind, d.sources, d.pattern) for d in spec.derived}
    assert derived == {
        "timestamp_hour": ("hour_of_day", ("timestamp",), None),
        "timestamp_weekday": ("day_of_week", ("timestamp",), None),
        "created_at_hour": ("hour_of_day", ("created_at",), "epoch_ms"),
        "created_at_weekday": ("day_of_week", ("created_at",), "epoch_ms"),
        "hour_hour": ("hour_of_day", ("hour",), "YYMMDDHH"),
        "hour_weekday": ("day_of_week", ("hour",), "YYMMDDHH")}
    assert [f.name for f in spec.dense] == ["count"]
    assert set(spec.columns) == {"label", "timestamp", "created_at", "hour",
                                 "count"}
    report = convert([tmp_path / "log.parquet"], spec, tmp_path / "data")
    assert report.bad_rows == 0


def _widths(spec) -> dict[str, int]:
    dims = {t.name: t.dim for t in spec.tables}
    return {f.name: dims[f.table] for f in spec.categorical}


def test_each_categorical_feature_gets_a_width_from_its_cardinality(
        parquet, tmp_path):
    """Not one width for all from the widest feature: 6 x distinct ** 0.25
    rounded to a multiple of 8, in [8, 64]; one table per width."""
    paths, table = parquet
    out = tmp_path / "s.yaml"
    infer_spec(paths, "click", out, InferOptions(exclude=["rating"]))
    spec = resolve_spec(str(out))
    queries = len(set(table.column("query").to_pylist()))
    wide = 8 * math.floor(6 * queries ** 0.25 / 8 + 0.5)
    assert wide in (32, 40)  # about 1,300 distinct queries
    assert _widths(spec) == {"country": 8, "query": wide, "tags": 8}
    assert embedding_dim(2) == 8 and embedding_dim(10 ** 7) == 64
    assert sorted(t.name for t in spec.tables) == [f"categorical_{wide}",
                                                   "categorical_8"]
    assert f"# the categorical features of width {wide}" in out.read_text()


def _code_table(rows: int = 4000, seed: int = 3) -> pa.Table:
    rng = np.random.default_rng(seed)
    # City ids: Zipf-like frequencies in a random id order, sparse ids (no
    # range to fill); brands: codes 1..60 ranked by frequency (FuxiCTR's
    # label encoding).
    weights = 1.0 / np.arange(1, 201)
    city_code = 3 + 7 * rng.permutation(200)
    cities = city_code[rng.choice(200, rows, p=weights / weights.sum())]
    brand_weights = 1.0 / np.arange(1, 61) ** 0.7
    brands = 1 + rng.choice(60, rows, p=brand_weights / brand_weights.sum())
    return pa.table({
        "click": pa.array(rng.integers(0, 2, rows), pa.int64()),
        "city": pa.array(cities, pa.int64()),
        "brand": pa.array(brands, pa.int64()),
        # Counts and measures stay numbers.
        "visits": pa.array(rng.geometric(0.02, rows), pa.int64()),
        "age": pa.array(np.clip(rng.normal(40, 12, rows), 18, 90)
                        .astype(np.int64)),
        "noise": pa.array(rng.integers(0, 5000, rows), pa.int64()),
    })


def test_label_encoded_int_codes_become_categorical(tmp_path):
    pq.write_table(_code_table(), tmp_path / "codes.parquet")
    out = tmp_path / "s.yaml"
    report = infer_spec([tmp_path / "codes.parquet"], "click", out)
    spec = resolve_spec(str(out))
    categorical = _by_name(spec.categorical)
    assert set(categorical) == {"city", "brand"}
    assert set(report.dense) == {"visits", "age", "noise"}
    assert categorical["city"].dtype == "int64"
    assert categorical["city"].hash_buckets == 512  # >= 2 x 200 distinct
    assert categorical["brand"].hash_buckets == 128  # >= 2 x 60
    text = out.read_text()
    assert "its 60 distinct values fill 1..60: label-encoded codes" in text
    assert "unrelated frequencies (roughness" in text


def test_text_timestamps_are_times(tmp_path):
    import datetime

    rng = np.random.default_rng(7)
    rows = 500
    start = datetime.datetime(2024, 3, 1, tzinfo=datetime.timezone.utc)
    times = [start + datetime.timedelta(seconds=int(s))
             for s in rng.integers(0, 30 * 86400, rows)]
    notes = [t.strftime("%Y-%m-%d %H:%M:%S") for t in times]
    notes[17] = "n/a"  # one value that is no time: a string column
    pq.write_table(pa.table({
        "click": pa.array(rng.integers(0, 2, rows)),
        "event_time": pa.array([t.strftime("%Y-%m-%d %H:%M:%S")
                                for t in times]),
        "signup": pa.array([t.strftime("%Y-%m-%d") for t in times]),
        "seen": pa.array([t.strftime("%Y-%m-%dT%H:%M:%S.%f+02:00")
                          for t in times]),
        "note": pa.array(notes),
        "country": pa.array([("de", "fr")[i] for i in
                             rng.integers(0, 2, rows)]),
    }), tmp_path / "log.parquet")
    out = tmp_path / "spec.yaml"
    report = infer_spec([tmp_path / "log.parquet"], "click", out)
    spec = resolve_spec(str(out))
    derived = {d.name: (d.kind, d.sources, d.pattern) for d in spec.derived}
    assert derived == {
        "event_time_hour": ("hour_of_day", ("event_time",),
                            "YYYY-MM-DD HH:mm:ss"),
        "event_time_weekday": ("day_of_week", ("event_time",),
                               "YYYY-MM-DD HH:mm:ss"),
        "signup_weekday": ("day_of_week", ("signup",), "YYYY-MM-DD")}
    assert "ISO-8601" in report.skipped["seen"]
    assert "id-like" in report.skipped["note"]  # no time: one value is not
    assert report.time_columns == ["event_time", "signup", "seen"]
    assert "--order-by event_time" in report.summary()
    assert "#   event_time: psrec convert ... --order-by event_time" in (
        out.read_text())
    result = convert([tmp_path / "log.parquet"], spec, tmp_path / "data")
    assert result.bad_rows == 0


def test_a_column_filled_for_one_class_only_is_a_leak(tmp_path, capsys):
    rng = np.random.default_rng(11)
    rows = 2000
    click = rng.random(rows) < 0.2
    value = rng.exponential(20.0, rows)
    pq.write_table(pa.table({
        "click": pa.array(click.astype(np.int64)),
        "conversion_value": pa.array(np.where(click, value, None),
                                     pa.float64()),
        "bounce_reason": pa.array(np.where(click, None, "timeout")
                                  .tolist()),
        "coupon": pa.array(np.where(rng.random(rows) < 0.5, None,
                                    rng.choice(["c1", "c2"], rows)).tolist()),
        "spend": pa.array(value),
    }), tmp_path / "log.parquet")
    out = tmp_path / "spec.yaml"
    assert main(["spec", "infer", str(tmp_path / "log.parquet"), "--label",
                 "click", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    warnings = [line for line in printed.splitlines()
                if line.startswith("warning:")]
    assert len(warnings) == 2
    assert "'conversion_value': label leak: filled in 100.0% of positive" \
        in warnings[0]
    assert "`- {name: conversion_value}` under `dense:`" in warnings[0]
    assert "'bounce_reason'" in warnings[1]
    spec = resolve_spec(str(out))
    assert "conversion_value" not in spec.columns
    assert "bounce_reason" not in spec.columns
    assert {"coupon", "spend"} <= set(spec.columns)
    assert "#   conversion_value: label leak" in out.read_text()
