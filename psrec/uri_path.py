"""A remote location with the part of the :class:`pathlib.Path` interface
psrec's writers and readers use, so one code path serves both.

:func:`as_path` gives a :class:`pathlib.Path` for a local path (local
behaviour is exactly pathlib's) and a :class:`UriPath` for a URI. A
``UriPath`` reaches its store through ``pyarrow.fs`` for ``s3://`` and
``hdfs://`` and through ``tf.io.gfile`` for the schemes TensorFlow knows
(``gs://``, ``ram://``, plugins), so TFRecords, checkpoints and Parquet
files of one run can sit side by side in one bucket.

Publication: :meth:`UriPath.replace` renames (``tf.io.gfile.rename``, or
``pyarrow``'s ``move``). On an object store that is a server-side copy,
whole per object but not atomic for a folder, so multi-file outputs are
published with a marker written last (docs/kubernetes.md, "Atomic
publication").
"""

from __future__ import annotations

import fnmatch
import io
import os
import types
from pathlib import Path
from pathlib import PurePosixPath
from typing import Iterator

from psrec.uri import arrow_filesystem
from psrec.uri import is_uri
from psrec.uri import join as uri_join
from psrec.uri import local as uri_local
from psrec.uri import name as uri_name
from psrec.uri import parent as uri_parent
from psrec.uri import scheme
from psrec.uri import split_root
from psrec.uri import tf_supports


class _Gfile:
    """The store behind ``tf.io.gfile``."""

    def __init__(self) -> None:
        import tensorflow as tf
        self.g = tf.io.gfile
        self.errors = tf.errors

    def exists(self, path: str) -> bool:
        return self.g.exists(path)

    def is_dir(self, path: str) -> bool:
        return self.g.isdir(path)

    def listdir(self, path: str) -> list[str]:
        return [n.rstrip("/") for n in self.g.listdir(path)]

    def makedirs(self, path: str) -> None:
        self.g.makedirs(path)

    def open(self, path: str, mode: str):
        return self.g.GFile(path, mode)

    def remove(self, path: str) -> None:
        self.g.remove(path)

    def rmtree(self, path: str) -> None:
        self.g.rmtree(path)

    def rename(self, source: str, target: str) -> None:
        self.g.rename(source, target, overwrite=True)

    def copy(self, source: str, target: str) -> None:
        self.g.copy(source, target, overwrite=True)

    def stat(self, path: str) -> types.SimpleNamespace:
        found = self.g.stat(path)
        return types.SimpleNamespace(st_size=found.length,
                                     st_mtime=found.mtime_nsec / 1e9)


class _Arrow:
    """The store behind ``pyarrow.fs`` (schemes TensorFlow lacks)."""

    def __init__(self, some_path: str) -> None:
        self.fs, _ = arrow_filesystem(some_path)  # cached per store

    @staticmethod
    def _p(path: str) -> str:
        return arrow_filesystem(path)[1]

    def _info(self, path: str):
        return self.fs.get_file_info(self._p(path))

    def exists(self, path: str) -> bool:
        import pyarrow.fs as pafs
        return self._info(path).type != pafs.FileType.NotFound

    def is_dir(self, path: str) -> bool:
        import pyarrow.fs as pafs
        return self._info(path).type == pafs.FileType.Directory

    def listdir(self, path: str) -> list[str]:
        import pyarrow.fs as pafs
        return [info.base_name for info in self.fs.get_file_info(
            pafs.FileSelector(self._p(path)))]

    def makedirs(self, path: str) -> None:
        self.fs.create_dir(self._p(path), recursive=True)

    def open(self, path: str, mode: str):
        if "r" in mode:
            stream = self.fs.open_input_file(self._p(path))
        else:
            stream = self.fs.open_output_stream(self._p(path))
        if "b" in mode:
            return stream
        raw = _Buffered(stream)
        buffered = (io.BufferedReader(raw) if "r" in mode
                    else io.BufferedWriter(raw))
        return io.TextIOWrapper(buffered, encoding="utf-8")

    def remove(self, path: str) -> None:
        self.fs.delete_file(self._p(path))

    def rmtree(self, path: str) -> None:
        self.fs.delete_dir(self._p(path))

    def rename(self, source: str, target: str) -> None:
        self.fs.move(self._p(source), self._p(target))

    def copy(self, source: str, target: str) -> None:
        self.fs.copy_file(self._p(source), self._p(target))

    def stat(self, path: str) -> types.SimpleNamespace:
        info = self._info(path)
        if info.size is None:
            raise FileNotFoundError(f"{path} does not exist")
        return types.SimpleNamespace(
            st_size=info.size, st_mtime=(info.mtime.timestamp()
                                         if info.mtime else 0.0))


