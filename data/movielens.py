"""MovieLens 100k -> one Parquet table: ``u.data`` ratings joined with the
``u.item`` genres and ``u.user`` demographics (see ``data.ingest``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from psrec.data.ingest import IngestError
from psrec.data.ingest import IngestReport
from psrec.data.ingest import atomic_output
from psrec.data.ingest import prepare_out_dir
from psrec.data.ingest import require_file

MOVIELENS_FILE_NAME = "movielens.parquet"
# How many offending ids an error message lists before "...".
_MAX_IDS_IN_MESSAGE = 10


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
    require_file(path, what)
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

    out = prepare_out_dir(out_dir)
    dst = out / MOVIELENS_FILE_NAME
    with atomic_output(dst) as tmp_path:
        pq.write_table(table, tmp_path)
    return IngestReport(
        files=(str(dst),), rows=table.num_rows, positives=positives or 0
    )
