"""Lookup tables (a dynamic table's id -> row map and pending counts) in the
streamed restore and its check.

A ``MutableHashTable`` is saved as two tensors, ``<path>/.ATTRIBUTES/
table-keys`` and ``table-values``, its pairs in the table's iteration order,
which a restore changes: a table is restored whole (``LookupTableImportV2``
on the table's own device, what TensorFlow's restore runs) and compared as
pairs sorted by key. Tables hold one pair per admitted or pending id, far
smaller than the rows they index, so they are not split into blocks.

A dynamic table's sharded map (``models.dynamic.shards.ShardedMap``: one
hash table per embedding shard) saves as one table and is handled as one
here: its pairs are exported from every shard and restored through its
``import_pairs``, which puts each pair in the shard that owns it now (any
shard count restores).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from psrec.models.dynamic.shards import ShardedMap
from psrec.models.dynamic.shards import saved_pairs

_ATTRIBUTE = "/.ATTRIBUTES/table"
SUFFIXES = ("-keys", "-values")


def _is_table(value) -> bool:
    return isinstance(value, (tf.lookup.experimental.MutableHashTable,
                               tf.lookup.experimental.DenseHashTable,
                               ShardedMap))


def _device(table) -> str:
    """Where a table's saved pairs are read (a sharded map: its first
    shard's device)."""
    if isinstance(table, ShardedMap):
        return table.devices[0] or ""
    return table.resource_handle.device


def _export(table):
    if isinstance(table, ShardedMap):
        return table.export()  # each shard on its own device
    with tf.device(table.resource_handle.device):
        return table.export()


def live_tables(objects: list[tuple[object, str]]) -> dict[str, object]:
    """``<path>/.ATTRIBUTES/table`` -> table, of the ``(object, checkpoint
    path)`` pairs of a checkpoint's object graph."""
    return {path + _ATTRIBUTE: table for table, path in objects
            if _is_table(table)}


def table_keys(tables: dict[str, object]) -> set[str]:
    """The checkpoint keys the tables save under."""
    return {base + suffix for base in tables for suffix in SUFFIXES}


def in_checkpoint(tables: dict[str, object], saved_keys) -> dict[str, object]:
    """The tables whose two keys are among ``saved_keys``."""
    return {base: table for base, table in tables.items()
            if table_keys({base: table}) <= saved_keys}


def _saved(path: str, base: str, table, device: str | None):
    """The saved keys and values of one table, read on ``device`` (None:
    the table's own)."""
    with tf.device(device or _device(table)):
        return tf.raw_ops.RestoreV2(
            prefix=str(path), tensor_names=[base + s for s in SUFFIXES],
            shape_and_slices=["", ""],
            dtypes=[table.key_dtype, table.value_dtype])


def _sorted_pairs(keys, values) -> tuple[np.ndarray, np.ndarray]:
    keys, values = np.asarray(keys), np.asarray(values)
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order]


def differing_tables(tables: dict[str, object], path: str,
                     io_device: str | None) -> list[str]:
    """The keys of the tables whose pairs differ from checkpoint ``path``'s
    (order aside)."""
    bad = []
    for base, table in sorted(tables.items()):
        pairs = _saved(path, base, table, io_device)
        if isinstance(table, ShardedMap):
            pairs = saved_pairs(*pairs)
        saved = _sorted_pairs(*(t.numpy() for t in pairs))
        live = _sorted_pairs(*(t.numpy() for t in _export(table)))
        if not all(np.array_equal(a, b) for a, b in zip(live, saved)):
            bad += [base + suffix for suffix in SUFFIXES]
    return bad


def restore_tables(tables: dict[str, object], path: str,
                   io_device: str | None) -> None:
    """Replaces each table's contents with checkpoint ``path``'s."""
    for base, table in sorted(tables.items()):
        keys, values = _saved(path, base, table, io_device)
        if isinstance(table, ShardedMap):
            table.import_pairs(keys, values)
            continue
        with tf.device(table.resource_handle.device):
            tf.raw_ops.LookupTableImportV2(
                table_handle=table.resource_handle, keys=keys, values=values)
