"""Checkpoints written by the PS tasks or the coordinator
(:mod:`psrec.ps_cluster.checkpoint.writers`), and restores that are proven
complete.

``tf.train.CheckpointManager`` writes the model, both optimizers (with their
slots) and the training progress. Its ``checkpoint`` state file is replaced
atomically after the data files are complete, so a save cut off mid-write is
never the one ``latest_checkpoint`` names; the ``<prefix>_temp`` folder it
leaves is removed when a keeper starts and when a save fails.

A restore is streamed block by block of rows and verified by value
(:mod:`psrec.ps_cluster.checkpoint.verify`); mirrored variables go through
TensorFlow's restore. The status object's
``assert_existing_objects_matched()`` passes even when sharded optimizer
slots silently keep their initial values (measured: a checkpoint from 2 PS
shards restored into 3), so after restoring, every variable's live value is
compared with the checkpoint's tensor; a difference is an error naming the
variables, never a silent partial restore. Optimizer slots of resharded
tables that TensorFlow's restore leaves behind are restored by
:func:`_restore_resharded_slots`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

import tensorflow as tf

from psrec import progress as reporting
from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.errors import RetryableError
from psrec.errors import one_line
from psrec.errors import os_error_cause
from psrec.ps_cluster.checkpoint.delta import DELTAS
from psrec.ps_cluster.checkpoint.delta import DeltaState
from psrec.ps_cluster.checkpoint.delta import apply_delta
from psrec.ps_cluster.checkpoint.delta import delta_chain
from psrec.ps_cluster.checkpoint.delta import rebuild_maps
from psrec.ps_cluster.checkpoint.delta import remove_deltas
from psrec.ps_cluster.checkpoint.delta import write_delta
from psrec.ps_cluster.checkpoint.delta import write_manifest
from psrec.ps_cluster.checkpoint.save import absolute
from psrec.ps_cluster.checkpoint.save import save_options
from psrec.ps_cluster.checkpoint.save import save_progress
from psrec.ps_cluster.checkpoint.verify import copy_rows
from psrec.ps_cluster.checkpoint.verify import differing_keys
from psrec.ps_cluster.checkpoint.verify import live_tensors
from psrec.ps_cluster.checkpoint.verify import restore_streamed
from psrec.ps_cluster.checkpoint.verify import saved_tensors
from psrec.ps_cluster.checkpoint.verify import streamable
from psrec.ps_cluster.checkpoint.verify import tensor_bytes
from psrec.ps_cluster.checkpoint.writers import check_tasks_see_folder
from psrec.ps_cluster.checkpoint.writers import tasks_write
from psrec.uri import is_uri
from psrec.uri import require_tf_filesystem
from psrec.uri_path import UriPath
from psrec.uri_path import as_path


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
    file can be written to, with ``needed_bytes`` free. Creates nothing. A
    URI must be a store TensorFlow writes; a probe object is written there
    and removed (a store reports no free space to check)."""
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


def io_options() -> tf.train.CheckpointOptions:
    """The options of a restore: in a cluster, the coordinator's own CPU
    reads the files; outside a cluster, the default."""
    return save_options(tasks_write=False)


def _io_device() -> str:
    """The device that reads checkpoint files for a verification."""
    return io_options().experimental_io_device or "/device:CPU:0"


def _model_key(key: str) -> bool:
    return key.startswith("model/") and ".OPTIMIZER_SLOT" not in key


def compare_with_checkpoint(checkpoint: tf.train.Checkpoint, path: str,
                            model_only: bool = False, *,
                            progress: reporting.Progress = reporting.SILENT,
                            on_tasks: bool = False) -> list[str]:
    """Keys whose live value differs from ``path``, or that only one side has.

    Streamed per shard and block of rows (extra memory: two blocks); nothing
    is written. Sharded variables are compared against their full logical
    tensors, so any sharding compares.

    Args:
      model_only: compare only the model's own variables (not optimizer
        slots, optimizers or progress), for a model restored alone.
      on_tasks: read and compare each block on its variable's own task
        (every task sees ``path``): only booleans reach the coordinator.
    """
    return differing_keys(checkpoint, path,
                          None if on_tasks else _io_device(),
                          _model_key if model_only else None,
                          progress=progress)


def shape_mismatches(checkpoint: tf.train.Checkpoint, path: str,
                     model_only: bool = False) -> list[str]:
    """Keys present on both sides whose live shape differs from ``path``'s
    (live shapes are those of the variables; nothing is written)."""
    saved, _ = saved_tensors(path)
    live = live_tensors(checkpoint)
    return sorted(k for k in live.keys() & saved.keys()
                  if list(live[k].shape) != list(saved[k]) and (
                      not model_only or k.startswith("model/")))


