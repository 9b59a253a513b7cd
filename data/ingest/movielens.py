"""MovieLens 100k -> one Parquet table: ``u.data`` ratings joined with the
``u.item`` genres and ``u.user`` demographics (see ``data.ingest.common``), in
time order, so a tail split evaluates on the most recent ratings."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from psrec.data.format.files import atomic_output
from psrec.data.format.files import open_arrow_input
from psrec.data.ingest.common import IngestError
from psrec.data.ingest.common import IngestReport
from psrec.data.ingest.common import IngestUsageError
from psrec.data.ingest.common import prepare_out_dir
from psrec.data.ingest.common import require_file
from psrec.uri_path import as_path

MOVIELENS_FILE_NAME = "movielens.parquet"
_RATING_COLUMNS = ["user_id", "item_id", "rating", "timestamp"]
# How many offending ids an error message lists before "...".
_MAX_IDS_IN_MESSAGE = 10


def _format_ids(ids: pa.Array) -> str:
    """Up to ``_MAX_IDS_IN_MESSAGE`` ids, for an error message."""
    values = ids.to_pylist()
    shown = ", ".join(str(v) for v in values[:_MAX_IDS_IN_MESSAGE])
    if len(values) > _MAX_IDS_IN_MESSAGE:
        shown += f", ... ({len(values)} in all)"
    return shown


def _read_table(path: Path, what: str, column_names: Sequence[str],
                column_types: dict[str, pa.DataType], *, delimiter: str,
                encoding: str = "utf8") -> pa.Table:
    """Reads a small headerless delimited file strictly under a fixed schema
    (empty fields are errors, not nulls; quotes are not special)."""
    require_file(path, what)
    try:
        with open_arrow_input(path) as source:  # local, s3://, gs://, ...
            return pa_csv.read_csv(
                source,
                read_options=pa_csv.ReadOptions(
                    column_names=list(column_names), encoding=encoding),
                parse_options=pa_csv.ParseOptions(delimiter=delimiter,
                                                  quote_char=False),
                convert_options=pa_csv.ConvertOptions(
                    column_types=column_types,
                    include_columns=list(column_types), null_values=[],
                    strings_can_be_null=False))
    except (pa.ArrowInvalid, UnicodeDecodeError) as err:
        raise IngestError(
            f"Cannot parse {what} {str(path)!r}: {err}. Expected "
            f"{len(column_names)} {delimiter!r}-separated fields per line "
            f"({', '.join(column_names)}); check that the file is the "
            "original, uncorrupted one.") from err


def movielens_schema() -> pa.Schema:
    """The Arrow schema of the ingested MovieLens table."""
    return pa.schema(
        [(name, pa.int64()) for name in _RATING_COLUMNS]
        + [("genres", pa.list_(pa.string())), ("age", pa.int64())]
        + [(name, pa.string()) for name in ("gender", "occupation", "zip")])


def _read_genre_names(path: Path) -> pa.Array:
    """``u.genre`` (``name|index``) -> genre names in index order."""
    table = _read_table(path, "MovieLens genre file", ["name", "index"],
                        {"name": pa.string(), "index": pa.int64()},
                        delimiter="|").sort_by("index")
    index = table.column("index").to_numpy()
    if table.num_rows == 0 or not np.array_equal(index,
                                                 np.arange(table.num_rows)):
        raise IngestError(
            f"MovieLens genre file {str(path)!r} must list genres with "
            f"indices 0..n-1 (got {index.tolist()}); check that it is the "
            "original u.genre.")
    return table.column("name").combine_chunks()


def _check_unique_ids(ids: pa.ChunkedArray, path: Path, what: str) -> None:
    counts = pc.value_counts(ids)
    dup = pc.filter(counts.field("values"),
                    pc.greater(counts.field("counts"), 1))
    if len(dup):
        raise IngestError(
            f"MovieLens {what} file {str(path)!r} lists id(s) "
            f"{_format_ids(dup)} more than once; each id must appear on one "
            "line only.")


def _genre_lists(flags: np.ndarray, genre_names: pa.Array,
                 item_ids: np.ndarray, path: Path) -> pa.ListArray:
    """One list of genre names per item, from the ``(n_items, n_genres)``
    0/1 flag matrix of ``u.item`` (``path``)."""
    bad = (flags != 0) & (flags != 1)
    if bad.any():
        rows = np.flatnonzero(bad.any(axis=1))
        raise IngestError(
            f"MovieLens item file {str(path)!r}: genre flags must be 0 or 1, "
            f"but item id(s) {_format_ids(pa.array(item_ids[rows]))} have "
            "other values; check that it is the original u.item.")
    mask = flags == 1
    offsets = np.zeros(len(flags) + 1, dtype=np.int32)
    np.cumsum(mask.sum(axis=1), out=offsets[1:])
    # Row-major flattening keeps items in order and genres in u.genre order.
    genre_index = np.flatnonzero(mask.ravel()) % flags.shape[1]
    values = genre_names.take(pa.array(genre_index))
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _lookup(keys: pa.ChunkedArray, ids: pa.ChunkedArray, path: Path,
            what: str) -> pa.Array:
    """Per key, its row position in ``ids``; every key must be there."""
    positions = pc.index_in(keys, value_set=ids.combine_chunks())
    if positions.null_count:
        missing = pc.unique(pc.filter(keys, pc.is_null(positions)))
        raise IngestError(
            f"MovieLens ratings refer to {what} id(s) {_format_ids(missing)} "
            f"that are missing from {str(path)!r}; use the u.data, u.item "
            "and u.user files of one and the same ml-100k copy.")
    return positions.combine_chunks()


def ingest_movielens(ml_dir: str | Path, out_dir: str | Path) -> IngestReport:
    """Converts MovieLens 100k into one joined Parquet table.

    Reads ``u.data`` (ratings), ``u.item`` (movies, latin-1), ``u.genre`` and
    ``u.user`` from ``ml_dir`` and writes ``out_dir/movielens.parquet``
    (replacing it): one row per rating, ordered by ``timestamp`` (ratings
    of the same second keep their ``u.data`` order), so ``psrec convert
    --split tail`` puts the most recent ratings in eval; with the columns
    of :func:`movielens_schema`; ``genres`` lists the genres flagged
    1 for the movie, in ``u.genre`` order. ``positives`` of the report
    counts ratings of 4 or more.
    """
    ml = as_path(ml_dir)
    if not ml.is_dir():
        raise IngestUsageError(
            f"MovieLens folder {str(ml)!r} does not exist; pass the folder "
            "holding u.data, u.item, u.genre and u.user.")
    genre_names = _read_genre_names(ml / "u.genre")
    ratings = _read_table(
        ml / "u.data", "MovieLens ratings file", _RATING_COLUMNS,
        {name: pa.int64() for name in _RATING_COLUMNS}, delimiter="\t")
    ratings = ratings.take(pc.sort_indices(  # stable: ties keep file order
        ratings, sort_keys=[("timestamp", "ascending")]))

    item_path = ml / "u.item"
    flag_names = [f"genre_{i}" for i in range(len(genre_names))]
    items = _read_table(
        item_path, "MovieLens item file",
        ["item_id", "title", "release_date", "video_release_date",
         "imdb_url"] + flag_names,
        {"item_id": pa.int64(), **{name: pa.int8() for name in flag_names}},
        delimiter="|", encoding="latin1")
    _check_unique_ids(items.column("item_id"), item_path, "item")
    flags = np.column_stack([items.column(n).to_numpy() for n in flag_names])
    item_genres = _genre_lists(flags, genre_names,
                               items.column("item_id").to_numpy(), item_path)

    user_path = ml / "u.user"
    schema = movielens_schema()
    user_columns = ["user_id", "age", "gender", "occupation", "zip"]
    users = _read_table(
        user_path, "MovieLens user file", user_columns,
        {name: schema.field(name).type for name in user_columns},
        delimiter="|")
    _check_unique_ids(users.column("user_id"), user_path, "user")

    item_pos = _lookup(ratings.column("item_id"), items.column("item_id"),
                       item_path, "item")
    user_rows = users.take(_lookup(ratings.column("user_id"),
                                   users.column("user_id"), user_path, "user"))
    genres = item_genres.take(item_pos).cast(schema.field("genres").type)
    table = pa.table(
        [ratings.column(name) for name in _RATING_COLUMNS] + [genres]
        + [user_rows.column(name) for name in user_columns[1:]],
        schema=schema)
    positives = pc.sum(pc.greater_equal(ratings.column("rating"), 4)).as_py()

    dst = prepare_out_dir(out_dir) / MOVIELENS_FILE_NAME
    with atomic_output(dst) as tmp_path:
        pq.write_table(table, str(tmp_path))
    return IngestReport(files=(str(dst),), rows=table.num_rows,
                        positives=positives or 0)
