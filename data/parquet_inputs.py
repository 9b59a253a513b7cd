"""The Parquet inputs of ``psrec convert``: folders expanded as pyarrow's
dataset discovery does, and a file that is no Parquet named with the
``psrec ingest`` command that reads it; a truncated or corrupted Parquet
file is a one-line :class:`CorruptParquetError` naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from psrec.errors import ConfigError
from psrec.errors import DataError


def parquet_files(paths: Sequence[str | Path]) -> list[str]:
    """Input paths as Parquet files, as pyarrow's dataset discovery finds
    them: a folder expands to every ``*.parquet`` file below it (recursive,
    sorted, skipping names that start with ``.`` or ``_``); files stay in the
    given order.

    Raises:
      FileNotFoundError: a path does not exist.
      ConfigError: a folder holds no ``*.parquet`` file.
    """
    files: list[str] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(
                file.relative_to(path).as_posix()
                for file in path.rglob("*.parquet") if file.is_file()
                and not any(part.startswith((".", "_"))
                            for part in file.relative_to(path).parts))
            if not found:
                raise ConfigError(
                    f"input folder {path} holds no *.parquet file; pass "
                    "Parquet files or a folder of them (`psrec ingest` "
                    "turns CSV, libFM, JSON lines, Criteo TSV or MovieLens files into "
                    "Parquet).")
            files += [str(path / name) for name in found]
        elif path.is_file():
            files.append(str(path))
        else:
            raise FileNotFoundError(
                f"input Parquet file {path} does not exist.")
    return files


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
        return pq.read_metadata(path)
    except (pa.ArrowException, OSError) as error:
        with open(path, "rb") as file:
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
        parquet = pq.ParquetFile(path, page_checksum_verification=True)
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
    suffixes = [s for s in Path(path).suffixes
                if s not in (".gz", ".bz2", ".zst", ".lz4")]
    kind = _INGEST_BY_SUFFIX.get(suffixes[-1].lower() if suffixes else "")
    return (f"`psrec ingest {kind}`" if kind else
            "`psrec ingest csv|libfm|jsonl|criteo|movielens`")
