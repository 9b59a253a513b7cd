"""Small file helpers shared by psrec's writers: every file is written under
a hidden temporary name and renamed into place when complete
(:func:`atomic_output`). A location may be a local path or a URI
(``psrec.uri``); on an object store the rename is a copy of the whole object
(``psrec.uri_path``), so readers still never see part of a file.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from psrec.uri import arrow_filesystem
from psrec.uri import arrow_supports
from psrec.uri import is_uri
from psrec.uri import local as uri_local
from psrec.uri_path import UriPath
from psrec.uri_path import as_path


@contextlib.contextmanager
def atomic_output(final_path: str | Path | UriPath
                  ) -> Iterator[Path | UriPath]:
    """Yields a hidden temporary path (``.<name>.tmp-<pid>``) beside
    ``final_path`` (its folder created if needed) and renames it into place
    when the body succeeds (an atomic :func:`os.replace` on a local disk),
    so readers see the old file or the whole new one, never a part; if it
    raises, the temporary file goes. A remote ``final_path`` yields a
    :class:`~psrec.uri_path.UriPath` (pass ``str(tmp)`` to pyarrow)."""
    final_path = as_path(final_path)
    final_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = final_path.with_name(f".{final_path.name}.tmp-{os.getpid()}")
    try:
        yield tmp_path
        tmp_path.replace(final_path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path | UriPath, data: Any
                      ) -> Path | UriPath:
    """Writes ``data`` as indented JSON with :func:`atomic_output`."""
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
    return as_path(path)


def open_arrow_input(path: str | Path | UriPath):
    """``path`` opened for reading as a pyarrow random-access file: a local
    file, a URI through ``pyarrow.fs`` (``s3://``, ``gs://``, ``hdfs://``),
    or through ``tf.io.gfile`` for schemes only TensorFlow has
    (``ram://``)."""
    import pyarrow as pa
    text = str(path)
    if not is_uri(text):
        return pa.OSFile(uri_local(path), "rb")
    if arrow_supports(text):
        filesystem, inner = arrow_filesystem(text)
        return filesystem.open_input_file(inner)
    return pa.PythonFile(_Source(as_path(text).open("rb")), mode="r")


@contextlib.contextmanager
def parquet_sink(path: str | Path | UriPath) -> Iterator[Any]:
    """What pyarrow's Parquet writers take for ``path``: the path as a
    string when it is local or on a store pyarrow reaches (``s3://``,
    ``gs://``), else a file opened through ``tf.io.gfile`` (``ram://``),
    closed when the block ends."""
    text = str(path)
    if arrow_supports(text):  # True for every local path too
        yield text
        return
    with open_sink(text) as handle:
        yield handle


class _Sink(io.RawIOBase):
    """A file written through ``tf.io.gfile`` as pyarrow wants a Python
    output file: ``closed`` and ``tell`` answered here (a ``GFile`` opened
    for writing answers neither until its first write)."""

    def __init__(self, handle) -> None:
        self._handle, self._at = handle, 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        data = bytes(data)
        self._handle.write(data)
        self._at += len(data)
        return len(data)

    def tell(self) -> int:
        return self._at

    def close(self) -> None:
        if not self.closed:
            self._handle.close()
        super().close()


class _Source(io.RawIOBase):
    """A file read through ``tf.io.gfile`` as pyarrow wants a Python input
    file (``GFile`` answers no ``closed``)."""

    def __init__(self, handle) -> None:
        self._handle = handle

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._handle.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        self._handle.seek(offset, whence)
        return self._handle.tell()

    def tell(self) -> int:
        return self._handle.tell()

    def close(self) -> None:
        if not self.closed:
            self._handle.close()
        super().close()


def open_sink(path: str | UriPath) -> _Sink:
    """``path`` (a URI TensorFlow reaches, e.g. ``ram://``) opened for
    writing as a Python file pyarrow accepts."""
    return _Sink(as_path(str(path)).open("wb"))