_SLOT_RE = re.compile(r"^(?P<var>.+)/\.OPTIMIZER_SLOT/(?P<opt>[^/]+)/"
                      r"(?P<slot>[^/]+)/\.ATTRIBUTES/VARIABLE_VALUE$")


def _restore_resharded_slots(checkpoint: tf.train.Checkpoint, path: str,
                             bad_keys: list[str], optimizers: dict,
                             tables: dict, io_device: str | None
                             ) -> list[str]:
    """Assigns slot values of resharded tables from the checkpoint, block
    by block of rows (never a whole table on the coordinator).

    Args:
      bad_keys: keys that differ after the regular restore.
      tables: checkpoint key prefix of a table -> its (sharded) variable.
      io_device: where blocks are read (None: on each shard's task).

    Returns the keys that are not repaired (the caller checks the repaired
    ones again).
    """
    live = live_tensors(checkpoint)
    saved, _ = saved_tensors(path)
    remaining = []
    for key in bad_keys:
        match = _SLOT_RE.match(key)
        table = tables.get(match.group("var")) if match else None
        optimizer = optimizers.get(match.group("opt")) if match else None
        if (table is None or optimizer is None or key not in live
                or key not in saved
                or list(live[key].shape) != list(saved[key])):
            remaining.append(key)
            continue
        copy_rows(path, key, live[key], io_device)
    return remaining


def _does_not_fit(path: str, bad: list[str]) -> RestoreError:
    return RestoreError(
        f"checkpoint {path} does not fit this model: {len(bad)} key(s) have "
        f"another shape in the checkpoint: {bad[:8]}. Was it written with "
        "another spec or model configuration? Nothing was trained on the "
        "partial state.")


_SAVE_FUNCTION = "MultiDeviceSaver.save.<locals>.tf_function_save"


