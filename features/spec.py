"""The feature specification: the single source of truth of a psrec job.

Parsing, conversion, schema checks, synthetic data, embedding-table creation
and the serving signature are all derived from one :class:`FeatureSpec`.
Its parts are in ``features.columns``. A spec file (YAML or JSON) looks like::

    name: tiny
    label: {name: label}
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
value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any
from typing import Mapping

import yaml

from psrec.features.columns import CategoricalFeature
from psrec.features.columns import DenseFeature
from psrec.features.columns import LabelConfig
from psrec.features.columns import SpecError
from psrec.features.columns import TableConfig

# Reserved names of the record columns psrec adds itself.
ID_COLUMN = "psrec__id"
DENSE_COLUMN = "psrec__dense"
RESERVED_NAMES = (ID_COLUMN, DENSE_COLUMN)


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """Everything psrec needs to know about a dataset's features.

    Attributes:
        name: a short name for the dataset (shown in manifests and reports).
        label: the target column.
        dense: numeric columns, in model input order.
        categorical: categorical columns, in model input order.
        tables: embedding tables referenced by the categorical features.
    """

    name: str
    label: LabelConfig
    dense: tuple[DenseFeature, ...]
    categorical: tuple[CategoricalFeature, ...]
    tables: tuple[TableConfig, ...]

    def __post_init__(self) -> None:
        for key in ("dense", "categorical", "tables"):
            object.__setattr__(self, key, tuple(getattr(self, key)))
        if not self.categorical and not self.dense:
            raise SpecError(
                "spec: give at least one dense or categorical feature.")
        seen: set[str] = set()
        for column in self.columns:
            if column in RESERVED_NAMES:
                raise SpecError(f"spec: column {column!r} is reserved by "
                                "psrec; rename the column.")
            if column in seen:
                raise SpecError(
                    f"spec: column {column!r} is used twice; each input "
                    "column may be one feature (share a table to share "
                    "embeddings instead).")
            seen.add(column)
        tables = {}
        for table in self.tables:
            if table.name in tables:
                raise SpecError(f"spec: table {table.name!r} is defined twice.")
            tables[table.name] = table
        for feature in self.categorical:
            table = tables.get(feature.table)
            if table is None:
                raise SpecError(
                    f"categorical feature {feature.name!r}: `table` = "
                    f"{feature.table!r} is not defined; defined tables: "
                    f"{sorted(tables) or 'none'}.")
            if feature.hash_buckets is not None:
                end = feature.row_offset + feature.hash_buckets
                if end > table.rows:
                    raise SpecError(
                        f"categorical feature {feature.name!r}: row_offset "
                        f"{feature.row_offset} + hash_buckets "
                        f"{feature.hash_buckets} = {end} exceeds table "
                        f"{table.name!r} rows = {table.rows}; enlarge the "
                        "table or lower the buckets.")
        unused = sorted(set(tables) - {f.table for f in self.categorical})
        if unused:
            raise SpecError(f"spec: tables {unused} are not used by any "
                            "categorical feature; remove them.")

    # -- derived views -----------------------------------------------------

    def table(self, name: str) -> TableConfig:
        for table in self.tables:
            if table.name == name:
                return table
        raise KeyError(name)

    @property
    def columns(self) -> tuple[str, ...]:
        """Input columns this spec reads, label first."""
        return ((self.label.name,) + tuple(f.name for f in self.dense)
                + tuple(f.name for f in self.categorical))

    @property
    def table_bytes(self) -> int:
        return sum(t.bytes for t in self.tables)

    def check_vocabularies(self) -> None:
        """Checks vocabulary-backed features fit their tables (reads the
        files)."""
        for feature in self.categorical:
            if feature.vocabulary_file is None:
                continue
            table = self.table(feature.table)
            end = feature.row_offset + feature.num_ids
            if end > table.rows:
                raise SpecError(
                    f"categorical feature {feature.name!r}: row_offset "
                    f"{feature.row_offset} + vocabulary size + 1 = {end} "
                    f"exceeds table {table.name!r} rows = {table.rows}.")

    # -- serialisation -------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        asdict = dataclasses.asdict
        return {"name": self.name, "label": asdict(self.label),
                "tables": [asdict(t) for t in self.tables],
                "dense": [asdict(f) for f in self.dense],
                "categorical": [asdict(f) for f in self.categorical]}

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON form (plus vocabulary contents)."""
        digest = hashlib.sha256(
            json.dumps(self.to_dict(), sort_keys=True).encode())
        for feature in self.categorical:
            if feature.vocabulary_file is not None:
                digest.update("\n".join(feature.vocabulary()).encode())
        return digest.hexdigest()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any],
                  base_dir: str | Path | None = None) -> FeatureSpec:
        """Builds a spec from plain data, rejecting unknown keys; relative
        vocabulary paths resolve against ``base_dir``."""
        if not isinstance(data, Mapping):
            raise SpecError("spec: expected a mapping at the top level, got "
                            f"{type(data).__name__}.")
        _reject_unknown("spec", data, ("name", "label", "tables", "dense",
                                       "categorical"))
        if "name" not in data:
            raise SpecError("spec: missing key `name`.")
        categorical = []
        for item in _list_of(data, "categorical"):
            feature = _build(CategoricalFeature, item, "categorical feature")
            vocabulary = feature.vocabulary_file
            if vocabulary and base_dir is not None and not Path(
                    vocabulary).is_absolute():
                feature = dataclasses.replace(
                    feature, vocabulary_file=str(Path(base_dir) / vocabulary))
            categorical.append(feature)
        return cls(
            name=data["name"],
            label=_build(LabelConfig, data.get("label", {}), "label"),
            dense=tuple(_build(DenseFeature, item, "dense feature")
                        for item in _list_of(data, "dense")),
            categorical=tuple(categorical),
            tables=tuple(_build(TableConfig, item, "table")
                         for item in _list_of(data, "tables")))

    def save(self, path: str | Path) -> Path:
        """Writes the spec as YAML (``.yaml``/``.yml``) or JSON (anything
        else)."""
        path = Path(path)
        data = self.to_dict()
        if path.suffix in (".yaml", ".yml"):
            text = yaml.safe_dump(data, sort_keys=False)
        else:
            text = json.dumps(data, indent=2) + "\n"
        path.write_text(text, encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> FeatureSpec:
        """Reads a YAML or JSON spec file."""
        path = Path(path)
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
            raise SpecError(f"{path}: {error}") from None


def _reject_unknown(where: str, data: Mapping[str, Any],
                    allowed: tuple[str, ...]) -> None:
    for key in data:
        if key not in allowed:
            raise SpecError(f"{where}: unknown key {key!r}; allowed keys: "
                            f"{', '.join(allowed)}.")


def _list_of(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise SpecError(
            f"spec: `{key}` must be a list, got {type(value).__name__}.")
    return value


def _build(cls: type, item: Any, where: str) -> Any:
    if not isinstance(item, Mapping):
        raise SpecError(f"{where}: expected a mapping, got {item!r}.")
    fields = dataclasses.fields(cls)
    label = f"{where} {item.get('name', '?')!r}"
    _reject_unknown(label, item, tuple(f.name for f in fields))
    for field in fields:
        if (field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
                and field.name not in item):
            raise SpecError(f"{label}: missing required key `{field.name}`.")
    try:
        return cls(**item)
    except TypeError as error:
        raise SpecError(f"{label}: {error}") from None
