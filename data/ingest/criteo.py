"""Kaggle Criteo Display Advertising Challenge TSV files -> Parquet, streamed
block by block, one Parquet file per input file (see ``data.ingest.common``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from psrec.data.format.files import atomic_output
from psrec.data.ingest.common import IngestError
from psrec.data.ingest.common import IngestReport
from psrec.data.ingest.common import IngestUsageError
from psrec.data.ingest.common import ReadMeter
from psrec.data.ingest.common import check_sources
from psrec.data.ingest.common import clip
from psrec.data.ingest.common import first_line
from psrec.data.ingest.common import input_task
from psrec.data.ingest.common import invalid_rows
from psrec.data.ingest.common import open_input
from psrec.data.ingest.common import write_each
from psrec.progress import SILENT
from psrec.progress import Progress
from psrec.progress import Task

CRITEO_LABEL_COLUMN = "label"
CRITEO_INTEGER_COLUMNS: tuple[str, ...] = tuple(f"I{i}" for i in range(1, 14))
CRITEO_CATEGORICAL_COLUMNS: tuple[str, ...] = tuple(
    f"C{i}" for i in range(1, 27))
CRITEO_COLUMNS: tuple[str, ...] = (
    (CRITEO_LABEL_COLUMN,) + CRITEO_INTEGER_COLUMNS + CRITEO_CATEGORICAL_COLUMNS)

# How much of a file is read to count the fields of its first line.
_SNIFF_BYTES = 1 << 16
_CRITEO_FIX = (
    "Check that it is a raw Kaggle Criteo file: tab-separated, no header, "
    "40 fields per line (label, I1..I13, C1..C26; 39 without the label), "
    "integer fields empty or matching -?[0-9]+, and that it is not truncated "
    "or corrupted.")


def criteo_schema(*, labelled: bool = True) -> pa.Schema:
    """The Arrow schema of an ingested Criteo file; ``labelled``: with the
    leading ``label`` column (Kaggle ``train.txt``) or not (``test.txt``)."""
    fields = [pa.field(name, pa.int64()) for name in CRITEO_INTEGER_COLUMNS]
    fields += [pa.field(name, pa.string())
               for name in CRITEO_CATEGORICAL_COLUMNS]
    if labelled:
        fields.insert(0, pa.field(CRITEO_LABEL_COLUMN, pa.int64()))
    return pa.schema(fields)


def _criteo_is_labelled(path: Path) -> bool:
    """Tells the labelled (40-field) from the unlabelled (39-field) layout by
    the first line; the parser checks every other line against it."""
    line = first_line(path, _SNIFF_BYTES, "Criteo file", "the download")
    n_fields = line.count(b"\t") + 1
    if n_fields == len(CRITEO_COLUMNS):
        return True
    if n_fields == len(CRITEO_COLUMNS) - 1:
        return False
    raise IngestError(
        f"Criteo file {str(path)!r}: line 1 has {n_fields} tab-separated "
        f"fields, expected {len(CRITEO_COLUMNS)} (or "
        f"{len(CRITEO_COLUMNS) - 1} without the label). {_CRITEO_FIX}")


def _describe_csv_error(err: Exception, column_names: Sequence[str],
                        bad_rows: list[pa_csv.InvalidRow]) -> str:
    """Turns a pyarrow CSV error into a precise, readable reason."""
    if bad_rows:
        row = bad_rows[0]
        return (f"a line has {row.actual_columns} tab-separated fields "
                f"instead of {row.expected_columns}: {clip(row.text)!r}")
    reason = str(err)
    match = re.search(r"column #(\d+)", reason)
    if match and int(match.group(1)) < len(column_names):
        reason = f"column {column_names[int(match.group(1))]}: {reason}"
    return reason


def _ingest_criteo_file(src: Path, dst: Path, labelled: bool,
                        block_size_bytes: int,
                        task: Task) -> tuple[int, int | None]:
    """Streams one Criteo TSV into one Parquet file; returns ``(rows,
    positives)`` (``positives`` None when unlabelled)."""
    schema = criteo_schema(labelled=labelled)
    column_names = schema.names
    bad_rows, on_invalid_row = invalid_rows()
    positives = 0
    with atomic_output(dst) as tmp_path, open_input(src) as (raw, stream):
        meter = ReadMeter(task, src, raw)
        try:
            reader = pa_csv.open_csv(
                stream,
                read_options=pa_csv.ReadOptions(
                    column_names=column_names, block_size=block_size_bytes),
                parse_options=pa_csv.ParseOptions(
                    delimiter="\t", quote_char=False,
                    invalid_row_handler=on_invalid_row),
                convert_options=pa_csv.ConvertOptions(
                    column_types={field.name: field.type for field in schema},
                    null_values=[""], strings_can_be_null=True))
            with pq.ParquetWriter(str(tmp_path), schema) as writer:
                for batch in reader:
                    writer.write_batch(batch)
                    meter.add(batch.num_rows)
                    if labelled:
                        total = pc.sum(batch.column(CRITEO_LABEL_COLUMN))
                        positives += total.as_py() or 0
            meter.finish()
        except (pa.ArrowInvalid, UnicodeDecodeError) as err:
            reason = _describe_csv_error(err, column_names, bad_rows)
            where = (f"after its first {meter.rows:,} data rows, which parsed "
                     "fine" if meter.rows else "within its first block of rows")
            raise IngestError(
                f"Cannot parse Criteo file {str(src)!r} ({where}): {reason}. "
                f"{_CRITEO_FIX}") from err
    return meter.rows, (positives if labelled else None)


def ingest_criteo(tsv_paths: Sequence[str | Path], out_dir: str | Path, *,
                  block_size_bytes: int = 64 << 20,
                  progress: Progress = SILENT) -> IngestReport:
    """Converts raw Kaggle Criteo TSV files (all labelled or all not,
    optionally compressed) to Parquet, one file per input.

    Each input is streamed and written batch by batch to
    ``out_dir/<input stem>.parquet`` (replaced if there): ``label`` (int64,
    only for the 40-field ``train.txt`` layout), ``I1``..``I13`` (int64) and
    ``C1``..``C26`` (string); empty fields become nulls. Values are not
    range-checked here (a label of 2 is kept as is). ``block_size_bytes`` of
    text are parsed per block (bounding memory and the batches written);
    ``positives`` is the sum of the label column.
    """
    if block_size_bytes <= 0:
        raise IngestUsageError(f"block_size_bytes must be positive, got "
                          f"{block_size_bytes}; use e.g. 64 << 20.")
    sources = check_sources(tsv_paths, "Criteo file")
    layouts = [_criteo_is_labelled(src) for src in sources]
    if len(set(layouts)) > 1:
        labelled_files = [str(s) for s, lab in zip(sources, layouts) if lab]
        unlabelled = [str(s) for s, lab in zip(sources, layouts) if not lab]
        raise IngestUsageError(
            f"Criteo inputs mix labelled files {labelled_files} with "
            f"unlabelled files {unlabelled}; ingest them in separate calls.")
    with input_task(progress, sources) as task:
        files, rows, positives = write_each(
            out_dir, list(zip(sources, layouts)),
            lambda src, dst, labelled: _ingest_criteo_file(
                src, dst, labelled, block_size_bytes, task))
    return IngestReport(files=files, rows=rows,
                        positives=positives if layouts[0] else None)
