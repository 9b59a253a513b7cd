"""Split serving bundles (``psrec export --split``): the embedding tables as
Parquet beside a dense SavedModel, full or as a delta on a published
version, and ``psrec apply-delta``. Plain Python and pyarrow: applying
deltas needs no TensorFlow and no cluster.

A bundle is one version folder ``ROOT/<version>/``::

    manifest.json             written last; names everything below
    model/                    SavedModel: `keys` and `serving_default`
    tables/<table>.parquet    rows: table (string), key (int64),
                              vector (fixed_size_list<float32>[dim])
    tables/<table>.deleted.parquet   a delta's removed keys (dynamic tables)

Every table file is sorted by ``key``: a hashed table's key is its row
index (every row, 0 .. rows-1), a dynamic table's the raw 64-bit id
(admitted ids only) and :data:`DEFAULT_KEY` (-2) for its default row, the
row every id it does not hold reads. Files are written in row groups of
:data:`ROW_GROUP_ROWS` rows whatever the blocks they come in, so one table
state is one byte sequence: a base with its deltas applied is the file a
full export at the delta's step writes. The format, the manifest's fields
and how a key-value store loads and updates itself:
``docs/checkpoints-and-export.md`` ("Split export").

Diff and apply stream both sides in key order (a merge of sorted runs),
holding a few blocks of each at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from psrec.data.format.files import open_arrow_input
from psrec.data.format.files import parquet_sink
from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.uri_path import as_path

FORMAT = "psrec-split/1"
MANIFEST = "manifest.json"
MODEL_DIR = "model"
TABLES_DIR = "tables"
#: The key of a dynamic table's default row.
DEFAULT_KEY = -2
#: Rows per Parquet row group (and per block read back).
ROW_GROUP_ROWS = 65_536
_DELETED = ".deleted.parquet"

#: A run of rows in key order: ``(keys int64 [n], vectors float32 [n, dim])``.
Block = tuple[np.ndarray, np.ndarray]


def table_file(name: str) -> str:
    return f"{TABLES_DIR}/{name}.parquet"


def deleted_file(name: str) -> str:
    return f"{TABLES_DIR}/{name}{_DELETED}"


def _schema(dim: int | None):
    import pyarrow as pa
    fields = [pa.field("table", pa.string(), nullable=False),
              pa.field("key", pa.int64(), nullable=False)]
    if dim is not None:
        fields.append(pa.field("vector", pa.list_(pa.float32(), dim),
                               nullable=False))
    return pa.schema(fields)


class TableWriter:
    """Writes one table's rows (``write(keys, vectors)``, in key order) to a
    Parquet file in row groups of exactly :data:`ROW_GROUP_ROWS` rows;
    ``dim`` None: a key-only file (a delta's deleted keys)."""

    def __init__(self, path: str | Path, table: str, dim: int | None) -> None:
        import pyarrow.parquet as pq
        self.table, self.dim, self.rows = table, dim, 0
        as_path(path).parent.mkdir(parents=True, exist_ok=True)
        self._sink = contextlib.ExitStack()
        # Dictionary-encoded table names; statistics (min/max) of the keys
        # only: a reader skips row groups by key range (those of the floats
        # cost 4x the write time and no reader uses them).
        self._writer = pq.ParquetWriter(
            self._sink.enter_context(parquet_sink(path)), _schema(dim),
            use_dictionary=["table"], write_statistics=["table", "key"])
        self._keys: list[np.ndarray] = []
        self._vectors: list[np.ndarray] = []
        self._buffered = 0
        self._last = None

    def write(self, keys: np.ndarray, vectors: np.ndarray | None = None
              ) -> None:
        if keys.size == 0:
            return
        if self._last is not None and keys[0] <= self._last:
            raise ValueError(f"table {self.table}: keys out of order")
        self._last = keys[-1]
        self._keys.append(np.asarray(keys, np.int64))
        if self.dim is not None:
            self._vectors.append(np.asarray(vectors, np.float32))
        self._buffered += keys.size
        while self._buffered >= ROW_GROUP_ROWS:
            self._flush(ROW_GROUP_ROWS)

    def _flush(self, rows: int) -> None:
        import pyarrow as pa
        keys = np.concatenate(self._keys)
        name = self.table.encode()
        columns = [pa.StringArray.from_buffers(  # one name, repeated
            rows, pa.py_buffer(np.arange(0, (rows + 1) * len(name),
                                         len(name), dtype=np.int32)),
            pa.py_buffer(name * rows)), pa.array(keys[:rows])]
        self._keys = [keys[rows:]]
        if self.dim is not None:
            vectors = np.concatenate(self._vectors)
            columns.append(pa.FixedSizeListArray.from_arrays(
                pa.array(vectors[:rows].reshape(-1)), self.dim))
            self._vectors = [vectors[rows:]]
        self._writer.write_table(pa.Table.from_arrays(
            columns, schema=_schema(self.dim)), row_group_size=rows)
        self._buffered -= rows
        self.rows += rows

    def close(self) -> None:
        if self._buffered:
            self._flush(self._buffered)
        self._writer.close()
        self._sink.close()


def read_blocks(path: str | Path, dim: int | None) -> Iterator[Block]:
    """The rows of a table file, a row group at a time (``dim`` None: a
    key-only file; its vectors are None)."""
    import pyarrow.parquet as pq
    with open_arrow_input(path) as stream:
        columns = ["key"] + ([] if dim is None else ["vector"])
        for batch in pq.ParquetFile(stream).iter_batches(
                batch_size=ROW_GROUP_ROWS, columns=columns):
            keys = batch.column(0).to_numpy().astype(np.int64)
            vectors = None
            if dim is not None:
                vectors = batch.column(1).flatten().to_numpy(
                    zero_copy_only=False).reshape(-1, dim)
            yield keys, vectors


class _Cursor:
    """A sorted stream of blocks, buffered: :meth:`take` hands out the rows
    with keys up to a bound."""

    def __init__(self, blocks: Iterable[Block], dim: int | None) -> None:
        self._blocks = iter(blocks)
        self.dim = dim
        self.keys = np.zeros(0, np.int64)
        self.vectors = None if dim is None else np.zeros((0, dim), np.float32)
        self.done = False

    def fill(self) -> None:
        while self.keys.size == 0 and not self.done:
            try:
                self.keys, self.vectors = next(self._blocks)
            except StopIteration:
                self.done = True

    def take(self, bound: int) -> Block:
        cut = int(np.searchsorted(self.keys, bound, side="right"))
        keys, self.keys = self.keys[:cut], self.keys[cut:]
        if self.vectors is None:
            return keys, None
        vectors, self.vectors = self.vectors[:cut], self.vectors[cut:]
        return keys, vectors


def _aligned(left: Iterable[Block], right: Iterable[Block],
             dims: tuple[int | None, int | None]
             ) -> Iterator[tuple[Block, Block]]:
    """Pairs of runs of two key-sorted streams covering the same key range:
    each key of either stream is in exactly one pair."""
    a, b = _Cursor(left, dims[0]), _Cursor(right, dims[1])
    while True:
        a.fill()
        b.fill()
        lasts = [c.keys[-1] for c in (a, b) if c.keys.size]
        if not lasts:
            return
        bound = min(lasts)
        yield a.take(bound), b.take(bound)


def _same(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per row: bit-identical float32 vectors."""
    return np.all(x.view(np.uint32) == y.view(np.uint32), axis=1)


@dataclasses.dataclass
class DiffCounts:
    """What a table's delta holds: rows changed in place, ids admitted
    (rows new to the table) and ids deleted (evicted)."""

    changed: int = 0
    admitted: int = 0
    deleted: int = 0


def diff(base: Iterable[Block], current: Iterable[Block], dim: int,
         counts: DiffCounts
         ) -> Iterator[tuple[Block, np.ndarray]]:
    """The delta from ``base`` to ``current`` (both key-sorted), a run at a
    time: ``((keys, vectors) to upsert, keys deleted)``; ``counts`` is
    updated as it goes."""
    for (kb, vb), (kc, vc) in _aligned(base, current, (dim, dim)):
        if kb.size == kc.size and np.array_equal(kb, kc):  # same keys
            ib = ic = np.arange(kc.size)
            upsert = ~_same(vb, vc)
        else:
            _, ib, ic = np.intersect1d(kb, kc, assume_unique=True,
                                       return_indices=True)
            upsert = np.ones(kc.size, bool)
            upsert[ic[_same(vb[ib], vc[ic])]] = False
        gone = np.ones(kb.size, bool)
        gone[ib] = False
        counts.admitted += kc.size - ic.size
        counts.changed += int(upsert.sum()) - (kc.size - ic.size)
        counts.deleted += int(gone.sum())
        yield (kc[upsert], vc[upsert]), kb[gone]


def apply(base: Iterable[Block], upserts: Iterable[Block],
          deleted: Iterable[Block], dim: int) -> Iterator[Block]:
    """``base`` with ``deleted`` keys removed and ``upserts`` written over
    (all key-sorted), key-sorted."""
    def kept() -> Iterator[Block]:
        for (kb, vb), (kd, _) in _aligned(base, deleted, (dim, None)):
            keep = ~np.isin(kb, kd, assume_unique=True)
            yield kb[keep], vb[keep]

    for (kb, vb), (ku, vu) in _aligned(kept(), upserts, (dim, dim)):
        if ku.size == 0:
            yield kb, vb
            continue
        keep = ~np.isin(kb, ku, assume_unique=True)
        keys = np.concatenate([kb[keep], ku])
        order = np.argsort(keys, kind="stable")
        yield keys[order], np.concatenate([vb[keep], vu])[order]


# -- manifests and folders -------------------------------------------------------


def _sha256(path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with as_path(path).open("rb") as stream:
        while chunk := stream.read(1 << 22):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def file_checksums(folder: str | Path) -> dict[str, dict[str, object]]:
    """``relative path -> {bytes, sha256}`` of every file of a bundle
    folder but its manifest, sorted."""
    root = as_path(folder)
    found = {}
    for path in root.rglob("*"):
        relative = path.relative_to(root).as_posix()
        if relative != MANIFEST and path.is_file():
            size, digest = _sha256(path)
            found[relative] = {"bytes": size, "sha256": digest}
    return dict(sorted(found.items()))


@dataclasses.dataclass(frozen=True)
class Bundle:
    """A published split version: its folder and manifest."""

    path: str
    manifest: dict

    @property
    def version(self) -> int:
        return int(self.manifest["version"])

    @property
    def kind(self) -> str:
        return self.manifest["kind"]

    @property
    def state(self) -> dict[str, object]:
        """What its tables are the state of: version, step and checkpoint
        (a delta names its base by these; an applied version has its last
        delta's, so the next delta applies to it as to that delta)."""
        return {key: self.manifest[key]
                for key in ("version", "step", "checkpoint")}

    def describe(self) -> str:
        return (f"{self.path} ({self.kind} split version {self.version}, "
                f"step {self.manifest['step']})")

    def summary(self) -> dict[str, object]:
        """Kind, step, base and per table its rows (a delta's: also the rows
        it carries, changed, admitted and deleted)."""
        counts = ("rows", "delta_rows", "changed", "admitted", "deleted")
        return {"kind": self.kind, "step": self.manifest["step"],
                "base": self.manifest.get("base"),
                "tables": {name: {k: entry[k] for k in counts if k in entry}
                           for name, entry in self.manifest["tables"].items()}}

    def blocks(self, table: str) -> Iterator[Block]:
        dim = self.manifest["tables"][table]["dim"]
        return read_blocks(as_path(self.path) / table_file(table), dim)

    def deleted(self, table: str) -> Iterator[Block]:
        entry = self.manifest["tables"][table]
        if not entry.get("deleted_file"):
            return iter(())
        return read_blocks(as_path(self.path) / entry["deleted_file"], None)

    def verify(self) -> None:
        """Every file the manifest lists has its size and sha256.

        Raises:
          DataError: a file missing or changed (exit 1).
        """
        listed = self.manifest["files"]
        for relative, expected in listed.items():
            path = as_path(self.path) / relative
            if not path.exists():
                raise DataError(f"{path}: listed in {self.path}/{MANIFEST} "
                                "but missing; publish the version again.")
            size, digest = _sha256(path)
            if (size, digest) != (expected["bytes"], expected["sha256"]):
                raise DataError(
                    f"{path}: {size} bytes, sha256 {digest[:12]}..., not the "
                    f"{expected['bytes']} bytes, {expected['sha256'][:12]}... "
                    f"{self.path}/{MANIFEST} lists; the copy is damaged: "
                    "publish or copy the version again.")


def load_bundle(path: str | Path) -> Bundle:
    """The split bundle in folder ``path``.

    Raises:
      ConfigError: no ``manifest.json`` of a split bundle there (exit 2).
    """
    manifest_path = as_path(path) / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ConfigError(
            f"{path} is not a split export version (no {MANIFEST} of format "
            f"{FORMAT}); write one with `psrec export CHECKPOINT_DIR --out "
            "DIR --split`.")
    return Bundle(str(path), manifest)


def chain_of(bundle: Bundle, root: str | Path) -> list[Bundle]:
    """The full version a delta stands on and the deltas up to ``bundle``,
    oldest first, found as versions of ``root`` (each checked against the
    base its successor names)."""
    chain = [bundle]
    while chain[0].kind == "delta":
        base = chain[0].manifest["base"]
        found = load_bundle(as_path(root) / str(base["version"]))
        check_base(found, chain[0])
        chain.insert(0, found)
    return chain


def check_base(base: Bundle, delta: Bundle) -> None:
    """Refuses ``delta`` unless it was made on the state of ``base``
    (:attr:`Bundle.state`: version, step and checkpoint).

    Raises:
      ConfigError: naming both (exit 2).
    """
    wanted = delta.manifest.get("base") or {}
    if delta.kind != "delta":
        raise ConfigError(f"{delta.describe()} is not a delta; give the "
                          "delta versions after the base.")
    if wanted != base.state:
        raise ConfigError(
            f"{delta.path} is a delta on version {wanted.get('version')} "
            f"(step {wanted.get('step')}, {wanted.get('checkpoint')}), not "
            f"on {base.describe()}: give the version it was made on, then "
            "its deltas in order.")


def table_state(chain: list[Bundle], table: str) -> Iterator[Block]:
    """The rows of ``table`` after the full version and deltas of
    ``chain``, key-sorted, streamed."""
    dim = chain[0].manifest["tables"][table]["dim"]
    blocks = chain[0].blocks(table)
    for delta in chain[1:]:
        blocks = apply(blocks, delta.blocks(table), delta.deleted(table), dim)
    return blocks


def write_manifest(folder: str | Path, manifest: dict) -> None:
    """Adds the checksums of every file of ``folder`` and writes the
    manifest, last."""
    manifest = {**manifest, "files": file_checksums(folder)}
    (as_path(folder) / MANIFEST).write_text(json.dumps(manifest, indent=2)
                                            + "\n")


def publish_bundle(root: str | Path, version: int,
                   write: Callable[[str], None]) -> str:
    """Publishes ``root/<version>`` whole or not at all: ``write(folder)``
    fills a hidden temporary folder, renamed into place (on an object
    store: copied, ``manifest.json`` last; a version without it is not
    complete). An existing version is never overwritten.

    Raises:
      ConfigError: the version exists (exit 2).
    """
    base = as_path(root)
    final = base / str(version)

    def refuse() -> None:
        if final.exists():
            raise ConfigError(f"export version {final} exists: versions are "
                              "never overwritten; give another --version.")

    refuse()
    base.mkdir(parents=True, exist_ok=True)
    tmp = base / f".tmp-{version}-{os.getpid()}"
    if tmp.exists():
        _remove(tmp)
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        write(str(tmp))
        refuse()
        if isinstance(tmp, Path):
            tmp.rename(final)
        else:
            files = sorted((p.relative_to(tmp).as_posix() for p in
                            tmp.rglob("*") if p.is_file()),
                           key=lambda name: name == MANIFEST)
            for name in files:
                (final / name).parent.mkdir(parents=True, exist_ok=True)
                (tmp / name).copy_to(final / name)
            _remove(tmp)
    finally:
        if tmp.exists():
            _remove(tmp)
    return str(final)


def _remove(path) -> None:
    if isinstance(path, Path):
        import shutil
        shutil.rmtree(path)
    else:
        path.rmtree()


def apply_deltas(base_dir: str | Path, delta_dirs: list[str | Path],
                 out_root: str | Path) -> Bundle:
    """``psrec apply-delta``: the full split version that ``base_dir`` (a
    full or applied version) and ``delta_dirs`` (each made on the one
    before) stand for, published as ``out_root/<the last delta's
    version>``; every input file is checked against its manifest first.

    Raises:
      ConfigError: a folder that is no split version, a delta not made on
        the version before it, no delta given (exit 2).
      DataError: an input file that does not match its manifest (exit 1).
    """
    if not delta_dirs:
        raise ConfigError("give at least one DELTA_DIR after BASE_DIR.")
    chain = [load_bundle(base_dir)]
    if chain[0].kind != "full":
        raise ConfigError(f"{chain[0].describe()} is a delta: BASE_DIR must "
                          "be a full split version (apply its own chain "
                          "first).")
    for folder in delta_dirs:
        delta = load_bundle(folder)
        check_base(chain[-1], delta)
        chain.append(delta)
    for bundle in chain:
        bundle.verify()
    last = chain[-1]

    def write(folder: str) -> None:
        _copy_tree(as_path(last.path) / MODEL_DIR, as_path(folder) / MODEL_DIR)
        tables = {}
        for name, entry in last.manifest["tables"].items():
            out = TableWriter(as_path(folder) / table_file(name), name,
                              entry["dim"])
            try:
                for keys, vectors in table_state(chain, name):
                    out.write(keys, vectors)
            finally:
                out.close()
            tables[name] = full_entry(entry, out.rows)
        manifest = {key: value for key, value in last.manifest.items()
                    if key not in ("base", "files", "tables")}
        write_manifest(folder, {
            **manifest, "kind": "full", "tables": tables,
            "applied": [b.version for b in chain]})

    published = publish_bundle(out_root, last.version, write)
    return load_bundle(published)


def full_entry(entry: dict, rows: int) -> dict:
    """A table's manifest entry in a full version (a delta's less its
    counts of changes)."""
    kept = {k: v for k, v in entry.items()
            if k not in ("changed", "admitted", "deleted", "deleted_file",
                         "delta_rows")}
    return {**kept, "rows": rows, "file": table_file(entry["name"])}


def _copy_tree(source, target) -> None:
    for path in sorted(source.rglob("*")):
        if path.is_file():
            into = target / path.relative_to(source).as_posix()
            into.parent.mkdir(parents=True, exist_ok=True)
            into.write_bytes(path.read_bytes())
