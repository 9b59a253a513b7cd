"""Parquet -> sharded TFRecord conversion (``psrec convert``).

The conversion streams Parquet record batches (never the whole dataset),
checks every file's schema against the spec before reading a row, sends bad
rows to a quarantine Parquet with their source file, row and reason, encodes
categorical values with the same TensorFlow ops used at serving time, packs
rows into block records (see ``data.records``) and writes them round-robin to
N shards under temporary names. Shards are renamed when all are complete and
``manifest.json`` is written last, so an interrupted run leaves nothing under
a final name, and a re-run on the same input is byte-identical.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import time
from pathlib import Path
from typing import Iterator
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import tensorflow as tf

from psrec.data.manifest import MANIFEST_NAME
from psrec.data.manifest import Manifest
from psrec.data.manifest import ShardInfo
from psrec.data.manifest import sha256_file
from psrec.data.records import PAD_ID
from psrec.data.records import encode_block
from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.features.spec import DENSE_COLUMN
from psrec.features.spec import ID_COLUMN
from psrec.features.spec import CategoricalFeature
from psrec.features.spec import FeatureSpec
from psrec.features.transforms import CategoricalEncoder

SPLIT_MODES = ("tail", "hash")
QUARANTINE_NAME = "quarantine.parquet"
_SHARD_RE = re.compile(r"^(train|eval)-\d{5}-of-\d{5}\.tfrecord$")
_QUARANTINE_SCHEMA = pa.schema([
    ("source_file", pa.string()), ("row", pa.int64()),
    ("reason", pa.string()), ("record", pa.string())])


class SchemaError(ConfigError):
    """A Parquet file's schema does not match the spec."""


class BadDataError(DataError):
    """Too many rows failed the row checks."""


@dataclasses.dataclass(frozen=True)
class ConversionOptions:
    """Options of one conversion.

    Attributes:
      shards: number of train shards (>= the number of input pipelines that
        will read them).
      eval_fraction: share of rows in the eval split, in [0, 1).
      split_mode: ``tail`` -- the last rows (time-ordered logs: evaluate on
        the most recent data) -- or ``hash`` -- a stable hash of the row id.
      eval_shards: number of eval shards (default: ``shards``).
      block_rows: rows packed per record.
      max_bad_fraction: above this share of bad rows the conversion fails.
      batch_rows: Parquet rows read per batch.
    """

    shards: int = 4
    eval_fraction: float = 0.0
    split_mode: str = "tail"
    eval_shards: int | None = None
    block_rows: int = 256
    max_bad_fraction: float = 0.001
    batch_rows: int = 65_536

    def __post_init__(self) -> None:
        for key in ("shards", "block_rows", "batch_rows"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"`{key}` = {value!r} must be an integer >= 1.")
        if self.eval_shards is not None and self.eval_shards < 1:
            raise ValueError(
                f"`eval_shards` = {self.eval_shards!r} must be >= 1.")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"`eval_fraction` = {self.eval_fraction!r} must "
                             "be in [0, 1).")
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ValueError(f"`max_bad_fraction` = {self.max_bad_fraction!r} "
                             "must be in [0, 1].")
        if self.split_mode not in SPLIT_MODES:
            raise ValueError(f"`split_mode` = {self.split_mode!r}; use one of "
                             f"{', '.join(SPLIT_MODES)}.")


@dataclasses.dataclass(frozen=True)
class ConversionReport:
    """What a conversion did; ``summary()`` is what the CLI prints."""

    manifest: Manifest | None
    rows_read: int
    rows_written: dict[str, int]
    bad_rows: int
    bad_reasons: dict[str, int]
    extra_columns: dict[str, tuple[str, ...]]
    truncated_lists: dict[str, int]
    quarantine: str | None
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.rows_read / self.seconds if self.seconds else float("inf")

    def summary(self) -> str:
        lines = [
            f"read {self.rows_read} rows in {self.seconds:.2f} s "
            f"({self.rows_per_second:,.0f} rows/s); wrote "
            + ", ".join(f"{k} {v}" for k, v in self.rows_written.items()),
            f"bad rows: {self.bad_rows}"
            + (f" -> {self.quarantine}" if self.quarantine else ""),
        ]
        lines += [f"  {count} x {reason}"
                  for reason, count in sorted(self.bad_reasons.items())]
        for path, extras in self.extra_columns.items():
            lines.append(f"ignored extra columns in {path}: {', '.join(extras)}")
        for name, count in self.truncated_lists.items():
            lines.append(f"multi-hot {name}: {count} lists cut to max_length")
        if self.manifest is not None:
            lines.append(f"manifest: {self.manifest.root / MANIFEST_NAME}")
        return "\n".join(lines)


