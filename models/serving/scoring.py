"""Scoring raw rows with an exported SavedModel (``psrec predict``).

The inputs are Parquet files with the raw columns that ``psrec ingest``
writes (the ones ``psrec convert`` reads). They are read in streaming
batches and fed to the export's ``serving_default`` signature in the
serving contract of :mod:`psrec.models.serving.export`: a null dense value is NaN
(the spec's default), a null categorical value is ``""`` (strings) or ``-1``
(ints), and multi-hot lists are padded to the batch's longest list with
``""`` or ``-1`` (a null element is padding too) -- what conversion does
with the same rows. The signature alone says which columns are needed and
of which type, so no spec is required.

The model is an export folder: a version folder (``EXPORT_DIR/3``) or the
versioned root (``EXPORT_DIR``: its highest complete version is used, and
the report says which; :func:`psrec.models.serving.versions.resolve`).

The output has one row per input row, in input order: ``row`` (the 0-based
position over the inputs in the given order -- the row id ``psrec convert``
gives the same row), the label column when the inputs have it, any
``keep`` columns as they are, then ``probability`` and ``logit`` (and, for
a multi-task export, each task's ``<task>_score``) -- or,
for a retrieval export (its signature returns ``candidate_ids`` and
``scores``), the query row's top-K candidate ids and their scores, best
first, as lists (Parquet only).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import tensorflow as tf

from psrec.data.convert.checks import float_values
from psrec.data.convert.inputs import parquet_batches
from psrec.data.convert.inputs import parquet_files
from psrec.data.convert.inputs import read_metadata
from psrec.data.format.files import atomic_output
from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.errors import check
from psrec.errors import did_you_mean
from psrec.features.transforms.ops import MISSING_INT
from psrec.features.transforms.ops import MISSING_TOKEN
from psrec.models.serving.export import TASK_SUFFIX
from psrec.models.serving.versions import resolve
from psrec.progress import SILENT
from psrec.progress import Progress

ROW_COLUMN = "row"
OUTPUT_COLUMNS = ("probability", "logit")
#: What a retrieval export (``psrec train --task retrieval``) returns per
#: query row: its top-K candidate ids and their scores, best first.
RETRIEVAL_COLUMNS = ("candidate_ids", "scores")
DEFAULT_LABEL = "label"  # copied when every input has it and none is named


@dataclasses.dataclass(frozen=True)
class ScoreReport:
    """What one :func:`score_files` call wrote.

    Attributes:
      out: the scores file (Parquet, or CSV for a ``.csv`` name).
      mean_probability: NaN for no rows.
      seconds: wall time in all, loading the model included.
      model: the SavedModel folder used (a version folder of an export).
      version: its version (None: an unversioned SavedModel).
      model_note: how the summary names the model (says which version of
        a versioned root was chosen).
    """

    out: str
    rows: int
    files: tuple[str, ...]
    columns: tuple[str, ...]
    mean_probability: float
    seconds: float
    load_seconds: float
    model: str = ""
    version: int | None = None
    model_note: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"out": self.out, "rows": self.rows, "files": list(self.files),
                "columns": list(self.columns),
                "mean_probability": self.mean_probability,
                "seconds": self.seconds, "load_seconds": self.load_seconds,
                "model": self.model, "version": self.version}

    def summary(self) -> str:
        n = len(self.files)
        scoring = self.seconds - self.load_seconds
        rate = self.rows / scoring if scoring > 0 else 0.0
        what = (f"mean probability {self.mean_probability:.4f}"
                if "probability" in self.columns
                else "top-K candidates per row")
        return (f"model {self.model_note or self.model}\n"
                f"scored {self.rows:,} rows of {n} file{'s' if n != 1 else ''}"
                f" in {scoring:.2f} s ({rate:,.0f} rows/s; loading the model "
                f"took {self.load_seconds:.1f} s), {what}\nwrote {self.out} "
                f"({', '.join(self.columns)})")


def load_serving(export_dir: str | Path):
    """``(loaded SavedModel, {input name: tf.TensorSpec})`` of an export (a
    version folder, or a versioned root: its highest version); its serving
    function is ``loaded.signatures["serving_default"]``."""
    path = resolve(str(export_dir)).path
    loaded = tf.saved_model.load(path)
    if "serving_default" not in loaded.signatures:
        raise ConfigError(f"{path} has no serving_default signature; it was "
                          "not written by `psrec export`.")
    _, inputs = loaded.signatures["serving_default"].structured_input_signature
    return loaded, dict(inputs)


def _type_ok(arrow_type: pa.DataType, spec: tf.TensorSpec) -> bool:
    multi_hot = spec.shape.rank == 2
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        if not multi_hot:
            return False
        arrow_type = arrow_type.value_type
    elif multi_hot:
        return False
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    if spec.dtype == tf.string:
        return pa.types.is_string(arrow_type) or pa.types.is_large_string(
            arrow_type)
    if spec.dtype == tf.int64:
        return pa.types.is_integer(arrow_type)
    return pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)


def _describe(spec: tf.TensorSpec) -> str:
    kind = {tf.string: "string", tf.int64: "integer"}.get(spec.dtype,
                                                           "number")
    if spec.shape.rank == 2:
        return f"a list of {kind}s"
    return f"{'an' if kind == 'integer' else 'a'} {kind} column"


def check_inputs(path: str, schema: pa.Schema,
                 inputs: dict[str, tf.TensorSpec],
                 required: Sequence[str] = ()) -> None:
    """Every serving input (and every ``required`` column) is in the file's
    schema with a type the signature takes."""
    for column in [*inputs, *required]:
        if schema.get_field_index(column) < 0:
            what = ("the exported model" if column in inputs else
                    "--label/--keep")
            raise ConfigError(
                f"{path}: column {column!r} required by {what} is missing"
                f"{did_you_mean(column, schema.names)} (found: "
                f"{', '.join(schema.names)}); the export takes the raw "
                "columns that `psrec ingest` wrote.")
        if column in inputs:
            arrow_type = schema.field(column).type
            if not _type_ok(arrow_type, inputs[column]):
                raise ConfigError(
                    f"{path}: column {column!r} has type {arrow_type}, the "
                    f"exported model takes {_describe(inputs[column])}.")


def _single(column: pa.Array, spec: tf.TensorSpec) -> np.ndarray:
    """One value a row: nulls -> the missing value of the dtype."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if spec.dtype == tf.string:
        return np.asarray(pc.fill_null(column, MISSING_TOKEN).to_numpy(
            zero_copy_only=False), object)
    column = pc.cast(column, pa.int64())
    return np.asarray(pc.fill_null(column, MISSING_INT).to_numpy(
        zero_copy_only=False), np.int64)


