"""One bounded-memory pass of column statistics over Parquet files, for
``psrec spec infer`` (``data.infer.infer``).

Record batches are streamed; per column psrec keeps the row and null counts,
the running mean and variance (Chan's merge), min and max of the finite
numeric values, a seeded random sample (at most ``SAMPLE_CAP`` values) for
the median and of list lengths for their 95th percentile, and the distinct
count: an exact set of values up to ``exact_cap`` distinct values, beyond
which the set is dropped and a K-minimum-values sketch of 64-bit BLAKE2b
hashes (``SKETCH_K`` smallest hashes, relative error about 1/sqrt(K), ~1.6%)
estimates it. String columns also keep the time pattern of their first
value (``TEXT_TIME_PATTERNS``) and how many later values miss it; with a
``label``, every column counts its filled (non-null, non-empty) values
among positive and negative rows (a column filled for one class only is a
label leak).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from typing import Any
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from psrec.data.convert.inputs import parquet_batches
from psrec.data.convert.inputs import read_metadata
from psrec.errors import DataError
from psrec.features.spec.derived import parse_pattern
from psrec.progress import SILENT
from psrec.progress import Progress

EXACT_DISTINCT_CAP = 1_000_000
SKETCH_K = 4096
SAMPLE_CAP = 100_000
_BATCH_ROWS = 65_536
#: Fixed-width text times (``features.spec.derived`` patterns), most
#: specific first; a column matches the first that its first value matches.
TEXT_TIME_PATTERNS = ("YYYY-MM-DDTHH:mm:ssZ", "YYYY-MM-DDTHH:mm:ss",
                      "YYYY-MM-DD HH:mm:ss", "YYYY-MM-DDTHH:mm",
                      "YYYY-MM-DD HH:mm", "YYYY/MM/DD HH:mm:ss",
                      "YYYY-MM-DD", "YYYY/MM/DD")
#: Other ISO-8601 date-times (fractions of a second, UTC offsets): a time,
#: though no fixed-width pattern reads it.
ISO_TIME = (r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}"
            r"(:[0-9]{2}([.,][0-9]+)?)?(Z|[+-][0-9]{2}:?[0-9]{2})?")


def column_kind(arrow_type: pa.DataType) -> str:
    """``int``, ``float``, ``string``, ``bool``, ``list-int``,
    ``list-string``, ``list-other`` or ``other``."""
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        inner = column_kind(arrow_type.value_type)
        return f"list-{inner if inner in ('int', 'string') else 'other'}"
    if pa.types.is_boolean(arrow_type):
        return "bool"
    if pa.types.is_integer(arrow_type):
        return "int"
    if pa.types.is_floating(arrow_type):
        return "float"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "string"
    return "other"


class DistinctCounter:
    """Exact distinct values up to ``cap``, then a KMV estimate."""

    def __init__(self, cap: int = EXACT_DISTINCT_CAP, k: int = SKETCH_K):
        self.cap, self.k = cap, k
        self.exact: set[Any] | None = set()
        self._hashes = np.zeros(0, np.uint64)

    def add(self, uniques: list[Any]) -> None:
        """Adds a batch's distinct values."""
        if self.exact is not None:
            self.exact.update(uniques)
            if len(self.exact) <= self.cap:
                return
            uniques, self.exact = list(self.exact), None
        hashes = np.fromiter(
            (int.from_bytes(hashlib.blake2b(str(v).encode(), digest_size=8)
                            .digest(), "little") for v in uniques),
            np.uint64, len(uniques))
        self._hashes = np.unique(np.concatenate([self._hashes, hashes]))[
            :self.k]

    @property
    def is_exact(self) -> bool:
        return self.exact is not None

    @property
    def count(self) -> int:
        if self.exact is not None:
            return len(self.exact)
        if len(self._hashes) < self.k:
            return len(self._hashes)
        kth = float(self._hashes[self.k - 1]) / 2.0 ** 64
        return int(round((self.k - 1) / kth))


