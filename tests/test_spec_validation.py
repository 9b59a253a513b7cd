"""Spec validation (issue 9): ``standardize`` needs its statistics, and a
spec's problems are all reported at once."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from psrec.features import DenseFeature
from psrec.features import FeatureSpec
from psrec.features import LabelConfig
from psrec.features import SpecError
from psrec.features import criteo
from psrec.features import movielens
from psrec.launch.cli.main import main

# Fingerprints of the presets computed before mean/std became optional: a
# spec that does not use standardize (criteo) and one that does (movielens)
# keep theirs, so data converted earlier still matches its spec.
CRITEO_FINGERPRINT = (
    "1a9cb48ea66ddd190385aa2b1182a293db4d00cb087ba3eb0ec836bb60b92745")
MOVIELENS_FINGERPRINT = (
    "baddce03944608945b42476be366533b150eeec4b6f3eb9b8ca1e431450eea60")


def _spec_dict(dense: list[dict]) -> dict:
    return {"name": "tiny", "label": {"name": "label"},
            "tables": [{"name": "ids", "rows": 100, "dim": 4}],
            "dense": dense,
            "categorical": [{"name": "user", "table": "ids",
                             "hash_buckets": 100}]}


def _write(tmp_path, data: dict, name: str = "spec.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


# -- standardize statistics -----------------------------------------------------


def test_preset_fingerprints_are_unchanged():
    assert criteo().fingerprint() == CRITEO_FINGERPRINT
    assert movielens().fingerprint() == MOVIELENS_FINGERPRINT


@pytest.mark.parametrize("given,missing", [
    ({}, ["`mean`", "`std`"]),
    ({"mean": 3.0}, ["`std`"]),
    ({"std": 2.0}, ["`mean`"]),
])
def test_standardize_without_statistics_is_refused(tmp_path, given, missing):
    feature = {"name": "age", "transform": "standardize", **given}
    with pytest.raises(SpecError) as error:
        FeatureSpec.load(_write(tmp_path, _spec_dict([feature])))
    message = str(error.value)
    assert "'age'" in message and "'standardize' needs" in message
    for key in missing:
        assert key in message
    with pytest.raises(SpecError):
        DenseFeature("age", transform="standardize", **given)


def test_standardize_std_must_be_positive():
    with pytest.raises(SpecError, match="`std` = 0.0 must be > 0"):
        DenseFeature("age", transform="standardize", mean=1.0, std=0.0)


@pytest.mark.parametrize("transform", ["none", "log1p"])
def test_statistics_with_another_transform_are_refused(tmp_path, transform):
    feature = {"name": "price", "transform": transform, "mean": 5.0,
               "std": 2.0}
    with pytest.raises(SpecError) as error:
        FeatureSpec.load(_write(tmp_path, _spec_dict([feature])))
    message = str(error.value)
    assert "'price'" in message and "mean=5.0" in message
    assert "would be ignored" in message and repr(transform) in message
    with pytest.raises(SpecError, match="would be ignored"):
        DenseFeature("price", transform=transform, std=3.0)


def test_standardize_with_statistics_applies_them(tmp_path):
    from psrec.features.transforms.ops import transform_dense
    feature = {"name": "age", "transform": "standardize", "mean": 10.0,
               "std": 4.0}
    spec = FeatureSpec.load(_write(tmp_path, _spec_dict(
        [feature, {"name": "raw"}])))
    assert spec.dense[0] == DenseFeature("age", transform="standardize",
                                         mean=10.0, std=4.0)
    assert spec.dense[1].mean is None and spec.dense[1].std is None
    out = transform_dense(np.array([[18.0, 7.0]], np.float32), spec).numpy()
    np.testing.assert_allclose(out, [[2.0, 7.0]])


def test_saved_spec_leaves_out_unset_statistics_and_round_trips(tmp_path):
    spec = FeatureSpec.load(_write(tmp_path, _spec_dict([{"name": "x"}])))
    assert "mean" not in spec.to_dict()["dense"][0]
    again = FeatureSpec.load(spec.save(tmp_path / "again.json"))
    assert again == spec and again.fingerprint() == spec.fingerprint()


def test_spec_saved_with_old_neutral_statistics_still_loads(tmp_path):
    """A spec.yaml written before statistics were optional holds mean 0.0,
    std 1.0 on every dense feature; it loads, with the same fingerprint."""
    old = criteo(buckets=10, dim=2).to_dict()
    for feature in old["dense"]:
        feature.update(mean=0.0, std=1.0)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old), encoding="utf-8")
    loaded = FeatureSpec.load(path)
    assert loaded == criteo(buckets=10, dim=2)
    assert loaded.fingerprint() == criteo(buckets=10, dim=2).fingerprint()


# -- every problem at once ------------------------------------------------------


def _broken_spec() -> dict:
    """Five independent mistakes (see the test)."""
    return {
        "name": "broken",
        "label": {"name": "label"},
        "tables": [{"name": "ids", "rows": 100, "dim": 4},
                   {"name": "spare", "rows": 10, "dim": 4}],
        "dense": [{"name": "age", "transform": "standardize"},
                  {"name": "price", "transform": "log"}],
        "categorical": [
            {"name": "user", "table": "users", "hash_buckets": 10},
            {"name": "item", "table": "ids", "hash_buckets": 80,
             "row_offset": 50},
        ],
    }


def test_every_problem_of_a_spec_file_is_reported(tmp_path):
    path = _write(tmp_path, _broken_spec())
    with pytest.raises(SpecError) as error:
        FeatureSpec.load(path)
    problems = error.value.problems
    assert len(problems) == 5, problems
    expected = [
        ("dense feature 'age'", "'standardize' needs `mean` and `std`"),
        ("dense feature 'price'", "`transform` = 'log' is not allowed"),
        ("categorical feature 'user'", "'users' is not defined"),
        ("categorical feature 'item'", "= 130 exceeds table 'ids' rows"),
        ("spec: tables ['spare']", "not used"),
    ]
    for where, what in expected:
        assert [p for p in problems if where in p and what in p], (
            where, problems)
    lines = str(error.value).splitlines()
    assert lines[0] == f"{path}: 5 problems in the spec:"
    assert lines[1:] == [f"({i}) {p}" for i, p in enumerate(problems, 1)]


def test_unknown_keys_and_bad_values_of_several_parts_are_all_reported():
    data = _broken_spec()
    data["colour"] = "blue"
    data["tables"][0]["rows"] = 0
    data["categorical"][1]["buckets"] = 3
    data["label"] = {"name": "label", "threshold": "high"}
    with pytest.raises(SpecError) as error:
        FeatureSpec.from_dict(data)
    text = "\n".join(error.value.problems)
    for fragment in ("unknown key 'colour'", "`rows` = 0 must be",
                     "unknown key 'buckets'", "`threshold` = 'high'",
                     "'standardize' needs", "`transform` = 'log'"):
        assert fragment in text, fragment
    # A broken table is not reported again as undefined or unused.
    assert "'ids' is not defined" not in text


def test_part_reports_all_of_its_own_problems():
    with pytest.raises(SpecError) as error:
        DenseFeature("", transform="scale", default=float("nan"))
    assert len(error.value.problems) == 3
    with pytest.raises(SpecError) as error:
        LabelConfig("", threshold=float("inf"))
    assert len(error.value.problems) == 2


def test_duplicate_columns_and_tables_are_reported_together(tmp_path):
    data = _spec_dict([{"name": "user"}, {"name": "psrec__id"}])
    data["tables"].append({"name": "ids", "rows": 5, "dim": 2})
    with pytest.raises(SpecError) as error:
        FeatureSpec.load(_write(tmp_path, data))
    text = "\n".join(error.value.problems)
    assert "column 'user' is used twice" in text
    assert "'psrec__id' is reserved" in text
    assert "table 'ids' is defined twice" in text


def test_cli_prints_all_problems_numbered_on_one_line(tmp_path, capsys):
    path = _write(tmp_path, _broken_spec())
    assert main(["spec", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    line = err[0]
    assert line.startswith(f"psrec spec: error: {path}: 5 problems in the "
                           "spec: (1) ")
    for i in range(1, 6):
        assert f" ({i}) " in line
    assert "'users' is not defined" in line and "'spare'" in line
