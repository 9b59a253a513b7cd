"""Who writes (and reads) the checkpoint files of a PS job, and the proof
that every PS task sees the checkpoint folder before it is trusted to.

``--checkpoint-writers``:

* ``tasks``: every PS task writes its own shards on save, and reads and
  checks its own rows on restore, wherever the folder is (a local path on
  storage every host mounts -- NFS, GCS fuse -- or a ``gs://`` bucket every
  task can write): no table travels to the coordinator.
* ``coordinator``: the coordinator writes and reads every tensor (its CPU
  is the checkpoint's io device): works with a folder only the coordinator
  sees, at the price of the whole state passing through it.
* ``auto`` (default): ``tasks`` where every task sees the folder for sure
  -- a local path and a cluster whose every address is on this host
  (:func:`~psrec.ps_cluster.checkpoint.save.tasks_share_folder`) --,
  ``coordinator`` elsewhere.

Whenever the tasks write, :func:`check_tasks_see_folder` proves it first:
each PS task reads a probe file the coordinator wrote into the folder and
writes one of its own there (from its own device), which the coordinator
reads back; then the probes are removed. A PS that cannot is a
:class:`CheckpointFolderError` (exit 2) naming the task, the folder and
the fix, before any step is trained -- not a save that fails (or a restore
that reads another file system) later.
"""

from __future__ import annotations

import contextlib
import uuid

import tensorflow as tf

from psrec.errors import ConfigError
from psrec.errors import check_choice
from psrec.errors import one_line
from psrec.ps_cluster.checkpoint import WRITERS
from psrec.ps_cluster.checkpoint.save import tasks_share_folder
from psrec.ps_cluster.cluster.strategy import cluster_resolver

PROBE_PREFIX = ".psrec-probe-"
# Errors of an unreachable task, not of its storage: raised as they are
# (retryable), never reported as a folder the task does not see.
_NETWORK_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError,
                   tf.errors.CancelledError, tf.errors.DeadlineExceededError)


class CheckpointFolderError(ConfigError):
    """A PS task cannot read or write the checkpoint folder its shards
    would be written to (exit 2, before training)."""


def tasks_write(writers: str, strategy, directory) -> bool:
    """Whether each PS task of ``strategy`` writes and reads its own shards
    of checkpoints in ``directory`` under ``--checkpoint-writers
    writers`` (never without a ``ParameterServerStrategy``: then this
    process holds every variable)."""
    check_choice("JobConfig.checkpoint_writers", writers, WRITERS)
    if writers == "auto":
        return tasks_share_folder(strategy, directory)
    return writers == "tasks" and isinstance(
        strategy, tf.distribute.ParameterServerStrategy)


def ps_devices(strategy) -> list[str]:
    """The CPU device of every PS task of ``strategy``'s cluster."""
    resolver = cluster_resolver(strategy)
    count = resolver.cluster_spec().num_tasks("ps") if resolver else 0
    return [f"/job:ps/replica:0/task:{index}/device:CPU:0"
            for index in range(count)]


def _read_on(device: str, path: str) -> bytes:
    """``path``'s bytes, read by ``device``'s task (only they come back)."""
    with tf.device(device):
        return tf.io.read_file(path).numpy()


def _probe_one(device: str, folder: str, token: bytes) -> str | None:
    """What ``device``'s task could not do with ``folder`` (None: it reads
    the coordinator's probe and writes its own, which the coordinator
    reads back). Its own probe is left for the caller to remove (one the
    coordinator does not see stays on the task's storage: TensorFlow has
    no op to delete a file on a task)."""
    coordinator_file = f"{folder}/{PROBE_PREFIX}coordinator"
    own = _own_probe(folder, device)
    try:
        if _read_on(device, coordinator_file) != token:
            return ("it read another file under the probe file's name: not "
                    "the coordinator's folder")
    except _NETWORK_ERRORS:
        raise
    except tf.errors.OpError as error:
        return ("it cannot read a file the coordinator wrote there "
                f"({_reason(error)})")
    mine = token + b"-" + device.encode()
    try:
        with tf.device(device):
            tf.io.write_file(own, mine)
        _read_on(device, own)  # waits for the write (and its error)
    except _NETWORK_ERRORS:
        raise
    except tf.errors.OpError as error:
        return f"it cannot write there ({_reason(error)})"
    try:
        with tf.io.gfile.GFile(own, "rb") as handle:
            seen = handle.read()
    except tf.errors.OpError:
        seen = None
    if seen != mine:
        return ("the coordinator does not see the file it wrote there (the "
                "task has another file system under that name)")
    return None


def check_tasks_see_folder(strategy, directory, writers: str) -> None:
    """Proves every PS task of ``strategy`` reads and writes ``directory``
    as the coordinator does; removes every probe file it wrote.

    Raises:
      CheckpointFolderError: naming the first PS task that cannot, the
        folder and the fix.
    """
    folder = str(directory).rstrip("/")
    created = not tf.io.gfile.exists(folder)
    tf.io.gfile.makedirs(folder)
    token = uuid.uuid4().hex.encode()
    probes = [f"{folder}/{PROBE_PREFIX}coordinator"]
    try:
        with tf.io.gfile.GFile(probes[0], "wb") as handle:
            handle.write(token)
        for device in ps_devices(strategy):
            probes.append(_own_probe(folder, device))
            problem = _probe_one(device, folder, token)
            if problem is not None:
                raise CheckpointFolderError(_message(
                    device, folder, problem, writers))
    finally:
        for probe in probes:
            with contextlib.suppress(tf.errors.OpError):
                tf.io.gfile.remove(probe)
        if created:
            with contextlib.suppress(tf.errors.OpError):
                if not tf.io.gfile.listdir(folder):
                    tf.io.gfile.rmtree(folder)


def _reason(error: tf.errors.OpError) -> str:
    """Why a task's file operation failed, in a few words (a remote error's
    text is mostly gRPC's)."""
    known = {tf.errors.NotFoundError: "not found",
             tf.errors.PermissionDeniedError: "permission denied",
             tf.errors.UnimplementedError: "a file system it does not have"}
    for kind, words in known.items():
        if isinstance(error, kind):
            return f"{words}: {type(error).__name__}"
    return one_line(error)[:200]


def _own_probe(folder: str, device: str) -> str:
    job = device.split("/job:")[1].split("/")[0]
    task = device.split("task:")[1].split("/")[0]
    return f"{folder}/{PROBE_PREFIX}{job}-{task}"


def _message(device: str, folder: str, problem: str, writers: str) -> str:
    task = device.split("task:")[1].split("/")[0]
    why = ("--checkpoint-writers tasks" if writers == "tasks" else
           f"--checkpoint-writers {writers} chose the PS tasks (a local "
           "path, every task on this host)")
    return (f"PS task {task} ({device.rsplit('/device', 1)[0]}) does not "
            f"see the checkpoint folder {folder}: {problem}. With {why}, "
            "every PS writes and reads its own shards there: give a "
            "--workdir on storage every task shares (NFS, GCS fuse, a gs:// "
            "bucket every task can write), or use --checkpoint-writers "
            "coordinator (the coordinator writes every tensor).")
