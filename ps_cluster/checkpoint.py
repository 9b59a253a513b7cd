"""Checkpoints written by the coordinator only, and restores that are proven
complete.

``tf.train.CheckpointManager`` writes the model, both optimizers (with their
slots) and the training progress. Its ``checkpoint`` state file is replaced
atomically after the data files are complete, so a save cut off mid-write is
never the one ``latest_checkpoint`` names. The ``<prefix>_temp`` folder a
cut-off or failed save leaves is removed when a keeper starts and when a
save fails; :func:`check_output_folder` checks a folder is writable with
room for one checkpoint before any server starts.

A restore is **verified by value**: the status object's
``assert_existing_objects_matched()`` passes even when sharded optimizer
slots silently keep their initial values (measured: a checkpoint from 2 PS
shards restored into 3). So after restoring, every variable's live value is
read back and compared with the checkpoint's tensor; a difference is an error
naming the variables -- never a silent partial restore. Optimizer slots of
resharded tables, which TensorFlow cannot restore itself, are restored by
:func:`_restore_resharded_slots` from the checkpoint's full tensors.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf

from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.errors import RetryableError
from psrec.errors import one_line
from psrec.uri import is_uri
from psrec.uri import require_tf_filesystem
from psrec.uri_path import UriPath
from psrec.uri_path import as_path

_SKIP_KEYS = ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter")


class RestoreError(DataError):
    """A checkpoint did not restore completely."""


class OutputFolderError(ConfigError):
    """A checkpoint or export folder is not writable or lacks room (exit 2,
    before any server starts)."""


class SaveError(DataError):
    """A checkpoint save failed; its partial files were removed."""


class SaveInterruptedError(RetryableError):
    """A checkpoint save failed because a task was unreachable (a lost or
    partitioned PS, a reset gRPC channel): a rerun can finish it (exit
    138), unlike a full or read-only disk (:class:`SaveError`, exit 1)."""


# TensorFlow errors of an unreachable task (not of the storage).
_NETWORK_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError,
                   tf.errors.CancelledError, tf.errors.DeadlineExceededError)


TEMP_SUFFIX = "_temp"  # TensorFlow's sharded save writes <prefix>_temp/ first


def remove_partial_saves(directory: str | Path) -> list[str]:
    """Removes the ``<prefix>_temp`` folders (and files) a save that was cut
    off or failed leaves in ``directory``; returns their names."""
    folder = as_path(directory)
    if not folder.is_dir():
        return []
    removed = []
    for path in sorted(folder.iterdir()):
        if path.name.endswith(TEMP_SUFFIX):
            if isinstance(path, UriPath) and path.is_dir():
                path.rmtree()
            elif path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def check_output_folder(directory: str | Path, needed_bytes: int,
                        what: str) -> None:
    """Raises :class:`OutputFolderError` unless ``directory`` -- or, when it
    does not exist yet, its nearest existing parent -- is a folder a probe
    file can be written to (and is removed from), on a file system with
    ``needed_bytes`` free. Creates nothing. A URI (``gs://``, ``ram://``)
    must be a store TensorFlow writes; a probe object is written there and
    removed (a store reports no free space to check)."""
    if is_uri(directory):
        _check_remote_folder(str(directory), what)
        return
    folder = Path(directory).absolute()
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, f"{existing} is not a folder")
        with tempfile.NamedTemporaryFile(dir=existing,
                                         prefix=".psrec-probe-"):
            pass
        free = shutil.disk_usage(existing).free
    except OSError as error:
        raise OutputFolderError(
            f"the {what} folder {folder} is not writable "
            f"({error.strerror or error}); give a --workdir you can write "
            "to.") from None
    if free < needed_bytes:
        raise OutputFolderError(
            f"the {what} folder {folder} has {free / 2**20:,.1f} MiB free, "
            f"one {what} needs about {needed_bytes / 2**20:,.1f} MiB "
            "(tables, optimizer slots and dense weights); free space or give "
            "another --workdir.")


def _check_remote_folder(directory: str, what: str) -> None:
    require_tf_filesystem(directory, "--workdir")
    probe = as_path(directory) / f".psrec-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except (tf.errors.OpError, OSError) as error:
        message = getattr(error, "message", None) or str(error)
        raise OutputFolderError(
            f"the {what} folder {directory} is not writable "
            f"({message.splitlines()[0][:200]}); give a --workdir you can "
            "write to.") from None


class Progress(tf.Module):
    """Training progress saved with every checkpoint.

    Attributes:
      step: steps completed and joined (the resumed run continues from it).
      examples: examples trained on.
      resumes: how many times the job was resumed; the input pipeline's
        shuffle seed is offset by it, so a resumed run does not replay the
        data order from the start (per-worker iterators cannot be
        checkpointed under ParameterServerStrategy).
    """

    def __init__(self) -> None:
        super().__init__(name="progress")
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.examples = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.resumes = tf.Variable(0, dtype=tf.int64, trainable=False)


_COORDINATOR_CPU = "/job:chief/replica:0/task:0/device:CPU:0"


def io_options() -> tf.train.CheckpointOptions:
    """In a cluster, every byte goes through the coordinator's own CPU (not
    the PS tasks' file systems), so only the coordinator writes checkpoint
    files; outside a cluster, the default."""
    in_cluster = any(d.name == _COORDINATOR_CPU
                     for d in tf.config.list_logical_devices("CPU"))
    return tf.train.CheckpointOptions(
        experimental_io_device=_COORDINATOR_CPU if in_cluster else None)


def _reader(prefix: str) -> tf.train.CheckpointReader:
    """The reader of the checkpoint at ``prefix``. Not
    ``tf.train.load_checkpoint``: on ``ram://`` every prefix of a file name
    is a folder, so it looks for a ``checkpoint`` file under the prefix."""
    return tf.compat.v1.train.NewCheckpointReader(str(prefix))


def _tensor_keys(reader: tf.train.CheckpointReader) -> dict[str, list[int]]:
    return {k: s for k, s in reader.get_variable_to_shape_map().items()
            if not any(k.startswith(p) for p in _SKIP_KEYS)}


def compare_with_checkpoint(checkpoint: tf.train.Checkpoint, path: str,
                            model_only: bool = False) -> list[str]:
    """Keys whose live value differs from ``path``, or that only one side has.

    Writes the live state to a temporary checkpoint and compares tensor by
    tensor; this works for any sharding because sharded variables (and their
    slots) are saved as their full logical tensors.

    Args:
      model_only: compare only the model's own variables (not optimizer
        slots, optimizers or progress), for a model restored alone.
    """
    def wanted(keys: dict) -> set[str]:
        return {k for k in keys if not model_only or (
            k.startswith("model/") and ".OPTIMIZER_SLOT" not in k)}

    saved = _reader(path)
    tmp = tempfile.mkdtemp(prefix="psrec-verify-")
    try:
        live_path = checkpoint.write(str(Path(tmp) / "live"),
                                     options=io_options())
        live = _reader(live_path)
        expected = wanted(_tensor_keys(saved))
        actual = wanted(_tensor_keys(live))
        bad = sorted(actual ^ expected)
        for key in sorted(actual & expected):
            if not _same_tensor(live, saved, key):
                bad.append(key)
        return bad
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_TABLE_SUFFIXES = ("/table-keys", "/table-values")


def _same_tensor(live, saved, key: str) -> bool:
    """Equal tensors; a lookup table (a dynamic table's map) saves its
    pairs in iteration order, which a restore changes: compared sorted by
    key."""
    if not key.endswith(_TABLE_SUFFIXES):
        return np.array_equal(live.get_tensor(key), saved.get_tensor(key))
    base = key.rsplit("-", 1)[0]
    pairs = []
    for reader in (live, saved):
        keys = reader.get_tensor(base + "-keys")
        order = np.argsort(keys, kind="stable")
        pairs.append((keys[order], reader.get_tensor(base + "-values")[order]))
    return all(np.array_equal(a, b) for a, b in zip(*pairs))


def shape_mismatches(checkpoint: tf.train.Checkpoint, path: str,
                     model_only: bool = False) -> list[str]:
    """Keys present on both sides whose live shape differs from ``path``'s
    (the live state is written to a temporary checkpoint to list them)."""
    saved = _tensor_keys(_reader(path))
    tmp = tempfile.mkdtemp(prefix="psrec-shapes-")
    try:
        live = _tensor_keys(_reader(checkpoint.write(
            str(Path(tmp) / "live"), options=io_options())))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(k for k in live.keys() & saved.keys()
                  if list(live[k]) != list(saved[k]) and (
                      not model_only or k.startswith("model/")))


_SLOT_RE = re.compile(r"^(?P<var>.+)/\.OPTIMIZER_SLOT/(?P<opt>[^/]+)/"
                      r"(?P<slot>[^/]+)/\.ATTRIBUTES/VARIABLE_VALUE$")


def _restore_resharded_slots(checkpoint: tf.train.Checkpoint, path: str,
                             bad_keys: list[str], optimizers: dict,
                             tables: dict) -> list[str]:
    """Assigns slot values of resharded tables from the checkpoint.

    Args:
      bad_keys: keys that differ after the regular restore.
      optimizers: checkpoint attribute name -> optimizer.
      tables: checkpoint key prefix of a table -> its (sharded) variable.

    Returns:
      The keys that are still not restored.
    """
    reader = _reader(path)
    remaining = []
    for key in bad_keys:
        match = _SLOT_RE.match(key)
        table = tables.get(match.group("var")) if match else None
        optimizer = optimizers.get(match.group("opt")) if match else None
        if table is None or optimizer is None:
            remaining.append(key)
            continue
        full = reader.get_tensor(key)
        start = 0
        for shard in getattr(table, "variables", [table]):
            rows = shard.shape[0]
            optimizer.get_slot(shard, match.group("slot")).assign(
                full[start:start + rows])
            start += rows
    return remaining


class CheckpointKeeper:
    """Saves and restores the state of a PS training job.

    Args:
      directory: checkpoint folder.
      checkpoint: a ``tf.train.Checkpoint`` over model, optimizers, progress.
      optimizers: checkpoint attribute name -> optimizer (for slot repair).
      tables: checkpoint key prefix -> table variable (for slot repair).
      max_to_keep: checkpoints kept.
    """

    def __init__(self, directory: str | Path, checkpoint: tf.train.Checkpoint,
                 optimizers: dict | None = None, tables: dict | None = None,
                 max_to_keep: int = 3) -> None:
        self.checkpoint = checkpoint
        self.manager = tf.train.CheckpointManager(
            checkpoint, str(directory), max_to_keep=max_to_keep)
        self._optimizers = optimizers or {}
        self._tables = tables or {}
        self.directory = as_path(directory)
        remove_partial_saves(self.directory)  # of a save that was cut off

    @property
    def latest(self) -> str | None:
        return self.manager.latest_checkpoint

    def save(self, step: int) -> str:
        """Saves checkpoint ``step``; a failed save removes its partial
        ``*_temp`` files and raises :class:`SaveError`."""
        try:
            return self.manager.save(checkpoint_number=step,
                                     options=io_options())
        except (tf.errors.OpError, OSError) as error:
            removed = remove_partial_saves(self.directory)
            kind = (SaveInterruptedError
                    if isinstance(error, _NETWORK_ERRORS) else SaveError)
            raise kind(
                f"saving checkpoint {step} in {self.directory} failed "
                f"({one_line(error)[:600]}); its partial files were "
                f"removed ({', '.join(removed) or 'none'}), the previous "
                f"checkpoint ({self.latest}) is intact.") from error

    def restore(self, path: str | None = None, *,
                model_only: bool = False) -> str | None:
        """Restores ``path`` (default: the latest) and proves it complete.

        Completeness is checked by value, not with the status object's
        ``assert_existing_objects_matched()``: that assertion both misses
        sharded slots that kept their initial values and flags the
        optimizer's ShardedVariable slot containers, which own no tensor.

        Args:
          path: a checkpoint prefix; None for the latest.
          model_only: restore and check only ``model/`` keys (export, eval).

        Returns:
          The restored path, or None when there is no checkpoint.

        Raises:
          RestoreError: naming the keys that are missing or differ.
        """
        path = path or self.latest
        if path is None:
            return None
        try:
            self.checkpoint.restore(path, options=io_options()).expect_partial()
        except (tf.errors.InvalidArgumentError, ValueError) as error:
            # A tensor of another shape (e.g. another `dim` or bucket count)
            # fails inside RestoreV2; report it as an incomplete restore.
            bad = shape_mismatches(self.checkpoint, path, model_only)
            raise RestoreError(
                f"checkpoint {path} does not fit this model: {len(bad)} "
                f"key(s) have another shape in the checkpoint: {bad[:8]}. "
                "Was it written with another spec or model configuration? "
                "Nothing was trained on the partial state.") from error
        bad = compare_with_checkpoint(self.checkpoint, path, model_only)
        if bad:
            still = _restore_resharded_slots(self.checkpoint, path, bad,
                                             self._optimizers, self._tables)
            if len(still) < len(bad):
                still = compare_with_checkpoint(self.checkpoint, path,
                                                model_only)
            bad = still
        if bad:
            raise RestoreError(
                f"checkpoint {path} restored incompletely: {len(bad)} key(s) "
                f"are missing on one side or differ after restore: {bad[:8]}. "
                "Was it written with another spec or model configuration? "
                "Nothing was trained on the partial state.")
        return path
