"""The feature specification: the single source of truth of a psrec job.

Parsing, conversion, schema checks, synthetic data, embedding-table creation
and the serving signature are all derived from one :class:`FeatureSpec`.

A spec file (YAML or JSON) looks like::

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
import math
from pathlib import Path
from typing import Any
from typing import Mapping

import yaml

from psrec.errors import ConfigError

DENSE_TRANSFORMS = ("none", "log1p", "standardize")
COMBINERS = ("sum", "mean")
CATEGORICAL_DTYPES = ("string", "int64")
INITIALIZERS = ("uniform", "truncated_normal", "zeros")

# Reserved names of the record columns psrec adds itself.
ID_COLUMN = "psrec__id"
DENSE_COLUMN = "psrec__dense"
RESERVED_NAMES = (ID_COLUMN, DENSE_COLUMN)


class SpecError(ConfigError):
    """A feature spec is malformed; the message names the key and the value."""


def _check_choice(where: str, key: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise SpecError(
                f"{where}: `{key}` = {value!r} is not allowed; use one of "
                f"{', '.join(map(repr, allowed))}."
        )


def _check_positive_int(where: str, key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(
                f"{where}: `{key}` = {value!r} must be a positive integer."
        )


def _check_name(where: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"{where}: `name` = {value!r} must be a non-empty string.")
    if value in RESERVED_NAMES:
        raise SpecError(
                f"{where}: `name` = {value!r} is reserved by psrec; rename the column."
        )


@dataclasses.dataclass(frozen=True)
class DenseFeature:
    """A numeric input column.

    Attributes:
        name: column name in the Parquet input.
        transform: ``none``; ``log1p`` (``log(1 + max(x, 0))``: Criteo's counts
            have a few negatives, which are clipped to 0); or ``standardize``
            (``(x - mean) / std`` with the stored statistics).
        mean: mean used by ``standardize``.
        std: standard deviation used by ``standardize`` (> 0).
        default: value used where the input is missing (null in Parquet, NaN at
            serving time).
        required: when true, a null is a bad row (quarantined) instead of being
            replaced by ``default``.
    """

    name: str
    transform: str = "none"
    mean: float = 0.0
    std: float = 1.0
    default: float = 0.0
    required: bool = False

    def __post_init__(self) -> None:
        where = f"dense feature {self.name!r}"
        _check_name(where, self.name)
        _check_choice(where, "transform", self.transform, DENSE_TRANSFORMS)
        for key in ("mean", "std", "default"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                    not math.isfinite(value)):
                raise SpecError(f"{where}: `{key}` = {value!r} must be a finite number.")
        if self.std <= 0:
            raise SpecError(f"{where}: `std` = {self.std!r} must be > 0.")


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """One embedding table; several categorical features may share it.

    Attributes:
        name: table name (also the variable name).
        rows: number of rows (ids ``0..rows-1``).
        dim: embedding width.
        initializer: ``uniform`` (``U(-scale, scale)``, scale defaulting to
            ``1/sqrt(dim)``), ``truncated_normal`` (stddev ``scale``, default
            ``1/sqrt(dim)``) or ``zeros``.
        scale: optional scale of the initializer.
    """

    name: str
    rows: int
    dim: int
    initializer: str = "uniform"
    scale: float | None = None

    def __post_init__(self) -> None:
        where = f"table {self.name!r}"
        _check_name(where, self.name)
        _check_positive_int(where, "rows", self.rows)
        _check_positive_int(where, "dim", self.dim)
        _check_choice(where, "initializer", self.initializer, INITIALIZERS)
        if self.scale is not None and (
                isinstance(self.scale, bool) or not isinstance(self.scale, (int, float))
                or not self.scale > 0):
            raise SpecError(f"{where}: `scale` = {self.scale!r} must be > 0.")

    @property
    def bytes(self) -> int:
        """Size of the float32 table in bytes."""
        return self.rows * self.dim * 4


@dataclasses.dataclass(frozen=True)
class CategoricalFeature:
    """A categorical input column mapped to rows of an embedding table.

    Ids are ``row_offset + bucket`` where ``bucket`` is either a stable hash of
    the value's string form into ``hash_buckets`` buckets (FarmHash
    fingerprint64, the same TensorFlow op at conversion and at serving time) or
    the value's line in ``vocabulary_file`` (``0`` is reserved for
    out-of-vocabulary values, so a vocabulary of V lines uses V + 1 ids).

    Attributes:
        name: column name in the Parquet input.
        table: name of the :class:`TableConfig` this feature looks up.
        dtype: ``string`` or ``int64`` -- the raw type at serving time; ints are
            hashed through their decimal string form.
        hash_buckets: number of hash buckets (exclusive with vocabulary_file).
        vocabulary_file: path of a vocabulary, one value per line.
        row_offset: first table row used by this feature; features sharing a
            table with equal offsets share rows (same value, same embedding).
        max_length: 1 for a single value; > 1 for a multi-hot list column, of
            which the first ``max_length`` values are kept.
        combiner: how a multi-hot list is reduced: ``sum`` or ``mean``.
        required: when true, a null is a bad row; otherwise null is hashed as the
            empty string (its own "missing" bucket).
    """

    name: str
    table: str
    dtype: str = "string"
    hash_buckets: int | None = None
    vocabulary_file: str | None = None
    row_offset: int = 0
    max_length: int = 1
    combiner: str = "mean"
    required: bool = False

    def __post_init__(self) -> None:
        where = f"categorical feature {self.name!r}"
        _check_name(where, self.name)
        _check_choice(where, "dtype", self.dtype, CATEGORICAL_DTYPES)
        _check_choice(where, "combiner", self.combiner, COMBINERS)
        _check_positive_int(where, "max_length", self.max_length)
        if (self.hash_buckets is None) == (self.vocabulary_file is None):
            raise SpecError(
                    f"{where}: give exactly one of `hash_buckets` and `vocabulary_file` "
                    f"(got hash_buckets={self.hash_buckets!r}, "
                    f"vocabulary_file={self.vocabulary_file!r})."
            )
        if self.hash_buckets is not None:
            _check_positive_int(where, "hash_buckets", self.hash_buckets)
        if isinstance(self.row_offset, bool) or not isinstance(
                self.row_offset, int) or self.row_offset < 0:
            raise SpecError(
                    f"{where}: `row_offset` = {self.row_offset!r} must be an integer "
                    ">= 0."
            )

    @property
    def multi_hot(self) -> bool:
        return self.max_length > 1

    def vocabulary(self) -> list[str]:
        """Reads the vocabulary file (one value per line, blank lines ignored)."""
        if self.vocabulary_file is None:
            raise SpecError(f"feature {self.name!r} has no vocabulary_file.")
        path = Path(self.vocabulary_file)
        if not path.is_file():
            raise SpecError(
                    f"categorical feature {self.name!r}: `vocabulary_file` = "
                    f"{str(path)!r} does not exist; give an existing file (relative "
                    "paths are resolved against the spec file's folder)."
            )
        lines = path.read_text(encoding="utf-8").splitlines()
        return [line for line in lines if line]

    @property
    def num_ids(self) -> int:
        """Number of distinct ids this feature can produce."""
        if self.hash_buckets is not None:
            return self.hash_buckets
        return len(self.vocabulary()) + 1


@dataclasses.dataclass(frozen=True)
class LabelConfig:
    """The training target.

    Attributes:
        name: column name in the Parquet input.
        threshold: when given, label = ``value >= threshold`` (e.g. rating >= 4);
            otherwise the column must hold 0/1 and anything else is a bad row.
    """

    name: str = "label"
    threshold: float | None = None

    def __post_init__(self) -> None:
        _check_name("label", self.name)
        if self.threshold is not None and (
                isinstance(self.threshold, bool)
                or not isinstance(self.threshold, (int, float))
                or not math.isfinite(self.threshold)):
            raise SpecError(
                    f"label: `threshold` = {self.threshold!r} must be a finite number "
                    "or null."
            )


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
        object.__setattr__(self, "dense", tuple(self.dense))
        object.__setattr__(self, "categorical", tuple(self.categorical))
        object.__setattr__(self, "tables", tuple(self.tables))
        if not self.categorical and not self.dense:
            raise SpecError("spec: give at least one dense or categorical feature.")
        columns = [self.label.name] + [f.name for f in self.dense] + [
                f.name for f in self.categorical]
        seen: set[str] = set()
        for column in columns:
            if column in seen:
                raise SpecError(
                        f"spec: column {column!r} is used twice; each input column may be "
                        "one feature (share a table to share embeddings instead)."
                )
            seen.add(column)
        tables = {}
        for table in self.tables:
            if table.name in tables:
                raise SpecError(f"spec: table {table.name!r} is defined twice.")
            tables[table.name] = table
        used = set()
        for feature in self.categorical:
            table = tables.get(feature.table)
            if table is None:
                raise SpecError(
                        f"categorical feature {feature.name!r}: `table` = "
                        f"{feature.table!r} is not defined; defined tables: "
                        f"{sorted(tables) or 'none'}."
                )
            used.add(table.name)
            if feature.hash_buckets is not None:
                end = feature.row_offset + feature.hash_buckets
                if end > table.rows:
                    raise SpecError(
                            f"categorical feature {feature.name!r}: row_offset "
                            f"{feature.row_offset} + hash_buckets {feature.hash_buckets} = "
                            f"{end} exceeds table {table.name!r} rows = {table.rows}; "
                            "enlarge the table or lower the buckets."
                    )
        unused = sorted(set(tables) - used)
        if unused:
            raise SpecError(
                    f"spec: tables {unused} are not used by any categorical feature; "
                    "remove them."
            )

    # -- derived views -----------------------------------------------------

    def table(self, name: str) -> TableConfig:
        for table in self.tables:
            if table.name == name:
                return table
        raise KeyError(name)

    @property
    def columns(self) -> tuple[str, ...]:
        """Input columns this spec reads, label first."""
        return (self.label.name,) + tuple(f.name for f in self.dense) + tuple(
                f.name for f in self.categorical)

    @property
    def table_bytes(self) -> int:
        return sum(t.bytes for t in self.tables)

    def check_vocabularies(self) -> None:
        """Checks vocabulary-backed features fit their tables (reads the files)."""
        for feature in self.categorical:
            if feature.vocabulary_file is None:
                continue
            table = self.table(feature.table)
            end = feature.row_offset + feature.num_ids
            if end > table.rows:
                raise SpecError(
                        f"categorical feature {feature.name!r}: row_offset "
                        f"{feature.row_offset} + vocabulary size + 1 = {end} exceeds "
                        f"table {table.name!r} rows = {table.rows}."
                )

    # -- serialisation -------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        def _clean(obj: Any) -> dict[str, Any]:
            return {k: v for k, v in dataclasses.asdict(obj).items()}

        return {
                "name": self.name,
                "label": _clean(self.label),
                "tables": [_clean(t) for t in self.tables],
                "dense": [_clean(f) for f in self.dense],
                "categorical": [_clean(f) for f in self.categorical],
        }

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
                                base_dir: str | Path | None = None) -> "FeatureSpec":
        """Builds a spec from plain data, rejecting unknown keys.

        Args:
            data: the mapping read from YAML/JSON.
            base_dir: folder against which relative vocabulary paths resolve.
        """
        if not isinstance(data, Mapping):
            raise SpecError(
                    f"spec: expected a mapping at the top level, got "
                    f"{type(data).__name__}."
            )
        _reject_unknown("spec", data, ("name", "label", "tables", "dense",
                                                                      "categorical"))
        if "name" not in data:
            raise SpecError("spec: missing key `name`.")
        categorical = []
        for item in _list_of(data, "categorical"):
            feature = _build(CategoricalFeature, item, "categorical feature")
            if feature.vocabulary_file and base_dir is not None and not Path(
                    feature.vocabulary_file).is_absolute():
                feature = dataclasses.replace(
                        feature,
                        vocabulary_file=str(Path(base_dir) / feature.vocabulary_file))
            categorical.append(feature)
        return cls(
                name=data["name"],
                label=_build(LabelConfig, data.get("label", {}), "label"),
                dense=tuple(_build(DenseFeature, item, "dense feature")
                                        for item in _list_of(data, "dense")),
                categorical=tuple(categorical),
                tables=tuple(_build(TableConfig, item, "table")
                                          for item in _list_of(data, "tables")),
        )

    def save(self, path: str | Path) -> Path:
        """Writes the spec as YAML (``.yaml``/``.yml``) or JSON (anything else)."""
        path = Path(path)
        data = self.to_dict()
        if path.suffix in (".yaml", ".yml"):
            text = yaml.safe_dump(data, sort_keys=False)
        else:
            text = json.dumps(data, indent=2) + "\n"
        path.write_text(text, encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "FeatureSpec":
        """Reads a YAML or JSON spec file."""
        path = Path(path)
        if not path.is_file():
            raise SpecError(f"spec file {str(path)!r} does not exist.")
        text = path.read_text(encoding="utf-8")
        try:
            if path.suffix == ".json":
                data = json.loads(text)
            else:
                data = yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as error:
            raise SpecError(f"spec file {str(path)!r} is not valid: {error}") from None
        try:
            return cls.from_dict(data, base_dir=path.parent)
        except SpecError as error:
            raise SpecError(f"{path}: {error}") from None


def _reject_unknown(where: str, data: Mapping[str, Any],
                                        allowed: tuple[str, ...]) -> None:
    for key in data:
        if key not in allowed:
            raise SpecError(
                    f"{where}: unknown key {key!r}; allowed keys: {', '.join(allowed)}."
            )


def _list_of(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise SpecError(f"spec: `{key}` must be a list, got {type(value).__name__}.")
    return value


def _build(cls: type, item: Any, where: str) -> Any:
    if not isinstance(item, Mapping):
        raise SpecError(f"{where}: expected a mapping, got {item!r}.")
    fields = tuple(f.name for f in dataclasses.fields(cls))
    label = f"{where} {item.get('name', '?')!r}"
    _reject_unknown(label, item, fields)
    required = [f.name for f in dataclasses.fields(cls)
                            if f.default is dataclasses.MISSING
                            and f.default_factory is dataclasses.MISSING]
    for key in required:
        if key not in item:
            raise SpecError(f"{label}: missing required key `{key}`.")
    try:
        return cls(**item)
    except TypeError as error:
        raise SpecError(f"{label}: {error}") from None
