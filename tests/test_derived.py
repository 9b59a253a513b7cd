"""Derived features (``features.spec.derived``): time parts, buckets and crosses
computed by the same ops at conversion and in the serving function."""

from __future__ import annotations

import datetime

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.ingest.synthetic import synthetic_table
from psrec.data.input.config import InputConfig
from psrec.data.input.dataset import make_train_dataset_fn
from psrec.features.spec.columns import SpecError
from psrec.features.spec.derived import DerivedFeature
from psrec.features.spec.spec import ID_COLUMN
from psrec.features.spec.spec import FeatureSpec
from psrec.features.transforms.ops import derive
from psrec.models.build import build_model
from psrec.models.ranking.config import ModelConfig
from psrec.models.serving.export import ServingModule
from psrec.models.serving.export import export_saved_model
from psrec.models.serving.export import serving_signature
from tests._client import client_inputs

UTC = datetime.timezone.utc


def _strings(tensor) -> list[str]:
    return [v.decode() for v in tensor.numpy()]


def test_time_parts_of_epoch_seconds_match_python():
    seconds = np.random.default_rng(0).integers(-2_000_000_000,
                                                4_000_000_000, 500)
    stamps = [datetime.datetime.fromtimestamp(int(s), UTC) for s in seconds]
    hour = derive(DerivedFeature("h", "hour_of_day", ("t",)),
                  [tf.constant(seconds)])
    weekday = derive(DerivedFeature("w", "day_of_week", ("t",)),
                     [tf.constant(seconds)])
    assert _strings(hour) == [str(s.hour) for s in stamps]
    assert _strings(weekday) == [str(s.weekday()) for s in stamps]
    millis = derive(DerivedFeature("h", "hour_of_day", ("t",),
                                   pattern="epoch_ms"),
                    [tf.constant(seconds * 1000 + 999)])
    assert _strings(millis) == [str(s.hour) for s in stamps]
    missing = derive(DerivedFeature("h", "hour_of_day", ("t",)),
                     [tf.constant([-1], tf.int64)])
    assert _strings(missing) == [""]


@pytest.mark.parametrize("pattern,fmt", [("YYMMDDHH", "%y%m%d%H"),
                                         ("YYYY-MM-DD HH:mm:ss",
                                          "%Y-%m-%d %H:%M:%S")])
def test_time_parts_of_a_pattern_match_python(pattern, fmt):
    seconds = np.random.default_rng(1).integers(946_684_800, 4_000_000_000,
                                                400)
    stamps = [datetime.datetime.fromtimestamp(int(s), UTC) for s in seconds]
    text = [s.strftime(fmt) for s in stamps]
    bad = ["", "14102", "141321xx", "14023124"] if pattern == "YYMMDDHH" \
        else ["2014-13-01 00:00:00", "2014-01-01"]
    values = tf.constant(text + bad)
    hour = derive(DerivedFeature("h", "hour_of_day", ("t",), pattern=pattern),
                  [values])
    weekday = derive(DerivedFeature("w", "day_of_week", ("t",),
                                    pattern=pattern), [values])
    assert _strings(hour) == [str(s.hour) for s in stamps] + [""] * len(bad)
    assert _strings(weekday) == ([str(s.weekday()) for s in stamps]
                                 + [""] * len(bad))
    if pattern == "YYMMDDHH":  # Avazu's hour as an int64 column
        as_int = derive(DerivedFeature("h", "day_of_week", ("t",),
                                       pattern=pattern),
                        [tf.constant([14102100, 14102823, -1], tf.int64)])
        # 2014-10-21 was a Tuesday, 2014-10-28 too; -1 is missing.
        assert _strings(as_int) == ["1", "1", ""]


def test_bucketize_matches_searchsorted_and_nan_is_missing():
    bounds = (0.0, 1.5, 10.0, 100.0)
    x = np.random.default_rng(2).normal(5, 50, 300).astype(np.float32)
    x[:4] = [0.0, 1.5, 100.0, -0.0]
    got = derive(DerivedFeature("b", "bucketize", ("x",), boundaries=bounds),
                 [tf.constant(np.append(x, np.nan))])
    want = np.searchsorted(np.array(bounds, np.float32), x, side="right")
    assert _strings(got) == [str(i) for i in want] + [""]


