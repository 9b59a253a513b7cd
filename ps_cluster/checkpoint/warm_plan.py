"""What a warm start carries from another run's spec into this one's: the
plan of ``psrec train --warm-start`` (plain Python, no TensorFlow).

The rows of an embedding table belong to the categorical features that own
ranges in it (``features.spec.layout``). Comparing the source run's spec
(recorded in its ``job.json``) with this run's, feature by feature (by
name):

* a table whose shape and every range are unchanged, and a dynamic table
  whose settings are unchanged (its id -> row map comes with it), is
  restored whole, by checkpoint key (``carried``);
* a feature whose range moved (another ``row_offset``, another table of the
  same ``dim``, a table resized around it) has its rows copied range to
  range (``moved``);
* a vocabulary feature whose vocabulary changed keeps the rows of the
  values both vocabularies hold, row by row of value (``remapped``);
* a feature whose hashing changed (another ``hash_buckets``, hashing
  replaced by a vocabulary or the reverse) or whose table changed ``dim``
  starts from fresh rows (``re-initialised``), as does a feature the source
  did not have (``added``); a feature only the source had is ``dropped``.

A dynamic table that exists in both runs but with other settings is refused
(:class:`WarmStartError`): its id -> row map cannot follow a new capacity
or row layout here.

Optimizer slots follow their rows while the optimizer of the rows' table
(its spec's ``optimizer``, else the run's ``--sparse-optimizer``) is the
same in both runs -- under whatever name that optimizer has in each run's
checkpoint (``models.optim.config.TableGroup``); rows whose table's
optimizer changed start with fresh slots, one line per table
(:meth:`WarmStartPlan.slot_rest`).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from psrec.errors import ConfigError
from psrec.features.spec.columns import CategoricalFeature
from psrec.features.spec.columns import TableConfig
from psrec.features.spec.spec import FeatureSpec
from psrec.models.optim.config import OptimizerConfig
from psrec.models.optim.config import TableGroup
from psrec.models.optim.config import table_groups

FATES = ("carried", "moved", "remapped", "re-initialised", "added",
         "dropped")


class WarmStartError(ConfigError):
    """A warm start that cannot be done (exit 2, before any server
    starts)."""


@dataclasses.dataclass(frozen=True)
class RowCopy:
    """``count`` rows of the source's table ``source`` from row
    ``source_start`` into this run's table ``target`` from
    ``target_start`` (with their optimizer slots)."""

    source: str
    target: str
    source_start: int
    target_start: int
    count: int


@dataclasses.dataclass(frozen=True)
class FeatureFate:
    """What happens to one feature's rows (``fate`` one of :data:`FATES`),
    the rows carried and why, as shown."""

    feature: str
    fate: str
    rows: int = 0
    why: str = ""

    def line(self) -> str:
        return f"warm start: feature {self.feature!r} {self.fate}" + (
            f": {self.why}" if self.why else "")


@dataclasses.dataclass(frozen=True)
class WarmStartPlan:
    """This run's tables (``tables``), those restored whole (``whole``, by
    checkpoint key), range copies into the others (``copies``: rows no copy
    reaches keep their fresh values) and each feature's fate."""

    tables: tuple[str, ...]
    whole: tuple[str, ...]
    copies: tuple[RowCopy, ...]
    features: tuple[FeatureFate, ...]
    # Table name -> its optimizer group, in the source run and in this one.
    source_groups: dict[str, TableGroup] = dataclasses.field(
        default_factory=dict)
    groups: dict[str, TableGroup] = dataclasses.field(default_factory=dict)

    @property
    def copied_tables(self) -> tuple[str, ...]:
        """This run's tables not restored whole."""
        return tuple(t for t in self.tables if t not in self.whole)

    def count(self, fate: str) -> int:
        return sum(1 for f in self.features if f.fate == fate)

    def rows(self, *fates: str) -> int:
        """Rows carried for the features of ``fates``."""
        return sum(f.rows for f in self.features if f.fate in fates)

    def lines(self) -> list[str]:
        """One line per feature not carried as-is, and one per table whose
        optimizer changed."""
        return [f.line() for f in self.features if f.fate != "carried"] + [
            f"warm start: table {table!r} optimizer {before} -> {after}: "
            "its optimizer slots are re-initialised"
            for table, before, after in self.optimizer_changes()]

    def optimizer_changes(self) -> list[tuple[str, str, str]]:
        """``(table, source optimizer, optimizer)`` of this run's tables
        whose rows come from a source table with another optimizer."""
        pairs = {(t, t) for t in self.whole} | {
            (c.source, c.target) for c in self.copies}
        changes = {}
        for source, table in sorted(pairs):
            before, after = self.source_groups.get(source), self.groups.get(
                table)
            if before and after and before.optimizer != after.optimizer:
                changes.setdefault(table, (table, before.optimizer,
                                           after.optimizer))
        return list(changes.values())

    def slot_rest(self, source: str, table: str, rest: str) -> str | None:
        """The source key's rest (after the table's name) of this run's
        key ``rest`` of ``table``, filled from the source's table
        ``source``: ``rest`` itself but for an optimizer slot, whose
        optimizer is named as in the source; None for a slot of a table
        whose optimizer is another than the source table's (fresh)."""
        before, after = self.source_groups.get(source), self.groups.get(
            table)
        mark = f"/.OPTIMIZER_SLOT/{after.name}/" if after else None
        if mark is None or mark not in rest or before is None:
            return rest
        if before.optimizer != after.optimizer:
            return None
        return rest.replace(mark, f"/.OPTIMIZER_SLOT/{before.name}/", 1)

    def summary(self, source: str, dense: str, slots: str) -> str:
        moved = self.count("moved") + self.count("remapped")
        remapped = (f", {self.count('remapped')} of them remapped by value"
                    if self.count("remapped") else "")
        return (f"warm start from {source}: carried "
                f"{self.count('carried')} features "
                f"({self.rows('carried'):,} rows), moved {moved} "
                f"({self.rows('moved', 'remapped'):,} rows{remapped}), "
                f"added {self.count('added')}, re-initialised "
                f"{self.count('re-initialised')}, dropped "
                f"{self.count('dropped')}; dense weights {dense}; optimizer "
                f"slots {slots}")


