"""Row ranges of categorical features inside their embedding tables.

Each categorical feature owns ``num_ids`` consecutive rows of its table,
starting at ``row_offset``. A spec need not give offsets or table sizes:

* a feature without ``row_offset`` (and without ``share``) gets the first
  free rows of its table that fit it, in spec order (so features without
  offsets are laid out one after the other, around explicitly placed
  ranges);
* ``share: OTHER`` puts a feature in OTHER's range (same table, same
  hashing or vocabulary: the same value is the same row, e.g. a clicked-items
  history sharing the item ids); a feature shares with the root of a chain;
* a table without ``rows`` gets the end of its last range.

Two ranges of one table that overlap without sharing are refused, as is a
range that ends past ``rows``. :func:`layout_problems` returns the parts
with every offset and size filled in (what the spec saved beside converted
data holds, so resolving it again changes nothing) and every problem at
once.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from psrec.features.spec.columns import CategoricalFeature
from psrec.features.spec.columns import SpecError
from psrec.features.spec.columns import TableConfig

_INHERITED = ("table", "hash_buckets", "vocabulary_file")


def _roots(categorical: Sequence[CategoricalFeature],
           problems: list[str]) -> dict[str, CategoricalFeature]:
    """name -> the feature whose range it uses (itself when not sharing);
    features with a broken ``share`` are left out."""
    by_name = {f.name: f for f in categorical}
    roots = {}
    for feature in categorical:
        seen, current = [feature.name], feature
        while current is not None and current.share is not None:
            target = by_name.get(current.share)
            if target is None:
                problems.append(
                    f"categorical feature {current.name!r}: `share` = "
                    f"{current.share!r} is not a categorical feature of the "
                    f"spec; features: {sorted(by_name)}.")
                current = None
            elif target.name in seen:
                problems.append(
                    f"categorical feature {feature.name!r}: `share` makes a "
                    f"cycle ({' -> '.join(seen + [target.name])}); one "
                    "feature of a shared range must own it (no `share`).")
                current = None
            else:
                seen.append(target.name)
                current = target
        if current is not None:
            roots[feature.name] = current
    return roots


def _inherit(feature: CategoricalFeature, root: CategoricalFeature,
             problems: list[str]) -> CategoricalFeature | None:
    """``feature`` with the table and hashing of the feature it shares;
    a key given with a different value is a problem."""
    changes = {}
    for key in _INHERITED:
        mine, theirs = getattr(feature, key), getattr(root, key)
        if mine is None:
            changes[key] = theirs
        elif mine != theirs:
            problems.append(
                f"categorical feature {feature.name!r}: `{key}` = {mine!r} "
                f"differs from {theirs!r} of {root.name!r}, whose rows it "
                "shares (`share`); remove the key (it is inherited) or "
                "stop sharing.")
            return None
    return dataclasses.replace(feature, **changes)


def _ids(feature: CategoricalFeature, problems: list[str]) -> int | None:
    try:
        return feature.num_ids
    except SpecError as error:
        problems += error.problems
        return None


def layout_problems(categorical: Sequence[CategoricalFeature],
                    tables: Sequence[TableConfig]
                    ) -> tuple[list[CategoricalFeature], list[TableConfig],
                               list[str]]:
    """The parts with offsets and sizes resolved, and the problems found.

    Parts that cannot be resolved are returned unchanged (their problem is
    in the list), so the other checks of a spec still run on them.
    """
    problems: list[str] = []
    roots = _roots(categorical, problems)
    resolved: dict[str, CategoricalFeature] = {}
    for feature in categorical:  # owners first: sharers take their range
        if feature.share is None:
            resolved[feature.name] = feature
    taken: dict[str, list[tuple[int, int]]] = {}
    for feature in categorical:
        if feature.share is None and feature.row_offset is not None:
            ids = _ids(feature, [])  # an unreadable vocabulary is reported
            if ids is not None:      # by check_vocabularies (conversion)
                taken.setdefault(feature.table, []).append(
                    (feature.row_offset, feature.row_offset + ids))
    for feature in categorical:
        if feature.share is None and feature.row_offset is None and (
                not feature.raw_ids):  # raw ids (dynamic tables): no range
            ids = _ids(feature, problems) or 0
            ranges = taken.setdefault(feature.table, [])
            start = _first_fit(ranges, ids)
            ranges.append((start, start + ids))
            resolved[feature.name] = dataclasses.replace(feature,
                                                         row_offset=start)
    for feature in categorical:
        root = roots.get(feature.name)
        if feature.share is None or root is None:
            continue
        owner = resolved[root.name]
        shared = _inherit(feature, owner, problems)
        if shared is None:
            continue
        if shared.row_offset not in (None, owner.row_offset):
            problems.append(
                f"categorical feature {feature.name!r}: `row_offset` = "
                f"{shared.row_offset} but it shares the rows of "
                f"{owner.name!r}, which start at {owner.row_offset}; remove "
                "`row_offset` (it is inherited).")
            continue
        resolved[feature.name] = dataclasses.replace(
            shared, row_offset=owner.row_offset)
    out = [resolved.get(f.name, f) for f in categorical]
    ranges = _ranges(out)  # reads each vocabulary once
    problems += _overlaps(ranges, roots)
    sized = [_sized(table, ranges, problems) for table in tables]
    return out, sized, problems


def _first_fit(taken: Sequence[tuple[int, int]], ids: int) -> int:
    """The lowest start of ``ids`` free rows around the ``taken`` ranges."""
    start = 0
    for begin, end in sorted(taken):
        if start + ids <= begin:
            break
        start = max(start, end)
    return start


def _ranges(features: Sequence[CategoricalFeature]
            ) -> list[tuple[CategoricalFeature, int, int]]:
    ranges = []
    for feature in features:
        if feature.row_offset is None or feature.table is None:
            continue
        try:
            ids = feature.num_ids
        except SpecError:
            continue  # reported once, by layout_problems
        ranges.append((feature, feature.row_offset,
                       feature.row_offset + ids))
    return ranges


def _overlaps(ranges: Sequence[tuple[CategoricalFeature, int, int]],
              roots: dict[str, CategoricalFeature]) -> list[str]:
    problems = []
    for i, (a, a_start, a_end) in enumerate(ranges):
        for b, b_start, b_end in ranges[i + 1:]:
            if a.table != b.table or a_end <= b_start or b_end <= a_start:
                continue
            root_a, root_b = roots.get(a.name), roots.get(b.name)
            if root_a is not None and root_a is root_b:
                continue
            problems.append(
                f"categorical features {a.name!r} (rows {a_start}.."
                f"{a_end - 1}) and {b.name!r} (rows {b_start}..{b_end - 1}) "
                f"overlap in table {a.table!r}; give `share: {a.name}` to "
                f"{b.name!r} if they should share embeddings, otherwise "
                "drop `row_offset` (ranges are laid out automatically).")
    return problems


def _sized(table: TableConfig,
           ranges: Sequence[tuple[CategoricalFeature, int, int]],
           problems: list[str]) -> TableConfig:
    """``table`` with ``rows`` = the end of its last range when not given
    (a dynamic table: ``capacity`` + 1); a range past a given ``rows`` is a
    problem."""
    if table.dynamic:
        if table.rows is None and isinstance(table.capacity, int):
            return dataclasses.replace(table, rows=table.capacity + 1)
        return table
    ends = [(feature, end) for feature, _, end in ranges
            if feature.table == table.name]
    if table.rows is None:
        rows = max((end for _, end in ends), default=0)
        if rows == 0:
            return table  # no feature uses it: reported as unused
        return dataclasses.replace(table, rows=rows)
    for feature, end in ends:
        if end > table.rows:
            what = ("hash_buckets " + str(feature.hash_buckets)
                    if feature.hash_buckets else "vocabulary size + 1")
            problems.append(
                f"categorical feature {feature.name!r}: row_offset "
                f"{feature.row_offset} + {what} = {end} exceeds table "
                f"{table.name!r} rows = {table.rows}; enlarge the table, "
                "leave out its `rows` (sized automatically) or lower the "
                "buckets.")
    return table