def _padded(column: pa.Array, spec: tf.TensorSpec) -> np.ndarray:
    """Lists as ``[rows, longest]`` padded with ``""``/-1; a null list is
    all padding, a null element is padding."""
    pad = MISSING_TOKEN if spec.dtype == tf.string else MISSING_INT
    lengths = np.asarray(pc.fill_null(pc.list_value_length(column), 0)
                         .to_numpy(zero_copy_only=False), np.int64)
    values = _single(pc.list_flatten(column), spec)
    width = max(1, int(lengths.max(initial=0)))
    out = np.full([len(column), width], pad,
                  object if spec.dtype == tf.string else np.int64)
    rows = np.repeat(np.arange(len(column)), lengths)
    starts = np.cumsum(lengths) - lengths
    out[rows, np.arange(len(values)) - starts[rows]] = values
    return out


def serving_batch(batch: pa.RecordBatch,
                  inputs: dict[str, tf.TensorSpec]) -> dict[str, np.ndarray]:
    """Raw Arrow columns as the serving signature takes them."""
    raw = {}
    for name, spec in inputs.items():
        column = batch.column(name)
        if spec.dtype == tf.float32:
            raw[name] = float_values(column, np.nan).astype(np.float32)
        elif spec.shape.rank == 2:
            raw[name] = _padded(column, spec)
        else:
            raw[name] = _single(column, spec)
    return raw


def _score_batch(function, batch: pa.RecordBatch,
                 signature: dict[str, tf.TensorSpec], schema: pa.Schema, *,
                 first_row: int,
                 outputs: Sequence[str] = OUTPUT_COLUMNS) -> pa.RecordBatch:
    """The output rows of one input batch (``schema``: row, the copied
    columns, then ``outputs``: probability and logit, or a retrieval
    export's top-K candidate ids and scores, one list per row)."""
    raw = serving_batch(batch, signature)
    result = function(**{k: tf.constant(v) for k, v in raw.items()})
    columns = [pa.array(np.arange(first_row, first_row + batch.num_rows,
                                  dtype=np.int64))]
    columns += [batch.column(field.name).cast(field.type)
                for field in schema if field.name != ROW_COLUMN
                and field.name not in outputs]
    for name in outputs:
        values = result[name].numpy()
        if values.dtype == object:  # string candidate ids
            values = values.astype(str)
        elif values.dtype.kind == "f":
            values = values.astype(np.float32)
        columns.append(pa.array(list(values) if values.ndim == 2 else values,
                                schema.field(name).type))
    return pa.record_batch(columns, schema=schema)


def _outputs(function, path: str, out: Path) -> dict[str, pa.DataType]:
    """The output columns of the export's signature: probability and logit
    (ranking), or a retrieval export's top-K candidate ids and scores (a
    list per row: Parquet only); else a ConfigError naming what it
    returns."""
    given = function.structured_outputs
    if all(name in given for name in OUTPUT_COLUMNS):  # + one per task
        tasks = sorted(name for name in given if name.endswith(TASK_SUFFIX))
        return {name: pa.float32() for name in (*OUTPUT_COLUMNS, *tasks)}
    if not all(name in given for name in RETRIEVAL_COLUMNS):
        raise ConfigError(
            f"{path}: its serving signature returns "
            f"{', '.join(sorted(given))}: neither a ranking export "
            f"({', '.join(OUTPUT_COLUMNS)}) nor a retrieval one "
            f"({', '.join(RETRIEVAL_COLUMNS)}); give an export written by "
            "`psrec export` or `psrec train`.")
    if out.suffix.lower() == ".csv":
        raise ConfigError(
            f"{path} is a retrieval export: its top-K candidate ids and "
            f"scores are lists per row, which CSV cannot hold; write "
            f"Parquet (--out {out.with_suffix('.parquet')}).")
    ids = given["candidate_ids"].dtype
    return {"candidate_ids": pa.list_(pa.string() if ids == tf.string
                                      else pa.int64()),
            "scores": pa.list_(pa.float32())}


