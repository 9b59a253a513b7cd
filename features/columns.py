"""The parts of a feature spec: the label, dense and categorical features,
and the embedding tables the categorical features look up. Each checks its
own values on construction; :class:`features.spec.FeatureSpec` checks how
they fit together."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from psrec.errors import ConfigError

DENSE_TRANSFORMS = ("none", "log1p", "standardize")
COMBINERS = ("sum", "mean")
CATEGORICAL_DTYPES = ("string", "int64")
INITIALIZERS = ("uniform", "truncated_normal", "zeros")

class SpecError(ConfigError):
    """A feature spec is malformed; the message names the key and the value."""


def _check_choice(where: str, key: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise SpecError(f"{where}: `{key}` = {value!r} is not allowed; use one "
                        f"of {', '.join(map(repr, allowed))}.")


def _check_int(where: str, key: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(
            f"{where}: `{key}` = {value!r} must be "
            + ("a positive integer." if minimum == 1 else
               f"an integer >= {minimum}."))


def _check_number(where: str, key: str, value: Any, *,
                  positive: bool = False, optional: bool = False) -> None:
    """A finite number (> 0 if ``positive``; None allowed if ``optional``)."""
    if value is None and optional:
        return
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or (positive and value <= 0)):
        want = "> 0" if positive else "a finite number"
        raise SpecError(f"{where}: `{key}` = {value!r} must be {want}"
                        + (" or null." if optional else "."))


def _check_name(where: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise SpecError(
            f"{where}: `name` = {value!r} must be a non-empty string.")


@dataclasses.dataclass(frozen=True)
class DenseFeature:
    """A numeric input column.

    Attributes:
        name: column name in the Parquet input.
        transform: ``none``; ``log1p`` (``log(1 + max(x, 0))``: Criteo's
            counts have a few negatives, which are clipped to 0); or
            ``standardize`` (``(x - mean) / std`` with the stored statistics).
        mean, std: the statistics of ``standardize`` (``std`` > 0).
        default: value used where the input is missing (null in Parquet, NaN
            at serving time).
        required: when true, a null is a bad row (quarantined) instead of
            being replaced by ``default``.
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
            _check_number(where, key, getattr(self, key))
        _check_number(where, "std", self.std, positive=True)


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """One embedding table; several categorical features may share it.

    Attributes:
        name: table name (also the variable name).
        rows: number of rows (ids ``0..rows-1``).
        dim: embedding width.
        initializer: ``uniform`` (``U(-scale, scale)``), ``truncated_normal``
            (stddev ``scale``) or ``zeros``.
        scale: scale of the initializer; default ``1/sqrt(dim)``.
    """

    name: str
    rows: int
    dim: int
    initializer: str = "uniform"
    scale: float | None = None

    def __post_init__(self) -> None:
        where = f"table {self.name!r}"
        _check_name(where, self.name)
        _check_int(where, "rows", self.rows)
        _check_int(where, "dim", self.dim)
        _check_choice(where, "initializer", self.initializer, INITIALIZERS)
        _check_number(where, "scale", self.scale, positive=True, optional=True)

    @property
    def bytes(self) -> int:
        """Size of the float32 table in bytes."""
        return self.rows * self.dim * 4


@dataclasses.dataclass(frozen=True)
class CategoricalFeature:
    """A categorical input column mapped to rows of an embedding table.

    Ids are ``row_offset + bucket`` where ``bucket`` is either a stable hash
    of the value's string form into ``hash_buckets`` buckets (FarmHash
    fingerprint64, the same TensorFlow op at conversion and at serving time)
    or the value's line in ``vocabulary_file`` (``0`` is reserved for
    out-of-vocabulary values, so a vocabulary of V lines uses V + 1 ids).

    Attributes:
        name: column name in the Parquet input.
        table: name of the :class:`TableConfig` this feature looks up.
        dtype: ``string`` or ``int64`` -- the raw type at serving time; ints
            are hashed through their decimal string form.
        hash_buckets: number of hash buckets (exclusive with vocabulary_file).
        vocabulary_file: path of a vocabulary, one value per line.
        row_offset: first table row used by this feature; features sharing a
            table with equal offsets share rows (same value, same embedding).
        max_length: 1 for a single value; > 1 for a multi-hot list column,
            of which the first ``max_length`` non-padding values are kept
            (null, ``""`` and ``-1`` elements are padding).
        combiner: how a multi-hot list is reduced: ``sum`` or ``mean``.
        required: when true, a null is a bad row; otherwise null is hashed as
            the empty string (its own "missing" bucket).
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
        _check_int(where, "max_length", self.max_length)
        if (self.hash_buckets is None) == (self.vocabulary_file is None):
            raise SpecError(
                f"{where}: give exactly one of `hash_buckets` and "
                f"`vocabulary_file` (got hash_buckets={self.hash_buckets!r}, "
                f"vocabulary_file={self.vocabulary_file!r}).")
        if self.hash_buckets is not None:
            _check_int(where, "hash_buckets", self.hash_buckets)
        _check_int(where, "row_offset", self.row_offset, minimum=0)

    @property
    def multi_hot(self) -> bool:
        return self.max_length > 1

    def vocabulary(self) -> list[str]:
        """Reads the vocabulary file (one value per line, blank lines
        ignored)."""
        if self.vocabulary_file is None:
            raise SpecError(f"feature {self.name!r} has no vocabulary_file.")
        path = Path(self.vocabulary_file)
        if not path.is_file():
            raise SpecError(
                f"categorical feature {self.name!r}: `vocabulary_file` = "
                f"{str(path)!r} does not exist; give an existing file "
                "(relative paths are resolved against the spec file's "
                "folder).")
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
        threshold: when given, label = ``value >= threshold`` (e.g. rating
            >= 4); otherwise the column must hold 0/1 and anything else is a
            bad row.
    """

    name: str = "label"
    threshold: float | None = None

    def __post_init__(self) -> None:
        _check_name("label", self.name)
        _check_number("label", "threshold", self.threshold, optional=True)
