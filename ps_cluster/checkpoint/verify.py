"""Restore verification streamed one slice at a time.

After a restore, every live variable is compared by value with the
checkpoint's tensor of the same key (a restore can "succeed" with sharded
optimizer slots left at their initial values). Nothing is written for it:
the checkpoint keys of the live objects are derived the way TensorFlow names
them when saving (a breadth-first walk of the object graph from the
``tf.train.Checkpoint``, slot variables under
``<variable>/.OPTIMIZER_SLOT/<optimizer>/<slot>``), and each variable is
compared per shard and per block of rows: the live rows are sliced on the
variable's own device (its PS) and the saved rows are read by key and slice
(``RestoreV2`` with a ``shape_and_slices`` spec) on the coordinator. The
extra memory is two blocks of at most :data:`BLOCK_BYTES`, whatever the size
of the tables.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import tensorflow as tf

from psrec.models.embedding.table_init import assign_rows
from psrec.progress import SILENT
from psrec.progress import Progress
from psrec.ps_cluster.checkpoint.tables import differing_tables
from psrec.ps_cluster.checkpoint.tables import in_checkpoint
from psrec.ps_cluster.checkpoint.tables import live_tables
from psrec.ps_cluster.checkpoint.tables import restore_tables
from psrec.ps_cluster.checkpoint.tables import table_keys

BLOCK_BYTES = 64 << 20  # rows compared (or copied) at a time
PROGRESS_BYTES = 1 << 30  # passes over this many bytes report progress
SKIP_KEYS = ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter")
_ATTRIBUTE = "/.ATTRIBUTES/VARIABLE_VALUE"
_SHARDED = getattr(getattr(tf.__internal__, "distribute", None),
                   "ShardedVariable", ())


@dataclasses.dataclass(frozen=True)
class LiveTensor:
    """One checkpoint key of the live state.

    Attributes:
      shards: ``(variable, first row)`` of each piece (a plain variable is
        one piece at row 0).
      shape: the full (logical) shape.
    """

    shards: tuple[tuple[tf.Variable, int], ...]
    shape: tuple[int, ...]
    dtype: tf.DType


def _escape(name: str) -> str:
    """A child name as it appears in a checkpoint key (TensorFlow's
    ``trackable_utils.escape_local_name``)."""
    return name.replace(".", "..").replace("/", "./")


def _live(variable) -> LiveTensor:
    parts = list(variable.variables) if _is_sharded(variable) else [variable]
    shards, row = [], 0
    for part in parts:
        shards.append((part, row))
        row += int(part.shape[0]) if part.shape.rank else 0
    shape = tuple(int(d) for d in variable.shape)
    return LiveTensor(tuple(shards), shape, variable.dtype)


def _is_sharded(value) -> bool:
    return bool(_SHARDED) and isinstance(value, _SHARDED)


def _walk(root) -> list[tuple[object, str]]:
    """Every object reachable from ``root`` with its checkpoint path, in the
    breadth-first order (and first-found paths) TensorFlow saves with."""
    view = tf.train.TrackableView(root)
    paths = {id(root): ""}
    order = [(root, "")]
    queue = collections.deque([root])
    while queue:
        current = queue.popleft()
        for name, child in view.children(current).items():
            if id(child) in paths:
                continue
            path = f"{paths[id(current)]}/{_escape(name)}".lstrip("/")
            paths[id(child)] = path
            order.append((child, path))
            queue.append(child)
    return order


def lookup_tables(root: tf.train.Checkpoint) -> dict[str, object]:
    """``<path>/.ATTRIBUTES/table`` -> lookup table of everything ``root``
    saves (:func:`psrec.ps_cluster.checkpoint.tables.live_tables`)."""
    return live_tables(_walk(root))


def live_tensors(root: tf.train.Checkpoint) -> dict[str, LiveTensor]:
    """Checkpoint key -> live variable of everything ``root`` saves (save
    counter and object graph excepted), without saving anything."""
    objects = _walk(root)
    variables = [(o, p) for o, p in objects
                 if isinstance(o, tf.Variable) or _is_sharded(o)]
    found = {p + _ATTRIBUTE: _live(o) for o, p in variables}
    for optimizer, opt_path in objects:
        if not (hasattr(optimizer, "get_slot_names")
                and hasattr(optimizer, "get_slot")):
            continue
        for slot_name in optimizer.get_slot_names():
            for variable, path in variables:
                try:
                    slot = optimizer.get_slot(variable, slot_name)
                except (AttributeError, KeyError):
                    continue
                if slot is not None:
                    found[f"{path}/.OPTIMIZER_SLOT/{opt_path}/"
                          f"{_escape(slot_name)}{_ATTRIBUTE}"] = _live(slot)
    return {k: v for k, v in found.items()
            if not any(k.startswith(s) for s in SKIP_KEYS)}


def saved_tensors(path: str) -> tuple[dict[str, list[int]], dict]:
    """Key -> shape and key -> dtype of the checkpoint at ``path``, read
    from its index alone. (Not ``tf.train.load_checkpoint``: on ``ram://``
    every prefix of a file name is a folder, so it would look for a
    ``checkpoint`` file under the prefix.)"""
    reader = tf.compat.v1.train.NewCheckpointReader(str(path))
    shapes = {k: s for k, s in reader.get_variable_to_shape_map().items()
              if not any(k.startswith(p) for p in SKIP_KEYS)}
    return shapes, reader.get_variable_to_dtype_map()


def tensor_bytes(tensor: LiveTensor) -> int:
    """Bytes of ``tensor``'s full (logical) value."""
    return tensor.dtype.size * int(np.prod(tensor.shape))


