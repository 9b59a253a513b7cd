"""Where a checkpoint is written from, and the progress of a large save.

TensorFlow's sharded save (``MultiDeviceSaver``) runs each task's ``SaveV2``
on the task that holds the variables, unless
``CheckpointOptions.experimental_io_device`` names one device, which then
receives *every* tensor and writes them all: the whole training state
(tables and optimizer slots) travels over gRPC into it (5.32 GiB peak RSS
on the coordinator for a 2.39 GiB state). So where every task sees the
checkpoint folder (:func:`tasks_share_folder`) each PS writes its own
shards from its own memory; the checkpoint has the same keys and slices
(TensorFlow merges the per-task index files into one), so it restores and
reshards alike. Elsewhere the coordinator's CPU is the only writer, unless
``--checkpoint-writers tasks`` says the tasks share the folder
(:mod:`psrec.ps_cluster.checkpoint.writers`, which proves it first).
"""

from __future__ import annotations

import contextlib
import math
import threading
from pathlib import Path
from typing import Iterator

import tensorflow as tf

from psrec.progress import SILENT
from psrec.progress import Progress
from psrec.progress import default_progress
from psrec.ps_cluster.cluster.addresses import is_loopback_host
from psrec.ps_cluster.cluster.addresses import parse_address
from psrec.ps_cluster.cluster.strategy import cluster_resolver
from psrec.uri import is_uri

COORDINATOR_CPU = "/job:chief/replica:0/task:0/device:CPU:0"
PROGRESS_BYTES = 1 << 30  # saves of this many bytes report progress
POLL_SECONDS = 0.5
SLICE_BYTES = 64 << 20  # the largest slice of a tensor in a checkpoint
ALIGN_BYTES = 64  # a slice sharing its variable's buffer starts at these


def tasks_share_folder(strategy, directory) -> bool:
    """True when every task of ``strategy``'s cluster can write
    ``directory`` itself: a local path, a ``ParameterServerStrategy`` whose
    every task address is on this host (so every task sees this file
    system)."""
    if strategy is None or is_uri(str(directory)) or not isinstance(
            strategy, tf.distribute.ParameterServerStrategy):
        return False
    resolver = cluster_resolver(strategy)
    if resolver is None:
        return False
    addresses = [address for task_addresses in
                 resolver.cluster_spec().as_dict().values()
                 for address in (task_addresses.values()
                                 if isinstance(task_addresses, dict)
                                 else task_addresses)]
    return bool(addresses) and all(
        is_loopback_host(parse_address(address)[0]) for address in addresses)


def in_cluster() -> bool:
    """True in a coordinator connected to a cluster (its own CPU is the
    chief's)."""
    return any(device.name == COORDINATOR_CPU
               for device in tf.config.list_logical_devices("CPU"))