def test_cross_tells_every_combination_apart():
    a = tf.constant(["x", "x", "y", "", "x1"])
    b = tf.constant([1, 2, 1, 1, -1], tf.int64)
    got = _strings(derive(DerivedFeature("c", "cross", ("a", "b")), [a, b]))
    assert len(set(got)) == 5
    assert got[0] == "x\x1f1" and got[4] == "x1\x1f"  # -1 is missing


SPEC = FeatureSpec.from_dict({
    "name": "derived", "label": {"name": "label"},
    "tables": [{"name": "ids", "dim": 4}],
    "dense": [{"name": "price", "transform": "log1p"}],
    "categorical": [
        {"name": "site", "table": "ids", "hash_buckets": 40},
        {"name": "app", "table": "ids", "dtype": "int64", "hash_buckets": 40},
        {"name": "hour", "table": "ids", "hash_buckets": 24},
        {"name": "weekday", "table": "ids", "hash_buckets": 7},
        {"name": "price_band", "table": "ids", "hash_buckets": 8},
        {"name": "site_x_app", "table": "ids", "hash_buckets": 100},
    ],
    "derived": [
        {"name": "hour", "kind": "hour_of_day", "sources": ["ts"]},
        {"name": "weekday", "kind": "day_of_week", "sources": ["ymdh"],
         "pattern": "YYMMDDHH"},
        {"name": "price_band", "kind": "bucketize", "sources": ["price"],
         "boundaries": [1, 10, 100]},
        {"name": "site_x_app", "kind": "cross", "sources": ["site", "app"]},
    ],
})


def _raw_table(rows: int = 120) -> pa.Table:
    rng = np.random.default_rng(3)
    seconds = rng.integers(1_400_000_000, 1_500_000_000, rows)
    ymdh = [datetime.datetime.fromtimestamp(int(s), UTC).strftime("%y%m%d%H")
            for s in seconds]

    def holes(values, every):
        return [None if i % every == 2 else v for i, v in enumerate(values)]

    return pa.table({
        "label": pa.array(rng.integers(0, 2, rows)),
        "price": pa.array(holes(rng.gamma(2.0, 20.0, rows).tolist(), 7),
                          pa.float64()),
        "site": pa.array(holes([f"s{i}" for i in rng.integers(0, 9, rows)],
                               5), pa.string()),
        "app": pa.array(holes(rng.integers(0, 9, rows).tolist(), 6),
                        pa.int64()),
        "ts": pa.array(holes(seconds.tolist(), 4), pa.int64()),
        "ymdh": pa.array(holes(ymdh, 3), pa.string()),
    })


def _serving_inputs(table: pa.Table) -> dict[str, tf.Tensor]:
    return {k: tf.constant(v) for k, v in client_inputs(table, SPEC).items()}


def test_serving_takes_the_raw_sources_not_the_derived_columns():
    signature = serving_signature(SPEC)
    assert sorted(signature) == ["app", "price", "site", "ts", "ymdh"]
    assert signature["ts"].dtype == tf.int64
    assert signature["ymdh"].dtype == tf.string
    assert SPEC.columns == ("label", "price", "site", "app", "ts", "ymdh")


def test_conversion_and_serving_give_identical_derived_ids(tmp_path):
    table = _raw_table()
    pq.write_table(table, tmp_path / "raw.parquet")
    report = convert([tmp_path / "raw.parquet"], SPEC, tmp_path / "data",
                     ConversionOptions(shards=1, block_rows=16,
                                       eval_fraction=0))
    assert report.bad_rows == 0
    dataset = make_train_dataset_fn(report.manifest, SPEC,
                                    InputConfig(batch_size=200), epochs=1)
    batch = next(iter(dataset(None)))
    order = np.argsort(batch[ID_COLUMN].numpy())
    model = build_model(SPEC, ModelConfig(interaction="dot",
                                          bottom_mlp=(8,), top_mlp=(8,)))
    raw = _serving_inputs(table)
    served = ServingModule(model, SPEC).model_batch(raw)
    for name in ("hour", "weekday", "price_band", "site_x_app", "site"):
        np.testing.assert_array_equal(batch[name].numpy()[order],
                                      served[name].numpy(), err_msg=name)
    # Missing sources give the missing id, not a real hour.
    hour = next(f for f in SPEC.categorical if f.name == "hour")
    missing_id = tf.strings.to_hash_bucket_fast([""], 24).numpy()[0] + \
        hour.row_offset
    assert (served["hour"].numpy()[2::4] == missing_id).all()
    # The exported SavedModel computes them itself from the raw columns.
    loaded = tf.saved_model.load(str(export_saved_model(
        model, SPEC, tmp_path / "export")))
    probability = loaded.signatures["serving_default"](**raw)["probability"]
    expected = tf.sigmoid(model({k: tf.constant(v.numpy()[order])
                                 for k, v in batch.items()
                                 if k in served or k == "psrec__dense"}))
    np.testing.assert_allclose(probability.numpy(), expected.numpy(),
                               atol=1e-6)


