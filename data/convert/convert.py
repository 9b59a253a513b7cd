"""Parquet -> sharded TFRecord conversion (``psrec convert``).

The conversion streams Parquet record batches (never the whole dataset),
checks every file's schema against the spec before reading a row and then
every row (``data.convert.checks``), sends bad rows to a quarantine Parquet
with their source file, row and reason, encodes categorical values with the
same TensorFlow ops used at serving time (a null becomes the value serving
takes as missing: ``""`` or ``-1``; null, ``""`` and ``-1`` list elements
are padding, as in serving), packs rows into block records
(``data.format.records``) and writes them round-robin to N shards under temporary
names (``data.convert.writer``); ``data.convert.split`` decides which rows go to
eval. Shards are renamed when all are complete, the spec is saved beside
them (``spec.yaml``) and ``manifest.json`` is written last, so an
interrupted run leaves nothing under a final name, and a re-run on the same
input is byte-identical.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tensorflow as tf

from psrec.data.convert.catalogue import CatalogueCollector
from psrec.data.convert.checks import check_schema
from psrec.data.convert.checks import float_values
from psrec.data.convert.checks import label_values
from psrec.data.convert.checks import row_reasons
from psrec.data.convert.checks import serving_values
from psrec.data.convert.config import ConversionOptions
from psrec.data.convert.history import HistoryBuilder
from psrec.data.convert.inputs import parquet_batches
from psrec.data.convert.inputs import parquet_files
from psrec.data.convert.inputs import read_metadata
from psrec.data.convert.sampling import kept_rows
from psrec.data.convert.sampling import sampling_summary
from psrec.data.convert.seen import SEEN_NAME
from psrec.data.convert.seen import SeenCollector
from psrec.data.convert.split import plan_split
from psrec.data.convert.writer import QUARANTINE_NAME
from psrec.data.convert.writer import SHARD_NAME_RE
from psrec.data.convert.writer import Quarantine
from psrec.data.convert.writer import ShardWriter
from psrec.data.format.manifest import MANIFEST_NAME
from psrec.data.format.manifest import SPEC_FILE_NAME
from psrec.data.format.manifest import SPLITS
from psrec.data.format.manifest import Manifest
from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.features.spec.columns import CategoricalFeature
from psrec.features.spec.presets import with_absolute_vocabularies
from psrec.features.spec.spec import DENSE_COLUMN
from psrec.features.spec.spec import ID_COLUMN
from psrec.features.spec.spec import FeatureSpec
from psrec.features.transforms.ops import MISSING_INT
from psrec.features.transforms.ops import MISSING_TOKEN
from psrec.features.transforms.ops import CategoricalEncoder
from psrec.features.transforms.ops import derive_all
from psrec.progress import SILENT
from psrec.progress import Progress
from psrec.uri import require_tf_filesystem
from psrec.uri_path import UriPath
from psrec.uri_path import as_path


class BadDataError(DataError):
    """Too many rows failed the row checks."""


class EmptyInputError(DataError):
    """The inputs hold no row, or none is left for the train split."""


class OtherDatasetError(ConfigError):
    """The output folder holds a dataset made from other inputs."""


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
    warnings: tuple[str, ...] = ()
    split: str = ""  # which rows the eval split holds, in words

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
            "warnings": list(self.warnings), "split": self.split,
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
        if self.split:
            lines.append(f"eval split: {self.split}")
        lines += sampling_summary(self.manifest)
        for path, extras in self.extra_columns.items():
            lines.append(f"ignored extra columns in {path}: {', '.join(extras)}")
        for name, count in self.truncated_lists.items():
            lines.append(f"multi-hot {name}: {count} lists cut to max_length")
        if self.manifest is not None:
            lines.append(f"manifest: {self.manifest.root / MANIFEST_NAME}")
        return "\n".join(lines)


# -- encoding -----------------------------------------------------------------


def _encode_categorical(column: pa.Array, feature: CategoricalFeature,
                        encoder: CategoricalEncoder) -> tuple[np.ndarray, int]:
    """Row ids ([n] or [n, L] padded with -1) and the count of cut lists
    (more than ``max_length`` values besides padding)."""
    if not feature.multi_hot:
        if len(column) == 0:
            return np.zeros([0], np.int64), 0
        return encoder.encode(feature.name, serving_values(
            column, feature.dtype, feature.name)).numpy(), 0
    column = pc.fill_null(column, pa.scalar([], column.type))
    lengths = np.asarray(pc.list_value_length(column).to_numpy(
        zero_copy_only=False), np.int64)
    values = serving_values(pc.list_flatten(column), feature.dtype,
                            feature.name)
    pad = MISSING_INT if feature.dtype == "int64" else MISSING_TOKEN
    rows = np.repeat(np.arange(len(column)), lengths)
    counts = np.bincount(rows[values != pad], minlength=len(column))
    truncated = int((counts > feature.max_length).sum())
    dtype = tf.int64 if feature.dtype == "int64" else tf.string
    ragged = tf.RaggedTensor.from_row_lengths(tf.constant(values, dtype),
                                              lengths)
    return encoder.encode_lists(feature.name, ragged).numpy(), truncated


def _derived_values(batch: pa.RecordBatch,
                    spec: FeatureSpec) -> dict[str, tf.Tensor]:
    """The spec's derived columns of a batch, from the raw values in their
    serving form (the ops the serving function runs)."""
    if not spec.derived:
        return {}
    raw = {name: tf.constant(serving_values(batch.column(name), dtype, name),
                             tf.as_dtype(dtype))
           for name, (dtype, _) in spec.raw_inputs.items()
           if any(name in d.sources for d in spec.derived)}
    return derive_all(spec.derived, raw)


def _encode_rows(batch: pa.RecordBatch, spec: FeatureSpec,
                 encoder: CategoricalEncoder,
                 truncated: collections.Counter,
                 histories: dict[str, tf.RaggedTensor]
                 ) -> dict[str, np.ndarray]:
    columns = {label.name: label_values(batch.column(label.name), label)
               for label in spec.labels}  # NaN: a missing (masked) label
    if spec.dense:
        columns[DENSE_COLUMN] = np.stack(
            [float_values(batch.column(f.name), f.default)
             for f in spec.dense], axis=1).astype("<f4")
    derived = _derived_values(batch, spec)
    for feature in spec.categorical:
        if feature.name in derived:
            ids, cut = encoder.encode(feature.name,
                                      derived[feature.name]).numpy(), 0
        elif feature.name in histories:  # at most max_length, by its build
            ids, cut = encoder.encode_lists(
                feature.name, histories[feature.name]).numpy(), 0
        else:
            ids, cut = _encode_categorical(batch.column(feature.name),
                                           feature, encoder)
        columns[feature.name] = ids.astype("<i8")
        if cut:
            truncated[feature.name] += cut
    return columns


def _split_words(options: ConversionOptions) -> str:
    """Which rows the eval split holds, in words ("" for none)."""
    if options.eval_files is not None:
        return f"the rows of the files matching {options.eval_files!r}"
    share = options.eval_share
    if not share:
        return ""
    rows = (f"the rows with the last {options.order_by} values"
            if options.order_by else "the last rows" if
            options.split_mode == "tail" else "a stable hash of the row id")
    words = f"{100 * share:g}% of the rows: {rows} (--split {options.split_mode})"
    if options.eval_fraction is None:
        words += ("; the default held-out share, --eval-fraction to choose "
                  "it, 0 for none")
    return words


def _warnings(rows_written: dict[str, int],
              options: ConversionOptions) -> tuple[str, ...]:
    if rows_written["eval"]:
        return ()
    if options.eval_share == 0 and options.eval_files is None:
        return ("no eval split written (--eval-fraction 0): nothing is held "
                "out for evaluation; pass e.g. --eval-fraction 0.1.",)
    return (f"no eval split written: --eval-fraction "
            f"{options.eval_share:g} of {sum(rows_written.values())} rows "
            "selected no row; raise --eval-fraction.",)


def _clean_previous(out_dir: Path | UriPath) -> None:
    """Removes the old manifest first, so stale shards are never published."""
    (out_dir / MANIFEST_NAME).unlink(missing_ok=True)
    (out_dir / SPEC_FILE_NAME).unlink(missing_ok=True)
    (out_dir / SEEN_NAME).unlink(missing_ok=True)  # rewritten if it applies
    for path in out_dir.glob(".*.tmp*"):
        path.unlink()


def _check_same_inputs(out: Path | UriPath, sources: list[dict]) -> None:
    """Refuses an output folder whose manifest records other inputs (files
    or their row counts): a run may read that dataset. Re-running the same
    conversion (the same inputs) into its folder is allowed."""
    if not (out / MANIFEST_NAME).exists():  # also for URIs (no OSError)
        return
    try:
        recorded = json.loads((out / MANIFEST_NAME).read_text())["sources"]
    except (OSError, ValueError, KeyError, TypeError):
        recorded = None  # unreadable: not known to be the same inputs
    if recorded != sources:
        raise OtherDatasetError(
            f"output folder {str(out)!r} holds a dataset converted from "
            "other inputs, which a run may read; give another --out, or "
            "--overwrite to replace it.")


def _save_spec(spec: FeatureSpec, out_dir: Path | UriPath) -> str:
    """Saves the spec beside the data (temp file + rename)."""
    tmp = out_dir / f".spec.tmp-{os.getpid()}.yaml"
    try:
        spec.save(tmp).replace(out_dir / SPEC_FILE_NAME)
    finally:
        tmp.unlink(missing_ok=True)
    return SPEC_FILE_NAME


def convert(parquet_paths: Sequence[str | Path], spec: FeatureSpec,
            out_dir: str | Path,
            options: ConversionOptions = ConversionOptions(), *,
            progress: Progress = SILENT) -> ConversionReport:
    """Converts Parquet files (read in the given order, which row ids
    follow, or folders of them: see
    :func:`~psrec.data.convert.inputs.parquet_files`) to sharded block
    TFRecords plus a manifest, under ``out_dir`` (created; a local path or a
    URI TensorFlow writes: ``gs://``, ``ram://``; inputs may also be
    ``s3://``). ``progress`` is told the input rows as they are read.

    Raises:
      SchemaError: a file's schema does not match the spec (before any row is
        read from any file).
      BadDataError: bad rows exceed ``options.max_bad_fraction`` (the
        quarantine is still written; no shard or manifest is published).
    """
    start = time.perf_counter()
    require_tf_filesystem(out_dir, "output folder")
    paths = parquet_files(list(parquet_paths))
    if not paths:
        raise ValueError("give at least one Parquet file to convert.")
    spec = with_absolute_vocabularies(spec)  # the form saved beside the data
    spec.check_vocabularies()
    extras, sources = {}, []
    for path in paths:  # every schema is checked before any row is read
        metadata = read_metadata(path)
        found = tuple(c for c in check_schema(
            path, metadata.schema.to_arrow_schema(), spec)
            if c != options.order_by)  # used: it orders the split
        if found:
            extras[path] = found
        sources.append({"file": path, "rows": metadata.num_rows})
    total_rows = sum(s["rows"] for s in sources)
    if not total_rows:
        raise EmptyInputError(
            f"{', '.join(paths)}: no rows to convert (a header-only CSV "
            "ingests to 0 rows); give inputs that hold rows.")
    split = plan_split(paths, [s["rows"] for s in sources],
                       mode=options.split_mode,
                       eval_fraction=options.eval_share,
                       order_by=options.order_by,
                       eval_files=options.eval_files)

    out = as_path(out_dir)
    if not options.overwrite:
        _check_same_inputs(out, sources)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    _clean_previous(out)
    encoder = CategoricalEncoder(spec)
    writers = {"train": ShardWriter(out, "train", options.shards,
                                     options.block_rows)}
    if split.has_eval:
        writers["eval"] = ShardWriter(
            out, "eval", options.eval_shards or options.shards,
            options.block_rows)
    quarantine = Quarantine(out)
    truncated: collections.Counter = collections.Counter()
    positives = dict.fromkeys(SPLITS, 0)
    next_id = 0
    catalogue = CatalogueCollector(spec) if spec.towers else None
    seen = SeenCollector(spec) if spec.towers and (
        spec.towers.query_id) else None
    history = HistoryBuilder(spec)  # user-history lists, in log order
    task = progress.task("convert", total_rows, "rows")
    try:
        for path in paths:
            row_in_file = 0
            for batch in parquet_batches(
                    path, batch_size=options.batch_rows,
                    columns=list(spec.columns)):
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
                histories = history.lists(
                    batch, path, np.arange(row_in_file, row_in_file + len(
                        reasons))[~bad]) if history else {}
                columns = _encode_rows(batch, spec, encoder, truncated,
                                       histories)
                columns[ID_COLUMN] = ids
                to_eval = split.is_eval(ids)
                # the first task's positives (its base rate); a missing
                # label (NaN, multi-task) counts as none
                label = np.nan_to_num(columns[spec.label.name])
                to_train = ~to_eval & kept_rows(ids, label,
                                                options.neg_sample_rate)
                positives["train"] += np.count_nonzero(label[to_train])
                positives["eval"] += np.count_nonzero(label[to_eval])
                if catalogue is not None:  # retrieval: candidates, counts
                    catalogue.add(batch, columns, to_train, to_eval)
                if seen is not None:  # each user's train candidates
                    seen.add(batch, columns, ids, to_train,
                             to_eval if "eval" in writers else None)
                writers["train"].add({k: v[to_train]
                                      for k, v in columns.items()})
                if "eval" in writers:
                    writers["eval"].add({k: v[to_eval]
                                         for k, v in columns.items()})
                next_id += len(reasons)
                row_in_file += len(reasons)
                task.advance(len(reasons))
        task.close()
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
        if not writers["train"].rows:
            raise EmptyInputError(
                f"{', '.join(paths)}: no row of {total_rows} was left for the "
                f"train split ({bad_rows} bad, the rest to eval or sampled "
                "out); lower --eval-fraction, fix the rows or raise "
                "--neg-sample-rate.")
        shards = {split: writer.publish(out)
                  for split, writer in writers.items()}
        shards.setdefault("eval", ())
        quarantine_path = quarantine.close()
    except BaseException:
        task.close()
        for writer in writers.values():
            writer.discard()
        quarantine.discard()
        if created and not any(out.iterdir()):
            out.rmdir()  # a failed conversion leaves no empty folder
        raise
    for stale in out.iterdir():  # shards of an earlier, different conversion
        if SHARD_NAME_RE.match(stale.name) and not any(
                stale.name == s.file for v in shards.values() for s in v):
            stale.unlink()
    if catalogue is not None:
        catalogue.write(out)
    if seen is not None:
        seen.write(out, catalogue.keys())
    manifest = Manifest(
        root=out, spec_name=spec.name, spec_hash=spec.fingerprint(),
        block_rows=options.block_rows, shards=shards,
        split=split.to_dict(),
        bad_rows=quarantine.count,
        quarantine=QUARANTINE_NAME if quarantine_path else None,
        sources=tuple(sources),
        positives={k: int(v) for k, v in positives.items()},
        spec_file=_save_spec(spec, out),
        neg_sample_rate=float(options.neg_sample_rate))
    manifest.write()
    rows_written = {k: sum(s.rows for s in v) for k, v in shards.items()}
    return ConversionReport(
        manifest=manifest, rows_read=total_rows,
        rows_written=rows_written,
        bad_rows=quarantine.count, bad_reasons=dict(quarantine.reasons),
        extra_columns=extras, truncated_lists=dict(truncated),
        quarantine=quarantine_path, seconds=time.perf_counter() - start,
        warnings=_warnings(rows_written, options),
        split=_split_words(options))
