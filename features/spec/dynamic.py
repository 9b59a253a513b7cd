"""The settings of a dynamic (collisionless) embedding table.

A table with ``mode: dynamic`` gives every raw id its own row once the id
has been seen ``admit_threshold`` times, up to ``capacity`` rows; ids not
(yet) admitted read a shared default row (the table's last row, so a
dynamic table has ``capacity + 1`` rows). When the rows run out, the
coldest rows are evicted: ``lfu`` (least often seen) or ``ttl`` (not seen
for ``ttl_steps`` steps). Admission and eviction happen every
``maintenance_every`` training steps (``psrec.models.dynamic.table``).

Features on a dynamic table carry raw 64-bit ids (``raw_ids``): a
fingerprint of the value, never folded into a bucket range.
"""

from __future__ import annotations

from typing import Any
from typing import Mapping

from psrec.errors import did_you_mean

TABLE_MODES = ("hashed", "dynamic")
EVICTION_POLICIES = ("lfu", "ttl")
# The keys that only a dynamic table takes, with their defaults (left out
# of a hashed table's saved form, so its spec fingerprint is unchanged).
DYNAMIC_DEFAULTS: dict[str, Any] = {
    "capacity": None, "admit_threshold": 1, "evict": "lfu",
    "ttl_steps": None, "maintenance_every": 100,
}
RAW_ID_BUCKETS = 2 ** 63 - 1  # raw ids: fingerprints in [0, 2**63 - 1)


def _positive(where: str, key: str, value: Any) -> list[str]:
    if not isinstance(value, bool) and isinstance(value, int) and value >= 1:
        return []
    return [f"{where}: `{key}` = {value!r} must be a positive integer."]


def dynamic_problems(where: str, table: Any) -> list[str]:
    """Every problem of the dynamic-table keys of ``table`` (a
    ``TableConfig``), each naming the key and the value."""
    mode = table.mode
    if mode not in TABLE_MODES:
        return [f"{where}: `mode` = {mode!r} is not allowed; use one of "
                f"{', '.join(map(repr, TABLE_MODES))}"
                f"{did_you_mean(mode, TABLE_MODES) or '.'}"]
    if mode == "hashed":
        given = [f"`{key}`" for key, default in DYNAMIC_DEFAULTS.items()
                 if getattr(table, key) != default]
        if given:
            verb = "apply" if len(given) > 1 else "applies"
            return [f"{where}: {', '.join(given)} {verb} only to `mode` = "
                    "'dynamic'; remove it or set `mode: dynamic`."]
        return []
    problems = []
    if table.capacity is None:
        problems.append(f"{where}: `mode` = 'dynamic' needs `capacity` (the "
                        "rows ids can be admitted to, e.g. 1000000).")
    else:
        problems += _positive(where, "capacity", table.capacity)
    problems += _positive(where, "admit_threshold", table.admit_threshold)
    problems += _positive(where, "maintenance_every", table.maintenance_every)
    if table.evict not in EVICTION_POLICIES:
        allowed = ", ".join(map(repr, EVICTION_POLICIES))
        hint = did_you_mean(table.evict, EVICTION_POLICIES)
        problems.append(f"{where}: `evict` = {table.evict!r} is not allowed; "
                        f"use one of {allowed}{hint or '.'}")
    if table.evict == "ttl":
        if table.ttl_steps is None:
            problems.append(f"{where}: `evict` = 'ttl' needs `ttl_steps` "
                            "(rows not seen for that many steps are "
                            "evicted).")
        else:
            problems += _positive(where, "ttl_steps", table.ttl_steps)
    elif table.ttl_steps is not None:
        problems.append(f"{where}: `ttl_steps` = {table.ttl_steps!r} applies "
                        "only to `evict` = 'ttl'; remove it or use evict ttl.")
    capacity_ok = (isinstance(table.capacity, int)
                   and not isinstance(table.capacity, bool))
    if table.rows is not None and capacity_ok and (
            table.rows != table.capacity + 1):
        problems.append(f"{where}: `rows` = {table.rows!r} but a dynamic "
                        "table has `capacity` + 1 = "
                        f"{table.capacity + 1} rows (the last is the "
                        "default row); leave `rows` out.")
    return problems


def table_dict(data: dict[str, Any]) -> dict[str, Any]:
    """A table's saved form: without the dynamic keys when it is hashed
    (specs saved before dynamic tables keep their form and fingerprint),
    without an unset ``ttl_steps`` when it is dynamic."""
    if data.get("mode") == "hashed":
        return {k: v for k, v in data.items()
                if k != "mode" and k not in DYNAMIC_DEFAULTS}
    return {k: v for k, v in data.items()
            if not (k == "ttl_steps" and v is None)}


def mark_raw_ids(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """``data`` with ``raw_ids: true`` on the categorical features of
    ``mode: dynamic`` tables and those sharing their rows (a spec file need
    not say it)."""
    tables = data.get("tables")
    features = data.get("categorical")
    if not isinstance(tables, list) or not isinstance(features, list):
        return data
    dynamic = {t.get("name") for t in tables
               if isinstance(t, Mapping) and t.get("mode") == "dynamic"}
    raw: set = set()  # features on a dynamic table, or sharing one's rows
    for _ in features:
        raw |= {f.get("name") for f in features if isinstance(f, Mapping)
                and (f.get("table") in dynamic or f.get("share") in raw)}
    marked = [dict(f, raw_ids=True) if isinstance(f, Mapping)
              and f.get("name") in raw and "raw_ids" not in f else f
              for f in features]
    return dict(data, categorical=marked)