# -- schema checks -----------------------------------------------------------


def _type_ok(arrow_type: pa.DataType, kind: str) -> bool:
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    if kind == "number":
        return pa.types.is_integer(arrow_type) or pa.types.is_floating(
            arrow_type)
    if kind == "label":
        return _type_ok(arrow_type, "number") or pa.types.is_boolean(arrow_type)
    if kind == "string":
        return pa.types.is_string(arrow_type) or pa.types.is_large_string(
            arrow_type)
    if kind == "int64":
        return pa.types.is_integer(arrow_type)
    raise AssertionError(kind)


def _expected_kinds(spec: FeatureSpec) -> dict[str, tuple[str, bool]]:
    """column -> (value kind, is a list)."""
    kinds = {spec.label.name: ("label", False)}
    kinds.update({f.name: ("number", False) for f in spec.dense})
    kinds.update({f.name: (f.dtype, f.multi_hot) for f in spec.categorical})
    return kinds


_KIND_TEXT = {"number": "an integer or floating column",
              "label": "an integer, boolean or floating column",
              "string": "a string column", "int64": "an integer column"}


def check_schema(path: str, schema: pa.Schema,
                 spec: FeatureSpec) -> tuple[str, ...]:
    """Checks a file's schema against the spec before any row is read.

    Returns:
      The extra columns, which are ignored.

    Raises:
      SchemaError: naming the file and the first missing or mistyped column.
    """
    for column, (kind, is_list) in _expected_kinds(spec).items():
        index = schema.get_field_index(column)
        if index < 0:
            raise SchemaError(
                f"{path}: column {column!r} required by spec "
                f"{spec.name!r} is missing (found: {', '.join(schema.names)}); "
                "fix the input or the spec -- psrec does not fill missing "
                "columns with nulls.")
        arrow_type = schema.field(index).type
        if is_list:
            ok = (pa.types.is_list(arrow_type)
                  or pa.types.is_large_list(arrow_type)) and _type_ok(
                      arrow_type.value_type, kind)
            want = f"a list of {_KIND_TEXT[kind].replace(' column', '')}s"
        else:
            ok = _type_ok(arrow_type, kind)
            want = _KIND_TEXT[kind]
        if not ok:
            raise SchemaError(
                f"{path}: column {column!r} has type {arrow_type}, spec "
                f"{spec.name!r} needs {want}; fix the input's type or the "
                "spec.")
    wanted = set(spec.columns)
    return tuple(name for name in schema.names if name not in wanted)


# -- row checks ---------------------------------------------------------------


