"""The warm-start plan (``ps_cluster.checkpoint.warm_plan``) on small specs:
what each spec change since the source run does to a feature's rows."""

from __future__ import annotations

import pytest

from psrec.features.spec.spec import FeatureSpec
from psrec.ps_cluster.checkpoint.warm_plan import RowCopy
from psrec.ps_cluster.checkpoint.warm_plan import WarmStartError
from psrec.ps_cluster.checkpoint.warm_plan import plan_warm_start


def _spec(*features: dict, tables=None) -> FeatureSpec:
    return FeatureSpec.from_dict({
        "name": "small", "label": {"name": "label"},
        "tables": tables or [{"name": "ids", "dim": 4}],
        "dense": [{"name": "price"}],
        "categorical": [dict(f, table=f.get("table", "ids"))
                        for f in features]})


USER = {"name": "user", "hash_buckets": 50}
ITEM = {"name": "item", "hash_buckets": 40}


def _fates(plan) -> dict[str, str]:
    return {f.feature: f.fate for f in plan.features}


def test_an_unchanged_spec_restores_every_table_whole():
    spec = _spec(USER, ITEM)
    plan = plan_warm_start(spec, spec)
    assert plan.whole == ("ids",) and plan.copies == ()
    assert _fates(plan) == {"user": "carried", "item": "carried"}
    assert plan.lines() == []
    assert plan.summary("A", "carried", "carried") == (
        "warm start from A: carried 2 features (90 rows), moved 0 (0 rows), "
        "added 0, re-initialised 0, dropped 0; dense weights carried; "
        "optimizer slots carried")


def test_an_added_feature_moves_the_ranges_after_it():
    plan = plan_warm_start(_spec(USER, ITEM),
                           _spec({"name": "cat", "hash_buckets": 10}, USER,
                                 ITEM))
    assert plan.whole == () and plan.copied_tables == ("ids",)
    assert _fates(plan) == {"cat": "added", "user": "moved",
                            "item": "moved"}
    assert plan.copies == (RowCopy("ids", "ids", 0, 10, 50),
                           RowCopy("ids", "ids", 50, 60, 40))
    assert "warm start: feature 'cat' added: its rows are freshly " \
        "initialised" in plan.lines()
    assert "warm start: feature 'user' moved: rows 'ids'[0:50] -> " \
        "'ids'[10:60]" in plan.lines()


def test_a_removed_feature_is_dropped_and_the_rest_stays_in_place():
    plan = plan_warm_start(_spec(USER, ITEM), _spec(USER))
    assert _fates(plan) == {"user": "carried", "item": "dropped"}
    # The table shrank: not restored whole, the kept range copied in place.
    assert plan.copies == (RowCopy("ids", "ids", 0, 0, 50),)
    [line] = plan.lines()
    assert line.startswith("warm start: feature 'item' dropped")


def test_a_rehashed_feature_is_reinitialised():
    plan = plan_warm_start(_spec(USER, ITEM),
                           _spec(USER, dict(ITEM, hash_buckets=80)))
    assert _fates(plan) == {"user": "carried", "item": "re-initialised"}
    assert plan.copies == (RowCopy("ids", "ids", 0, 0, 50),)
    assert any("hash_buckets 40 -> hash_buckets 80" in line
               for line in plan.lines())


def test_a_feature_moved_to_another_table_of_the_same_dim():
    tables = [{"name": "ids", "dim": 4}, {"name": "items", "dim": 4}]
    plan = plan_warm_start(_spec(USER, ITEM),
                           _spec(USER, dict(ITEM, table="items"),
                                 tables=tables))
    assert plan.whole == () and _fates(plan)["item"] == "moved"
    assert RowCopy("ids", "items", 50, 0, 40) in plan.copies
    narrow = [{"name": "ids", "dim": 4}, {"name": "items", "dim": 8}]
    plan = plan_warm_start(_spec(USER, ITEM),
                           _spec(USER, dict(ITEM, table="items"),
                                 tables=narrow))
    assert _fates(plan)["item"] == "re-initialised"
    assert any("dim 4 -> 'items' dim 8" in line for line in plan.lines())


def test_a_changed_vocabulary_is_remapped_by_value(tmp_path):
    old, new = tmp_path / "old.txt", tmp_path / "new.txt"
    old.write_text("a\nb\nc\nd\n")
    new.write_text("b\nc\nx\nd\n")  # a removed, x inserted
    before = _spec(USER, {"name": "item", "vocabulary_file": str(old)})
    after = _spec(USER, {"name": "item", "vocabulary_file": str(new)})
    plan = plan_warm_start(before, after)
    assert _fates(plan)["item"] == "remapped"
    # item's ids: 0 = out of vocabulary, value i at 1 + its line; rows 50..
    assert [c for c in plan.copies if c.target == "ids" and c.target_start
            >= 50] == [RowCopy("ids", "ids", 50, 50, 1),    # OOV row
                       RowCopy("ids", "ids", 52, 51, 2),    # b, c
                       RowCopy("ids", "ids", 54, 54, 1)]    # d
    old.unlink()
    with pytest.raises(WarmStartError, match="vocabulary of feature 'item'"):
        plan_warm_start(before, after)


def test_a_changed_dynamic_table_is_refused_an_unchanged_one_is_whole():
    def dynamic(capacity):
        return FeatureSpec.from_dict({
            "name": "small", "label": {"name": "label"},
            "tables": [{"name": "ids", "dim": 4},
                       {"name": "dyn", "dim": 4, "mode": "dynamic",
                        "capacity": capacity}],
            "dense": [{"name": "price"}],
            "categorical": [dict(USER, table="ids"),
                            {"name": "item", "table": "dyn"}]})
    plan = plan_warm_start(dynamic(100), dynamic(100))
    assert plan.whole == ("dyn", "ids")
    assert _fates(plan)["item"] == "carried"
    with pytest.raises(WarmStartError, match=r"dynamic table 'dyn' changed "
                       r"since the source run \(capacity 100 -> 200"):
        plan_warm_start(dynamic(100), dynamic(200))