def _task(progress: Progress, label: str, tensors: list[LiveTensor]):
    """A pass over ``tensors`` in bytes, shown when it is large."""
    total = sum(tensor_bytes(t) for t in tensors)
    return (progress if total >= PROGRESS_BYTES else SILENT).task(
        label, total, "bytes")


def _blocks(live: LiveTensor):
    """``(variable, first row in it, rows, first row in the full tensor)``
    of each block; rows None: the whole (rank-0) variable."""
    row_bytes = live.dtype.size * int(np.prod(live.shape[1:] or [1]))
    step = max(1, BLOCK_BYTES // max(row_bytes, 1))
    for variable, offset in live.shards:
        if variable.shape.rank == 0:
            yield variable, 0, None, 0
            continue
        rows = int(variable.shape[0])
        for start in range(0, rows, step):
            yield variable, start, min(step, rows - start), offset + start


def read_rows(path: str, key: str, shape: tuple[int, ...], dtype: tf.DType,
              begin: int, rows: int | None, device: str) -> tf.Tensor:
    """Rows ``begin .. begin+rows`` of tensor ``key`` in checkpoint ``path``
    (all of it when ``rows`` is None), read on ``device`` only."""
    if rows is None or not shape:
        spec = ""
    else:
        spec = " ".join(map(str, shape)) + f" {begin},{rows}" + (
            ":-" * (len(shape) - 1))
    with tf.device(device):
        return tf.raw_ops.RestoreV2(prefix=str(path), tensor_names=[key],
                                    shape_and_slices=[spec],
                                    dtypes=[dtype])[0]


def _live_rows(variable: tf.Variable, start: int,
               rows: int | None) -> np.ndarray:
    """Rows of ``variable``, gathered where it lives. A sparse read: a table
    that was ever read sparsely (every embedding lookup) is in TensorFlow's
    copy-on-read mode, where a dense read copies the whole variable."""
    with tf.device(variable.device):
        if rows is None:
            return variable.read_value().numpy()
        indices = tf.range(start, start + rows, dtype=tf.int64)
        try:
            return variable.sparse_read(indices).numpy()
        except AttributeError:  # mirrored variables have no sparse read
            return variable.read_value()[start:start + rows].numpy()


def _same_rows(path: str, key: str, tensor: LiveTensor, variable, start: int,
               rows: int | None, begin: int, io_device: str | None) -> bool:
    """Whether one block of ``variable`` equals the checkpoint's rows. With
    ``io_device`` None the block is read and compared on the variable's
    own device (its PS): only a boolean comes back."""
    if io_device is not None:
        expected = read_rows(path, key, tensor.shape, tensor.dtype, begin,
                             rows, io_device)
        return np.array_equal(_live_rows(variable, start, rows),
                              expected.numpy())
    with tf.device(variable.device):
        expected = read_rows(path, key, tensor.shape, tensor.dtype, begin,
                             rows, variable.device)
        if rows is None:
            live = variable.read_value()
        else:
            live = variable.sparse_read(
                tf.range(start, start + rows, dtype=tf.int64))
        return bool(tf.reduce_all(tf.equal(live, expected)).numpy())


def differing_keys(root: tf.train.Checkpoint, path: str,
                   io_device: str | None, keys_wanted=None, *,
                   progress: Progress = SILENT) -> list[str]:
    """Keys whose live value differs from checkpoint ``path``'s or that
    only one side has, compared block by block.

    Args:
      io_device: the device that reads the checkpoint files; None: each
        shard's own device (every task sees the files), where the block is
        also compared.
      keys_wanted: a predicate on keys (None: all).
      progress: told the bytes compared (``verify``) when the state is
        :data:`PROGRESS_BYTES` or more.
    """
    wanted = keys_wanted or (lambda key: True)
    live = {k: v for k, v in live_tensors(root).items() if wanted(k)}
    tables = {k: t for k, t in live_tables(_walk(root)).items()
              if all(map(wanted, table_keys({k: t})))}
    shapes, dtypes = saved_tensors(path)
    saved = {k for k in shapes if wanted(k)} - table_keys(tables)
    bad = set(live.keys() ^ saved)
    present = in_checkpoint(tables, shapes.keys())
    bad.update(table_keys(tables) - table_keys(present))
    bad.update(differing_tables(present, path, io_device))
    same = [k for k in sorted(live.keys() & saved)
            if list(live[k].shape) == list(shapes[k])
            and live[k].dtype == dtypes[k]]
    bad.update(live.keys() & saved - set(same))
    with _task(progress, "verify", [live[k] for k in same]) as task:
        for key in same:
            tensor = live[key]
            for variable, start, rows, begin in _blocks(tensor):
                if not _same_rows(path, key, tensor, variable, start, rows,
                                  begin, io_device):
                    bad.add(key)
                    break
                task.advance(tensor_bytes(tensor) if rows is None else
                             rows * tensor_bytes(tensor) // tensor.shape[0])
    return sorted(bad)


def streamable(live: dict[str, LiveTensor]) -> bool:
    """True when every piece is a plain variable, which
    :func:`restore_streamed` can fill: a mirrored variable's rows written
    through its handle would reach one replica only."""
    return not any(isinstance(variable, tf.distribute.DistributedValues)
                   for tensor in live.values() for variable, _ in tensor.shards)


def restore_streamed(root: tf.train.Checkpoint, path: str,
                     io_device: str | None, *,
                     progress: Progress = SILENT,
                     keys_wanted=None) -> None:
    """Restores every live variable of ``root`` that checkpoint ``path``
    holds with the same shape and dtype, block by block of rows
    (:func:`copy_rows`): at most one block is in flight, where TensorFlow's
    restore sends whole variables (and the PS then briefly holds a variable
    twice). Any sharding on either side restores, optimizer slots included;
    keys that do not fit are left to the caller's check. ``progress`` is told
    the bytes restored when they are :data:`PROGRESS_BYTES` or more;
    ``keys_wanted``, a predicate on keys, restores only those (None: all)."""
    wanted = keys_wanted or (lambda key: True)
    live = {k: v for k, v in live_tensors(root).items() if wanted(k)}
    shapes, dtypes = saved_tensors(path)
    keys = [k for k in sorted(live.keys() & shapes.keys())
            if list(live[k].shape) == list(shapes[k])
            and live[k].dtype == dtypes[k]]
    with _task(progress, "restore", [live[k] for k in keys]) as task:
        for key in keys:
            copy_rows(path, key, live[key], io_device)
            task.advance(tensor_bytes(live[key]))
    tables = {k: t for k, t in live_tables(_walk(root)).items()
              if all(map(wanted, table_keys({k: t})))}
    restore_tables(in_checkpoint(tables, shapes.keys()), path, io_device)


def copy_rows(path: str, key: str, live: LiveTensor,
              io_device: str | None) -> None:
    """Assigns checkpoint tensor ``key`` to ``live`` block by block (each
    block read on ``io_device``, or with None on its shard's own device,
    and written on its shard's device)."""
    for variable, start, rows, begin in _blocks(live):
        value = read_rows(path, key, live.shape, live.dtype, begin, rows,
                          io_device or variable.device)
        if rows is None:
            with tf.device(variable.device):
                variable.assign(value)
        else:
            assign_rows(variable, start, value)
        if io_device is None:
            # Ops on a remote task run asynchronously: wait for this block
            # (a scalar comes back) so that blocks are not all queued on
            # the PS at once.
            with tf.device(variable.device):
                tf.size(value).numpy()