def _null_mask(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(pc.is_null(column).to_numpy(zero_copy_only=False))


def _float_values(column: pa.Array, fill: float) -> np.ndarray:
    """float64 values with nulls replaced by ``fill``."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    return np.asarray(pc.fill_null(pc.cast(column, pa.float64()), fill)
                      .to_numpy(zero_copy_only=False))


def _row_reasons(batch: pa.RecordBatch, spec: FeatureSpec) -> np.ndarray:
    """The first failed check of each row as a string, None for good rows."""
    reasons = np.full(batch.num_rows, None, dtype=object)

    def flag(mask: np.ndarray, reason: str) -> None:
        mask = mask & (reasons == None)  # noqa: E711 (elementwise)
        reasons[mask] = reason

    label = batch.column(spec.label.name)
    flag(_null_mask(label), f"null in required field {spec.label.name!r}")
    values = _float_values(label, 0.0)
    flag(~np.isfinite(values), f"non-finite label {spec.label.name!r}")
    if spec.label.threshold is None:
        bad = np.isfinite(values) & (values != 0) & (values != 1)
        for value in np.unique(values[bad & (reasons == None)]):  # noqa: E711
            flag(bad & (values == value),
                 f"label {spec.label.name!r} = {value:g} is not 0/1")
    for feature in spec.dense:
        column = batch.column(feature.name)
        nulls = _null_mask(column)
        if feature.required:
            flag(nulls, f"null in required field {feature.name!r}")
        values = _float_values(column, feature.default)
        flag(~np.isfinite(values), f"non-finite value in {feature.name!r}")
    for feature in spec.categorical:
        if feature.required:
            flag(_null_mask(batch.column(feature.name)),
                 f"null in required field {feature.name!r}")
    return reasons


# -- encoding -----------------------------------------------------------------


def _strings(column: pa.Array) -> np.ndarray:
    """Values in their hashed string form; null -> the missing token ""."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if not (pa.types.is_string(column.type)
            or pa.types.is_large_string(column.type)):
        column = pc.cast(column, pa.string())
    return pc.fill_null(column, "").to_numpy(zero_copy_only=False)


def _encode_categorical(column: pa.Array, feature: CategoricalFeature,
                        encoder: CategoricalEncoder) -> tuple[np.ndarray, int]:
    """Row ids ([n] or [n, L] padded with -1) and the count of cut lists."""
    if not feature.multi_hot:
        if len(column) == 0:
            return np.zeros([0], np.int64), 0
        return encoder.encode(feature.name, _strings(column)).numpy(), 0
    column = pc.fill_null(column, pa.scalar([], column.type))
    lengths = np.asarray(pc.list_value_length(column).to_numpy(
        zero_copy_only=False), np.int64)
    truncated = int((lengths > feature.max_length).sum())
    values = pc.list_flatten(column)
    out = np.full([len(column), feature.max_length], PAD_ID, np.int64)
    if len(values):
        ids = encoder.encode(feature.name, _strings(values)).numpy()
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        position = np.arange(len(ids)) - starts
        rows = np.repeat(np.arange(len(column)), lengths)
        keep = position < feature.max_length
        out[rows[keep], position[keep]] = ids[keep]
    return out, truncated


def _encode_rows(batch: pa.RecordBatch, spec: FeatureSpec,
                 encoder: CategoricalEncoder,
                 truncated: collections.Counter) -> dict[str, np.ndarray]:
    label = _float_values(batch.column(spec.label.name), 0.0)
    if spec.label.threshold is not None:
        label = (label >= spec.label.threshold)
    columns = {spec.label.name: label.astype("<f4")}
    if spec.dense:
        columns[DENSE_COLUMN] = np.stack(
            [_float_values(batch.column(f.name), f.default)
             for f in spec.dense], axis=1).astype("<f4")
    for feature in spec.categorical:
        ids, cut = _encode_categorical(batch.column(feature.name), feature,
                                       encoder)
        columns[feature.name] = ids.astype("<i8")
        if cut:
            truncated[feature.name] += cut
    return columns


def _is_eval(ids: np.ndarray, total_rows: int,
             options: ConversionOptions) -> np.ndarray:
    if options.eval_fraction == 0:
        return np.zeros(len(ids), bool)
    if options.split_mode == "tail":
        cut = total_rows - int(round(total_rows * options.eval_fraction))
        return ids >= cut
    # splitmix64 of the id: a stable, well-mixed hash in pure numpy.
    z = ids.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(1_000_000)) < np.uint64(
        int(options.eval_fraction * 1_000_000))


# -- writing ------------------------------------------------------------------