def _writer(out: Path, tmp: Path, schema: pa.Schema):
    if out.suffix.lower() == ".csv":
        return pacsv.CSVWriter(str(tmp), schema)
    return pq.ParquetWriter(str(tmp), schema)


def _exported_label(export_dir: str | Path) -> str:
    """The label column the export was trained on (``psrec_export.json``,
    written by ``psrec export``), else ``label``."""
    info = os.path.join(str(export_dir), "psrec_export.json")
    try:
        with tf.io.gfile.GFile(info) as f:
            return json.loads(f.read())["label"]
    except (OSError, ValueError, KeyError, TypeError, tf.errors.OpError):
        return DEFAULT_LABEL


def score_files(export_dir: str | Path, inputs: Sequence[str | Path],
                out: str | Path, *, batch_rows: int = 65536,
                label: str | None = None,
                keep: Sequence[str] = (),
                progress: Progress = SILENT,
                progress_label: str = "score") -> ScoreReport:
    """Scores every row of ``inputs`` with an exported model.

    Args:
      export_dir: an export written by ``psrec export`` (see above).
      inputs: Parquet files or folders of them (see
        :func:`~psrec.data.convert.inputs.parquet_files`), read in order.
      out: the scores file: CSV when the name ends in ``.csv``, else
        Parquet; written under a temporary name and renamed when complete.
      label: the label column to copy (required in every input); None:
        copy the export's label column (``psrec_export.json``; ``label``
        when it names none) when every input has it.
      keep: further input columns to copy as they are (e.g. ids).
      progress: told the rows scored (total: the inputs' rows).
      progress_label: the task's name on ``progress`` (the command's).

    Raises:
      ConfigError: a missing or mistyped column (naming file and column),
        or ``export_dir`` is no export.
    """
    start = time.perf_counter()
    check(batch_rows >= 1, "batch_rows", batch_rows, "must be >= 1")
    model = resolve(str(export_dir))
    loaded, signature = load_serving(model.path)
    function = loaded.signatures["serving_default"]
    outputs = _outputs(function, model.path, Path(out))
    load_seconds = time.perf_counter() - start
    files = parquet_files(list(inputs))
    if not files:
        raise ConfigError("give at least one Parquet file to score.")
    schemas = [read_metadata(path).schema.to_arrow_schema() for path in files]
    required = list(dict.fromkeys(([label] if label else []) + list(keep)))
    for column in required:
        check(column not in (ROW_COLUMN, *outputs), "--label/--keep",
              column, "clashes with an output column "
              f"({', '.join((ROW_COLUMN, *outputs))})")
    for path, schema in zip(files, schemas):
        check_inputs(path, schema, signature, required)
    default = _exported_label(model.path)
    if label is None and all(default in s.names for s in schemas):
        required.insert(0, default)
    copied = list(dict.fromkeys(required))
    read = list(dict.fromkeys([*signature, *copied]))
    fields = [pa.field(ROW_COLUMN, pa.int64())]
    fields += [schemas[0].field(c) for c in copied]
    fields += [pa.field(c, kind) for c, kind in outputs.items()]
    schema = pa.schema(fields)
    out = Path(out)
    rows, total = 0, 0.0
    total_rows = sum(read_metadata(path).num_rows for path in files)
    with atomic_output(out) as tmp, progress.task(
            progress_label, total_rows, "rows") as task:
        writer = _writer(out, tmp, schema)
        try:
            for path in files:
                for batch in parquet_batches(path, batch_size=batch_rows,
                                             columns=read):
                    try:
                        scored = _score_batch(function, batch, signature,
                                              schema, first_row=rows,
                                              outputs=tuple(outputs))
                    except (pa.ArrowInvalid,
                            pa.ArrowNotImplementedError) as error:
                        raise DataError(f"{path}: {error}") from None
                    if "probability" in outputs:
                        total += float(np.sum(
                            scored.column("probability").to_numpy(),
                            dtype=np.float64))
                    writer.write_batch(scored)
                    rows += batch.num_rows
                    task.advance(batch.num_rows)
        finally:
            writer.close()
    return ScoreReport(out=str(out), rows=rows, files=tuple(files),
                       columns=tuple(schema.names),
                       mean_probability=total / rows if rows else float("nan"),
                       seconds=time.perf_counter() - start,
                       load_seconds=load_seconds, model=model.path,
                       version=model.version, model_note=model.describe())
