"""Raw public dataset files -> Parquet: what the ingest steps share.

Ingest only *parses*: each raw file is read with :mod:`pyarrow.csv` under an
explicit schema and written to Parquet; nothing is filtered or range-checked
(conversion quarantines bad values). A row that cannot be parsed stops the
run with :class:`IngestError`; rows are never skipped silently. Every file is
written with ``data.format.files.atomic_output``. No TensorFlow, and no
Python loop per row.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from psrec.data.format.files import open_arrow_input
from psrec.errors import EXIT_USAGE
from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.progress import Progress
from psrec.progress import Task
from psrec.uri_path import UriPath
from psrec.uri_path import as_path


class IngestError(DataError):
    """A raw input file cannot be converted (bad data, exit 1); the message
    names file and fix."""


class IngestUsageError(IngestError, ConfigError):
    """An ingest argument is wrong (an input that does not exist, a bad
    option, an output path that is not a folder): a user mistake, exit 2."""

    exit_code = EXIT_USAGE


@dataclasses.dataclass(frozen=True)
class IngestReport:
    """What one ingest call wrote: the Parquet files in input order, their
    rows, and the positive examples (None when the inputs carry no label).
    ``has_label`` is False for generic logs (csv, jsonl), whose label column
    psrec does not know at ingest (the summary does not call them
    unlabelled)."""

    files: tuple[str, ...]
    rows: int
    positives: int | None
    has_label: bool = True

    def to_dict(self) -> dict[str, object]:
        """The report as JSON-able data."""
        return {"files": list(self.files), "rows": self.rows,
                "positives": self.positives}

    def summary(self) -> str:
        """Returns a one-line human-readable summary of the ingest."""
        n = len(self.files)
        text = f"{self.rows:,} rows in {n} parquet file{'s' if n != 1 else ''}"
        if self.positives is not None:
            rate = self.positives / self.rows if self.rows else 0.0
            text += f", {self.positives:,} positives ({rate:.2%})"
        elif self.has_label:
            text += " (unlabelled)"
        if self.files:
            text += ": " + ", ".join(self.files)
        return text


def prepare_out_dir(out_dir: str | Path) -> Path | UriPath:
    """``out_dir`` as a :class:`Path` (or a :class:`UriPath` for a URI:
    ``s3://`` is written through ``pyarrow.fs``), created if needed."""
    path = as_path(out_dir)
    if path.exists() and not path.is_dir():
        raise IngestUsageError(
            f"Output path {str(path)!r} exists and is not a folder; pass a "
            "folder (it is created if missing).")
    path.mkdir(parents=True, exist_ok=True)
    return path


def require_file(path: Path, what: str) -> None:
    """Raises :class:`IngestUsageError` unless ``path`` is an existing
    file."""
    if not path.is_file():
        raise IngestUsageError(f"{what} {str(path)!r} does not exist or is not a "
                          "file; check the path.")


# Compression recognised by the input's last suffix; dropped from output names.
COMPRESSION_BY_SUFFIX = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd",
                         ".lz4": "lz4"}


def compression_of(path: Path) -> str | None:
    """The pyarrow codec name of ``path``'s compression suffix, or None."""
    return COMPRESSION_BY_SUFFIX.get(path.suffix.lower())


def output_stem(path: Path) -> str:
    """The output base name: the input's name without compression and the
    last remaining suffix (``day_1.csv.gz`` -> ``day_1``)."""
    if compression_of(path):
        path = path.with_suffix("")
    return path.stem


def check_sources(paths: Sequence[str | Path], what: str) -> list[Path]:
    """The inputs as paths: at least one, each an existing file, their
    output stems distinct (one Parquet file per input)."""
    sources = [as_path(p) for p in paths]  # local paths or URIs
    if not sources:
        raise IngestUsageError(f"no {what} given; pass at least one input file.")
    for src in sources:
        require_file(src, what)
    stems = [output_stem(src) for src in sources]
    if len(set(stems)) != len(stems):
        dup = sorted({s for s in stems if stems.count(s) > 1})
        raise IngestUsageError(
            f"{what}s map to the same output name(s) {dup}: "
            f"{[str(s) for s in sources]}; rename the inputs so their stems "
            "differ, or ingest them into different folders.")
    return sources


