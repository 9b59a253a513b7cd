"""Delta checkpoints: the rows changed since the previous save, written by
the PS that holds them, and restores of a full checkpoint plus its chain of
deltas, verified by value.

A delta ``checkpoints/deltas/delta-<step>/`` holds

* ``rows-<job>-<task>``: a TensorFlow tensor bundle per PS task (one
  ``rows`` bundle when the coordinator writes), written by ``SaveV2`` on
  that task: for each shard of each table, the local rows flagged by the
  :class:`~psrec.ps_cluster.checkpoint.changes.ChangeTracker`
  (``<table>/part_<k>/rows``) and, under ``<key>/part_<k>``, those rows of
  every tensor cut like the table -- the table itself, its optimizer slots
  and, for a dynamic table, its ``row_ids`` (admitted and evicted ids),
  ``freq`` and ``last_seen``. The rows are gathered on the shard's PS; only
  the changed rows ever leave it (to the coordinator only when it writes).
* ``dense``: a bundle of every other key of the checkpoint under its own
  checkpoint key and full shape -- dense weights and their slots, the
  optimizers' counters, the training progress (the step), the dynamic
  tables' pending-id counts and clocks --, restored and checked by the
  same streamed functions as a full checkpoint
  (:mod:`psrec.ps_cluster.checkpoint.verify`).
* ``manifest.json``, written last (atomically): the step, the full
  checkpoint of the chain (``full``), the link it was taken against
  (``base``: that full checkpoint or the previous delta), every file with
  its size, and the rows per shard. A folder without a manifest is a delta
  cut off mid-write: never part of a chain, removed when a run resumes.

A dynamic table's id -> row map is not written: it is the inverse of
``row_ids``, rebuilt on each shard's PS after a chain is applied.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
import shutil

import tensorflow as tf

from psrec.data.format.files import write_json_atomic
from psrec.errors import DataError
from psrec.models.dynamic.shards import parts
from psrec.models.dynamic.shards import placed
from psrec.ps_cluster.checkpoint.verify import LiveTensor
from psrec.ps_cluster.checkpoint.verify import differing_keys
from psrec.ps_cluster.checkpoint.verify import live_tensors
from psrec.ps_cluster.checkpoint.verify import lookup_tables
from psrec.ps_cluster.checkpoint.verify import restore_streamed
from psrec.uri_path import UriPath
from psrec.uri_path import as_path

DELTAS = "deltas"  # the folder of the deltas, beside the full checkpoints
MANIFEST = "manifest.json"
FORMAT = "psrec-delta-1"
DELTA_NAME = re.compile(r"^delta-(\d+)$")
_ATTRIBUTE = "/.ATTRIBUTES/VARIABLE_VALUE"
_SLOTS = "/.OPTIMIZER_SLOT/"


class DeltaChainError(DataError):
    """A chain of delta checkpoints cannot be restored as it is (a delta
    missing or damaged, another base, a dynamic table on another sharding):
    exit 1, before anything is trained on a partial state."""


@dataclasses.dataclass(frozen=True)
class _Group:
    """The checkpoint keys cut like one table (the table first)."""

    table: str
    keys: tuple[str, ...]


class DeltaState:
    """What a delta of ``root`` holds: the tables' row groups and the dense
    keys.

    Args:
      root: the ``tf.train.Checkpoint`` of the training state.
      tables: checkpoint key prefix of a table -> its (sharded) variable.
      dynamic: checkpoint key prefix of a dynamic table's embedding -> its
        ``DynamicTable``.
    """

    def __init__(self, root: tf.train.Checkpoint, tables: dict[str, object],
                 dynamic: dict[str, object] | None = None) -> None:
        self.root = root
        self.live = live_tensors(root)
        key_of = {id(t.shards[0][0]): k for k, t in self.live.items()}
        self.dynamic = dict(dynamic or {})
        self.groups = []
        for prefix in tables:
            keys = [prefix + _ATTRIBUTE] + sorted(
                k for k in self.live if k.startswith(prefix + _SLOTS))
            table = self.dynamic.get(prefix)
            if table is not None:
                keys += [key_of[id(parts(v)[0])] for v in (
                    table.row_ids, table.freq, table.last_seen)]
            self.groups.append(_Group(prefix, tuple(keys)))
        in_groups = {k for g in self.groups for k in g.keys}
        maps = {id(t.map) for t in self.dynamic.values()}
        lookups = lookup_tables(root)
        self.map_keys = {k for k, t in lookups.items() if id(t) in maps}
        self.dense_keys = sorted(set(self.live) - in_groups)
        self.lookup_keys = sorted(set(lookups) - self.map_keys)

    def dense_wanted(self, key: str) -> bool:
        """Keys of the ``dense`` bundle (lookup tables: their ``-keys`` and
        ``-values``)."""
        return key in self.dense_keys or any(
            key.startswith(base) for base in self.lookup_keys)

    def shard(self, key: str, part: int) -> tf.Variable:
        return self.live[key].shards[part][0]


def _task_file(device: str) -> str:
    """``rows-<job>-<task>`` of a device name."""
    job = device.split("/job:")[1].split("/")[0] if "/job:" in device else (
        "local")
    task = device.split("task:")[1].split("/")[0] if "task:" in device else (
        "0")
    return f"rows-{job}-{task}"


def _dense_tensors(state: DeltaState) -> tuple[list[str], list[tf.Tensor]]:
    names, tensors = [], []
    for key in state.dense_keys:
        live: LiveTensor = state.live[key]
        values = [v.read_value() for v, _ in live.shards]
        names.append(key)
        tensors.append(values[0] if len(values) == 1 else tf.concat(values,
                                                                    0))
    tables = lookup_tables(state.root)
    for base in state.lookup_keys:  # as TensorFlow saves them
        saved = tables[base]._serialize_to_tensors()  # noqa: SLF001
        for suffix, value in saved.items():
            names.append(f"{base}-{suffix.rsplit('-', 1)[1]}")
            tensors.append(value)
    return names, tensors


def write_delta(state: DeltaState, changed: dict[str, list[tf.Tensor]],
                folder: str, rows_device: str | None,
                dense_device: str | None) -> dict:
    """Writes the delta files of ``state``'s ``changed`` rows (table ->
    local rows of each shard, on the shard's device:
    ``ChangeTracker.changed``) and dense keys into ``folder`` (no
    manifest); returns the manifest's ``parts`` (rows and file of each
    shard of each table) and ``files``.

    Args:
      rows_device: the device that writes every rows bundle (the
        coordinator's CPU); None: each shard's PS writes its own task's.
      dense_device: the device that writes ``dense`` (None: the default).
    """
    bundles: dict[str, tuple[str, list, list]] = {}
    counts, info = [], {}
    for group in state.groups:
        for k, rows in enumerate(changed[group.table]):
            table = state.shard(group.keys[0], k)
            file = "rows" if rows_device else _task_file(table.device)
            device, names, tensors = bundles.setdefault(
                file, (rows_device or table.device, [], []))
            names.append(f"{group.table}/part_{k}/rows")
            tensors.append(rows)
            for key in group.keys:
                shard = state.shard(key, k)
                with tf.device(shard.device):
                    names.append(f"{key}/part_{k}")
                    tensors.append(shard.sparse_read(rows))
            with tf.device(table.device):
                counts.append(tf.size(rows))
            info[f"{group.table}/part_{k}"] = {
                "file": file, "shard_rows": int(table.shape[0])}
    for file, (device, names, tensors) in bundles.items():
        with tf.device(device):
            tf.raw_ops.SaveV2(prefix=f"{folder}/{file}", tensor_names=names,
                              shape_and_slices=[""] * len(names),
                              tensors=tensors)
    names, tensors = _dense_tensors(state)
    with placed(dense_device):
        tf.raw_ops.SaveV2(prefix=f"{folder}/dense", tensor_names=names,
                          shape_and_slices=[""] * len(names),
                          tensors=tensors)
    # Remote ops run asynchronously: a scalar per shard waits for them (and
    # raises their errors) before the files are listed.
    for part, count in zip(info.values(), counts):
        part["rows"] = int(count.numpy())
    files = {path.name: path.stat().st_size
             for path in sorted(as_path(folder).iterdir())}
    return {"parts": info, "files": files}


def write_manifest(folder: str, *, step: int, full: str, base: str,
                   written: dict) -> dict:
    """Writes ``folder``'s manifest last, atomically: from now on the
    delta is part of its chain."""
    manifest = {"format": FORMAT, "step": int(step), "full": full,
                "base": base,
                "written_at": datetime.datetime.now(
                    datetime.timezone.utc).isoformat(timespec="seconds"),
                "bytes": sum(written["files"].values()), **written}
    write_json_atomic(as_path(folder) / MANIFEST, manifest)
    return manifest


def _delta_folders(deltas) -> list:
    folder = as_path(deltas)
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.iterdir() if DELTA_NAME.match(p.name)),
                  key=lambda p: int(DELTA_NAME.match(p.name).group(1)))


def _read_manifest(path) -> dict:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise DeltaChainError(
            f"delta manifest {path} cannot be read ({error}); remove "
            f"{path.parent} to restore the chain before it.") from None
    if manifest.get("format") != FORMAT:
        raise DeltaChainError(
            f"delta manifest {path}: format {manifest.get('format')!r} is "
            f"not {FORMAT!r}; remove {path.parent} to restore the chain "
            "before it.")
    return manifest


def delta_chain(deltas, full: str) -> list[tuple[str, dict]]:
    """``(folder, manifest)`` of each delta taken after full checkpoint
    ``full`` (its name, ``ckpt-N``), in order.

    Raises:
      DeltaChainError: a delta whose base is not the link before it (a
        delta of the chain is missing) or whose files are missing or of
        another size, naming the file.
    """
    chain, link = [], full
    for folder in _delta_folders(deltas):
        manifest_path = folder / MANIFEST
        if not manifest_path.exists():
            continue  # cut off mid-write: not part of any chain
        manifest = _read_manifest(manifest_path)
        if manifest["full"] != full:
            continue  # of an older full checkpoint, compacted into ``full``
        if manifest["base"] != link:
            missing = as_path(deltas) / manifest["base"] / MANIFEST
            raise DeltaChainError(
                f"broken delta chain: {manifest_path} was taken after "
                f"{manifest['base']}, but the chain from {full} reaches "
                f"{link} ({missing} is missing or not complete); restore "
                f"{full} alone by removing the deltas after {link}, or put "
                "the missing delta back.")
        for name, size in manifest["files"].items():
            path = folder / name
            if not path.exists() or path.stat().st_size != size:
                raise DeltaChainError(
                    f"delta {folder.name} is damaged: {path} is missing or "
                    f"not {size} bytes (its manifest's); put it back, or "
                    f"remove {folder} and the deltas after it.")
        chain.append((str(folder), manifest))
        link = folder.name
    return chain


def remove_deltas(deltas, keep_full: str | None) -> list[str]:
    """Removes the deltas not chained from full checkpoint ``keep_full``
    (those of older full checkpoints, compacted into it) and the deltas cut
    off mid-write (no manifest); returns their names."""
    removed = []
    for folder in _delta_folders(deltas):
        manifest_path = folder / MANIFEST
        keep = False
        if manifest_path.exists() and keep_full is not None:
            try:
                keep = json.loads(manifest_path.read_text()).get(
                    "full") == keep_full
            except (OSError, ValueError):
                keep = False
        if not keep:
            if isinstance(folder, UriPath):
                folder.rmtree()
            else:
                shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
    return removed


def _read(prefix: str, name: str, dtype: tf.DType, device: str) -> tf.Tensor:
    with tf.device(device):
        return tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[name],
                                    shape_and_slices=[""], dtypes=[dtype])[0]


def apply_delta(state: DeltaState, folder: str, manifest: dict,
                rows_device: str | None, dense_device: str | None
                ) -> list[str]:
    """Writes delta ``folder``'s rows and dense keys into the live state and
    checks them by value: every written row read back from its shard, every
    dense key compared with the bundle. Returns the keys that differ.

    Args:
      rows_device: the device that reads the rows bundles (None: each
        shard's PS reads and compares its own: only booleans come back).
      dense_device: the device that reads ``dense``.
    """
    bad = set()
    for group in state.groups:
        written = _written_sharding(manifest, group.table)
        here = [int(v.shape[0]) for v, _ in state.live[group.keys[0]].shards]
        if written != here:
            bad |= _apply_resharded(state, folder, manifest, group, written,
                                    here, rows_device or dense_device
                                    or "/device:CPU:0")
            continue
        for k in range(len(state.live[group.keys[0]].shards)):
            part = manifest["parts"][f"{group.table}/part_{k}"]
            prefix = f"{folder}/{part['file']}"
            device = rows_device or state.shard(group.keys[0], k).device
            rows = _read(prefix, f"{group.table}/part_{k}/rows", tf.int64,
                         device)
            for key in group.keys:
                shard = state.shard(key, k)
                values = _read(prefix, f"{key}/part_{k}", shard.dtype,
                               device)
                if not _write_rows(shard, rows, values):
                    bad.add(key)
    dense = f"{folder}/dense"
    restore_streamed(state.root, dense, dense_device or "/device:CPU:0",
                     keys_wanted=state.dense_wanted)
    bad.update(differing_keys(state.root, dense,
                              dense_device or "/device:CPU:0",
                              state.dense_wanted))
    return sorted(bad)


def _write_rows(shard: tf.Variable, rows: tf.Tensor, values: tf.Tensor
                ) -> bool:
    """Writes ``values`` into ``rows`` of ``shard`` on its PS and reads
    them back: True when they are there, by value."""
    with tf.device(shard.device):
        shard.scatter_update(tf.IndexedSlices(values, rows))
        same = tf.reduce_all(tf.equal(shard.sparse_read(rows), values))
    return bool(same.numpy())


def _written_sharding(manifest: dict, table: str) -> list[int]:
    """The rows of each shard of ``table`` when the delta was written."""
    sizes = []
    while (part := manifest["parts"].get(f"{table}/part_{len(sizes)}")):
        sizes.append(int(part["shard_rows"]))
    return sizes


def _apply_resharded(state: DeltaState, folder: str, manifest: dict,
                     group: _Group, written: list[int], here: list[int],
                     device: str) -> set[str]:
    """Applies a delta written on another PS layout (another PS count:
    ``written`` rows a shard then, ``here`` now) to ``group``'s shards:
    each written shard's rows become table rows (its first row plus the
    local row), read on ``device`` (only the changed rows, as a full
    checkpoint's reshard reads blocks there), and go to the shards that
    hold those rows now, each checked by value. Returns the keys that
    differ."""
    if group.table in state.dynamic or sum(written) != sum(here):
        why = ("a dynamic table's maps are per shard" if sum(written) ==
               sum(here) else f"{sum(written)} rows there, {sum(here)} here")
        raise DeltaChainError(
            f"delta {folder}/{MANIFEST} was written with another sharding "
            f"of {group.table} ({len(written)} shards, here {len(here)}) "
            f"and cannot be moved ({why}): resume once with the PS count "
            "that wrote it (its first save is a full checkpoint), then "
            "change the PS count.")
    rows, values, first = [], {key: [] for key in group.keys}, 0
    for k, size in enumerate(written):
        part = manifest["parts"][f"{group.table}/part_{k}"]
        prefix = f"{folder}/{part['file']}"
        rows.append(_read(prefix, f"{group.table}/part_{k}/rows", tf.int64,
                          device) + first)
        for key in group.keys:
            values[key].append(_read(prefix, f"{key}/part_{k}",
                                     state.shard(key, 0).dtype, device))
        first += size
    with tf.device(device):
        rows = tf.concat(rows, 0)
        values = {key: tf.concat(v, 0) for key, v in values.items()}
    bad, first = set(), 0
    for k, size in enumerate(here):
        with tf.device(device):
            mine = tf.where((rows >= first) & (rows < first + size))[:, 0]
            local = tf.gather(rows, mine) - first
        for key in group.keys:
            shard = state.shard(key, k)
            with tf.device(device):
                part = tf.gather(values[key], mine)
            if not _write_rows(shard, local, part):
                bad.add(key)
        first += size
    return bad


def rebuild_maps(state: DeltaState) -> None:
    """Each dynamic table's id -> row map made again from its ``row_ids``
    (the rows of admitted ids), shard by shard on each shard's PS."""
    for table in state.dynamic.values():
        for shard in table.shards():
            with placed(shard.device):
                used = tf.where(shard.row_ids.read_value() >= 0)[:, 0]
                tf.raw_ops.LookupTableImportV2(
                    table_handle=shard.map.resource_handle,
                    keys=tf.gather(shard.row_ids, used),
                    values=used + shard.first_row)