class _SplitWriter:
    """Cuts a stream of rows into blocks written round-robin to shards."""

    def __init__(self, out_dir: Path, split: str, num_shards: int,
                 block_rows: int) -> None:
        self.names = [f"{split}-{i:05d}-of-{num_shards:05d}.tfrecord"
                      for i in range(num_shards)]
        self.tmp_paths = [out_dir / f".{name}.tmp" for name in self.names]
        self._writers = [tf.io.TFRecordWriter(str(p)) for p in self.tmp_paths]
        self._rows = [0] * num_shards
        self._pending: list[dict[str, np.ndarray]] = []
        self._pending_rows = 0
        self._blocks = 0
        self._block_rows = block_rows

    def add(self, columns: dict[str, np.ndarray]) -> None:
        rows = len(columns[ID_COLUMN])
        if not rows:
            return
        self._pending.append(columns)
        self._pending_rows += rows
        if self._pending_rows >= self._block_rows:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        if not self._pending:
            return
        merged = {k: np.concatenate([p[k] for p in self._pending])
                  for k in self._pending[0]}
        total = len(merged[ID_COLUMN])
        full = total - total % self._block_rows
        end = total if final else full
        for start in range(0, end, self._block_rows):
            block = {k: v[start:start + self._block_rows]
                     for k, v in merged.items()}
            shard = self._blocks % len(self._writers)
            self._writers[shard].write(encode_block(block))
            self._rows[shard] += len(block[ID_COLUMN])
            self._blocks += 1
        rest = {k: v[end:] for k, v in merged.items()}
        self._pending = [rest] if total > end else []
        self._pending_rows = total - end

    def close(self) -> None:
        self._flush(final=True)
        for writer in self._writers:
            writer.close()

    def publish(self, out_dir: Path) -> tuple[ShardInfo, ...]:
        infos = []
        for name, tmp, rows in zip(self.names, self.tmp_paths, self._rows):
            infos.append(ShardInfo(file=name, rows=rows,
                                   bytes=tmp.stat().st_size,
                                   sha256=sha256_file(tmp)))
            os.replace(tmp, out_dir / name)
        return tuple(infos)

    def discard(self) -> None:
        for path in self.tmp_paths:
            path.unlink(missing_ok=True)