@contextlib.contextmanager
def open_input(path: Path) -> Iterator[tuple[pa.NativeFile, pa.NativeFile]]:
    """Yields ``(raw, stream)``: the file as stored and the byte stream to
    parse, decompressed on the fly when the suffix says so. ``raw.tell()``
    is how far into the stored file the reader has got (for progress, see
    :class:`ReadMeter`). ``path`` may be a URI (``s3://``: pyarrow.fs)."""
    with open_arrow_input(path) as raw:
        codec = compression_of(path)
        if codec is None:
            yield raw, raw
            return
        with pa.CompressedInputStream(raw, codec) as stream:
            yield raw, stream


def first_line(path: Path, limit: int = 1 << 20, what: str = "Input file",
               fix: str = "the file") -> bytes:
    """The first line of ``path`` (decompressed, without its newline; at
    most ``limit`` bytes); refuses an empty file (``what``: check ``fix``)."""
    with open_input(path) as (_, stream):
        head = stream.read(limit)
    if not head.strip():
        raise IngestError(f"{what} {str(path)!r} is empty; check {fix} or "
                          "remove it from the inputs.")
    return head.split(b"\n", 1)[0].rstrip(b"\r")


def find_line(path: Path, text: str, chunk: int = 8 << 20) -> int | None:
    """The 1-based number of the first line of ``path`` that is exactly
    ``text``, or None; an error-path helper, streamed chunk by chunk."""
    needle = b"\n" + text.encode("utf-8", "replace")
    lines, tail = 0, b"\n"
    with open_input(path) as (_, stream):
        while True:
            data = stream.read(chunk)
            buf = tail + data
            start = 0
            while (hit := buf.find(needle, start)) >= 0:
                end = hit + len(needle)
                if end == len(buf) and data:
                    break  # the line may go on in the next chunk
                if end == len(buf) or buf[end:end + 1] in (b"\n", b"\r"):
                    return lines + buf.count(b"\n", 0, hit) + 1
                start = hit + 1
            if not data:
                return None
            keep = min(len(buf), len(needle) + 1)
            lines += buf.count(b"\n", 0, len(buf) - keep)
            tail = buf[len(buf) - keep:]


def invalid_rows() -> tuple[list, Callable[[object], str]]:
    """A list and the ``invalid_row_handler`` that fills it: pyarrow calls it
    only for a row with the wrong number of fields, and the read stops."""
    bad: list = []
    return bad, lambda row: bad.append(row) or "error"


def clip(text: str) -> str:
    """``text`` cut to 200 characters for an error message."""
    return text if len(text) <= 200 else text[:200] + "..."


def input_task(progress: Progress, sources: Sequence[Path]) -> Task:
    """One progress pass over ``sources``: their bytes as stored."""
    n = len(sources)
    return progress.task(f"ingest {n} file{'s' if n != 1 else ''}",
                         sum(src.stat().st_size for src in sources), "bytes")


class ReadMeter:
    """Counts the rows parsed from one input and advances ``task`` by the
    bytes of the file (as stored) read so far, ``raw.tell()``."""

    def __init__(self, task: Task, path: Path, raw: pa.NativeFile) -> None:
        self.task, self.raw = task, raw
        self.size = path.stat().st_size
        self.rows = self._read = 0

    def _to(self, read: int) -> None:
        read = min(read, self.size)
        if read > self._read:
            self.task.advance(read - self._read)
            self._read = read

    def add(self, rows: int) -> None:
        """Another ``rows`` rows were parsed."""
        self.rows += rows
        self._to(self.raw.tell())

    def finish(self) -> None:
        """The whole file was read (the reader reached its end)."""
        self._to(self.size)


def write_each(out_dir: str | Path, plans: Sequence[tuple],
               write: Callable[..., tuple[int, int | None]]
               ) -> tuple[tuple[str, ...], int, int]:
    """One Parquet file per input: ``write(src, dst, *rest)`` for each plan
    ``(src, *rest)``, ``dst`` = ``out_dir/<input stem>.parquet``. Returns
    the files, the rows and the positives (None counts as 0). An input
    that yields no row (a header-only CSV) is refused, its empty output
    removed: converting nothing would publish an empty dataset."""
    out = prepare_out_dir(out_dir)
    files, rows, positives = [], 0, 0
    for src, *rest in plans:
        dst = out / f"{output_stem(src)}.parquet"
        n, pos = write(src, dst, *rest)
        if not n:
            dst.unlink(missing_ok=True)
            raise IngestError(
                f"Input file {str(src)!r} holds no data row (a header "
                "only?); add its rows or remove it from the inputs.")
        files.append(str(dst))
        rows += n
        positives += pos or 0
    return tuple(files), rows, positives