@dataclasses.dataclass
class ColumnStats:
    """Statistics of one column; numeric moments over finite values."""

    name: str
    kind: str
    arrow_type: str
    distinct: DistinctCounter
    rows: int = 0
    nulls: int = 0
    nonfinite: int = 0
    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    minimum: float = math.inf
    maximum: float = -math.inf
    sample: np.ndarray = dataclasses.field(
        default_factory=lambda: np.zeros(0))
    time_pattern: str | None = None  # a TEXT_TIME_PATTERNS entry or "ISO"
    time_regex: str | None = None
    time_misses: int = 0
    positives: int = 0  # rows of each class (with a label)
    negatives: int = 0
    filled_positives: int = 0  # filled values among them
    filled_negatives: int = 0

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count else 0.0

    @property
    def null_share(self) -> float:
        return self.nulls / self.rows if self.rows else 0.0

    def quantile(self, q: float) -> float:
        return float(np.quantile(self.sample, q)) if len(self.sample) else 0.0

    def add_numbers(self, values: np.ndarray, rng: np.random.Generator
                    ) -> None:
        """Moments, range and sample of ``values`` (nulls already gone)."""
        finite = np.isfinite(values)
        self.nonfinite += int((~finite).sum())
        values = values[finite]
        if not len(values):
            return
        n, mean = len(values), float(values.mean())
        m2 = float(((values - mean) ** 2).sum())
        total = self.count + n
        delta = mean - self.mean
        self.m2 += m2 + delta * delta * self.count * n / total
        self.mean += delta * n / total
        self.count = total
        self.minimum = min(self.minimum, float(values.min()))
        self.maximum = max(self.maximum, float(values.max()))
        self._add_sample(values, rng)

    def _add_sample(self, values: np.ndarray, rng: np.random.Generator
                    ) -> None:
        sample = np.concatenate([self.sample, values.astype(np.float64)])
        if len(sample) > SAMPLE_CAP:
            sample = rng.choice(sample, SAMPLE_CAP, replace=False)
        self.sample = sample

    def add_classes(self, column: pa.Array, positive: np.ndarray,
                    negative: np.ndarray) -> None:
        """Counts the filled values among positive and negative rows."""
        filled = pc.is_valid(column)
        if self.kind == "string":
            filled = pc.and_(filled, pc.not_equal(column, ""))
        elif self.kind.startswith("list"):
            filled = pc.and_(filled, pc.greater(
                pc.list_value_length(column), 0))
        filled = np.asarray(pc.fill_null(filled, False).to_numpy(
            zero_copy_only=False), bool)
        self.positives += int(positive.sum())
        self.negatives += int(negative.sum())
        self.filled_positives += int((filled & positive).sum())
        self.filled_negatives += int((filled & negative).sum())

    def _add_times(self, present: pa.Array) -> None:
        """Checks text values against the column's time pattern (chosen
        from its first non-empty value)."""
        values = present.filter(pc.not_equal(present, ""))
        if not len(values):
            return
        if self.time_pattern is None:
            first = values[0].as_py()
            for pattern in TEXT_TIME_PATTERNS:
                regex = parse_pattern(pattern)[0]
                if re.fullmatch(regex, first):
                    break
            else:
                pattern, regex = "ISO", ISO_TIME
                if not re.fullmatch(regex, first):
                    self.time_misses += 1
                    return
            self.time_pattern, self.time_regex = pattern, regex
        if self.time_misses:
            return
        matched = pc.match_substring_regex(values, f"^(?:{self.time_regex})$")
        self.time_misses += len(values) - int(pc.sum(matched).as_py() or 0)

    def add_batch(self, column: pa.Array, rng: np.random.Generator) -> None:
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        self.rows += len(column)
        self.nulls += column.null_count
        present = column.drop_null()
        if self.kind.startswith("list"):
            lengths = pc.list_value_length(present).to_numpy(
                zero_copy_only=False)
            lengths = np.asarray(lengths, np.float64)
            if len(lengths):
                self.maximum = max(self.maximum, float(lengths.max()))
            self._add_sample(lengths, rng)
            present = _drop_padding(pc.list_flatten(present))
            if self.kind == "list-other":
                return
        elif self.kind in ("int", "float"):
            self.add_numbers(np.asarray(pc.cast(present, pa.float64())
                                        .to_numpy(zero_copy_only=False)), rng)
        elif self.kind == "string" and not self.time_misses:
            self._add_times(present)
        if self.kind != "other":
            self.distinct.add(pc.unique(present).to_pylist())