class _SaveRetraceFilter(logging.Filter):
    """Drops TensorFlow's "triggered tf.function retracing" warning about
    its own per-save function (see :func:`_no_save_retrace_warning`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("triggered tf.function retracing" in message
                    and _SAVE_FUNCTION in message)


@contextlib.contextmanager
def _no_save_retrace_warning():
    """During a save, TensorFlow's retracing warning for the save function
    is not logged. An eager save of variables on more than one task (every
    save under ParameterServerStrategy) makes a new ``tf.function`` each
    time, by design (TensorFlow's ``MultiDeviceSaver.save``: "this will
    cause a function re-trace on each save ... needed to pick up the latest
    values of options"); from the fifth save in a process, TensorFlow's
    frequent-retracing detector called each one a user mistake (~400
    characters, printed at each checkpoint). The retrace is TensorFlow's,
    needed and cheap next to the save; nothing of psrec retraces."""
    logger = tf.get_logger()
    quiet = _SaveRetraceFilter()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _save_cause(error: BaseException) -> str:
    """Why a save failed, short: the OS error (``Read-only file system
    (EROFS)``, ``No space left on device (ENOSPC)``) when the storage
    reported one -- a save through the cluster wraps it in a long,
    flattened graph stack -- else the TensorFlow error's own line, cut."""
    cause = os_error_cause(error)
    if cause is not None:
        return cause
    return f"{type(error).__name__}: {one_line(error)[:300]}"


class CheckpointKeeper:
    """Saves and restores the state of a PS training job.

    Args:
      checkpoint: a ``tf.train.Checkpoint`` over model, optimizers, progress.
      optimizers: checkpoint attribute name -> optimizer (for slot repair).
      tables: checkpoint key prefix -> table variable (for slot repair).
      writers: ``--checkpoint-writers`` (``tasks``, ``coordinator`` or
        ``auto``; :mod:`~psrec.ps_cluster.checkpoint.writers`). When the
        tasks write, each PS is first proven to see the folder.
      dynamic: checkpoint key prefix of a dynamic table -> its
        ``DynamicTable`` (for delta checkpoints).

    Delta checkpoints (:meth:`save_delta`) live in ``<directory>/deltas/``;
    :meth:`restore` of the latest restores the latest full checkpoint and
    then its chain of deltas; a full save removes the deltas of older full
    checkpoints (compacted into it).
    """

    def __init__(self, directory: str | Path, checkpoint: tf.train.Checkpoint,
                 optimizers: dict | None = None, tables: dict | None = None,
                 max_to_keep: int = 3, strategy=None,
                 writers: str = "auto", dynamic: dict | None = None) -> None:
        self.checkpoint = checkpoint
        self.writers = writers
        self.tasks_write = tasks_write(writers, strategy, directory)
        if self.tasks_write:  # before anything is trained or restored
            check_tasks_see_folder(strategy, absolute(directory), writers)
        self.manager = tf.train.CheckpointManager(
            checkpoint, absolute(directory) if self.tasks_write
            else str(directory), max_to_keep=max_to_keep)
        self._optimizers = optimizers or {}
        self._tables = tables or {}
        self._dynamic = dynamic or {}
        self.directory = as_path(directory)
        remove_partial_saves(self.directory)  # of a save that was cut off
        # The last checkpoint this keeper saved or restored (full or
        # delta): the base of the next delta. None: a delta needs a full
        # save or a restore first.
        self.last_link: str | None = None

    @property
    def deltas(self):
        """The folder of the delta checkpoints."""
        return as_path(self.manager.directory) / DELTAS

    @staticmethod
    def _full_name(path: str | None) -> str | None:
        return None if path is None else as_path(path).name

    def chain(self) -> list[tuple[str, dict]]:
        """``(folder, manifest)`` of each delta after the latest full
        checkpoint, in order (:func:`delta_chain`: refuses a broken
        chain)."""
        full = self._full_name(self.latest)
        return [] if full is None else delta_chain(self.deltas, full)

    def remove_stale_deltas(self) -> list[str]:
        """Removes the deltas cut off mid-write and those of a full
        checkpoint no longer the latest (a crash between a full save and
        its compaction); returns their names. A resume does this first; a
        reader of the folder (export, eval) never does: a training run may
        be writing a delta there."""
        return remove_deltas(self.deltas, self._full_name(self.latest))

    @property
    def latest_link(self) -> str | None:
        """The newest checkpoint a restore reaches: the last delta of the
        latest full checkpoint's chain, else that checkpoint."""
        chain = self.chain()
        return chain[-1][0] if chain else self.latest

    @property
    def latest(self) -> str | None:
        return self.manager.latest_checkpoint

    def save(self, step: int) -> str:
        """Saves checkpoint ``step`` (from each PS when the tasks write,
        else through the coordinator); a failed save removes its
        partial ``*_temp`` files and raises :class:`SaveError`. A save of
        1 GiB or more reports the bytes written to the default progress."""
        state = sum(tensor_bytes(t)
                    for t in live_tensors(self.checkpoint).values())
        prefix = f"{self.manager.directory}/ckpt-{step}"
        try:
            with save_progress(prefix, state), _no_save_retrace_warning():
                path = self.manager.save(
                    checkpoint_number=step,
                    options=save_options(self.tasks_write))
        except (tf.errors.OpError, OSError) as error:
            removed = remove_partial_saves(self.directory)
            kind = (SaveInterruptedError
                    if isinstance(error, _NETWORK_ERRORS) else SaveError)
            raise kind(
                f"saving checkpoint {step} in {self.directory} failed: "
                f"{_save_cause(error)}; its partial files were "
                f"removed ({', '.join(removed) or 'none'}), the previous "
                f"checkpoint ({self.latest}) is intact.") from error
        remove_deltas(self.deltas, self._full_name(path))  # compacted
        self.last_link = path
        return path

    def save_delta(self, step: int, tracker) -> str:
        """Saves delta checkpoint ``step``: the rows ``tracker`` flags (and
        their slots), written by their own PS when the tasks write, and
        every dense key, against :attr:`last_link`; the manifest is written
        last, then the flags of the rows written are cleared. A failed save removes its folder and raises
        :class:`SaveError` (or :class:`SaveInterruptedError`); the chain
        before it is intact."""
        if self.last_link is None or self.latest is None:
            raise ValueError("a delta needs a full checkpoint saved or "
                             "restored by this keeper first")
        folder = self.deltas / f"delta-{step}"
        text = absolute(folder) if self.tasks_write else str(folder)
        remove_deltas_folder(folder)
        changed = {name: [tracker.changed(name, k) for k in range(len(flags))]
                   for name, flags in tracker.flags.items()}
        try:
            folder.mkdir(parents=True, exist_ok=True)
            written = write_delta(
                DeltaState(self.checkpoint, self._tables, self._dynamic),
                changed, text, None if self.tasks_write else _io_device(),
                _io_device())
            write_manifest(text, step=step,
                           full=self._full_name(self.latest),
                           base=self._full_name(self.last_link),
                           written=written)
        except (tf.errors.OpError, OSError) as error:
            remove_deltas_folder(folder)
            kind = (SaveInterruptedError
                    if isinstance(error, _NETWORK_ERRORS) else SaveError)
            raise kind(
                f"saving delta checkpoint {step} in {self.deltas} failed: "
                f"{_save_cause(error)}; its partial files were removed, "
                f"the chain up to {self.last_link} is intact.") from error
        tracker.clear(changed)  # the rows written, on each PS
        self.last_link = text
        return text

    def _apply_chain(self, chain: list[tuple[str, dict]]) -> str | None:
        """Applies each delta of ``chain`` after its full checkpoint was
        restored, checking each by value; rebuilds the dynamic tables'
        maps. Returns the last delta's folder (None: no delta)."""
        if not chain:
            return None
        state = DeltaState(self.checkpoint, self._tables, self._dynamic)
        for folder, manifest in chain:
            bad = apply_delta(state, folder, manifest,
                              None if self.tasks_write else _io_device(),
                              _io_device())
            if bad:
                raise RestoreError(
                    f"delta checkpoint {folder} restored incompletely: "
                    f"{len(bad)} key(s) differ after restore: {bad[:8]}. "
                    "Nothing was trained on the partial state.")
        rebuild_maps(state)
        return chain[-1][0]

    def restore(self, path: str | None = None, *, model_only: bool = False,
                progress: reporting.Progress | None = None
                ) -> str | None:
        """Restores ``path`` (default: the latest) and proves it complete, by
        value: ``assert_existing_objects_matched()`` both misses sharded slots
        that kept their initial values and flags the optimizer's ShardedVariable
        slot containers, which own no tensor.

        Without ``path`` (and not ``model_only``), the latest full
        checkpoint's chain of deltas is applied after it, each checked by
        value (a broken chain is refused before anything is restored).

        Returns the restored path (a delta's folder when the chain has
        one), or None when there is no checkpoint. ``model_only``
        restores and checks only ``model/`` keys (export, eval);
        ``progress`` (default: the process's) is told the bytes restored
        and checked when the state is 1 GiB or more.
        """
        chain = []
        if path is None and not model_only:  # a resume: the whole chain
            self.remove_stale_deltas()
            chain = self.chain()
        path = path or self.latest
        if path is None:
            return None
        if progress is None:
            progress = reporting.default_progress()
        # Each PS reads (and checks) its own rows when it sees the files.
        device = None if self.tasks_write else _io_device()
        if self.tasks_write:
            path = absolute(path)
        if streamable(live_tensors(self.checkpoint)):
            # Block by block: no variable is ever sent whole (giant tables).
            if shape_mismatches(self.checkpoint, path):
                raise _does_not_fit(path, shape_mismatches(
                    self.checkpoint, path, model_only))
            restore_streamed(self.checkpoint, path, device,
                             progress=progress)
        else:  # mirrored variables: TensorFlow's restore reaches replicas
            try:
                self.checkpoint.restore(
                    path, options=io_options()).expect_partial()
            except (tf.errors.InvalidArgumentError, ValueError) as error:
                # A tensor of another shape (e.g. another `dim` or bucket
                # count) fails inside RestoreV2: an incomplete restore.
                raise _does_not_fit(path, shape_mismatches(
                    self.checkpoint, path, model_only)) from error
        bad = compare_with_checkpoint(self.checkpoint, path, model_only,
                                      progress=progress,
                                      on_tasks=self.tasks_write)
        if bad:
            still = _restore_resharded_slots(self.checkpoint, path, bad,
                                             self._optimizers, self._tables,
                                             device)
            repaired = set(bad) - set(still)
            if repaired:  # only they changed: check them again
                still += differing_keys(self.checkpoint, path, device,
                                        repaired.__contains__)
            bad = sorted(still)
        if bad:
            raise RestoreError(
                f"checkpoint {path} restored incompletely: {len(bad)} key(s) "
                f"are missing on one side or differ after restore: {bad[:8]}. "
                "Was it written with another spec, model configuration or "
                "table optimizer (a table's `optimizer`, --sparse-optimizer; "
                "to change one, start a new workdir with --warm-start)? "
                "Nothing was trained on the partial state.")
        path = self._apply_chain(chain) or path
        self.last_link = path
        return path


def remove_deltas_folder(folder) -> None:
    """Removes one delta folder (of a failed or repeated save)."""
    if isinstance(folder, UriPath):
        if folder.is_dir():
            folder.rmtree()
    else:
        shutil.rmtree(folder, ignore_errors=True)
