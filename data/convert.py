"""Parquet -> sharded TFRecord conversion (``psrec convert``).

The conversion streams Parquet record batches (never the whole dataset),
checks every file's schema against the spec before reading a row and then
every row (``data.input_checks``), sends bad rows to a quarantine Parquet
with their source file, row and reason, encodes categorical values with the
same TensorFlow ops used at serving time, packs rows into block records
(``data.records``) and writes them round-robin to N shards under temporary
names (``data.shard_writer``). Shards are renamed when all are complete and
``manifest.json`` is written last, so an interrupted run leaves nothing under
a final name, and a re-run on the same input is byte-identical.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from psrec.data.input_checks import check_schema
from psrec.data.input_checks import float_values
from psrec.data.input_checks import row_reasons
from psrec.data.manifest import MANIFEST_NAME
from psrec.data.manifest import Manifest
from psrec.data.records import PAD_ID
from psrec.data.shard_writer import QUARANTINE_NAME
from psrec.data.shard_writer import SHARD_NAME_RE
from psrec.data.shard_writer import Quarantine
from psrec.data.shard_writer import ShardWriter
from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.errors import check
from psrec.errors import check_choice
from psrec.features.columns import CategoricalFeature
from psrec.features.spec import DENSE_COLUMN
from psrec.features.spec import ID_COLUMN
from psrec.features.spec import FeatureSpec
from psrec.features.transforms import CategoricalEncoder

SPLIT_MODES = ("tail", "hash")


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
            check(isinstance(value, int) and value >= 1, key, value,
                  "must be an integer >= 1")
        check(self.eval_shards is None or self.eval_shards >= 1,
              "eval_shards", self.eval_shards, "must be >= 1")
        check(0.0 <= self.eval_fraction < 1.0, "eval_fraction",
              self.eval_fraction, "must be in [0, 1)")
        check(0.0 <= self.max_bad_fraction <= 1.0, "max_bad_fraction",
              self.max_bad_fraction, "must be in [0, 1]")
        check_choice("split_mode", self.split_mode, SPLIT_MODES)


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

    def to_dict(self) -> dict[str, object]:
        """The report as JSON-able data; ``manifest`` is the path of the
        written ``manifest.json`` (None when nothing was published)."""
        return {
            "manifest": (str(self.manifest.root / MANIFEST_NAME)
                         if self.manifest is not None else None),
            "rows_read": self.rows_read,
            "rows_written": dict(self.rows_written),
            "bad_rows": self.bad_rows,
            "bad_reasons": dict(self.bad_reasons),
            "extra_columns": {k: list(v)
                              for k, v in self.extra_columns.items()},
            "truncated_lists": dict(self.truncated_lists),
            "quarantine": self.quarantine, "seconds": self.seconds,
        }

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
    label = float_values(batch.column(spec.label.name), 0.0)
    if spec.label.threshold is not None:
        label = (label >= spec.label.threshold)
    columns = {spec.label.name: label.astype("<f4")}
    if spec.dense:
        columns[DENSE_COLUMN] = np.stack(
            [float_values(batch.column(f.name), f.default)
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


def _clean_previous(out_dir: Path) -> None:
    """Removes the old manifest first, so stale shards are never published."""
    (out_dir / MANIFEST_NAME).unlink(missing_ok=True)
    for path in out_dir.glob(".*.tmp*"):
        path.unlink()


def parquet_files(paths: Sequence[str | Path]) -> list[str]:
    """Input paths as Parquet files, as pyarrow's dataset discovery finds
    them: a folder expands to every ``*.parquet`` file below it (recursive,
    sorted, skipping names that start with ``.`` or ``_``); files stay in the
    given order.

    Raises:
      FileNotFoundError: a path does not exist.
      ConfigError: a folder holds no ``*.parquet`` file.
    """
    files: list[str] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(
                file.relative_to(path).as_posix()
                for file in path.rglob("*.parquet") if file.is_file()
                and not any(part.startswith((".", "_"))
                            for part in file.relative_to(path).parts))
            if not found:
                raise ConfigError(
                    f"input folder {path} holds no *.parquet file; pass "
                    "Parquet files or a folder of them (`psrec ingest` "
                    "turns raw Criteo TSV or MovieLens files into Parquet).")
            files += [str(path / name) for name in found]
        elif path.is_file():
            files.append(str(path))
        else:
            raise FileNotFoundError(
                f"input Parquet file {path} does not exist.")
    return files


def _read_metadata(path: str) -> pq.FileMetaData:
    try:
        return pq.read_metadata(path)
    except pa.ArrowException as error:
        reason = str(error).splitlines()[0] if str(error) else type(
            error).__name__
        raise ConfigError(
            f"input {path} is not a Parquet file ({reason}); convert takes "
            "Parquet: run `psrec ingest criteo|movielens` on raw files "
            "first.") from error


def convert(parquet_paths: Sequence[str | Path], spec: FeatureSpec,
            out_dir: str | Path,
            options: ConversionOptions = ConversionOptions()
            ) -> ConversionReport:
    """Converts Parquet files to sharded block TFRecords plus a manifest.

    Args:
      parquet_paths: input files, read in the given order (row ids follow
        it), or folders of them (see :func:`parquet_files`).
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
    paths = parquet_files(list(parquet_paths))
    if not paths:
        raise ValueError("give at least one Parquet file to convert.")
    spec.check_vocabularies()
    extras, sources = {}, []
    for path in paths:  # every schema is checked before any row is read
        metadata = _read_metadata(path)
        found = check_schema(path, metadata.schema.to_arrow_schema(), spec)
        if found:
            extras[path] = found
        sources.append({"file": path, "rows": metadata.num_rows})
    total_rows = sum(s["rows"] for s in sources)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _clean_previous(out)
    encoder = CategoricalEncoder(spec)
    writers = {"train": ShardWriter(out, "train", options.shards,
                                     options.block_rows)}
    if options.eval_fraction > 0:
        writers["eval"] = ShardWriter(
            out, "eval", options.eval_shards or options.shards,
            options.block_rows)
    quarantine = Quarantine(out)
    truncated: collections.Counter = collections.Counter()
    next_id = 0
    try:
        for path in paths:
            row_in_file = 0
            for batch in pq.ParquetFile(path).iter_batches(
                    batch_size=options.batch_rows, columns=list(spec.columns)):
                ids = np.arange(next_id, next_id + batch.num_rows,
                                dtype=np.int64)
                reasons = row_reasons(batch, spec)
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
        if SHARD_NAME_RE.match(stale.name) and not any(
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

