"""The Parquet inputs of ``psrec convert``: folders expanded as pyarrow's
dataset discovery does, and a file that is no Parquet named with the
``psrec ingest`` command that reads it; a truncated or corrupted Parquet
file is a one-line :class:`CorruptParquetError` naming it."""

from __future__ import annotations

from pathlib import Path
from pathlib import PurePosixPath
from typing import Iterator
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from psrec.data.format.files import open_arrow_input
from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.uri import arrow_filesystem
from psrec.uri import arrow_supports
from psrec.uri import is_uri
from psrec.uri import name as uri_name
from psrec.uri_path import as_path


def parquet_files(paths: Sequence[str | Path]) -> list[str]:
    """Input paths as Parquet files, as pyarrow's dataset discovery finds
    them: a folder expands to every ``*.parquet`` file below it (recursive,
    sorted, skipping names that start with ``.`` or ``_``); files stay in the
    given order. A path may be a URI (``s3://bucket/logs/``): folders are
    listed through ``pyarrow.fs`` (``psrec.uri``).
    """
    files: list[str] = []
    for path in paths:
        kind, found = _listing(path)
        if kind == "dir":
            if not found:
                raise ConfigError(
                    f"input folder {path} holds no *.parquet file; pass "
                    "Parquet files or a folder of them (`psrec ingest` "
                    "turns CSV, libFM, JSON lines, Criteo TSV or MovieLens "
                    "files into Parquet).")
            files += [str(as_path(path) / name) for name in found]
        elif kind == "file":
            files.append(str(as_path(path)))
        else:
            raise FileNotFoundError(
                f"input Parquet file {path} does not exist.")
    return files


def _hidden(relative: str) -> bool:
    return any(part.startswith((".", "_")) for part in relative.split("/"))


def _listing(path: str | Path) -> tuple[str, list[str]]:
    """``("dir", sorted relative *.parquet names)``, ``("file", [])`` or
    ``("missing", [])``."""
    if not is_uri(path) or not arrow_supports(path):
        folder = as_path(path)
        if folder.is_dir():
            relative = (found.relative_to(folder).as_posix()
                        for found in folder.rglob("*.parquet")
                        if found.is_file())
            return "dir", sorted(rel for rel in relative if not _hidden(rel))
        return ("file" if folder.is_file() else "missing"), []
    import pyarrow.fs as pafs
    filesystem, inner = arrow_filesystem(path)
    info = filesystem.get_file_info(inner)
    if info.type == pafs.FileType.Directory:
        below = filesystem.get_file_info(pafs.FileSelector(
            inner, recursive=True))
        return "dir", sorted(
            rel for rel in (i.path[len(inner.rstrip("/")) + 1:] for i in below
                            if i.type == pafs.FileType.File)
            if rel.endswith(".parquet") and not _hidden(rel))
    return ("file" if info.type == pafs.FileType.File else "missing"), []


class CorruptParquetError(DataError):
    """A Parquet input is truncated or corrupted (exit 1)."""

    def __init__(self, path: str | Path, error: BaseException,
                 where: str = "") -> None:
        self.path = str(path)
        super().__init__(
            f"Parquet file {path} is truncated or corrupted{where} "
            f"({_reason(error)}); re-create or re-download it. Nothing was "
            "written.")


_MAGIC = b"PAR1"


def _reason(error: BaseException) -> str:
    return (str(error).splitlines()[0] if str(error)
            else type(error).__name__)


def read_metadata(path: str) -> pq.FileMetaData:
    """A Parquet file's metadata; ConfigError naming the ``psrec ingest``
    command to run when the file is no Parquet, CorruptParquetError when
    it starts as Parquet but its footer is cut or broken."""
    try:
        with open_arrow_input(path) as file:
            return pq.read_metadata(file)
    except (pa.ArrowException, OSError) as error:
        if isinstance(error, FileNotFoundError):
            raise
        with open_arrow_input(path) as file:
            if file.read(len(_MAGIC)) == _MAGIC:
                raise CorruptParquetError(path, error) from error
        reason = _reason(error)
        raise ConfigError(
            f"input {path} is not a Parquet file ({reason}); convert takes "
            f"Parquet: run {_ingest_hint(path)} on it first.") from error


def parquet_batches(path: str, **options) -> Iterator[pa.RecordBatch]:
    """``ParquetFile(path).iter_batches(**options)`` with page checksums
    verified (where the writer stored them); a truncated or corrupted file
    is a :class:`CorruptParquetError` naming it and the rows read before
    the damage, never a bare ``OSError`` from pyarrow."""
    rows = 0
    try:
        with open_arrow_input(path) as file:
            parquet = pq.ParquetFile(file, page_checksum_verification=True)
            for batch in parquet.iter_batches(**options):
                rows += batch.num_rows
                yield batch
    except (pa.ArrowException, OSError) as error:
        raise CorruptParquetError(
            path, error, f" after row {rows}" if rows else "") from error


_INGEST_BY_SUFFIX = {".csv": "csv", ".tsv": "csv (or criteo)", ".txt": "csv",
                     ".libfm": "libfm", ".libsvm": "libfm", ".svm": "libfm",
                     ".json": "jsonl", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def _ingest_hint(path: str) -> str:
    """The ``psrec ingest`` command that reads a file like ``path``."""
    suffixes = [s for s in PurePosixPath(uri_name(path)).suffixes
                if s not in (".gz", ".bz2", ".zst", ".lz4")]
    kind = _INGEST_BY_SUFFIX.get(suffixes[-1].lower() if suffixes else "")
    return (f"`psrec ingest {kind}`" if kind else
            "`psrec ingest csv|libfm|jsonl|criteo|movielens`")