class _Quarantine:
    """Streams bad rows to a Parquet file under a temporary name."""

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / QUARANTINE_NAME
        self._tmp = out_dir / f".{QUARANTINE_NAME}.tmp"
        self._writer: pq.ParquetWriter | None = None
        self.reasons: collections.Counter = collections.Counter()

    def add(self, source: str, first_row: int, rows: np.ndarray,
            reasons: np.ndarray, batch: pa.RecordBatch) -> None:
        """Adds rows ``rows`` of ``batch``, whose first row is row
        ``first_row`` of ``source``."""
        records = [json.dumps(r, default=str, sort_keys=True)
                   for r in batch.take(pa.array(rows)).to_pylist()]
        self.reasons.update(reasons.tolist())
        table = pa.table({"source_file": [source] * len(rows),
                          "row": rows.astype(np.int64) + first_row,
                          "reason": reasons.tolist(), "record": records},
                         schema=_QUARANTINE_SCHEMA)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._tmp, _QUARANTINE_SCHEMA)
        self._writer.write_table(table)

    @property
    def count(self) -> int:
        return sum(self.reasons.values())

    def close(self) -> str | None:
        if self._writer is None:
            self.path.unlink(missing_ok=True)
            return None
        self._writer.close()
        os.replace(self._tmp, self.path)
        return str(self.path)

    def discard(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._tmp.unlink(missing_ok=True)


def _batches(path: str, columns: Sequence[str],
             batch_rows: int) -> Iterator[pa.RecordBatch]:
    yield from pq.ParquetFile(path).iter_batches(batch_size=batch_rows,
                                                 columns=list(columns))


def _clean_previous(out_dir: Path) -> None:
    """Removes the old manifest first, so stale shards are never published."""
    (out_dir / MANIFEST_NAME).unlink(missing_ok=True)
    for path in out_dir.glob(".*.tmp*"):
        path.unlink()


def convert(parquet_paths: Sequence[str | Path], spec: FeatureSpec,
            out_dir: str | Path,
            options: ConversionOptions = ConversionOptions()
            ) -> ConversionReport:
    """Converts Parquet files to sharded block TFRecords plus a manifest.

    Args:
      parquet_paths: input files, read in the given order (row ids follow it).
      spec: the feature spec.
      out_dir: output folder (created).
      options: see :class:`ConversionOptions`.

    Returns:
      A report; ``report.manifest`` is the written manifest.

    Raises:
      SchemaError: a file's schema does not match the spec (before any row is
        read from any file).
      BadDataError: bad rows exceed ``options.max_bad_fraction`` (the
        quarantine is still written; no shard or manifest is published).
    """
    start = time.perf_counter()
    paths = [str(p) for p in parquet_paths]
    if not paths:
        raise ValueError("give at least one Parquet file to convert.")
    for path in paths:
        if not Path(path).is_file():
            raise FileNotFoundError(f"input Parquet file {path} does not exist.")
    spec.check_vocabularies()
    extras, sources = {}, []
    for path in paths:  # every schema is checked before any row is read
        metadata = pq.read_metadata(path)
        found = check_schema(path, metadata.schema.to_arrow_schema(), spec)
        if found:
            extras[path] = found
        sources.append({"file": path, "rows": metadata.num_rows})
    total_rows = sum(s["rows"] for s in sources)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _clean_previous(out)
    encoder = CategoricalEncoder(spec)
    writers = {"train": _SplitWriter(out, "train", options.shards,
                                     options.block_rows)}
    if options.eval_fraction > 0:
        writers["eval"] = _SplitWriter(
            out, "eval", options.eval_shards or options.shards,
            options.block_rows)
    quarantine = _Quarantine(out)
    truncated: collections.Counter = collections.Counter()
    next_id = 0
    try:
        for path in paths:
            row_in_file = 0
            for batch in _batches(path, spec.columns, options.batch_rows):
                ids = np.arange(next_id, next_id + batch.num_rows,
                                dtype=np.int64)
                reasons = _row_reasons(batch, spec)
                bad = reasons != None  # noqa: E711 (elementwise)
                if bad.any():
                    rows = np.flatnonzero(bad)
                    quarantine.add(path, row_in_file, rows, reasons[bad],
                                   batch)
                    keep = np.flatnonzero(~bad)
                    batch = batch.take(pa.array(keep))
                    ids = ids[keep]
                columns = _encode_rows(batch, spec, encoder, truncated)
                columns[ID_COLUMN] = ids
                to_eval = _is_eval(ids, total_rows, options)
                writers["train"].add({k: v[~to_eval]
                                      for k, v in columns.items()})
                if "eval" in writers:
                    writers["eval"].add({k: v[to_eval]
                                         for k, v in columns.items()})
                next_id += len(reasons)
                row_in_file += len(reasons)
        for writer in writers.values():
            writer.close()
        bad_rows = quarantine.count
        if total_rows and bad_rows / total_rows > options.max_bad_fraction:
            for writer in writers.values():
                writer.discard()
            quarantine_path = quarantine.close()
            raise BadDataError(
                f"{bad_rows} of {total_rows} rows "
                f"({bad_rows / total_rows:.3%}) failed the row checks, above "
                f"--max-bad-fraction {options.max_bad_fraction:g}; see "
                f"{quarantine_path} (reasons: {dict(quarantine.reasons)}). "
                "No shard was written; fix the input or raise the limit.")
        shards = {split: writer.publish(out)
                  for split, writer in writers.items()}
        shards.setdefault("eval", ())
        quarantine_path = quarantine.close()
    except BaseException:
        for writer in writers.values():
            writer.discard()
        quarantine.discard()
        raise
    for stale in out.iterdir():  # shards of an earlier, different conversion
        if _SHARD_RE.match(stale.name) and not any(
                stale.name == s.file for v in shards.values() for s in v):
            stale.unlink()
    manifest = Manifest(
        root=out, spec_name=spec.name, spec_hash=spec.fingerprint(),
        block_rows=options.block_rows, shards=shards,
        split={"mode": options.split_mode,
               "eval_fraction": options.eval_fraction},
        bad_rows=quarantine.count,
        quarantine=QUARANTINE_NAME if quarantine_path else None,
        sources=tuple(sources))
    manifest.write()
    return ConversionReport(
        manifest=manifest, rows_read=total_rows,
        rows_written={k: sum(s.rows for s in v) for k, v in shards.items()},
        bad_rows=quarantine.count, bad_reasons=dict(quarantine.reasons),
        extra_columns=extras, truncated_lists=dict(truncated),
        quarantine=quarantine_path, seconds=time.perf_counter() - start)

