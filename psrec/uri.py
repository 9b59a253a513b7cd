"""Locations given as URIs (``gs://b/x``, ``s3://b/x``, ``hdfs://nn/x``,
``ram://x``) or as local paths, handled as strings.

:class:`pathlib.Path` collapses ``gs://b/x`` to ``gs:/b/x``, so a URI is
never put through it: :func:`join`, :func:`parent` and :func:`name` keep the
``scheme://`` intact, and act as :mod:`os.path` does on a local path.

Two libraries reach remote storage, each with its own schemes (which
serves what: docs/kubernetes.md, "Object storage"): ``tf.io.gfile`` and
``pyarrow.fs``. :func:`require_tf_filesystem` and :func:`arrow_filesystem`
turn a scheme the library lacks into a one-line
:class:`~psrec.errors.ConfigError` naming the URI and the way out.
TensorFlow is imported on first use only.
"""

from __future__ import annotations

import os
import re

from psrec.errors import ConfigError

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def scheme(path: object) -> str:
    """The URI scheme of ``path`` in lower case; ``""`` for a local path
    (``file://`` URIs included: they are local)."""
    match = _SCHEME_RE.match(str(path))
    found = match.group(1).lower() if match else ""
    return "" if found == "file" else found


def is_uri(path: object) -> bool:
    """True for ``scheme://...`` other than ``file://``."""
    return bool(scheme(path))


def split_root(uri: str) -> tuple[str, str]:
    """``("gs://", "bucket/a/b")``: a URI's root and the rest, without the
    trailing ``/`` (the rest is the path inside its store, as
    ``pyarrow.fs`` names it)."""
    match = _SCHEME_RE.match(uri)
    root = uri[:match.end()]
    return root, uri[match.end():].rstrip("/")


def local(path: object) -> str:
    """A local path as a string (``file://`` prefix dropped)."""
    text = os.fspath(path) if isinstance(path, os.PathLike) else str(path)
    return text[len("file://"):] if text.lower().startswith(
        "file://") else text


def join(base: object, *parts: str) -> str:
    """``base`` joined with ``parts`` by ``/``; a local ``base`` joins as
    :func:`os.path.join` does."""
    text = str(base)
    if not is_uri(text):
        return os.path.join(local(base), *parts)
    root, rest = split_root(text)
    pieces = [rest] if rest else []
    pieces += [p.strip("/") for p in parts if p.strip("/")]
    return root + "/".join(pieces)


def parent(path: object) -> str:
    """The folder holding ``path``; a bucket (or ``ram://``) root is its
    own parent, as ``/`` is."""
    text = str(path)
    if not is_uri(text):
        return os.path.dirname(local(path).rstrip("/") or "/") or "."
    root, rest = split_root(text)
    return root + rest.rsplit("/", 1)[0] if "/" in rest else root + rest


def name(path: object) -> str:
    """The last part of ``path`` (the bucket of ``gs://bucket``; ``""``
    for a bare ``ram://``)."""
    text = str(path)
    if not is_uri(text):
        return os.path.basename(local(path).rstrip("/"))
    _, rest = split_root(text)
    return rest.rsplit("/", 1)[-1] if rest else ""


# -- which library reaches which scheme ---------------------------------------


def tf_schemes() -> frozenset[str]:
    """The schemes ``tf.io.gfile`` can reach in this process (plugins
    imported so far included)."""
    import tensorflow as tf
    return frozenset(s for s in tf.io.gfile.get_registered_schemes() if s)


def tf_supports(path: object) -> bool:
    """True when TensorFlow reads and writes ``path`` (local, or a URI of a
    registered scheme)."""
    return not is_uri(path) or scheme(path) in tf_schemes()


def require_tf_filesystem(path: object, what: str) -> None:
    """Raises a one-line ConfigError unless TensorFlow can write ``path``
    (``what`` names the flag or output, e.g. ``--workdir``)."""
    if tf_supports(path):
        return
    known = ", ".join(f"{s}://" for s in sorted(tf_schemes()))
    raise ConfigError(
        f"{what} {path}: TensorFlow has no {scheme(path)}:// filesystem here "
        f"(it has local paths and {known}); write TFRecords, checkpoints and "
        "TensorBoard logs to a local path or gs://, or install the "
        "filesystem plugin (tensorflow-io) and import it; Parquet inputs on "
        f"{scheme(path)}:// are read through pyarrow.")


def arrow_filesystem(path: object):
    """``(pyarrow.fs.FileSystem, path inside it)`` for ``path``: the local
    file system for a local path, else ``FileSystem.from_uri`` (``s3://``
    honours ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``...).

    One file system per store (scheme, bucket or name node, query, and the
    ``AWS_*``/``GOOGLE_*``/``HADOOP_*`` variables) for the life of the
    process: ``from_uri`` on ``s3://`` asks the bucket's region
    over the network, so it is not repeated for every file.

    Raises:
      ConfigError: pyarrow has no filesystem for the scheme.
    """
    import pyarrow.fs as pafs
    if not is_uri(path):
        return pafs.LocalFileSystem(), os.path.abspath(local(path))
    text = str(path)
    rest, _, query = split_root(text)[1].partition("?")
    authority = rest.split("/", 1)[0]
    key = (scheme(text), authority, query, _store_environment())
    if key not in _ARROW_STORES:
        filesystem, inner = _arrow_from_uri(text)
        # s3/gs/abfs name a file "bucket/key"; hdfs names it "/key".
        _ARROW_STORES[key] = (filesystem, inner.startswith(authority))
    filesystem, keeps_authority = _ARROW_STORES[key]
    inner = rest if keeps_authority else rest[len(authority):] or "/"
    return filesystem, inner


_ARROW_STORES: dict = {}


def _store_environment() -> tuple:
    """The variables that configure a store's client (endpoint,
    credentials): a changed one means another file system."""
    return tuple(sorted(
        (name, value) for name, value in os.environ.items()
        if name.startswith(("AWS_", "GOOGLE_", "HADOOP_", "ARROW_"))))


def _arrow_from_uri(path: str):
    import pyarrow as pa
    import pyarrow.fs as pafs
    try:
        found = pafs.FileSystem.from_uri(path)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError,
            OSError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(
            error).__name__
        raise ConfigError(
            f"{path}: pyarrow cannot open {scheme(path)}:// ({reason}); "
            "give Parquet files on a local path, s3://, gs:// or hdfs://."
        ) from None
    if scheme(path) == "s3":
        _finalize_s3_at_exit()
    return found


_S3_FINALIZER: list = []


def _finalize_s3_at_exit() -> None:
    """Shuts pyarrow's S3 client down at exit before anything else does:
    measured, a process that used ``s3://`` and then trained aborted at
    exit (``terminate called ...``) when the shutdown was left to pyarrow's
    own exit hooks."""
    if not _S3_FINALIZER:
        import atexit

        import pyarrow.fs as pafs
        _S3_FINALIZER.append(pafs.finalize_s3)
        atexit.register(pafs.finalize_s3)


def arrow_supports(path: object) -> bool:
    """True when pyarrow has a filesystem for ``path``'s scheme."""
    return not is_uri(path) or scheme(path) in _ARROW_SCHEMES


# pyarrow.fs.FileSystem.from_uri's schemes (besides file://).
_ARROW_SCHEMES = frozenset({"s3", "gs", "gcs", "hdfs", "viewfs", "abfs",
                            "abfss"})
