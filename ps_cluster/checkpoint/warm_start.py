"""A warm start: this run's fresh state filled from another run's
checkpoint by a :class:`~psrec.ps_cluster.checkpoint.warm_plan.
WarmStartPlan`, verified by value.

Every key of the live state is one of:

* the training progress (``progress/``): not carried, the step counter
  starts at 0;
* optimizer state (slots ``.OPTIMIZER_SLOT``, the optimizers' own
  variables, the loss scale): carried unless ``reset_optimizer``;
* a table the plan fills by range copies (its embedding variable, its wide
  ``[rows, 1]`` companion and their slots): each copy's rows, block by
  block, from the source key of the source table into this run's rows;
* a table's optimizer slot where the table's optimizer is the source's but
  named otherwise in the checkpoint (``WarmStartPlan.slot_rest``): copied
  whole from the source's key; where its optimizer changed: left fresh;
* anything else (dense weights, whole tables, a dynamic table's state and
  its id -> row maps): restored by key where the checkpoint holds it with
  the same shape and dtype, else left freshly initialised (a dense weight
  of another shape: another ``--model`` or another input width) and named
  in the result.

A table variable stored in another float dtype than the source's (a
16-bit run warm-started from a float32 one, or back) is carried cast to
this run's dtype (round to nearest), whole or by range copies, and checked
against the cast source values; one line of the result says so per table.
Its slots are float32 on both sides.

Rows are read through the coordinator's CPU (the source folder is where the
coordinator checked it; the PS tasks need not see it) and written on each
shard's own device, one block at a time: any PS count on either side.
Afterwards every carried key is compared with the checkpoint (whole keys
by :func:`~psrec.ps_cluster.checkpoint.verify.differing_keys`, each copied
range block by block); a difference is a
:class:`~psrec.ps_cluster.checkpoint.keeper.RestoreError`-like
:class:`WarmStartRestoreError`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from psrec.errors import DataError
from psrec.models.embedding.sparse_arch import WIDE_SUFFIX
from psrec.models.embedding.table_init import assign_rows
from psrec.ps_cluster.checkpoint.tables import in_checkpoint
from psrec.ps_cluster.checkpoint.tables import restore_tables
from psrec.ps_cluster.checkpoint.tables import table_keys
from psrec.ps_cluster.checkpoint.verify import BLOCK_BYTES
from psrec.ps_cluster.checkpoint.verify import LiveTensor
from psrec.ps_cluster.checkpoint.verify import copy_rows
from psrec.ps_cluster.checkpoint.verify import differing_keys
from psrec.ps_cluster.checkpoint.verify import live_tensors
from psrec.ps_cluster.checkpoint.verify import lookup_tables
from psrec.ps_cluster.checkpoint.verify import read_rows
from psrec.ps_cluster.checkpoint.verify import saved_tensors
from psrec.ps_cluster.checkpoint.verify import streamable
from psrec.ps_cluster.checkpoint.warm_plan import RowCopy
from psrec.ps_cluster.checkpoint.warm_plan import WarmStartError
from psrec.ps_cluster.checkpoint.warm_plan import WarmStartPlan

_TABLES = "model/sparse_arch/"
_SLOT = "/.OPTIMIZER_SLOT/"
# The tables' optimizers are `sparse_optimizer` and `sparse_optimizer_*`
# (``models.optim.config.TableGroup``).
_OPTIMIZER_ROOTS = ("sparse_optimizer", "dense_optimizer/", "loss_scale/")


class WarmStartRestoreError(DataError):
    """The warm-started state differs from the source checkpoint after the
    copy (exit 1)."""


@dataclasses.dataclass(frozen=True)
class WarmStartResult:
    """What a warm start did: the plan's lines and summary, the dense
    weights left fresh (``fresh_dense``, keys) and the slots reset."""

    lines: tuple[str, ...]
    summary: str
    carried_keys: int
    fresh_dense: tuple[str, ...]
    slots_reset: bool


def _is_optimizer(key: str) -> bool:
    return _SLOT in key or key.startswith(_OPTIMIZER_ROOTS)


def _is_dense(key: str) -> bool:
    """A dense weight of the model (not a table, not optimizer state)."""
    return (key.startswith("model/") and not key.startswith(_TABLES)
            and not _is_optimizer(key))


def _table_of(key: str, tables: tuple[str, ...]) -> tuple[str, str] | None:
    """``(table, rest of the key after the table's name)`` when ``key``
    belongs to one of ``tables`` (its variable, its wide companion, their
    slots)."""
    if not key.startswith(_TABLES):
        return None
    tail = key[len(_TABLES):]
    for table in tables:
        for name in (table, table + WIDE_SUFFIX):
            if tail.startswith(name + "/"):
                return table, tail[len(table):]
    return None


def _pieces(live: LiveTensor, start: int, count: int, row_bytes: int):
    """``(variable, first row in it, rows, first row in the full tensor)``
    of rows ``start .. start+count`` of ``live``, in blocks."""
    step = max(1, BLOCK_BYTES // max(row_bytes, 1))
    for variable, offset in live.shards:
        low = max(start, offset)
        high = min(start + count, offset + int(variable.shape[0]))
        for begin in range(low, high, step):
            yield variable, begin - offset, min(step, high - begin), begin


def _castable(key: str, saved: tf.DType, live: tf.DType) -> bool:
    """A table variable (not a slot) saved in another float dtype: carried
    cast to the live one."""
    return (key.startswith(_TABLES) and _SLOT not in key and saved != live
            and saved.is_floating and live.is_floating)


def _copy_range(path: str, source_key: str, saved_shape, live: LiveTensor,
                copy: RowCopy, io_device: str, check: bool,
                saved_dtype: tf.DType | None = None) -> bool:
    """Copies (``check``: compares) one :class:`RowCopy` of one key, cast
    from ``saved_dtype`` (default: the live dtype); returns whether every
    block is equal (always True when copying)."""
    row_bytes = live.dtype.size * int(np.prod(live.shape[1:] or [1]))
    for variable, first, rows, begin in _pieces(
            live, copy.target_start, copy.count, row_bytes):
        source_row = copy.source_start + (begin - copy.target_start)
        value = tf.cast(read_rows(path, source_key, tuple(saved_shape),
                                  saved_dtype or live.dtype, source_row,
                                  rows, io_device), live.dtype)
        if not check:
            assign_rows(variable, first, value)
            continue
        with tf.device(variable.device):
            now = variable.sparse_read(
                tf.range(first, first + rows, dtype=tf.int64))
        if not np.array_equal(now.numpy(), value.numpy()):
            return False
    return True


def apply_warm_start(root: tf.train.Checkpoint, path: str,
                     plan: WarmStartPlan, *, reset_optimizer: bool,
                     io_device: str, source: str | None = None
                     ) -> WarmStartResult:
    """Fills ``root``'s live state from checkpoint ``path`` by ``plan``
    (see the module docstring); returns what it did.

    Raises:
      WarmStartError: the state cannot be written block by block
        (mirrored variables).
      WarmStartRestoreError: a carried key differs afterwards.
    """
    live = live_tensors(root)
    if not streamable(live):
        raise WarmStartError(
            "--warm-start needs variables this process writes block by "
            "block (--strategy ps or one-device); mirrored replicas are not "
            "warm-started: train under --strategy ps.")
    shapes, dtypes = saved_tensors(path)
    ranged = plan.copied_tables
    whole, copies, fresh_dense, cast = [], [], [], {}

    def fits(source_key: str, key: str, rows_only: bool = True) -> bool:
        first = 1 if rows_only else 0
        return source_key in shapes and list(shapes[source_key][first:]) == (
            list(live[key].shape[first:])) and (
            dtypes[source_key] == live[key].dtype or _castable(
                key, dtypes[source_key], live[key].dtype))

    for key in sorted(live):
        if key.startswith("progress/") or (
                reset_optimizer and _is_optimizer(key)):
            continue
        owner = _table_of(key, ranged)
        if owner is not None:
            table, rest = owner
            for copy in plan.copies:
                rest_there = plan.slot_rest(copy.source, table, rest)
                if copy.target != table or rest_there is None:
                    continue
                source_key = _TABLES + copy.source + rest_there
                if fits(source_key, key):
                    copies.append((key, source_key, copy))
            continue
        owner = _table_of(key, plan.whole)
        if owner is not None and _SLOT in owner[1]:
            table, rest = owner
            rest_there = plan.slot_rest(table, table, rest)
            source_key = None if rest_there is None else (
                _TABLES + table + rest_there)
            if source_key is None or source_key == key:
                if source_key is not None and fits(key, key, False):
                    whole.append(key)
                continue  # another optimizer: fresh slots
            if fits(source_key, key, False):
                rows = int(live[key].shape[0])
                copies.append((key, source_key,
                               RowCopy(table, table, 0, 0, rows)))
            continue
        same_shape = key in shapes and list(shapes[key]) == list(
            live[key].shape)
        if same_shape and dtypes[key] == live[key].dtype:
            whole.append(key)
        elif same_shape and _castable(key, dtypes[key], live[key].dtype):
            rows = live[key].shape[0]
            copies.append((key, key, RowCopy(key, key, 0, 0, rows)))
        elif _is_dense(key):
            fresh_dense.append(key)
    for key in whole:
        copy_rows(path, key, live[key], io_device)
    for key, source_key, copy in copies:
        if dtypes[source_key] != live[key].dtype:
            cast[_short_table(key)] = (dtypes[source_key], live[key].dtype)
        _copy_range(path, source_key, shapes[source_key], live[key], copy,
                    io_device, check=False, saved_dtype=dtypes[source_key])
    maps = {base: table for base, table in lookup_tables(root).items()
            if _table_of(base, ranged) is None}
    maps = in_checkpoint(maps, shapes.keys())
    restore_tables(maps, path, io_device)
    wanted = set(whole) | table_keys(maps)
    bad = differing_keys(root, path, io_device, wanted.__contains__)
    bad += sorted({key for key, source_key, copy in copies
                   if not _copy_range(path, source_key, shapes[source_key],
                                      live[key], copy, io_device,
                                      check=True,
                                      saved_dtype=dtypes[source_key])})
    if bad:
        raise WarmStartRestoreError(
            f"warm start from {path}: {len(bad)} key(s) differ from the "
            f"checkpoint after the copy: {bad[:8]}; nothing was trained on "
            "the partial state.")
    dense_keys = [k for k in live if _is_dense(k)]
    dense = ("carried" if not fresh_dense else
             f"re-initialised (shape changed) for {len(fresh_dense)} of "
             f"{len(dense_keys)} variables: "
             + ", ".join(_short(k) for k in fresh_dense[:6])
             + (" ..." if len(fresh_dense) > 6 else ""))
    changed = [table for table, _, _ in plan.optimizer_changes()]
    slots = "reset" if reset_optimizer else "carried" + (
        f" (re-initialised for {len(changed)} table(s) whose optimizer "
        f"changed: {', '.join(changed)})" if changed else "")
    return WarmStartResult(
        lines=tuple(plan.lines()) + tuple(
            f"table {name}: {saved.name} in the source, carried cast to "
            f"{now.name} (round to nearest)"
            for name, (saved, now) in sorted(cast.items())),
        summary=plan.summary(source or path, dense, slots),
        carried_keys=len(wanted) + len({k for k, _, _ in copies}),
        fresh_dense=tuple(fresh_dense), slots_reset=reset_optimizer)


def _short_table(key: str) -> str:
    """A table variable's name in its key (``C1``, ``C1__wide``)."""
    return key[len(_TABLES):].split("/")[0]


def _short(key: str) -> str:
    """A dense weight's key as shown (``over_arch/out/kernel``)."""
    return key.removeprefix("model/").removesuffix(
        "/.ATTRIBUTES/VARIABLE_VALUE")
