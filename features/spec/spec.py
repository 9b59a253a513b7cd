"""The feature specification: the single source of truth of a psrec job.

Parsing, conversion, schema checks, synthetic data, embedding-table creation
and the serving signature are all derived from one :class:`FeatureSpec`.
Its parts are in ``features.spec.columns``. A spec file (YAML or JSON) looks like::

    name: tiny
    label: {name: label}      # or several: labels: [{name: click},
                              #   {name: rating, loss: mse, weight: 0.5}]
    tables:
        - {name: ids, rows: 2000, dim: 8}
    dense:
        - {name: price, transform: log1p, default: 0.0}
    categorical:
        - {name: user, table: ids, hash_buckets: 1000}
        - {name: item, table: ids, hash_buckets: 1000, row_offset: 1000}
        - {name: tags, table: ids, hash_buckets: 1000, max_length: 4,
           combiner: mean}

Unknown keys and bad values raise :class:`SpecError` naming the key, the
value and what is allowed; all the problems of a spec are reported at
once (numbered, and as the error's ``problems`` list).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import AbstractSet as Set
from typing import Any
from typing import Mapping
from typing import Sequence

import yaml

from psrec.errors import did_you_mean
from psrec.features.spec.columns import CategoricalFeature
from psrec.features.spec.columns import DenseFeature
from psrec.features.spec.columns import LabelConfig
from psrec.features.spec.columns import SpecError
from psrec.features.spec.columns import TableConfig
from psrec.features.spec.columns import raise_problems
from psrec.features.spec.derived import DerivedFeature
from psrec.features.spec.derived import derived_problems
from psrec.features.spec.derived import raw_inputs
from psrec.features.spec.dynamic import mark_raw_ids
from psrec.features.spec.history import history_problems
from psrec.features.spec.history import log_columns
from psrec.features.spec.layout import layout_problems
from psrec.features.spec.towers import TowersConfig
from psrec.features.spec.towers import towers_from_dict
from psrec.features.spec.towers import towers_problems
from psrec.uri_path import as_path

# Reserved names of the record columns psrec adds itself.
ID_COLUMN = "psrec__id"
DENSE_COLUMN = "psrec__dense"
RESERVED_NAMES = (ID_COLUMN, DENSE_COLUMN)
# A dense feature's statistics and the neutral values of an unset one.
_STATISTICS = {"mean": 0.0, "std": 1.0}
# A label's default loss and weight, left out of its dict (specs written
# before they existed keep their form and fingerprint).
_LABEL_DEFAULTS = (("loss", "logloss"), ("weight", 1.0), ("given", None))


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """Everything psrec needs to know about a dataset's features.

    Attributes:
        name: a short name for the dataset (shown in manifests and reports).
        dense, categorical: the input columns, in model input order.
        tables: embedding tables referenced by the categorical features.
        label: the training target; with ``further_labels``, the first task
            of several (a spec file's ``labels`` list): its metrics and
            outputs are those a single-label spec reports.
        further_labels: the other tasks of a multi-task spec, in order
            (empty: one label).
        derived: columns computed from raw columns (``features.spec.derived``),
            each used by the categorical feature of its name.
        towers: the query/candidate split of the features for two-tower
            retrieval (``features.spec.towers``); None: ranking only.

    Row offsets and table sizes left out are laid out on construction
    (``features.spec.layout``), so a spec's parts always hold them.
    """

    name: str
    label: LabelConfig
    dense: tuple[DenseFeature, ...]
    categorical: tuple[CategoricalFeature, ...]
    tables: tuple[TableConfig, ...]
    derived: tuple[DerivedFeature, ...] = ()
    towers: TowersConfig | None = None
    further_labels: tuple[LabelConfig, ...] = ()

    def __post_init__(self) -> None:
        for key in ("dense", "categorical", "tables", "derived",
                    "further_labels"):
            object.__setattr__(self, key, tuple(getattr(self, key)))
        categorical, tables, problems = layout_problems(self.categorical,
                                                        self.tables)
        object.__setattr__(self, "categorical", tuple(categorical))
        object.__setattr__(self, "tables", tuple(tables))
        raise_problems(problems + _cross_problems(
            self.labels, self.dense, self.categorical, self.tables)
            + derived_problems(self.label_names, self.dense,
                               self.categorical, self.derived)
            + history_problems(self.categorical, self.derived_names())
            + towers_problems(self.towers, self.dense, self.categorical))

    # -- derived views -----------------------------------------------------

    def table(self, name: str) -> TableConfig:
        for table in self.tables:
            if table.name == name:
                return table
        raise KeyError(name)

    @property
    def labels(self) -> tuple[LabelConfig, ...]:
        """Every task's label, the first one first."""
        return (self.label,) + self.further_labels

    @property
    def label_names(self) -> tuple[str, ...]:
        return tuple(label.name for label in self.labels)

    @property
    def multi_task(self) -> bool:
        """True when the spec names several labels (each may be missing
        in a row: masked for that task)."""
        return bool(self.further_labels)

    @property
    def columns(self) -> tuple[str, ...]:
        """Input columns conversion reads, labels first (a derived feature's
        raw sources, not the derived column)."""
        return self.label_names + tuple(self.log_inputs)

    @property
    def log_inputs(self) -> dict[str, tuple[str, bool]]:
        """``{column: (dtype, is a list)}`` conversion reads besides the
        labels: :attr:`raw_inputs` less the history lists (built from the
        log) plus their order columns (``int64``: integer or timestamp)."""
        inputs = {name: kind for name, kind in self.raw_inputs.items()
                  if name not in self.history_names()}
        for name in log_columns(self.categorical):
            inputs.setdefault(name, ("int64", False))
        return inputs

    def history_names(self) -> frozenset[str]:
        """The user-history features (``features.spec.history``)."""
        return frozenset(f.name for f in self.categorical
                         if f.history is not None)

    @property
    def raw_inputs(self) -> dict[str, tuple[str, bool]]:
        """``{column: (serving dtype, is a list)}`` of the raw inputs
        besides the label: what the serving function takes."""
        return raw_inputs(self.dense, self.categorical, self.derived)

    def derived_names(self) -> frozenset[str]:
        return frozenset(d.name for d in self.derived)

    @property
    def table_bytes(self) -> int:
        return sum(t.bytes for t in self.tables)

    def with_table_dtype(self, dtype: str) -> FeatureSpec:
        """This spec with ``dtype`` on every table that leaves its
        ``dtype`` unset (``psrec train --table-dtype``: the flag is the
        default, a table's own ``dtype`` wins); float32 leaves them unset
        (unset is float32), so a float32 run's spec keeps its form."""
        if dtype == "float32":
            return self
        tables = tuple(t if t.dtype is not None
                       else dataclasses.replace(t, dtype=dtype)
                       for t in self.tables)
        return dataclasses.replace(self, tables=tables)

    def check_vocabularies(self) -> None:
        """Checks vocabulary-backed features fit their tables (reads the
        files)."""
        problems = []
        for feature in self.categorical:
            if feature.vocabulary_file is None:
                continue
            table = self.table(feature.table)
            try:
                end = feature.row_offset + feature.num_ids
            except SpecError as error:
                problems += error.problems
                continue
            if end > table.rows:
                problems.append(
                    f"categorical feature {feature.name!r}: row_offset "
                    f"{feature.row_offset} + vocabulary size + 1 = {end} "
                    f"exceeds table {table.name!r} rows = {table.rows}; "
                    "enlarge the table or lower the row offset.")
        raise_problems(problems)

    # -- serialisation -------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain data :meth:`from_dict` inverts; a dense feature's unset
        ``mean``/``std`` (any transform but ``standardize``), an unset
        ``share`` and an empty ``derived`` are left out (specs written
        before they existed keep their form and fingerprint)."""
        asdict = dataclasses.asdict
        dense = [{key: value for key, value in asdict(f).items()
                  if value is not None or key not in _STATISTICS}
                 for f in self.dense]
        categorical = [{key: value for key, value in asdict(f).items()
                        if (value is not None or key not in ("share",
                                                             "history"))
                        and (value or key != "raw_ids")}
                       for f in self.categorical]
        labels = [{key: value for key, value in asdict(label).items()
                   if (key, value) not in _LABEL_DEFAULTS}  # fingerprints kept
                  for label in self.labels]
        data = {"name": self.name,
                **({"labels": labels} if self.multi_task
                   else {"label": labels[0]}),
                "tables": [t.to_dict() for t in self.tables],
                "dense": dense, "categorical": categorical}
        if self.derived:
            data["derived"] = [
                {key: list(value) if isinstance(value, tuple) else value
                 for key, value in asdict(f).items() if value is not None}
                for f in self.derived]
        if self.towers is not None:
            data["towers"] = self.towers.to_dict()
        return data

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON form (plus vocabulary contents). An
        unset ``mean``/``std`` is written as the neutral 0.0/1.0 that specs held
        before statistics became optional, so those specs keep their fingerprint.
        """
        data = self.to_dict()
        for feature in data["dense"]:
            for key, neutral in _STATISTICS.items():
                feature.setdefault(key, neutral)
        for table in data["tables"]:  # the storage dtype is not the data's
            table.pop("dtype", None)
        digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode())
        for feature in self.categorical:
            if feature.vocabulary_file is not None:
                digest.update("\n".join(feature.vocabulary()).encode())
        return digest.hexdigest()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any],
                  base_dir: str | Path | None = None) -> FeatureSpec:
        """Builds a spec from plain data, rejecting unknown keys; relative
        vocabulary paths resolve against ``base_dir``.

        Raises:
          SpecError: listing every problem found (``.problems``), in the
            parts and in how they fit together, not only the first.
        """
        if not isinstance(data, Mapping):
            raise SpecError("spec: expected a mapping at the top level, got "
                            f"{type(data).__name__}.")
        problems = _unknown_keys("spec", data, (
            "name", "label", "labels", "tables", "dense", "categorical",
            "derived", "towers"))
        if "name" not in data:
            problems.append("spec: missing key `name`; give the dataset a "
                            "short name.")
        labels = _labels(data, problems)
        label = labels[0] if labels else None
        dense, broken_dense = _build_list(DenseFeature, data, "dense",
                                          problems)
        categorical, broken_categorical = _build_list(
            CategoricalFeature, mark_raw_ids(data), "categorical", problems)
        tables, broken_tables = _build_list(TableConfig, data, "tables",
                                            problems)
        derived, _ = _build_list(DerivedFeature, data, "derived", problems)
        towers = towers_from_dict(data.get("towers"), problems)
        categorical = [_resolve_vocabulary(f, base_dir) for f in categorical]
        categorical, tables, found = layout_problems(categorical, tables)
        problems += found
        if labels:
            problems += derived_problems([x.name for x in labels], dense,
                                         categorical, derived)
        problems += history_problems(categorical,
                                     {d.name for d in derived})
        problems += _cross_problems(
            labels, dense, categorical, tables,
            broken_features=len(broken_dense) + len(broken_categorical),
            broken_tables={item.get("name") for item in broken_tables},
            broken_refs={item.get("table") for item in broken_categorical})
        problems += towers_problems(towers, dense, categorical)
        raise_problems(problems)
        return cls(name=data["name"], label=label, dense=tuple(dense),
                   categorical=tuple(categorical), tables=tuple(tables),
                   derived=tuple(derived), towers=towers,
                   further_labels=tuple(labels[1:]))

    def save(self, path: str | Path) -> Path:
        """Writes the spec as YAML (``.yaml``/``.yml``) or JSON (anything
        else); ``path`` may be a URI (``psrec.uri``)."""
        path = as_path(path)
        data = self.to_dict()
        if path.suffix in (".yaml", ".yml"):
            text = yaml.safe_dump(data, sort_keys=False)
        else:
            text = json.dumps(data, indent=2) + "\n"
        path.write_text(text, encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> FeatureSpec:
        """Reads a YAML or JSON spec file (a local path or a URI)."""
        path = as_path(path)
        if not path.is_file():
            raise SpecError(f"spec file {str(path)!r} does not exist.")
        text = path.read_text(encoding="utf-8")
        try:
            data = (json.loads(text) if path.suffix == ".json"
                    else yaml.safe_load(text))
        except (json.JSONDecodeError, yaml.YAMLError) as error:
            raise SpecError(
                f"spec file {str(path)!r} is not valid: {error}") from None
        try:
            return cls.from_dict(data, base_dir=path.parent)
        except SpecError as error:
            raise SpecError.of(error.problems, f"{path}: ") from None


def _cross_problems(labels: Sequence[LabelConfig],
                    dense: Sequence[DenseFeature],
                    categorical: Sequence[CategoricalFeature],
                    tables: Sequence[TableConfig], *,
                    broken_features: int = 0,
                    broken_tables: Set[Any] = frozenset(),
                    broken_refs: Set[Any] = frozenset()) -> list[str]:
    """The problems of how the parts fit together. ``broken_*`` describe
    parts that failed their own checks (counted features, table names and
    the tables broken features name), so they cause no second report."""
    problems = []
    if not categorical and not dense and not broken_features:
        problems.append(
            "spec: give at least one dense or categorical feature.")
    columns = [label.name for label in labels] + [
        f.name for f in (*dense, *categorical)]
    problems += _given_problems(labels)
    if len(labels) > 1 and not any(label.weight > 0 for label in labels):
        problems.append("spec: every label has `weight` 0; give at least "
                        "one task a weight > 0 to train.")
    for column in dict.fromkeys(columns):
        if column in RESERVED_NAMES:
            problems.append(f"spec: column {column!r} is reserved by psrec; "
                            "rename the column.")
        if columns.count(column) > 1:
            problems.append(
                f"spec: column {column!r} is used twice; each input column "
                "may be one feature (share a table to share embeddings "
                "instead).")
    defined: dict[str, TableConfig] = {}
    for table in tables:
        if table.name in defined:
            problems.append(f"spec: table {table.name!r} is defined twice; "
                            "give each table a distinct name.")
        defined.setdefault(table.name, table)
    for feature in categorical:
        table = defined.get(feature.table)
        if table is None:
            if feature.table not in broken_tables and feature.table is not None:
                problems.append(
                    f"categorical feature {feature.name!r}: `table` = "
                    f"{feature.table!r} is not defined; defined tables: "
                    f"{sorted(defined) or 'none'}"
                    f"{did_you_mean(feature.table, sorted(defined)) or '.'}")
            continue
        if feature.raw_ids != table.dynamic:
            problems.append(
                f"categorical feature {feature.name!r}: `raw_ids` = "
                f"{feature.raw_ids} but table {table.name!r} is "
                f"{table.mode}; raw ids go with `mode: dynamic` tables only "
                "(a spec file leaves `raw_ids` out).")
    used = {f.table for f in categorical} | set(broken_refs)
    unused = sorted(set(defined) - used)
    if unused:
        problems.append(f"spec: tables {unused} are not used by any "
                        "categorical feature; remove them.")
    return problems


def _given_problems(labels: Sequence[LabelConfig]) -> list[str]:
    """A label's ``given`` names another 0/1 label of the spec that is not
    conditioned itself (one funnel step: ``click -> conversion``)."""
    by_name = {label.name: label for label in labels}
    problems = []
    for label in labels:
        if label.given is None:
            continue
        where = f"label {label.name!r}: `given` = {label.given!r}"
        base = by_name.get(label.given)
        if base is None or base is label:
            names = [n for n in by_name if n != label.name]
            problems.append(
                f"{where} must name another label of the spec"
                f"{did_you_mean(str(label.given), names)}; labels: "
                f"{', '.join(names) or 'none (add the label it is given)'}.")
        elif base.regression or base.given is not None:
            problems.append(
                f"{where} names a label that is "
                + ("a regression target (loss: mse)" if base.regression
                   else f"itself given {base.given!r}")
                + "; a funnel conditions a 0/1 label on an unconditioned "
                "0/1 label.")
    return problems


def _labels(data: Mapping[str, Any],
            problems: list[str]) -> list[LabelConfig]:
    """The labels of a spec file: ``label`` (one mapping) or ``labels`` (a
    non-empty list of them, the first one the main task); [] after adding
    their problems to ``problems``."""
    if "labels" not in data:
        label = _build(LabelConfig, data.get("label", {}), "label", problems)
        return [] if label is None else [label]
    if "label" in data:
        problems.append("spec: give `label` (one task) or `labels` (a list "
                        "of tasks), not both.")
        return []
    items = data["labels"]
    if not isinstance(items, list) or not items:
        problems.append(f"spec: `labels` = {items!r} must be a non-empty "
                        "list of labels ({name: ..., loss: ..., weight: "
                        "...}).")
        return []
    built = [_build(LabelConfig, item, "label", problems) for item in items]
    return [] if None in built else built


def _unknown_keys(where: str, data: Mapping[str, Any],
                  allowed: tuple[str, ...]) -> list[str]:
    return [f"{where}: unknown key {key!r}{did_you_mean(key, allowed)} "
            f"(allowed keys: {', '.join(allowed)})." for key in data
            if key not in allowed]


def _list_of(data: Mapping[str, Any], key: str,
             problems: list[str]) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        problems.append(
            f"spec: `{key}` must be a list, got {type(value).__name__}.")
        return []
    return value


def _build_list(cls: type, data: Mapping[str, Any], key: str,
                problems: list[str]) -> tuple[list[Any], list[Mapping]]:
    """The parts listed under ``key`` that build, and the mappings that do
    not (their problems are added to ``problems``)."""
    where = {"dense": "dense feature", "categorical": "categorical feature",
             "tables": "table", "derived": "derived feature"}[key]
    built, broken = [], []
    for item in _list_of(data, key, problems):
        part = _build(cls, item, where, problems)
        if part is not None:
            built.append(part)
        elif isinstance(item, Mapping):
            broken.append(item)
    return built, broken


def _build(cls: type, item: Any, where: str, problems: list[str]) -> Any:
    """``cls(**item)``, or None after adding its problems to ``problems``."""
    if not isinstance(item, Mapping):
        problems.append(f"{where}: expected a mapping, got {item!r}.")
        return None
    fields = dataclasses.fields(cls)
    names = tuple(f.name for f in fields)
    label = f"{where} {item.get('name', '?')!r}"
    found = _unknown_keys(label, item, names)
    found += [f"{label}: missing required key `{f.name}`." for f in fields
              if f.default is dataclasses.MISSING
              and f.default_factory is dataclasses.MISSING
              and f.name not in item]
    if cls is DenseFeature:
        item = _without_legacy_statistics(item)
    part = None
    if not any("missing required key" in text for text in found):
        try:
            part = cls(**{k: v for k, v in item.items() if k in names})
        except SpecError as error:
            found += error.problems
        except TypeError as error:
            found.append(f"{label}: {error}")
    problems += found
    return None if found else part


def _without_legacy_statistics(item: Mapping[str, Any]) -> Mapping[str, Any]:
    """Drops ``mean: 0.0, std: 1.0`` from a non-``standardize`` dense
    feature: the neutral values every spec saved before statistics became
    optional holds (e.g. the ``spec.yaml`` beside converted data)."""
    if (item.get("transform", "none") != "standardize"
            and all(key in item and not isinstance(item[key], bool)
                    and item[key] == neutral
                    for key, neutral in _STATISTICS.items())):
        return {k: v for k, v in item.items() if k not in _STATISTICS}
    return item


def _resolve_vocabulary(feature: CategoricalFeature,
                        base_dir: str | Path | None) -> CategoricalFeature:
    vocabulary = feature.vocabulary_file
    if vocabulary and base_dir is not None and not as_path(
            vocabulary).is_absolute():
        return dataclasses.replace(
            feature, vocabulary_file=str(as_path(base_dir) / vocabulary))
    return feature