def _owners(spec: FeatureSpec) -> dict[str, CategoricalFeature]:
    """Features that own rows (not sharing another's range), by name."""
    return {f.name: f for f in spec.categorical if f.share is None}


def _hashing(feature: CategoricalFeature) -> str:
    if feature.raw_ids:
        return "raw ids (dynamic table)"
    if feature.hash_buckets is not None:
        return f"hash_buckets {feature.hash_buckets}"
    return "a vocabulary"


def _vocabulary(feature: CategoricalFeature, run: str) -> list[str]:
    try:
        return feature.vocabulary()
    except ConfigError:
        raise WarmStartError(
            f"--warm-start: the vocabulary of feature {feature.name!r} in "
            f"the {run} run's spec ({feature.vocabulary_file}) cannot be "
            "read: its rows are remapped by value; restore the file, or "
            "give the feature another name (it starts fresh).") from None


def _runs(pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """``(source, target)`` row pairs, sorted by target -> ``(source start,
    target start, count)`` runs of consecutive rows on both sides."""
    runs: list[list[int]] = []
    for source, target in pairs:
        if runs and (runs[-1][0] + runs[-1][2] == source
                     and runs[-1][1] + runs[-1][2] == target):
            runs[-1][2] += 1
        else:
            runs.append([source, target, 1])
    return [tuple(run) for run in runs]


def _remap(old: CategoricalFeature, new: CategoricalFeature
           ) -> tuple[list[tuple[int, int, int]], int, int]:
    """Runs of rows of a vocabulary feature by value (id 0, out of
    vocabulary, to id 0), the values kept and the values now."""
    before = {value: index + 1 for index, value in
              enumerate(_vocabulary(old, "source"))}
    after = _vocabulary(new, "new")
    pairs = [(old.row_offset, new.row_offset)]
    pairs += [(old.row_offset + before[value], new.row_offset + index + 1)
              for index, value in enumerate(after) if value in before]
    return _runs(pairs), len(pairs) - 1, len(after)


def _table_changes(source: FeatureSpec, target: FeatureSpec) -> None:
    """Refuses a dynamic table both runs have with other settings."""
    before = {t.name: t for t in source.tables}
    for table in target.tables:
        old = before.get(table.name)
        if old is None or not (old.dynamic or table.dynamic) or _same(
                old, table):
            continue
        changed = [f"{name} {getattr(old, name)!r} -> {getattr(table, name)!r}"
                   for name in ("mode", "capacity", "rows", "dim",
                                "admit_threshold", "evict", "ttl_steps",
                                "maintenance_every", "initializer", "scale")
                   if getattr(old, name) != getattr(table, name)]
        raise WarmStartError(
            f"--warm-start: dynamic table {table.name!r} changed since the "
            f"source run ({', '.join(changed)}); a warm start keeps a "
            "dynamic table's id -> row map only when the table is unchanged "
            "(remapping it is not done): keep its settings, or give the "
            "table another name (it starts empty).")


def _same(old: TableConfig, new: TableConfig) -> bool:
    """The same table but perhaps its storage dtype (carried cast)."""
    return dataclasses.replace(old, dtype=None) == dataclasses.replace(
        new, dtype=None)


def _whole_tables(source: FeatureSpec, target: FeatureSpec) -> set[str]:
    """Tables of ``target`` restored whole: same shape, same settings of a
    dynamic table, and the same features owning the same ranges with the
    same hashing and vocabulary contents."""
    before = {t.name: t for t in source.tables}
    whole = set()
    for table in target.tables:
        old = before.get(table.name)
        if old is None or (old.rows, old.dim) != (table.rows, table.dim):
            continue
        if table.dynamic:
            if _same(old, table):
                whole.add(table.name)
            continue
        mine = {f.name: f for f in _owners(target).values()
                if f.table == table.name}
        theirs = {f.name: f for f in _owners(source).values()
                  if f.table == table.name}
        if mine.keys() == theirs.keys() and all(
                _same_range(theirs[name], mine[name]) for name in mine):
            whole.add(table.name)
    return whole


def _same_range(old: CategoricalFeature, new: CategoricalFeature) -> bool:
    if (old.row_offset, old.hash_buckets, old.raw_ids) != (
            new.row_offset, new.hash_buckets, new.raw_ids):
        return False
    if (old.vocabulary_file is None) != (new.vocabulary_file is None):
        return False
    return old.vocabulary_file is None or (
        _vocabulary(old, "source") == _vocabulary(new, "new"))


def plan_warm_start(source: FeatureSpec, target: FeatureSpec,
                    source_optimizer: OptimizerConfig = OptimizerConfig(),
                    optimizer: OptimizerConfig = OptimizerConfig()
                    ) -> WarmStartPlan:
    """The plan of warm-starting a run of ``target`` from a checkpoint of
    ``source`` (both specs resolved, offsets laid out), whose optimizer
    flags were ``source_optimizer`` (this run's: ``optimizer``).

    Raises:
      WarmStartError: a dynamic table changed, or a vocabulary to remap
        cannot be read.
    """
    _table_changes(source, target)
    whole = _whole_tables(source, target)
    old_tables = {t.name: t for t in source.tables}
    new_tables = {t.name: t for t in target.tables}
    theirs = _owners(source)
    fates: list[FeatureFate] = []
    copies: list[RowCopy] = []
    for feature in _owners(target).values():
        old = theirs.get(feature.name)
        table = new_tables[feature.table]
        if old is None:
            fates.append(FeatureFate(feature.name, "added",
                                     why="its rows are freshly initialised"))
            continue
        if feature.table in whole:
            rows = table.rows if table.dynamic else feature.num_ids
            fates.append(FeatureFate(feature.name, "carried", rows))
            continue
        old_table = old_tables[old.table]
        fresh = "its rows are freshly initialised"
        if old.raw_ids or feature.raw_ids:
            fates.append(FeatureFate(
                feature.name, "re-initialised",
                why=f"its table changed ({old.table!r}, {_hashing(old)} -> "
                f"{feature.table!r}, {_hashing(feature)}); {fresh}"))
        elif old_table.dim != table.dim:
            fates.append(FeatureFate(
                feature.name, "re-initialised",
                why=f"its table's dim changed ({old.table!r} dim "
                f"{old_table.dim} -> {feature.table!r} dim {table.dim}); "
                f"{fresh}"))
        elif _hashing(old) != _hashing(feature):
            fates.append(FeatureFate(
                feature.name, "re-initialised",
                why=f"its hashing changed ({_hashing(old)} -> "
                f"{_hashing(feature)}); {fresh}"))
        elif feature.vocabulary_file is not None and (
                _vocabulary(old, "source") != _vocabulary(feature, "new")):
            runs, kept, now = _remap(old, feature)
            copies += [RowCopy(old.table, feature.table, *run)
                       for run in runs]
            fates.append(FeatureFate(
                feature.name, "remapped", kept + 1,
                why=f"its vocabulary changed: the rows of the {kept:,} of "
                f"{now:,} values the source's vocabulary holds (and the "
                "out-of-vocabulary row) are carried by value, the others "
                "are freshly initialised"))
        else:
            count = feature.num_ids
            copies.append(RowCopy(old.table, feature.table, old.row_offset,
                                  feature.row_offset, count))
            same = (old.table, old.row_offset) == (feature.table,
                                                   feature.row_offset)
            fates.append(FeatureFate(
                feature.name, "carried" if same else "moved", count,
                why="" if same else
                f"rows {old.table!r}[{old.row_offset}:"
                f"{old.row_offset + count}] -> {feature.table!r}"
                f"[{feature.row_offset}:{feature.row_offset + count}]"))
    mine = _owners(target)
    for name in theirs:
        if name not in mine:
            fates.append(FeatureFate(
                name, "dropped", why="the new spec does not have it (or "
                "shares another feature's rows): its rows are not carried"))
    return WarmStartPlan(tuple(t.name for t in target.tables),
                         tuple(sorted(whole)), tuple(copies), tuple(fates),
                         table_groups(source.tables, source_optimizer),
                         table_groups(target.tables, optimizer))