def _drop_padding(values: pa.Array) -> pa.Array:
    """List elements that are not padding (null, ``""``, ``-1``)."""
    values = values.drop_null()
    if pa.types.is_integer(values.type):
        return values.filter(pc.not_equal(values, -1))
    if pa.types.is_string(values.type) or pa.types.is_large_string(
            values.type):
        return values.filter(pc.not_equal(values, ""))
    return values


def _check_same_schema(path: str, schema: pa.Schema,
                       first_path: str, first: pa.Schema) -> None:
    if schema.names != first.names:
        raise DataError(
            f"{path}: columns {schema.names} differ from those of "
            f"{first_path} ({first.names}); infer a spec from files of one "
            "schema.")
    for field, other in zip(schema, first):
        if column_kind(field.type) != column_kind(other.type):
            raise DataError(
                f"{path}: column {field.name!r} has type {field.type}, "
                f"{first_path} has {other.type}; infer a spec from files of "
                "one schema.")


def _classes(column: pa.Array, threshold: float | None
             ) -> tuple[np.ndarray, np.ndarray] | None:
    """(positive, negative) row masks of a numeric label (null: neither);
    positive is ``value >= threshold``, or ``value == 1`` without one."""
    if column_kind(column.type) not in ("int", "float", "bool"):
        return None
    values = pc.cast(column, pa.float64())
    positive = (pc.greater_equal(values, threshold) if threshold is not None
                else pc.equal(values, 1.0))
    valid = np.asarray(pc.is_valid(values).to_numpy(zero_copy_only=False),
                       bool)
    positive = np.asarray(pc.fill_null(positive, False).to_numpy(
        zero_copy_only=False), bool) & valid
    return positive, valid & ~positive


def collect_stats(files: Sequence[str], columns: Sequence[str] | None = None,
                  *, exact_cap: int = EXACT_DISTINCT_CAP, seed: int = 0,
                  label: str | None = None, threshold: float | None = None,
                  progress: Progress = SILENT
                  ) -> tuple[pa.Schema, dict[str, ColumnStats]]:
    """One pass over ``files`` (all of one schema); ``columns``: the columns
    to describe (default all); ``label`` (with ``threshold``, see
    ``_classes``): count each column's filled values per class, when the
    label is a numeric column; ``progress`` is told the rows read (their
    total from the Parquet metadata). Returns the first file's schema and
    the statistics by column name."""
    if not files:
        raise DataError("no Parquet files to infer a spec from.")
    rng = np.random.default_rng(seed)
    schema = read_metadata(files[0]).schema.to_arrow_schema()
    names = list(schema.names if columns is None else columns)
    read = names + ([label] if label in schema.names and label not in names
                    else [])
    stats = {name: ColumnStats(name, column_kind(schema.field(name).type),
                               str(schema.field(name).type),
                               DistinctCounter(exact_cap))
             for name in names}
    metadata = {path: read_metadata(path) for path in files}
    total = sum(m.num_rows for m in metadata.values())
    with progress.task("spec infer: statistics", total, "rows") as task:
        for path in files:
            _check_same_schema(path, metadata[path].schema.to_arrow_schema(),
                               files[0], schema)
            for batch in parquet_batches(path, batch_size=_BATCH_ROWS,
                                         columns=read):
                classes = (_classes(batch.column(label), threshold)
                           if label in read else None)
                for name in names:
                    stats[name].add_batch(batch.column(name), rng)
                    if classes is not None:
                        stats[name].add_classes(batch.column(name), *classes)
                task.advance(batch.num_rows)
    return schema, stats
