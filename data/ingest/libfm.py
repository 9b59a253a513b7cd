"""libFM / libSVM text -> Parquet, streamed block by block, one Parquet file
per input (see ``data.ingest.common``).

A line is ``label feature feature ...``, split on whitespace; a feature is
``field:index:value`` (libFM/libFFM) or ``index:value`` (libSVM; all lines of
a file use one form). The output has:

* ``label`` (int64): ``1``/``+1`` -> 1; ``0`` and ``-1`` -> 0 (a file may
  not use both ``0`` and ``-1``: that would be three classes). Any other
  label (a rating, ``2``, text) stops the run naming the line: ingest never
  drops a row.
* one string column per field holding the feature's ``index`` (a
  categorical id; null where a line has no feature of that field). Fields
  are numbered: in libFM form by the ``field`` token (an integer from 0); in
  libSVM form by position (the k-th feature of a line is field k, as in
  libSVM conversions of fixed-width logs such as Frappe or Criteo). Field k
  is named ``fields[k]`` if given, else ``f<k>``; without ``fields`` their
  number is taken from the first block of the file, and a later line with
  a higher field stops the run (pass ``fields``).
* ``<field>_value`` (float64) for each field where some value of the file
  is not 1 (one-hot data, all values 1, gets no value columns). This is
  decided per file, after reading it all (the file is rewritten without the
  all-ones columns, column by column).

A line with two features in one field, an empty line, or a token that is
not of the file's form stops the run, naming the file and line. Parsing is
vectorised per block (pyarrow string kernels); the only Python loop is over
fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
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
from psrec.data.ingest.common import open_input
from psrec.data.ingest.common import write_each
from psrec.progress import SILENT
from psrec.progress import Progress
from psrec.progress import Task

LABEL_COLUMN = "label"
_ONE = pa.array(["1", "+1", "1.0", "+1.0"])
_ZERO = pa.array(["0", "0.0"])
_MINUS_ONE = pa.array(["-1", "-1.0"])
_NUMBER = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"
# A byte that never separates anything in libFM text: each line is one field.
_NO_DELIMITER = "\x1f"


@dataclasses.dataclass
class _FileState:
    """What parsing one file has established so far."""

    src: Path
    names: list[str] | None
    parts: int | None = None            # 3: field:index:value, 2: index:value
    zero_label: str | None = None       # "0" or "-1", whichever came first
    lines_before: int = 0
    non_one: np.ndarray | None = None   # per field: some value != 1

    def fail(self, row: int, text: str, why: str, fix: str) -> IngestError:
        return IngestError(f"{str(self.src)!r} line {self.lines_before + row + 1:,}"
                           f" ({clip(text)!r}): {why}; {fix}")


def _labels(lines: pa.Array, tokens: pa.ListArray, st: _FileState) -> np.ndarray:
    text = pc.list_element(tokens, 0)
    label = np.full(len(lines), -1, dtype=np.int64)
    label[pc.is_in(text, _ONE).to_numpy(zero_copy_only=False)] = 1
    hits = {kind: pc.is_in(text, values).to_numpy(zero_copy_only=False)
            for kind, values in (("0", _ZERO), ("-1", _MINUS_ONE))}
    firsts = {kind: int(np.argmax(hit)) for kind, hit in hits.items()
              if hit.any()}
    for kind in sorted(firsts, key=firsts.get):
        label[hits[kind]] = 0
        st.zero_label = st.zero_label or kind
        if st.zero_label != kind:
            row = firsts[kind]
            raise st.fail(row, lines[row].as_py(),
                          f"label {kind} in a file whose negatives are "
                          f"{st.zero_label}",
                          "binary labels are -1/1 or 0/1, not both")
    bad = np.flatnonzero(label < 0)
    if len(bad):
        row = int(bad[0])
        raise st.fail(row, lines[row].as_py(),
                      f"label {text[row].as_py()!r} is not 1, 0 or -1 "
                      f"({len(bad):,} such lines in this block)",
                      "ingest takes binary labels only; fix or remove them")
    return label


def _features(lines: pa.Array, tokens: pa.ListArray, st: _FileState):
    """``(row, field, index text, value)`` of every feature of the block."""
    feats = pc.list_slice(tokens, 1)
    flat = pc.list_flatten(feats)
    row = pc.list_parent_indices(feats).to_numpy()
    offsets = feats.offsets.to_numpy()
    position = np.arange(len(flat)) - (offsets[row] - offsets[0])
    parts = pc.split_pattern(flat, ":")
    n_parts = pc.list_value_length(parts).to_numpy()
    if st.parts is None and len(flat):
        st.parts = int(n_parts[0])
        if st.parts not in (2, 3):
            raise st.fail(int(row[0]), lines[int(row[0])].as_py(),
                          f"feature {flat[0].as_py()!r} is neither "
                          "field:index:value nor index:value",
                          "check that this is a libFM/libSVM file")
    bad = np.flatnonzero(n_parts != st.parts)
    if len(bad):
        i = int(bad[0])
        raise st.fail(int(row[i]), lines[int(row[i])].as_py(),
                      f"feature {flat[i].as_py()!r} does not have the "
                      f"{st.parts}-part form of the file's first feature",
                      "use one form (field:index:value or index:value) for "
                      "every line")
    pieces = [pc.list_element(parts, k) for k in range(st.parts)]
    index, value = pieces[-2], pieces[-1]
    checks = [(pc.invert(pc.match_substring_regex(value, _NUMBER)),
               "a value is not a number"),
              (pc.equal(pc.utf8_length(index), 0), "an index is empty")]
    if st.parts == 3:
        checks.append((pc.invert(pc.match_substring_regex(pieces[0],
                                                          r"^[0-9]+$")),
                       "a field is not an integer >= 0"))
    for mask, why in checks:
        bad = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
        if len(bad):
            i = int(bad[0])
            raise st.fail(int(row[i]), lines[int(row[i])].as_py(),
                          f"{why} in feature {flat[i].as_py()!r}",
                          "fix the line")
    field = (pc.cast(pieces[0], pa.int64()).to_numpy() if st.parts == 3
             else position)
    return row, field, index, pc.cast(value, pa.float64())


def _batch(lines: pa.Array, st: _FileState) -> pa.RecordBatch:
    """Parses one block of lines into a record batch of label + fields."""
    tokens = pc.utf8_split_whitespace(lines)
    blank = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(lines)), 0)
    empty = np.flatnonzero(blank.to_numpy(zero_copy_only=False))
    if len(empty):
        raise st.fail(int(empty[0]), lines[int(empty[0])].as_py(),
                      "the line is empty",
                      "remove empty lines (every line needs a label)")
    label = _labels(lines, tokens, st)
    row, field, index, value = _features(lines, tokens, st)
    if st.names is None:
        st.names = [f"f{k}" for k in range(int(field.max(initial=-1)) + 1)]
    n_fields = len(st.names)
    if st.non_one is None:
        st.non_one = np.zeros(n_fields, dtype=bool)
    key = row * n_fields + field
    order = np.argsort(key, kind="stable")
    twice = np.zeros(len(key), dtype=bool)
    twice[order[np.flatnonzero(np.diff(key[order]) == 0) + 1]] = True
    for bad, why, fix in (
            (field >= n_fields, f"a field beyond the {n_fields} known ones "
             "(named by --fields, or seen in the file's first block)",
             "name every field with --fields"),
            (twice, "two features in one field",
             "one feature per field and line is supported")):
        hits = np.flatnonzero(bad)
        if len(hits):
            r = int(row[hits].min())
            raise st.fail(r, lines[r].as_py(), f"the line has {why}", fix)
    n = len(lines)
    arrays, names = [pa.array(label)], [LABEL_COLUMN]
    values = []
    for k, name in enumerate(st.names):
        take = np.full(n, -1, dtype=np.int64)
        chosen = np.flatnonzero(field == k)
        take[row[chosen]] = chosen
        where = pa.array(take, mask=take < 0)
        arrays.append(index.take(where))
        names.append(name)
        column = value.take(where)
        st.non_one[k] |= bool(pc.any(pc.not_equal(column, 1.0)).as_py())
        values.append(column)
    arrays += values
    names += [f"{name}_value" for name in st.names]
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _read_lines(stream: pa.NativeFile, block_size_bytes: int):
    return pa_csv.open_csv(
        stream,
        read_options=pa_csv.ReadOptions(column_names=["line"],
                                        block_size=block_size_bytes),
        parse_options=pa_csv.ParseOptions(
            delimiter=_NO_DELIMITER, quote_char=False, escape_char=False,
            ignore_empty_lines=False),
        convert_options=pa_csv.ConvertOptions(
            column_types={"line": pa.string()}, null_values=[],
            strings_can_be_null=False))


def _ingest_file(src: Path, dst: Path, names: list[str] | None,
                 block_size_bytes: int, task: Task) -> tuple[int, int]:
    """Streams one libFM/libSVM file into one Parquet file; returns ``(rows,
    positives)``."""
    st = _FileState(src, None if names is None else list(names))
    positives = 0
    with atomic_output(dst) as tmp, open_input(src) as (raw, stream):
        work = tmp.with_name(f"{tmp.name}-all")
        meter = ReadMeter(task, src, raw)
        try:
            writer = None
            try:
                for block in _read_lines(stream, block_size_bytes):
                    batch = _batch(block.column(0), st)
                    if writer is None:
                        writer = pq.ParquetWriter(str(work), batch.schema)
                    writer.write_batch(batch)
                    positives += int(pc.sum(batch.column(0)).as_py() or 0)
                    st.lines_before += batch.num_rows
                    meter.add(batch.num_rows)
                meter.finish()
            except (pa.ArrowInvalid, UnicodeDecodeError) as err:
                raise IngestError(
                    f"Cannot read {str(src)!r} after line "
                    f"{st.lines_before:,}: {err}; check that it is a UTF-8 "
                    "libFM/libSVM text file") from err
            finally:
                if writer is not None:
                    writer.close()
            if writer is None:
                raise IngestError(f"{str(src)!r} has no lines; remove it "
                                  "from the inputs.")
            drop = {f"{n}_value" for n, non_one in zip(st.names, st.non_one)
                    if not non_one}
            if not drop:
                work.replace(tmp)
            else:
                parquet = pq.ParquetFile(str(work))
                schema = parquet.schema_arrow
                keep = [n for n in schema.names if n not in drop]
                with pq.ParquetWriter(str(tmp), pa.schema(
                        [schema.field(n) for n in keep])) as slim:
                    for group in range(parquet.num_row_groups):
                        slim.write_table(parquet.read_row_group(group, keep))
        finally:
            work.unlink(missing_ok=True)
    return meter.rows, positives


def _check_fields(fields: Sequence[str] | None) -> list[str] | None:
    if fields is None:
        return None
    names = list(fields)
    taken = {LABEL_COLUMN} | {f"{n}_value" for n in names}
    bad = sorted({n for n in names if not n or names.count(n) > 1
                  or n in taken})
    if not names or bad:
        raise IngestUsageError(
            f"--fields {','.join(names)!r}: names must be non-empty, "
            f"distinct, and not 'label' or '<another field>_value' (bad: "
            f"{bad}); give one name per field.")
    return names


def ingest_libfm(paths: Sequence[str | Path], out_dir: str | Path, *,
                 fields: Sequence[str] | None = None,
                 block_size_bytes: int = 16 << 20,
                 progress: Progress = SILENT) -> IngestReport:
    """Converts libFM/libSVM files (optionally compressed) to Parquet, one
    file per input (``out_dir/<input stem>.parquet``; the format, and what
    ``fields`` names, are in the module doc). ``positives`` counts labels 1;
    a line that does not parse writes nothing for its file.
    """
    names = _check_fields(fields)
    if block_size_bytes <= 0:
        raise IngestUsageError(f"`block_size_bytes` = {block_size_bytes} must be "
                          "positive.")
    sources = check_sources(paths, "libFM file")
    for src in sources:
        first_line(src)  # refuses an empty input before anything is written
    with input_task(progress, sources) as task:
        files, rows, positives = write_each(
            out_dir, [(src,) for src in sources],
            lambda src, dst: _ingest_file(src, dst, names, block_size_bytes,
                                          task))
    return IngestReport(files=files, rows=rows, positives=positives)