class _Buffered(io.RawIOBase):
    """A pyarrow stream as a raw Python stream (for text mode)."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def readable(self) -> bool:
        return self._stream.readable()

    def writable(self) -> bool:
        return self._stream.writable()

    def readinto(self, buffer) -> int:
        data = self._stream.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def write(self, data) -> int:
        self._stream.write(bytes(data))
        return len(data)

    def close(self) -> None:
        self._stream.close()
        super().close()


# Reached through pyarrow even when a TensorFlow plugin has them: reading
# and writing there (e.g. ``psrec ingest`` on s3://) never imports TF.
_ARROW_FIRST = frozenset({"s3", "hdfs", "viewfs", "abfs", "abfss"})


def _store(path: str):
    if scheme(path) in _ARROW_FIRST:
        return _Arrow(path)
    return _Gfile() if tf_supports(path) else _Arrow(path)


class UriPath:
    """A ``scheme://`` location with a pathlib-like interface."""

    __slots__ = ("_uri",)

    def __init__(self, location: object) -> None:
        text = str(location)
        if not is_uri(text):
            raise ValueError(f"{text!r} is no URI; use pathlib.Path")
        root, rest = split_root(text)
        self._uri = root + rest

    # -- names ------------------------------------------------------------
    def __str__(self) -> str:
        return self._uri

    def __repr__(self) -> str:
        return f"UriPath({self._uri!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UriPath) and other._uri == self._uri

    def __hash__(self) -> int:
        return hash(self._uri)

    def __lt__(self, other: UriPath) -> bool:
        return self._uri < str(other)

    def __truediv__(self, part: object) -> UriPath:
        return UriPath(uri_join(self._uri, str(part)))

    @property
    def name(self) -> str:
        return uri_name(self._uri)

    @property
    def parent(self) -> UriPath:
        return UriPath(uri_parent(self._uri))

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    @property
    def suffixes(self) -> list[str]:
        return PurePosixPath(self.name).suffixes

    @property
    def stem(self) -> str:
        return PurePosixPath(self.name).stem

    def with_name(self, new: str) -> UriPath:
        return self.parent / new

    def with_suffix(self, suffix: str) -> UriPath:
        return self.with_name(str(PurePosixPath(self.name).with_suffix(
            suffix)))

    def relative_to(self, other: object) -> PurePosixPath:
        base = str(other).rstrip("/") + "/"
        if not self._uri.startswith(base):
            raise ValueError(f"{self._uri} is not under {other}")
        return PurePosixPath(self._uri[len(base):])

    def as_posix(self) -> str:
        return self._uri

    def absolute(self) -> UriPath:
        return self

    resolve = absolute

    def is_absolute(self) -> bool:
        return True

    # -- the store ----------------------------------------------------------
    def exists(self) -> bool:
        return _store(self._uri).exists(self._uri)

    def is_dir(self) -> bool:
        return _store(self._uri).is_dir(self._uri)

    def is_file(self) -> bool:
        store = _store(self._uri)
        return store.exists(self._uri) and not store.is_dir(self._uri)

    def is_symlink(self) -> bool:
        return False

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Creates the folder (object stores: a no-op or a marker object).
        Like pathlib, refuses an existing one unless ``exist_ok``."""
        if self.exists() and not exist_ok:
            raise FileExistsError(f"{self._uri} exists")
        _store(self._uri).makedirs(self._uri)

    def iterdir(self) -> Iterator[UriPath]:
        for child in sorted(_store(self._uri).listdir(self._uri)):
            yield self / child

    def glob(self, pattern: str) -> Iterator[UriPath]:
        """Children whose name matches ``pattern`` (one level)."""
        if self.is_dir():
            yield from (child for child in self.iterdir()
                        if fnmatch.fnmatchcase(child.name, pattern))

    def rglob(self, pattern: str) -> Iterator[UriPath]:
        """Every path below whose name matches ``pattern``."""
        if not self.is_dir():
            return
        for child in self.iterdir():
            if fnmatch.fnmatchcase(child.name, pattern):
                yield child
            if child.is_dir():
                yield from child.rglob(pattern)

    def open(self, mode: str = "r", encoding: str | None = None):
        return _store(self._uri).open(self._uri, mode)

    def read_bytes(self) -> bytes:
        with self.open("rb") as handle:
            return handle.read()

    def read_text(self, encoding: str | None = "utf-8") -> str:
        return self.read_bytes().decode(encoding or "utf-8")

    def write_bytes(self, data: bytes) -> int:
        with self.open("wb") as handle:
            handle.write(data)
        return len(data)

    def write_text(self, text: str, encoding: str | None = "utf-8") -> int:
        return self.write_bytes(text.encode(encoding or "utf-8"))

    def stat(self) -> types.SimpleNamespace:
        """``st_size`` and ``st_mtime``."""
        return _store(self._uri).stat(self._uri)

    def unlink(self, missing_ok: bool = False) -> None:
        store = _store(self._uri)
        if missing_ok and not store.exists(self._uri):
            return
        store.remove(self._uri)

    def rmtree(self) -> None:
        """Removes the folder and everything below it."""
        _store(self._uri).rmtree(self._uri)

    rmdir = rmtree

    def replace(self, target: object) -> UriPath:
        """Renames onto ``target`` (replacing it); see the module
        docstring on atomicity."""
        _store(self._uri).rename(self._uri, str(target))
        return UriPath(target)

    def copy_to(self, target: object) -> None:
        """Copies the file onto ``target`` (replacing it)."""
        _store(self._uri).copy(self._uri, str(target))


def as_path(location: str | Path | UriPath) -> Path | UriPath:
    """``location`` as a :class:`pathlib.Path` (local, ``file://``
    dropped) or a :class:`UriPath`."""
    if isinstance(location, (Path, UriPath)):
        return location
    if is_uri(location):
        return UriPath(location)
    return Path(uri_local(location))


def shown_path(location: str | Path | UriPath | None) -> str:
    """A location as psrec prints it: a URI as it is; a local path relative
    to the working directory when it lies below it, else absolute -- so the
    files of one run are named one way in its output, whichever way
    TensorFlow or the user wrote them ("none" for None)."""
    if location is None:
        return "none"
    text = str(location)
    if is_uri(text):
        return text
    absolute = os.path.abspath(text)
    relative = os.path.relpath(absolute)
    return absolute if relative.startswith(os.pardir) else relative
