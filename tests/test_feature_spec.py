"""Tests for features.spec, .columns, .presets and .transforms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from psrec.features import CategoricalFeature
from psrec.features import DenseFeature
from psrec.features import FeatureSpec
from psrec.features import LabelConfig
from psrec.features import SpecError
from psrec.features import TableConfig
from psrec.features import criteo
from psrec.features import movielens
from psrec.features import resolve_spec


def _tiny_spec_dict() -> dict:
    """A small valid spec in plain-data form, to be broken by the tests."""
    return {
        "name": "tiny",
        "label": {"name": "label"},
        "tables": [{"name": "ids", "rows": 2000, "dim": 8}],
        "dense": [{"name": "price", "transform": "log1p", "default": 0.0}],
        "categorical": [
            {"name": "user", "table": "ids", "hash_buckets": 1000},
            {"name": "item", "table": "ids", "hash_buckets": 1000,
             "row_offset": 1000},
        ],
    }


def _load_yaml(tmp_path, data: dict) -> FeatureSpec:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return FeatureSpec.load(path)


# -- round trips ---------------------------------------------------------------


@pytest.mark.parametrize("preset", [criteo, movielens], ids=["criteo", "movielens"])
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_preset_round_trips_through_file_with_same_fingerprint(
        tmp_path, preset, suffix):
    spec = preset()
    path = spec.save(tmp_path / f"spec{suffix}")
    loaded = FeatureSpec.load(path)
    assert loaded == spec
    assert loaded.fingerprint() == spec.fingerprint()
    assert resolve_spec(str(path)) == spec
    # Saving the loaded spec again gives the same text.
    again = loaded.save(tmp_path / f"again{suffix}")
    assert again.read_text() == path.read_text()


def test_fingerprint_changes_when_spec_changes():
    assert criteo(buckets=1000).fingerprint() != criteo().fingerprint()
    assert criteo().fingerprint() != movielens().fingerprint()


def test_tiny_spec_from_yaml_builds_expected_objects(tmp_path):
    spec = _load_yaml(tmp_path, _tiny_spec_dict())
    assert spec.columns == ("label", "price", "user", "item")
    assert spec.table("ids") == TableConfig("ids", rows=2000, dim=8)
    assert spec.categorical[1] == CategoricalFeature(
        "item", table="ids", hash_buckets=1000, row_offset=1000)
    assert spec.dense == (DenseFeature("price", transform="log1p"),)
    assert spec.label == LabelConfig("label")


# -- strict errors --------------------------------------------------------------


def test_unknown_key_in_feature_names_key_and_allowed_keys(tmp_path):
    data = _tiny_spec_dict()
    data["categorical"][0]["buckets"] = 10
    with pytest.raises(SpecError) as error:
        _load_yaml(tmp_path, data)
    message = str(error.value)
    assert "'buckets'" in message
    assert "'user'" in message
    assert "hash_buckets" in message and "vocabulary_file" in message
    assert str(tmp_path / "spec.yaml") in message


def test_unknown_top_level_key_is_rejected(tmp_path):
    data = _tiny_spec_dict()
    data["lable"] = {"name": "label"}
    with pytest.raises(SpecError, match="unknown key 'lable'"):
        _load_yaml(tmp_path, data)


def test_bad_transform_names_value_and_allowed_values(tmp_path):
    data = _tiny_spec_dict()
    data["dense"][0]["transform"] = "log"
    with pytest.raises(SpecError) as error:
        _load_yaml(tmp_path, data)
    message = str(error.value)
    assert "transform" in message and "'log'" in message
    for allowed in ("'none'", "'log1p'", "'standardize'"):
        assert allowed in message


def test_bad_combiner_names_value_and_allowed_values(tmp_path):
    data = _tiny_spec_dict()
    data["categorical"][0].update(max_length=3, combiner="max")
    with pytest.raises(SpecError) as error:
        _load_yaml(tmp_path, data)
    message = str(error.value)
    assert "combiner" in message and "'max'" in message
    assert "'sum'" in message and "'mean'" in message


def test_missing_table_names_feature_table_and_defined_tables(tmp_path):
    data = _tiny_spec_dict()
    data["categorical"][1]["table"] = "items"
    with pytest.raises(SpecError) as error:
        _load_yaml(tmp_path, data)
    message = str(error.value)
    assert "'item'" in message and "'items'" in message
    assert "not defined" in message and "'ids'" in message


def test_hash_buckets_beyond_table_rows_is_rejected(tmp_path):
    data = _tiny_spec_dict()
    data["categorical"][1]["hash_buckets"] = 1001  # 1000 + 1001 > 2000 rows
    with pytest.raises(SpecError) as error:
        _load_yaml(tmp_path, data)
    message = str(error.value)
    assert "'item'" in message
    assert "2001" in message and "2000" in message and "'ids'" in message


def test_duplicate_column_is_rejected(tmp_path):
    data = _tiny_spec_dict()
    data["dense"].append({"name": "user"})
    with pytest.raises(SpecError, match="column 'user' is used twice"):
        _load_yaml(tmp_path, data)


def test_reserved_column_name_is_rejected(tmp_path):
    data = _tiny_spec_dict()
    data["dense"][0]["name"] = "psrec__id"
    with pytest.raises(SpecError, match="'psrec__id' is reserved by psrec"):
        _load_yaml(tmp_path, data)


def test_hash_buckets_and_vocabulary_file_together_is_rejected(tmp_path):
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    data = _tiny_spec_dict()
    data["categorical"][0]["vocabulary_file"] = "vocab.txt"
    with pytest.raises(SpecError) as error:
        _load_yaml(tmp_path, data)
    message = str(error.value)
    assert "exactly one of `hash_buckets` and `vocabulary_file`" in message
    assert "'user'" in message


def test_neither_hash_buckets_nor_vocabulary_file_is_rejected():
    with pytest.raises(SpecError, match="exactly one of"):
        CategoricalFeature("x", table="t")


@pytest.mark.parametrize("field, value", [
    ("rows", 0), ("dim", -1), ("rows", 2.5), ("initializer", "ones")])
def test_bad_table_values_name_key_and_value(field, value):
    kwargs = {"name": "t", "rows": 10, "dim": 4, field: value}
    with pytest.raises(SpecError) as error:
        TableConfig(**kwargs)
    assert field in str(error.value) and repr(value) in str(error.value)


def test_unused_table_and_missing_required_key_are_rejected(tmp_path):
    data = _tiny_spec_dict()
    data["tables"].append({"name": "spare", "rows": 5, "dim": 2})
    with pytest.raises(SpecError, match="'spare'"):
        _load_yaml(tmp_path, data)
    data = _tiny_spec_dict()
    del data["categorical"][0]["table"]
    with pytest.raises(SpecError, match="missing required key `table`"):
        _load_yaml(tmp_path, data)


def test_dense_std_must_be_positive_and_numbers_finite():
    with pytest.raises(SpecError, match="`std`"):
        DenseFeature("x", transform="standardize", std=0.0)
    with pytest.raises(SpecError, match="`default`"):
        DenseFeature("x", default=math.nan)


# -- vocabulary files and hashing ------------------------------------------------


def test_vocabulary_file_relative_to_spec_dir(tmp_path, monkeypatch):
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    (spec_dir / "colors.txt").write_text("red\ngreen\n\nblue\n")
    data = _tiny_spec_dict()
    data["tables"].append({"name": "colors", "rows": 10, "dim": 4})
    data["categorical"].append(
        {"name": "color", "table": "colors", "vocabulary_file": "colors.txt",
         "row_offset": 2})
    path = spec_dir / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)  # the spec's folder is not the cwd

    spec = FeatureSpec.load(path)
    color = spec.categorical[-1]
    assert color.vocabulary() == ["red", "green", "blue"]
    assert color.num_ids == 4  # 3 values + the out-of-vocabulary id
    spec.check_vocabularies()

    from psrec.features.transforms.ops import CategoricalEncoder
    ids = CategoricalEncoder(spec).encode(
        "color", np.array(["red", "green", "blue", "purple", ""], object))
    assert ids.numpy().tolist() == [3, 4, 5, 2, 2]  # offset 2; OOV -> 0

    # The vocabulary is part of the fingerprint.
    before = spec.fingerprint()
    (spec_dir / "colors.txt").write_text("red\ngreen\nblue\nteal\n")
    assert FeatureSpec.load(path).fingerprint() != before


def test_vocabulary_too_large_for_table_is_rejected(tmp_path):
    (tmp_path / "v.txt").write_text("\n".join(f"v{i}" for i in range(10)))
    data = _tiny_spec_dict()
    data["tables"].append({"name": "small", "rows": 10, "dim": 4})
    data["categorical"].append(
        {"name": "v", "table": "small", "vocabulary_file": "v.txt"})
    # The layout reads the vocabulary, so loading the spec already fails.
    with pytest.raises(SpecError, match="11 exceeds table 'small' rows = 10"):
        _load_yaml(tmp_path, data)


def test_missing_vocabulary_file_names_path(tmp_path):
    data = _tiny_spec_dict()
    data["tables"].append({"name": "v", "rows": 10, "dim": 4})
    data["categorical"].append(
        {"name": "v", "table": "v", "vocabulary_file": "nope.txt"})
    with pytest.raises(SpecError, match="nope.txt"):
        _load_yaml(tmp_path, data)


def test_categorical_hashing_is_stable_and_within_feature_rows():
    import tensorflow as tf

    from psrec.features.transforms.ops import CategoricalEncoder

    spec = criteo(buckets=1000)
    values = np.array([f"{i:08x}" for i in range(500)] + [""], object)
    first = CategoricalEncoder(spec)
    second = CategoricalEncoder(criteo(buckets=1000))
    for index, feature in enumerate(spec.categorical):
        a = first.encode(feature.name, values).numpy()
        b = second.encode(feature.name, values).numpy()
        np.testing.assert_array_equal(a, b)
        assert a.dtype == np.int64
        assert feature.row_offset == index * 1000
        assert a.min() >= feature.row_offset
        assert a.max() < feature.row_offset + feature.hash_buckets
        expected = tf.strings.to_hash_bucket_fast(values, 1000).numpy() + (
            index * 1000)
        np.testing.assert_array_equal(a, expected)
    # 500 distinct values into 1000 buckets: hashing spreads them.
    assert len(np.unique(a)) > 350


def test_int64_values_hash_like_their_decimal_string():
    from psrec.features.transforms.ops import CategoricalEncoder

    encoder = CategoricalEncoder(movielens())
    ints = encoder.encode("user_id", np.array([1, 42, 943], np.int64)).numpy()
    strings = encoder.encode("user_id", np.array(["1", "42", "943"], object))
    np.testing.assert_array_equal(ints, strings.numpy())


# -- dense transforms ---------------------------------------------------------------


def test_transform_dense_matches_hand_computed_values():
    from psrec.features.transforms.ops import transform_dense

    spec = FeatureSpec(
        name="dense",
        label=LabelConfig("label"),
        dense=(DenseFeature("count", transform="log1p", default=3.0),
               DenseFeature("age", transform="standardize", mean=30.0, std=10.0,
                            default=30.0),
               DenseFeature("raw", transform="none", default=-7.0)),
        categorical=(),
        tables=(),
    )
    raw = np.array([
        [-5.0, 50.0, 1.5],        # log1p clips the negative count to 0
        [0.0, 10.0, -2.0],
        [np.e - 1.0, 30.0, 0.0],  # log1p(e - 1) = 1
        [np.nan, np.nan, np.nan],  # missing -> defaults, then transformed
        [99.0, 25.0, 4.0],
    ], np.float32)
    expected = np.array([
        [0.0, 2.0, 1.5],
        [0.0, -2.0, -2.0],
        [1.0, 0.0, 0.0],
        [math.log(4.0), 0.0, -7.0],
        [math.log(100.0), -0.5, 4.0],
    ], np.float32)
    got = transform_dense(raw, spec).numpy()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