def test_a_time_that_does_not_match_its_pattern_is_a_bad_row(tmp_path):
    table = _raw_table(20)
    ymdh = table.column("ymdh").to_pylist()
    ymdh[5] = "2014-10-21"
    table = table.set_column(table.schema.get_field_index("ymdh"), "ymdh",
                             pa.array(ymdh, pa.string()))
    pq.write_table(table, tmp_path / "raw.parquet")
    report = convert([tmp_path / "raw.parquet"], SPEC, tmp_path / "data",
                     ConversionOptions(shards=1, max_bad_fraction=0.1))
    assert report.bad_rows == 1
    (reason,) = report.bad_reasons
    assert "'ymdh' does not match pattern 'YYMMDDHH'" in reason


def test_synthetic_data_of_a_derived_spec_converts_cleanly(tmp_path):
    pq.write_table(synthetic_table(SPEC, 500, seed=4), tmp_path / "s.parquet")
    report = convert([tmp_path / "s.parquet"], SPEC, tmp_path / "data",
                     ConversionOptions(shards=1, eval_fraction=0))
    assert report.bad_rows == 0 and report.rows_written["train"] == 500


@pytest.mark.parametrize("derived,categorical,message", [
    ({"name": "hour", "kind": "hour_of_day", "sources": ["ts"]}, [],
     "derived feature 'hour' is not used"),
    ({"name": "c", "kind": "cross", "sources": ["site", "raw"]},
     [{"name": "c", "table": "ids", "hash_buckets": 9}],
     "source 'raw' is not a categorical feature"),
    ({"name": "h", "kind": "hour_of_day", "sources": ["price"]},
     [{"name": "h", "table": "ids", "hash_buckets": 9}],
     "source 'price' is a dense (float32) feature"),
    ({"name": "h", "kind": "hour_of_day", "sources": ["ts"]},
     [{"name": "h", "table": "ids", "hash_buckets": 9, "dtype": "int64"}],
     "reads derived values, which are single strings"),
    ({"name": "b", "kind": "bucketize", "sources": ["p"],
      "boundaries": [3, 1]}, [{"name": "b", "table": "ids",
                               "hash_buckets": 9}],
     "`boundaries` = [3, 1] must be"),
    ({"name": "h", "kind": "weekday", "sources": ["ts"]},
     [{"name": "h", "table": "ids", "hash_buckets": 9}],
     "`kind` = 'weekday' is not allowed"),
])
def test_bad_derived_features_are_named(derived, categorical, message):
    data = {"name": "bad", "label": {"name": "label"},
            "tables": [{"name": "ids", "dim": 4}],
            "dense": [{"name": "price"}],
            "categorical": [{"name": "site", "table": "ids",
                             "hash_buckets": 9}] + categorical,
            "derived": [derived]}
    with pytest.raises(SpecError, match=message.replace("[", r"\[")
                       .replace("(", r"\(").replace(")", r"\)")):
        FeatureSpec.from_dict(data)


def test_a_derived_spec_round_trips_through_yaml(tmp_path):
    saved = FeatureSpec.load(SPEC.save(tmp_path / "spec.yaml"))
    assert saved == SPEC and saved.fingerprint() == SPEC.fingerprint()
    assert "pattern: YYMMDDHH" in (tmp_path / "spec.yaml").read_text()
