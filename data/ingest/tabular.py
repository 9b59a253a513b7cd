"""Any delimited text log (CSV, TSV, ...) -> Parquet, streamed block by
block with :func:`pyarrow.csv.open_csv`, one Parquet file per input (one row
group per parsed block; see ``data.ingest.common``).

Every column is read as a string (ids stay ids: ``007`` is not the number
7) unless typed with ``column_types``; an empty field is null. Nothing is
inferred, so every file of a log gets the same schema."""

from __future__ import annotations

import re
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from psrec.data.format.files import atomic_output
from psrec.data.ingest.common import IngestError
from psrec.data.ingest.common import IngestReport
from psrec.data.ingest.common import IngestUsageError
from psrec.data.ingest.common import ReadMeter
from psrec.data.ingest.common import check_sources
from psrec.data.ingest.common import clip
from psrec.data.ingest.common import find_line
from psrec.data.ingest.common import first_line
from psrec.data.ingest.common import input_task
from psrec.data.ingest.common import invalid_rows
from psrec.data.ingest.common import open_input
from psrec.data.ingest.common import write_each
from psrec.errors import check
from psrec.errors import did_you_mean
from psrec.progress import SILENT
from psrec.progress import Progress
from psrec.progress import Task

# The value types a column may be given (``--types COL=TYPE``).
COLUMN_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(), "int64": pa.int64(), "int32": pa.int32(),
    "float64": pa.float64(), "float32": pa.float32(), "bool": pa.bool_(),
    "timestamp": pa.timestamp("s"),
}
_FORBIDDEN_DELIMITERS = ("\n", "\r", '"')


def check_column_types(column_types: Mapping[str, str]) -> None:
    """Each ``{column: type}`` names one of :data:`COLUMN_TYPES`."""
    for column, name in column_types.items():
        check(name in COLUMN_TYPES, f"types[{column}]", name,
              f"must be one of {', '.join(COLUMN_TYPES)}"
              f"{did_you_mean(name, COLUMN_TYPES)}", error=IngestUsageError)


def _check_options(delimiter: str, column_types: Mapping[str, str],
                   block_size_bytes: int) -> None:
    check(len(delimiter) == 1 and delimiter not in _FORBIDDEN_DELIMITERS,
          "delimiter", delimiter, "must be one character other than a "
          "newline or '\"' (a tab is '\\t')", error=IngestUsageError)
    check_column_types(column_types)
    check(block_size_bytes > 0, "block_size_bytes", block_size_bytes,
          "must be positive", error=IngestUsageError)


def _column_names(path: Path, delimiter: str, header: bool,
                  columns: Sequence[str] | None) -> list[str]:
    """The file's column names: from its header, from ``columns`` (which
    replace a header), or ``f0``, ``f1``, ... by position."""
    line = first_line(path)
    try:
        # Line 1 read as a header: its fields, verbatim, are the names.
        table = pa_csv.read_csv(
            pa.BufferReader(line + b"\n"),
            parse_options=pa_csv.ParseOptions(delimiter=delimiter))
    except (pa.ArrowInvalid, UnicodeDecodeError) as err:
        raise IngestError(f"Cannot parse line 1 of {str(path)!r}: {err}; "
                          "check --delimiter and the encoding (UTF-8).") from err
    width = table.num_columns
    if columns is not None:
        if len(columns) != width:
            raise IngestUsageError(
                f"{str(path)!r}: --columns names {len(columns)} columns but "
                f"line 1 has {width} {delimiter!r}-separated fields; give one "
                "name per field or check --delimiter.")
        names = list(columns)
    elif header:
        names = table.schema.names
    else:
        names = [f"f{i}" for i in range(width)]
    dup = sorted({n for n in names if names.count(n) > 1 or not n})
    if dup:
        raise IngestError(
            f"{str(path)!r}: column names {dup} are empty or repeated; name "
            "the columns with --columns a,b,c (and --header to skip the "
            "file's own header line).")
    return names


def _options(names: list[str], types: dict[str, pa.DataType], *,
             delimiter: str, header: bool, block_size_bytes: int,
             invalid_row_handler=None) -> dict:
    return dict(
        read_options=pa_csv.ReadOptions(
            column_names=names, skip_rows=1 if header else 0,
            block_size=block_size_bytes),
        parse_options=pa_csv.ParseOptions(
            delimiter=delimiter, invalid_row_handler=invalid_row_handler),
        convert_options=pa_csv.ConvertOptions(
            column_types=types, null_values=[""], strings_can_be_null=True,
            quoted_strings_can_be_null=False))


