"""Row ranges laid out by the spec (``features.spec.layout``): automatic ranges,
``share`` and the refusal of overlapping ranges."""

from __future__ import annotations

import pytest
import tensorflow as tf

from psrec.features.spec.columns import SpecError
from psrec.features.spec.spec import FeatureSpec
from psrec.features.transforms.ops import CategoricalEncoder


def _spec(categorical, tables=None, **extra):
    return FeatureSpec.from_dict({
        "name": "layout", "label": {"name": "y"},
        "tables": tables or [{"name": "ids", "dim": 4}],
        "categorical": categorical, **extra})


def _ranges(spec):
    return {f.name: (f.row_offset, f.row_offset + f.num_ids)
            for f in spec.categorical}


def test_ranges_and_table_rows_are_laid_out_without_offsets():
    spec = _spec([{"name": "a", "table": "ids", "hash_buckets": 100},
                  {"name": "b", "table": "ids", "hash_buckets": 30},
                  {"name": "c", "table": "ids", "hash_buckets": 7}])
    assert _ranges(spec) == {"a": (0, 100), "b": (100, 130), "c": (130, 137)}
    assert spec.table("ids").rows == 137


def test_features_without_offset_fill_the_free_rows_around_given_ones():
    """The old style -- first feature at the implicit 0, the others at
    explicit offsets -- keeps its ids."""
    spec = _spec([{"name": "a", "table": "ids", "hash_buckets": 100},
                  {"name": "b", "table": "ids", "hash_buckets": 50,
                   "row_offset": 100},
                  {"name": "c", "table": "ids", "hash_buckets": 10}],
                 tables=[{"name": "ids", "rows": 160, "dim": 4}])
    assert _ranges(spec) == {"a": (0, 100), "b": (100, 150), "c": (150, 160)}


def test_share_uses_the_other_features_rows_and_hashing():
    spec = _spec([{"name": "item", "table": "ids", "hash_buckets": 50},
                  {"name": "user", "table": "ids", "hash_buckets": 20},
                  {"name": "history", "share": "item", "max_length": 3}])
    history = next(f for f in spec.categorical if f.name == "history")
    assert (history.table, history.hash_buckets, history.row_offset) == (
        "ids", 50, 0)
    assert spec.table("ids").rows == 70  # the shared range counts once
    encoder = CategoricalEncoder(spec)
    item_ids = encoder.encode("item", tf.constant(["i1", "i2"])).numpy()
    history_ids = encoder.encode_lists(
        "history", tf.constant([["i1", "i2", ""]])).numpy()
    assert history_ids[0].tolist() == [*item_ids.tolist(), -1]


def test_overlapping_ranges_without_share_are_refused():
    with pytest.raises(SpecError) as error:
        _spec([{"name": "a", "table": "ids", "hash_buckets": 100,
                "row_offset": 0},
               {"name": "b", "table": "ids", "hash_buckets": 100,
                "row_offset": 50}])
    text = str(error.value)
    assert "'a' (rows 0..99) and 'b' (rows 50..149) overlap" in text
    assert "share: a" in text
    # The same offsets with `share` are one shared range.
    spec = _spec([{"name": "a", "table": "ids", "hash_buckets": 100},
                  {"name": "b", "share": "a", "row_offset": 0}])
    assert _ranges(spec) == {"a": (0, 100), "b": (0, 100)}


def test_every_share_problem_is_reported_at_once():
    with pytest.raises(SpecError) as error:
        _spec([{"name": "a", "table": "ids", "hash_buckets": 10},
               {"name": "b", "share": "nope"},
               {"name": "c", "share": "d"}, {"name": "d", "share": "c"},
               {"name": "e", "share": "a", "hash_buckets": 11},
               {"name": "f", "share": "a", "row_offset": 3}])
    problems = error.value.problems
    assert len(problems) == 5, problems
    joined = "\n".join(problems)
    assert "`share` = 'nope' is not a categorical feature" in joined
    assert "cycle (c -> d -> c)" in joined
    assert "`hash_buckets` = 11 differs from 10 of 'a'" in joined
    assert "`row_offset` = 3 but it shares the rows of 'a'" in joined


def test_a_range_past_the_given_table_rows_is_refused():
    with pytest.raises(SpecError, match="= 12 exceeds table 'ids' rows = 10"):
        _spec([{"name": "a", "table": "ids", "hash_buckets": 12}],
              tables=[{"name": "ids", "rows": 10, "dim": 4}])


def test_layout_is_saved_resolved_and_round_trips(tmp_path):
    spec = _spec([{"name": "a", "table": "ids", "hash_buckets": 10},
                  {"name": "b", "share": "a", "max_length": 2},
                  {"name": "c", "table": "ids", "hash_buckets": 5}])
    saved = FeatureSpec.load(spec.save(tmp_path / "spec.yaml"))
    assert saved == spec and saved.fingerprint() == spec.fingerprint()
    text = (tmp_path / "spec.yaml").read_text()
    assert "row_offset: 10" in text and "rows: 15" in text
    assert "share: a" in text


def test_a_sharer_needs_no_table_but_a_plain_feature_does():
    with pytest.raises(SpecError, match="missing required key `table`"):
        _spec([{"name": "a", "hash_buckets": 10}])
