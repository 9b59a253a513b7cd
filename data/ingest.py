"""Raw public dataset files -> Parquet, with pyarrow only.

This is the first step of the data pipeline: it only *parses*. Each raw file
is read with :mod:`pyarrow.csv` under an explicit schema and written to
Parquet; nothing is filtered, deduplicated or range-checked here (the later
conversion step quarantines bad values such as labels outside ``{0, 1}``).
A row that cannot be parsed at all (wrong number of fields, an integer field
that is not an integer) stops the run with :class:`IngestError`; rows are
never skipped silently.

Two datasets are supported:

* :func:`ingest_criteo` -- the Kaggle Criteo Display Advertising Challenge
  TSV files, streamed block by block, one Parquet file per input file.
* :func:`ingest_movielens` -- MovieLens 100k (``u.data`` joined with
  ``u.item`` genres and ``u.user`` demographics), one Parquet file.

Every Parquet file is first written under a hidden temporary name in the
output folder and renamed into place (:func:`os.replace`) only when complete,
so an interrupted run never leaves a partial file under a final name.

No TensorFlow is imported here, and no Python loop runs per row: all work is
done by ``pyarrow.csv``, ``pyarrow.compute`` and numpy on whole columns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from collections.abc import Iterator
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from psrec.errors import ConfigError

__all__ = [
    "CRITEO_CATEGORICAL_COLUMNS",
    "CRITEO_COLUMNS",
    "CRITEO_INTEGER_COLUMNS",
    "CRITEO_LABEL_COLUMN",
    "MOVIELENS_FILE_NAME",
    "IngestError",
    "IngestReport",
    "criteo_schema",
    "ingest_criteo",
    "ingest_movielens",
    "movielens_schema",
]

CRITEO_LABEL_COLUMN = "label"
CRITEO_INTEGER_COLUMNS: tuple[str, ...] = tuple(f"I{i}" for i in range(1, 14))
CRITEO_CATEGORICAL_COLUMNS: tuple[str, ...] = tuple(
    f"C{i}" for i in range(1, 27)
)
CRITEO_COLUMNS: tuple[str, ...] = (
    (CRITEO_LABEL_COLUMN,) + CRITEO_INTEGER_COLUMNS + CRITEO_CATEGORICAL_COLUMNS
)

MOVIELENS_FILE_NAME = "movielens.parquet"

# Suffixes that pyarrow decompresses transparently; dropped from output names.
_COMPRESSION_SUFFIXES = frozenset({".gz", ".bz2", ".zst", ".lz4"})
# How much of a file is read to count the fields of its first line.
_SNIFF_BYTES = 1 << 16
# How many offending ids an error message lists before "...".
_MAX_IDS_IN_MESSAGE = 10

_CRITEO_FIX = (
    "Check that it is a raw Kaggle Criteo file: tab-separated, no header, "
    "40 fields per line (label, I1..I13, C1..C26; 39 without the label), "
    "integer fields empty or matching -?[0-9]+, and that it is not truncated "
    "or corrupted."
)


class IngestError(ConfigError):
    """A raw input file cannot be converted; the message names file and fix."""


@dataclasses.dataclass(frozen=True)
class IngestReport:
    """What one ingest call wrote.

    Attributes:
      files: Paths of the Parquet files written, in input order.
      rows: Total number of rows written over all files.
      positives: Number of positive examples (Criteo: sum of the ``label``
        column; MovieLens: ratings >= 4), or ``None`` when the inputs carry
        no label.
    """

    files: tuple[str, ...]
    rows: int
    positives: int | None

    def summary(self) -> str:
        """Returns a one-line human-readable summary of the ingest."""
        n = len(self.files)
        text = f"{self.rows:,} rows in {n} parquet file{'s' if n != 1 else ''}"
        if self.positives is None:
            text += " (unlabelled)"
        else:
            rate = self.positives / self.rows if self.rows else 0.0
            text += f", {self.positives:,} positives ({rate:.2%})"
        if self.files:
            text += ": " + ", ".join(self.files)
        return text


# --------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------


@contextlib.contextmanager
def _atomic_output(final_path: Path) -> Iterator[Path]:
    """Yields a temporary path next to ``final_path``; renames it on success.

    The temporary file is hidden (``.<name>.tmp-<pid>``) and lives in the same
    folder, so :func:`os.replace` is an atomic rename. If the body raises,
    the temporary file is removed and ``final_path`` is left untouched.
    """
    tmp_path = final_path.with_name(f".{final_path.name}.tmp-{os.getpid()}")
    try:
        yield tmp_path
        os.replace(tmp_path, final_path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def _prepare_out_dir(out_dir: str | Path) -> Path:
    """Creates ``out_dir`` if needed and returns it as a :class:`Path`."""
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise IngestError(
            f"Output path {str(path)!r} exists and is not a folder; pass a "
            "folder (it is created if missing)."
        )
    path.mkdir(parents=True, exist_ok=True)
    return path


def _require_file(path: Path, what: str) -> None:
    """Raises :class:`IngestError` unless ``path`` is an existing file."""
    if not path.is_file():
        raise IngestError(
            f"{what} {str(path)!r} does not exist or is not a file; check the "
            "path."
        )


def _format_ids(ids: pa.Array) -> str:
    """Formats up to ``_MAX_IDS_IN_MESSAGE`` ids for an error message."""
    values = ids.to_pylist()
    shown = ", ".join(str(v) for v in values[:_MAX_IDS_IN_MESSAGE])
    if len(values) > _MAX_IDS_IN_MESSAGE:
        shown += f", ... ({len(values)} in all)"
    return shown


def _read_table(
    path: Path,
    what: str,
    column_names: Sequence[str],
    column_types: dict[str, pa.DataType],
    *,
    delimiter: str,
    encoding: str = "utf8",
) -> pa.Table:
    """Reads a small headerless delimited file strictly under a fixed schema.

    Empty fields are errors (not nulls) and quotes are not special.

    Raises:
      IngestError: if the file is missing or a row does not parse.
    """
    _require_file(path, what)
    try:
        return pa_csv.read_csv(
            path,
            read_options=pa_csv.ReadOptions(
                column_names=list(column_names), encoding=encoding
            ),
            parse_options=pa_csv.ParseOptions(
                delimiter=delimiter, quote_char=False
            ),
            convert_options=pa_csv.ConvertOptions(
                column_types=column_types,
                include_columns=list(column_types),
                null_values=[],
                strings_can_be_null=False,
            ),
        )
    except (pa.ArrowInvalid, UnicodeDecodeError) as err:
        raise IngestError(
            f"Cannot parse {what} {str(path)!r}: {err}. Expected "
            f"{len(column_names)} {delimiter!r}-separated fields per line "
            f"({', '.join(column_names)}); check that the file is the "
            "original, uncorrupted one."
        ) from err


# --------------------------------------------------------------------------
# Criteo
# --------------------------------------------------------------------------


def criteo_schema(*, labelled: bool = True) -> pa.Schema:
    """Returns the Arrow schema of an ingested Criteo file.

    Args:
      labelled: Whether the file has the leading ``label`` column (the Kaggle
        ``train.txt`` layout) or not (the ``test.txt`` layout).
    """
    fields = [pa.field(name, pa.int64()) for name in CRITEO_INTEGER_COLUMNS]
    fields += [
        pa.field(name, pa.string()) for name in CRITEO_CATEGORICAL_COLUMNS
    ]
    if labelled:
        fields.insert(0, pa.field(CRITEO_LABEL_COLUMN, pa.int64()))
    return pa.schema(fields)


def _output_stem(path: Path) -> str:
    """Returns the output base name: the input stem, minus compression."""
    if path.suffix.lower() in _COMPRESSION_SUFFIXES:
        path = path.with_suffix("")
    return path.stem


def _criteo_is_labelled(path: Path) -> bool:
    """Tells the labelled (40-field) from the unlabelled (39-field) layout.

    Only the first line is looked at; every other line is checked by the
    parser against the layout chosen here.

    Raises:
      IngestError: if the file is empty or its first line has neither 40 nor
        39 tab-separated fields.
    """
    with pa.input_stream(str(path), compression="detect") as stream:
        head = stream.read(_SNIFF_BYTES)
    if not head.strip():
        raise IngestError(
            f"Criteo file {str(path)!r} is empty; check the download or "
            "remove it from the inputs."
        )
    first_line = head.split(b"\n", 1)[0].rstrip(b"\r")
    n_fields = first_line.count(b"\t") + 1
    if n_fields == len(CRITEO_COLUMNS):
        return True
    if n_fields == len(CRITEO_COLUMNS) - 1:
        return False
    raise IngestError(
        f"Criteo file {str(path)!r}: line 1 has {n_fields} tab-separated "
        f"fields, expected {len(CRITEO_COLUMNS)} (or "
        f"{len(CRITEO_COLUMNS) - 1} without the label). {_CRITEO_FIX}"
    )


def _describe_csv_error(
    err: Exception,
    column_names: Sequence[str],
    bad_rows: list[pa_csv.InvalidRow],
) -> str:
    """Turns a pyarrow CSV error into a precise, readable reason."""
    if bad_rows:
        row = bad_rows[0]
        text = row.text if len(row.text) <= 200 else row.text[:200] + "..."
        return (
            f"a line has {row.actual_columns} tab-separated fields instead "
            f"of {row.expected_columns}: {text!r}"
        )
    reason = str(err)
    match = re.search(r"column #(\d+)", reason)
    if match and int(match.group(1)) < len(column_names):
        name = column_names[int(match.group(1))]
        reason = f"column {name}: {reason}"
    return reason


def _ingest_criteo_file(
    src: Path, dst: Path, labelled: bool, block_size_bytes: int
) -> tuple[int, int | None]:
    """Streams one Criteo TSV into one Parquet file.

    Returns:
      ``(rows, positives)``; ``positives`` is ``None`` when unlabelled.

    Raises:
      IngestError: on the first row that does not parse.
    """
    schema = criteo_schema(labelled=labelled)
    column_names = schema.names
    # Filled by pyarrow with the rows that have the wrong number of fields;
    # called only for such rows, so this is not a per-row loop.
    bad_rows: list[pa_csv.InvalidRow] = []

    def on_invalid_row(row: pa_csv.InvalidRow) -> str:
        bad_rows.append(row)
        return "error"

    read_options = pa_csv.ReadOptions(
        column_names=column_names, block_size=block_size_bytes
    )
    parse_options = pa_csv.ParseOptions(
        delimiter="\t", quote_char=False, invalid_row_handler=on_invalid_row
    )
    convert_options = pa_csv.ConvertOptions(
        column_types={field.name: field.type for field in schema},
        null_values=[""],
        strings_can_be_null=True,
    )

    rows = 0
    positives = 0
    with _atomic_output(dst) as tmp_path:
        try:
            reader = pa_csv.open_csv(
                src,
                read_options=read_options,
                parse_options=parse_options,
                convert_options=convert_options,
            )
            with pq.ParquetWriter(tmp_path, schema) as writer:
                for batch in reader:
                    writer.write_batch(batch)
                    rows += batch.num_rows
                    if labelled:
                        total = pc.sum(batch.column(CRITEO_LABEL_COLUMN))
                        positives += total.as_py() or 0
        except (pa.ArrowInvalid, UnicodeDecodeError) as err:
            reason = _describe_csv_error(err, column_names, bad_rows)
            where = (
                f"after its first {rows:,} data rows, which parsed fine"
                if rows
                else "within its first block of rows"
            )
            raise IngestError(
                f"Cannot parse Criteo file {str(src)!r} ({where}): {reason}. "
                f"{_CRITEO_FIX}"
            ) from err
    return rows, (positives if labelled else None)


def ingest_criteo(
    tsv_paths: Sequence[str | Path],
    out_dir: str | Path,
    *,
    block_size_bytes: int = 64 << 20,
) -> IngestReport:
    """Converts raw Kaggle Criteo TSV files to Parquet, one file per input.

    Each input is streamed (never held whole in memory) with
    ``pyarrow.csv.open_csv`` and written batch by batch to
    ``out_dir/<input stem>.parquet``. Columns: ``label`` (int64, only for the
    40-field ``train.txt`` layout), ``I1``..``I13`` (int64) and
    ``C1``..``C26`` (string); empty fields become nulls. Values are not
    range-checked here (e.g. a label of 2 is kept as is).

    Args:
      tsv_paths: Raw TSV files (optionally ``.gz``/``.bz2``/``.zst``/``.lz4``
        compressed). All must share one layout: all labelled or all not.
      out_dir: Output folder; created if missing. Existing outputs with the
        same names are replaced.
      block_size_bytes: Bytes of text parsed per block; bounds the memory used
        and sets the size of the record batches written.

    Returns:
      An :class:`IngestReport`; ``positives`` is the sum of the label column,
      or ``None`` for unlabelled inputs.

    Raises:
      IngestError: if an input is missing or empty, the inputs mix layouts
        or map to the same output name, or a row has the wrong number of
        fields or an integer field that does not parse.
    """
    sources = [Path(p) for p in tsv_paths]
    if not sources:
        raise IngestError(
            "ingest_criteo got no input files; pass at least one TSV path."
        )
    if block_size_bytes <= 0:
        raise IngestError(
            f"block_size_bytes must be positive, got {block_size_bytes}; "
            "use e.g. 64 << 20."
        )
    for src in sources:
        _require_file(src, "Criteo file")

    stems = [_output_stem(src) for src in sources]
    if len(set(stems)) != len(stems):
        dup = sorted({s for s in stems if stems.count(s) > 1})
        raise IngestError(
            f"Criteo inputs map to the same output name(s) {dup}: "
            f"{[str(s) for s in sources]}; rename the inputs so their stems "
            "differ, or ingest them into different folders."
        )

    layouts = [_criteo_is_labelled(src) for src in sources]
    if len(set(layouts)) > 1:
        labelled_files = [str(s) for s, lab in zip(sources, layouts) if lab]
        unlabelled = [str(s) for s, lab in zip(sources, layouts) if not lab]
        raise IngestError(
            f"Criteo inputs mix labelled files {labelled_files} with "
            f"unlabelled files {unlabelled}; ingest them in separate calls."
        )

    out = _prepare_out_dir(out_dir)
    files: list[str] = []
    total_rows = 0
    total_positives = 0
    for src, stem, labelled in zip(sources, stems, layouts):
        dst = out / f"{stem}.parquet"
        rows, positives = _ingest_criteo_file(
            src, dst, labelled, block_size_bytes
        )
        files.append(str(dst))
        total_rows += rows
        total_positives += positives or 0
    return IngestReport(
        files=tuple(files),
        rows=total_rows,
        positives=total_positives if layouts[0] else None,
    )


# --------------------------------------------------------------------------
# MovieLens 100k
# --------------------------------------------------------------------------


def movielens_schema() -> pa.Schema:
    """Returns the Arrow schema of the ingested MovieLens table."""
    return pa.schema(
        [
            pa.field("user_id", pa.int64()),
            pa.field("item_id", pa.int64()),
            pa.field("rating", pa.int64()),
            pa.field("timestamp", pa.int64()),
            pa.field("genres", pa.list_(pa.string())),
            pa.field("age", pa.int64()),
            pa.field("gender", pa.string()),
            pa.field("occupation", pa.string()),
            pa.field("zip", pa.string()),
        ]
    )


def _read_genre_names(path: Path) -> pa.Array:
    """Reads ``u.genre`` (``name|index``) into genre names in index order.

    Raises:
      IngestError: if the indices are not exactly ``0..n-1``.
    """
    table = _read_table(
        path,
        "MovieLens genre file",
        ["name", "index"],
        {"name": pa.string(), "index": pa.int64()},
        delimiter="|",
    )
    table = table.sort_by("index")
    index = table.column("index").to_numpy()
    if table.num_rows == 0 or not np.array_equal(
        index, np.arange(table.num_rows)
    ):
        raise IngestError(
            f"MovieLens genre file {str(path)!r} must list genres with "
            f"indices 0..n-1 (got {index.tolist()}); check that it is the "
            "original u.genre."
        )
    return table.column("name").combine_chunks()


def _check_unique_ids(ids: pa.ChunkedArray, path: Path, what: str) -> None:
    """Raises :class:`IngestError` if ``ids`` has duplicates."""
    counts = pc.value_counts(ids)
    repeated = pc.greater(counts.field("counts"), 1)
    dup = pc.filter(counts.field("values"), repeated)
    if len(dup):
        raise IngestError(
            f"MovieLens {what} file {str(path)!r} lists id(s) "
            f"{_format_ids(dup)} more than once; each id must appear on one "
            "line only."
        )


def _genre_lists(
    flags: np.ndarray, genre_names: pa.Array, item_ids: np.ndarray, path: Path
) -> pa.ListArray:
    """Builds one list of genre names per item from its 0/1 flag matrix.

    Args:
      flags: ``(n_items, n_genres)`` integer matrix of genre flags.
      genre_names: ``n_genres`` names, in flag-column order.
      item_ids: ``n_items`` ids, for error messages.
      path: The ``u.item`` path, for error messages.

    Raises:
      IngestError: if a flag is neither 0 nor 1.
    """
    bad = (flags != 0) & (flags != 1)
    if bad.any():
        rows = np.flatnonzero(bad.any(axis=1))
        raise IngestError(
            f"MovieLens item file {str(path)!r}: genre flags must be 0 or 1, "
            f"but item id(s) {_format_ids(pa.array(item_ids[rows]))} have "
            "other values; check that it is the original u.item."
        )
    mask = flags == 1
    offsets = np.zeros(len(flags) + 1, dtype=np.int32)
    np.cumsum(mask.sum(axis=1), out=offsets[1:])
    # Row-major flattening keeps items in order and genres in u.genre order.
    genre_index = np.flatnonzero(mask.ravel()) % flags.shape[1]
    values = genre_names.take(pa.array(genre_index))
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _lookup(
    keys: pa.ChunkedArray, ids: pa.ChunkedArray, path: Path, what: str
) -> pa.Array:
    """Returns, per key, its row position in ``ids``.

    Raises:
      IngestError: naming the keys that are missing from ``ids``.
    """
    positions = pc.index_in(keys, value_set=ids.combine_chunks())
    if positions.null_count:
        missing = pc.unique(pc.filter(keys, pc.is_null(positions)))
        raise IngestError(
            f"MovieLens ratings refer to {what} id(s) {_format_ids(missing)} "
            f"that are missing from {str(path)!r}; use the u.data, u.item "
            "and u.user files of one and the same ml-100k copy."
        )
    return positions.combine_chunks()


def ingest_movielens(ml_dir: str | Path, out_dir: str | Path) -> IngestReport:
    """Converts MovieLens 100k into one joined Parquet table.

    Reads ``u.data`` (ratings), ``u.item`` (movies, latin-1), ``u.genre`` and
    ``u.user`` from ``ml_dir`` and writes ``out_dir/movielens.parquet`` with
    one row per rating, in ``u.data`` order, and the columns of
    :func:`movielens_schema`: ``user_id``, ``item_id``, ``rating``,
    ``timestamp`` (int64), ``genres`` (list<string>: the names of the genres
    flagged 1 for the movie, in ``u.genre`` order), ``age`` (int64),
    ``gender``, ``occupation`` and ``zip`` (string).

    Args:
      ml_dir: The folder holding the ml-100k files.
      out_dir: Output folder; created if missing. An existing
        ``movielens.parquet`` there is replaced.

    Returns:
      An :class:`IngestReport` with one file; ``positives`` counts ratings
      of 4 or more.

    Raises:
      IngestError: if a file is missing or does not parse, an id is listed
        twice in ``u.item``/``u.user``, a genre flag is not 0/1, or a rating
        names a user or item id that ``u.user``/``u.item`` lacks.
    """
    ml = Path(ml_dir)
    if not ml.is_dir():
        raise IngestError(
            f"MovieLens folder {str(ml)!r} does not exist; pass the folder "
            "holding u.data, u.item, u.genre and u.user."
        )

    genre_names = _read_genre_names(ml / "u.genre")
    n_genres = len(genre_names)

    data_path = ml / "u.data"
    ratings = _read_table(
        data_path,
        "MovieLens ratings file",
        ["user_id", "item_id", "rating", "timestamp"],
        {
            name: pa.int64()
            for name in ("user_id", "item_id", "rating", "timestamp")
        },
        delimiter="\t",
    )

    item_path = ml / "u.item"
    flag_names = [f"genre_{i}" for i in range(n_genres)]
    items = _read_table(
        item_path,
        "MovieLens item file",
        ["item_id", "title", "release_date", "video_release_date", "imdb_url"]
        + flag_names,
        {"item_id": pa.int64(), **{name: pa.int8() for name in flag_names}},
        delimiter="|",
        encoding="latin1",
    )
    _check_unique_ids(items.column("item_id"), item_path, "item")
    flags = np.column_stack(
        [items.column(name).to_numpy() for name in flag_names]
    )
    item_genres = _genre_lists(
        flags, genre_names, items.column("item_id").to_numpy(), item_path
    )

    user_path = ml / "u.user"
    users = _read_table(
        user_path,
        "MovieLens user file",
        ["user_id", "age", "gender", "occupation", "zip"],
        {
            "user_id": pa.int64(),
            "age": pa.int64(),
            "gender": pa.string(),
            "occupation": pa.string(),
            "zip": pa.string(),
        },
        delimiter="|",
    )
    _check_unique_ids(users.column("user_id"), user_path, "user")

    item_pos = _lookup(
        ratings.column("item_id"), items.column("item_id"), item_path, "item"
    )
    user_pos = _lookup(
        ratings.column("user_id"), users.column("user_id"), user_path, "user"
    )
    user_rows = users.take(user_pos)

    schema = movielens_schema()
    table = pa.table(
        [
            ratings.column("user_id"),
            ratings.column("item_id"),
            ratings.column("rating"),
            ratings.column("timestamp"),
            item_genres.take(item_pos).cast(schema.field("genres").type),
            user_rows.column("age"),
            user_rows.column("gender"),
            user_rows.column("occupation"),
            user_rows.column("zip"),
        ],
        schema=schema,
    )
    positives = pc.sum(pc.greater_equal(ratings.column("rating"), 4)).as_py()

    out = _prepare_out_dir(out_dir)
    dst = out / MOVIELENS_FILE_NAME
    with _atomic_output(dst) as tmp_path:
        pq.write_table(table, tmp_path)
    return IngestReport(
        files=(str(dst),), rows=table.num_rows, positives=positives or 0
    )