def _first_bad_row(src: Path, names: list[str], column: str,
                   arrow_type: pa.DataType, *, delimiter: str, header: bool,
                   block_size_bytes: int) -> tuple[int, str] | None:
    """Re-reads ``column`` as text and returns ``(data row, value)`` of its
    first value that does not convert to ``arrow_type`` (error path only:
    one cast per block, then a bisection of the failing block)."""
    as_text = dict.fromkeys(names, pa.string())
    options = _options(names, as_text, delimiter=delimiter, header=header,
                       block_size_bytes=block_size_bytes)
    options["convert_options"].include_columns = [column]
    before = 0
    with open_input(src) as (_, stream):
        for batch in pa_csv.open_csv(stream, **options):
            values = batch.column(0)
            try:
                values.cast(arrow_type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                lo, hi = 0, len(values)  # the first bad value is in [lo, hi)
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    try:
                        values.slice(lo, mid - lo).cast(arrow_type)
                        lo = mid
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                        hi = mid
                return before + lo + 1, values[lo].as_py()
            before += len(values)
    return None


def _describe(err: Exception, src: Path, names: list[str],
              types: dict[str, pa.DataType], bad_rows: list, rows: int,
              **read: object) -> str:
    """One sentence: what is wrong with ``src`` and where."""
    if bad_rows:
        row = bad_rows[0]
        line = find_line(src, row.text)
        where = f"line {line}" if line else f"after data row {rows:,}"
        return (f"{str(src)!r} {where} has {row.actual_columns} fields "
                f"instead of {row.expected_columns} ({', '.join(names)}): "
                f"{clip(row.text)!r}; fix or remove that line, or check --delimiter "
                "and quoting")
    match = re.search(r"column #(\d+)", str(err))
    if match and int(match.group(1)) < len(names):
        column = names[int(match.group(1))]
        arrow_type = types.get(column, pa.string())
        try:
            found = _first_bad_row(src, names, column, arrow_type, **read)
        except (pa.ArrowInvalid, UnicodeDecodeError):
            found = None
        where = (f"data row {found[0]:,} has {column}={found[1]!r}" if found
                 else f"column {column}: {err}")
        return (f"{str(src)!r}: {where}, which is not a valid {arrow_type}; "
                f"fix the value, or type the column as string (--types "
                f"{column}=string)")
    return (f"cannot parse {str(src)!r} after data row {rows:,}: {err}; check "
            "--delimiter, quoting and the encoding (UTF-8)")


def _ingest_file(src: Path, dst: Path, names: list[str],
                 types: dict[str, pa.DataType], task: Task, **read) -> int:
    """Streams one delimited file into one Parquet file; returns its rows."""
    schema = pa.schema([(n, types.get(n, pa.string())) for n in names])
    full_types = {n: schema.field(n).type for n in names}
    bad_rows, on_invalid_row = invalid_rows()
    with atomic_output(dst) as tmp_path, open_input(src) as (raw, stream):
        meter = ReadMeter(task, src, raw)
        try:
            reader = pa_csv.open_csv(stream, **_options(
                names, full_types, invalid_row_handler=on_invalid_row, **read))
            with pq.ParquetWriter(str(tmp_path), schema) as writer:
                for batch in reader:
                    writer.write_batch(batch)
                    meter.add(batch.num_rows)
            meter.finish()
        except (pa.ArrowInvalid, UnicodeDecodeError) as err:
            raise IngestError(_describe(err, src, names, full_types, bad_rows,
                                        meter.rows, **read)) from err
    return meter.rows


def ingest_csv(paths: Sequence[str | Path], out_dir: str | Path, *,
               delimiter: str = ",", header: bool = True,
               columns: Sequence[str] | None = None,
               column_types: Mapping[str, str] | None = None,
               block_size_bytes: int = 16 << 20,
               progress: Progress = SILENT) -> IngestReport:
    """Converts delimited text files to Parquet, one file per input.

    Each input (optionally compressed) is parsed block by block and written
    to ``out_dir/<input stem>.parquet``; quoting follows RFC 4180 (``"``).
    Each input has its own header line when ``header`` (never data);
    ``columns`` replace it, or name the fields of a headerless file (default
    ``f0``, ``f1``, ...). ``column_types`` maps columns to
    :data:`COLUMN_TYPES` names; untyped columns are strings.
    """
    column_types = dict(column_types or {})
    _check_options(delimiter, column_types, block_size_bytes)
    sources = check_sources(paths, "input file")
    read = dict(delimiter=delimiter, header=header,
                block_size_bytes=block_size_bytes)
    types = {c: COLUMN_TYPES[t] for c, t in column_types.items()}
    plans = []
    for src in sources:  # every header is checked before anything is written
        names = _column_names(src, delimiter, header, columns)
        unknown = sorted(set(types) - set(names))
        if unknown:
            raise IngestUsageError(
                f"--types names column(s) {unknown} that {str(src)!r} lacks"
                f"{did_you_mean(unknown[0], names)} (its columns: "
                f"{', '.join(names)}); fix the names.")
        plans.append((src, names))
    with input_task(progress, sources) as task:
        files, total, _ = write_each(out_dir, plans, lambda src, dst, names: (
            _ingest_file(src, dst, names, types, task, **read), None))
    return IngestReport(files=files, rows=total, positives=None,
                        has_label=False)