class AlignedSlices(tf.train.experimental.ShardingCallback):
    """Stores each tensor over ``slice_bytes`` in slices of whole rows of
    at most ``slice_bytes``, each starting at a byte offset that is a
    multiple of :data:`ALIGN_BYTES`; smaller tensors stay whole, packed
    together per device.

    TensorFlow's ``Slice`` shares the sliced tensor's buffer only when the
    result stays aligned: along the first axis of a matrix only when a row
    is a multiple of 64 bytes, of a vector when the slice starts (and ends,
    or runs to the end) at a multiple of 64 bytes; otherwise it copies.
    ``MaxShardSizePolicy`` slices the matrix, so every slice of a table
    with 32-byte rows (bfloat16, dim 16) was a copy, and every slice goes
    to ``SaveV2`` at once: a save held the table again (measured +0.64 GiB
    for 0.6 GiB of table; float32 of dim 16, 64-byte rows, never copied).
    Here each slice is cut from the tensor's flat view at an aligned
    offset and reshaped: views only, whatever the row size."""

    def __init__(self, slice_bytes: int = SLICE_BYTES) -> None:
        self.slice_bytes = slice_bytes

    @property
    def description(self) -> str:
        return (f"slices of at most {self.slice_bytes} bytes at "
                f"{ALIGN_BYTES}-byte aligned rows")

    def _rows_per_slice(self, shape: tf.TensorShape, dtype) -> int | None:
        """Rows of one slice of a tensor of ``shape``; None: kept whole."""
        dtype = tf.as_dtype(dtype)
        if shape.rank is None or shape.rank == 0 or dtype == tf.string:
            return None
        row_bytes = shape[1:].num_elements() * dtype.size
        if not row_bytes or shape[0] * row_bytes <= self.slice_bytes:
            return None
        unit = ALIGN_BYTES // math.gcd(row_bytes, ALIGN_BYTES)  # rows
        return max(unit, self.slice_bytes // row_bytes // unit * unit)

    def __call__(self, shardable_tensors) -> list[dict]:
        whole: dict[str, dict] = {}  # device -> its unsliced tensors
        sliced: list[dict] = []
        for shardable in shardable_tensors:
            key, tensor = shardable.checkpoint_key, shardable.tensor
            if shardable.slice_spec:  # a shard of a bigger variable
                info = tf.Variable.SaveSliceInfo.from_spec(
                    shardable.slice_spec)
                full, offset = info.full_shape, list(info.var_offset)
                shape = tf.TensorShape(info.var_shape)
            else:
                shape = shardable.shape
                full, offset = shape.as_list(), [0] * (shape.rank or 0)
            rows = self._rows_per_slice(shape, shardable.dtype)
            if rows is None:
                whole.setdefault(str(shardable.device), {}).setdefault(
                    key, {})[shardable.slice_spec] = tensor
                continue
            inner = shape[1:].num_elements()
            with tf.device(shardable.device):  # views: see the class
                flat = tf.reshape(tensor, [-1])
                for begin in range(0, shape[0], rows):
                    size = [min(rows, shape[0] - begin)] + shape[1:].as_list()
                    part = tf.reshape(tf.slice(
                        flat, [begin * inner], [size[0] * inner]), size)
                    spec = tf.Variable.SaveSliceInfo(
                        full_name=key, full_shape=full,
                        var_offset=[offset[0] + begin] + offset[1:],
                        var_shape=size).spec.strip()
                    sliced.append({key: {spec: part}})
        return list(whole.values()) + sliced


def save_options(tasks_write: bool) -> tf.train.CheckpointOptions:
    """The options of a save: each task writes its own variables when
    ``tasks_write``, else (in a cluster) the coordinator writes all.

    Tensors are stored in slices of at most :data:`SLICE_BYTES`
    (:class:`AlignedSlices`): TensorFlow reads a whole stored slice to
    return any part of it, so a streamed restore reading one block of rows
    of a table stored whole would read (and hold) the whole shard for
    every block."""
    device = COORDINATOR_CPU if in_cluster() and not tasks_write else None
    return tf.train.CheckpointOptions(
        experimental_io_device=device,
        experimental_sharding_callback=AlignedSlices())


def _written(prefix: str) -> int:
    """Bytes of the data files a save of ``prefix`` has written so far (in
    ``<prefix>_temp/`` while it runs, beside the prefix once merged)."""
    total = 0
    for pattern in (f"{prefix}_temp/*.data-*", f"{prefix}.data-*"):
        for name in tf.io.gfile.glob(pattern):
            with contextlib.suppress(tf.errors.OpError):
                total += tf.io.gfile.stat(name).length
    return total


@contextlib.contextmanager
def save_progress(prefix: str, state_bytes: int,
                  progress: Progress | None = None) -> Iterator[None]:
    """Reports the bytes a save of ``prefix`` writes (``save``), polled from
    its files by a thread, when the state is :data:`PROGRESS_BYTES` or more
    (``progress`` default: the process's default progress)."""
    reporter = SILENT
    if state_bytes >= PROGRESS_BYTES:
        reporter = default_progress() if progress is None else progress
    if reporter is SILENT:
        yield
        return
    done = threading.Event()
    task = reporter.task("save", state_bytes, "bytes")
    shown = [0]

    def poll() -> None:
        while not done.wait(POLL_SECONDS):
            now = min(_written(prefix), state_bytes)
            if now > shown[0]:
                task.advance(now - shown[0])
                shown[0] = now

    watcher = threading.Thread(target=poll, name="psrec-save-progress",
                               daemon=True)
    watcher.start()
    try:
        yield
        done.set()
        watcher.join()
        task.advance(state_bytes - shown[0])  # merged: every byte is there
    finally:
        done.set()
        watcher.join()
        task.close()


def absolute(directory) -> str:
    """``directory`` as an absolute local path (a PS task may run from
    another working directory), or unchanged when it is a URI."""
    text = str(directory)
    return text if is_uri(text) else str(Path(text).absolute())
