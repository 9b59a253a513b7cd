"""JSON lines (one object per line) -> Parquet, streamed block by block with
:func:`pyarrow.json.open_json`, one Parquet file per input (one row group
per block; see ``data.ingest.common``).

Types are JSON's own (``"007"`` stays a string, ``7`` is an int64), fixed
by the file's first block -- a field that is null throughout that block is a
string -- or given with ``column_types``. A later line whose value does not
fit the type, or that has a field the first block lacks, stops the run
naming the line and the fix (``--types FIELD=TYPE``).

Nested objects are flattened: ``{"user": {"id": "u1", "age": 30}}`` gives
the columns ``user.id`` and ``user.age`` (recursively). Lists of scalars stay
lists (multi-hot columns); a list of objects is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from psrec.data.format.files import atomic_output
from psrec.data.ingest.common import IngestError
from psrec.data.ingest.common import IngestReport
from psrec.data.ingest.common import IngestUsageError
from psrec.data.ingest.common import ReadMeter
from psrec.data.ingest.common import check_sources
from psrec.data.ingest.common import input_task
from psrec.data.ingest.common import open_input
from psrec.data.ingest.common import write_each
from psrec.data.ingest.tabular import COLUMN_TYPES
from psrec.data.ingest.tabular import check_column_types
from psrec.errors import check
from psrec.progress import SILENT
from psrec.progress import Progress
from psrec.progress import Task


def _fix_nulls(field: pa.Field) -> pa.Field:
    """Null-typed fields (no value seen yet) become strings, also nested."""
    if pa.types.is_null(field.type):
        return field.with_type(pa.string())
    if pa.types.is_struct(field.type):
        return field.with_type(pa.struct(
            [_fix_nulls(f) for f in field.type.fields]))
    if pa.types.is_list(field.type):
        return field.with_type(pa.list_(_fix_nulls(field.type.value_field)))
    return field


def _refuse_lists_of_objects(src: Path, field: pa.Field, prefix: str = ""
                             ) -> None:
    name = prefix + field.name
    if pa.types.is_struct(field.type):
        for child in field.type.fields:
            _refuse_lists_of_objects(src, child, name + ".")
    elif pa.types.is_list(field.type) and not (
            pa.types.is_string(field.type.value_type)
            or pa.types.is_integer(field.type.value_type)
            or pa.types.is_floating(field.type.value_type)
            or pa.types.is_boolean(field.type.value_type)):
        raise IngestError(
            f"{str(src)!r}: field {name!r} holds lists of "
            f"{field.type.value_type}; only lists of strings, numbers or "
            "booleans are ingested; flatten it before ingest or drop it.")


def _schema(src: Path, types: dict[str, pa.DataType],
            block_size_bytes: int) -> pa.Schema:
    """The explicit read schema of ``src``: its first block's, nulls as
    strings, ``types`` applied (top-level fields; added if missing)."""
    try:
        with open_input(src) as (_, stream):
            inferred = pa_json.open_json(
                stream, read_options=pa_json.ReadOptions(
                    block_size=block_size_bytes)).schema
    except (pa.ArrowInvalid, UnicodeDecodeError) as err:
        raise IngestError(_describe(err, src, pa.schema([]), 0)) from err
    fields = {f.name: _fix_nulls(f) for f in inferred}
    for name, arrow_type in types.items():
        fields[name] = pa.field(name, arrow_type)
    for field in fields.values():
        _refuse_lists_of_objects(src, field)
    return pa.schema(list(fields.values()))


def _flatten(table: pa.Table) -> pa.Table:
    """Struct columns -> ``parent.child`` columns, recursively."""
    while any(pa.types.is_struct(t) for t in table.schema.types):
        table = table.flatten()
    return table


def _describe(err: Exception, src: Path, schema: pa.Schema, rows: int) -> str:
    text = str(err)
    match = re.search(r"in row (\d+)", text)
    where = (f"line {rows + int(match.group(1)) + 1:,}" if match
             else f"after line {rows:,} (which parsed fine)")
    if "unexpected field" in text:
        return (f"{str(src)!r} {where}: a field that the file's first block "
                f"does not have (its fields: {', '.join(schema.names)}); "
                "declare it with --types FIELD=TYPE")
    column = re.search(r"Column\((/[^)]*)\)", text)
    if column and "changed from" in text:
        name = column.group(1).strip("/").replace("/", ".")
        fix = (f"field {name!r} must hold one JSON type on every line "
               "(numbers and strings do not mix); fix the file")
    elif "Failed to convert JSON to" in text:
        fix = ("declare the field holding that value with --types "
               "FIELD=float64 (the first block typed it from its values)")
    else:
        fix = "check that every line is one JSON object (UTF-8)"
    return f"{str(src)!r} {where}: {text}; {fix}"


def _ingest_file(src: Path, dst: Path, schema: pa.Schema,
                 block_size_bytes: int, task: Task) -> int:
    with atomic_output(dst) as tmp_path, open_input(src) as (raw, stream):
        meter = ReadMeter(task, src, raw)
        writer = None
        try:
            reader = pa_json.open_json(
                stream,
                read_options=pa_json.ReadOptions(block_size=block_size_bytes),
                parse_options=pa_json.ParseOptions(
                    explicit_schema=schema,
                    unexpected_field_behavior="error"))
            for batch in reader:
                table = _flatten(pa.Table.from_batches([batch]))
                if writer is None:
                    writer = pq.ParquetWriter(str(tmp_path), table.schema)
                writer.write_table(table)
                meter.add(batch.num_rows)
            meter.finish()
        except (pa.ArrowInvalid, UnicodeDecodeError) as err:
            raise IngestError(_describe(err, src, schema, meter.rows)) from err
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            pq.write_table(_flatten(schema.empty_table()), str(tmp_path))
    return meter.rows


def ingest_jsonl(paths: Sequence[str | Path], out_dir: str | Path, *,
                 column_types: Mapping[str, str] | None = None,
                 block_size_bytes: int = 16 << 20,
                 progress: Progress = SILENT) -> IngestReport:
    """Converts JSON-lines files (optionally compressed) to Parquet, one
    file per input (``out_dir/<input stem>.parquet``; the rules are in the
    module doc). ``column_types`` (``{top-level field: type}`` of
    ``data.ingest.tabular.COLUMN_TYPES``) override the first block's; a
    line must fit in one block of ``block_size_bytes``.
    """
    column_types = dict(column_types or {})
    check_column_types(column_types)
    check(block_size_bytes > 0, "block_size_bytes", block_size_bytes,
          "must be positive", error=IngestUsageError)
    sources = check_sources(paths, "JSON-lines file")
    types = {c: COLUMN_TYPES[t] for c, t in column_types.items()}
    plans = []
    for src in sources:
        if src.stat().st_size == 0:
            raise IngestError(f"Input file {str(src)!r} is empty; check the "
                              "file or remove it from the inputs.")
        plans.append((src, _schema(src, types, block_size_bytes)))
    with input_task(progress, sources) as task:
        files, rows, _ = write_each(out_dir, plans, lambda src, dst, schema: (
            _ingest_file(src, dst, schema, block_size_bytes, task), None))
    return IngestReport(files=files, rows=rows, positives=None,
                        has_label=False)
