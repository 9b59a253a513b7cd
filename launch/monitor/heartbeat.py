"""The coordinator's heartbeat: what it is doing, published to a file that
a separate process watches.

The coordinator writes ``heartbeat.json`` in the run folder (temp file +
rename, so a reader never sees half a file) at each phase change and after
each finished closure (at most every :data:`MIN_INTERVAL` seconds within a
phase)::

    {"seq": 17, "phase": "training", "step": 85, "time": 1767.2,
     "pid": 4242, "workers": {"0": {"closures": 9, "last_result_s": 0.4}},
     "checkpoint": "/run/checkpoints/ckpt-50"}

``seq`` grows by one per write. Phases: :data:`PHASES` (``connecting``:
probing the cluster, building the strategy, creating variables).

A watcher (the supervisor, and ``/healthz`` with ``/metrics``'
``psrec_heartbeat_age_seconds``) reads it with :func:`read_heartbeat` and
judges staleness with :class:`HeartbeatMonitor`, the one judge: the clock
is the watcher's own monotonic one, started when it last saw ``seq`` (or
the writer's pid) change -- never the file's wall-clock ``time``, which a
clock step would move -- so it works even when the coordinator is frozen
(SIGSTOP) or blocked in a call that holds the GIL -- the failure an
in-process watchdog thread cannot see.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any
from typing import Callable

from psrec.data.format.files import atomic_output
from psrec.uri import is_uri
from psrec.uri import local
from psrec.uri import scheme
from psrec.uri import split_root

HEARTBEAT_FILE = "heartbeat.json"
MIN_INTERVAL = 0.5  # seconds between writes within one phase
PHASES = ("connecting", "restoring", "training", "eval", "checkpoint", "done",
          "terminating", "terminated", "waiting")

#: The roles of a local job, as the supervisor restarts them (each on its own
#: budget) and ``/metrics`` counts their restarts.
ROLES = ("worker", "ps", "coordinator", "data_service")


def heartbeat_path(workdir: str | Path) -> Path:
    return Path(workdir) / HEARTBEAT_FILE


class HeartbeatWriter:
    """Publishes the coordinator's phase and step to the heartbeat file
    ``path``; ``details`` returns extra fields (per-worker progress) for
    each write."""

    def __init__(self, path: str | Path,
                 details: Callable[[], dict[str, Any]] | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.details = details
        self.seq = 0
        self.phase: str | None = None
        self.step: int | None = None
        self.extra: dict[str, Any] = {}
        self._written = 0.0

    def publish(self, phase: str, step: int | None = None,
                **extra: Any) -> None:
        """Records ``phase`` (and ``step``); writes at once on a phase change
        or new extra fields, else at most every :data:`MIN_INTERVAL` s."""
        if phase not in PHASES:
            raise ValueError(f"unknown heartbeat phase {phase!r}")
        changed = phase != self.phase or bool(extra)
        self.phase = phase
        if step is not None:
            self.step = step
        self.extra.update(extra)
        now = time.monotonic()
        if changed or now - self._written >= MIN_INTERVAL:
            self._write(now)

    def beat(self, phase: str = "training") -> None:
        """The trainer's callback: ``phase`` at the current step."""
        self.publish(phase)

    def _write(self, now: float) -> None:
        self.seq += 1
        data: dict[str, Any] = {"seq": self.seq, "phase": self.phase,
                                "step": self.step, "time": time.time(),
                                "pid": os.getpid(), **self.extra}
        if self.details is not None:
            try:
                data.update(self.details())
            except Exception as error:  # noqa: BLE001 -- never stop training
                data["details_error"] = repr(error)
        try:
            with atomic_output(self.path) as temp:
                temp.write_text(json.dumps(data))
        except OSError:
            return  # a full disk must not stop training; staleness shows it
        self._written = now


def read_heartbeat(path: str | Path) -> dict[str, Any] | None:
    """The last published heartbeat, or None (none yet, or unreadable)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class HeartbeatMonitor:
    """Decides when the heartbeat file ``path`` is stale, on the watcher's
    own clock (see the module): the one staleness judge of psrec. ``timeout``:
    seconds without a new ``seq`` before :meth:`stale` is true."""

    def __init__(self, path: str | Path, timeout: float) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.last: dict[str, Any] | None = None
        self._key: object = None
        self._changed = time.monotonic()

    def reset(self) -> None:
        """Starts the clock again (a new coordinator was started)."""
        self.last = None
        self._changed = time.monotonic()

    def poll(self) -> float:
        """Reads the file; returns the seconds since it last changed."""
        return self.observe(read_heartbeat(self.path))

    def observe(self, data: dict[str, Any] | None) -> float:
        """Takes ``data`` as the heartbeat read now (None: none); returns
        the seconds since a new one (another ``seq`` or ``pid``) was last
        seen, on this watcher's monotonic clock."""
        now = time.monotonic()
        key = None if data is None else (data.get("pid"), data.get("seq"))
        if data is not None and key != self._key:
            self._key = key
            self.last = data
            self._changed = now
        return now - self._changed

    def stale(self) -> bool:
        return self.poll() >= self.timeout

    def describe(self) -> str:
        """What the coordinator was last seen doing, on one line."""
        data = self.last
        if data is None:
            return "no heartbeat published yet (phase connecting)"
        idle = time.monotonic() - self._changed
        text = (f"phase {data.get('phase')}, last step {data.get('step')}, "
                f"last heartbeat {idle:.0f} s ago (seq {data.get('seq')})")
        workers = data.get("workers")
        if workers:
            text += "; " + "; ".join(
                f"worker {w}: {v.get('closures', 0)} closures, last result "
                + (f"{v['last_result_s']:.0f} s before the heartbeat"
                   if v.get("last_result_s") is not None else "none yet")
                for w, v in sorted(workers.items()))
        return text


# What the coordinator's heartbeat adds (at most every 0.5 s) for whichever
# process serves ``/metrics`` (:mod:`psrec.launch.monitor.metrics_http`)::
#
#     {"examples": 204800, "loss": 0.4712,
#      "eval": {"auc": 0.7412, "logloss": 0.4650, "step": 200,
#               "tasks": {"like": {"auc": 0.71, ...}, ...}},  # multi-task
#      "checkpoint_time": 1767225600.1, "checkpoint_seconds": 0.8}

class TrainerFields:
    """The trainer's part: examples (restored with the checkpoint, so the
    count survives a coordinator restart), the latest checkpoint's write
    time (its index file's modification time, looked up once per
    checkpoint: it may be on object storage) and the last save's duration.
    """

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self._checkpoint: str | None = None
        self._written: float | None = None

    def __call__(self) -> dict[str, Any]:
        trainer = self.trainer
        data: dict[str, Any] = {
            "examples": int(trainer.progress.examples.numpy())}
        latest = trainer.keeper.latest if trainer.keeper else None
        if latest is not None and latest != self._checkpoint:
            self._checkpoint, self._written = latest, _written_at(latest)
        if self._written is not None:
            data["checkpoint_time"] = self._written
        seconds = trainer.last_save_seconds
        if seconds is not None:
            data["checkpoint_seconds"] = float(seconds)
        return data


def _written_at(checkpoint: str) -> float | None:
    import tensorflow as tf
    try:
        return tf.io.gfile.stat(checkpoint + ".index").mtime_nsec / 1e9
    except tf.errors.OpError:
        return None


def reporter_fields(reporter) -> dict[str, Any]:
    """The progress reporter's part: the last training loss and eval."""
    data: dict[str, Any] = {}
    if reporter.loss == reporter.loss:  # not NaN: a loss was reported
        data["loss"] = float(reporter.loss)
    result, step = reporter.last_eval, reporter.last_eval_step
    if result is not None:
        data["eval"] = {"step": step}
        for name in ("auc", "logloss", "gauc"):  # retrieval: none of them
            try:  # gauc: None without --group-by
                value = float(getattr(result, name))
            except (AttributeError, TypeError, ValueError):
                continue
            if math.isfinite(value):
                data["eval"][name] = value
        tasks = {task["name"]: {
            key: float(value) for key, value in task.items()
            if key in ("auc", "logloss", "calibration", "rmse")
            and math.isfinite(value)}
            for task in getattr(result, "tasks", None) or ()}
        if tasks:  # a multi-task spec: every task's metrics
            data["eval"]["tasks"] = tasks
    return data


STATE_ENV = "PSREC_RUN_STATE_DIR"


def run_state_dir(workdir: object) -> Path:
    """The local run-state folder of a job: where the files that only this
    machine's processes share go (the coordinator's heartbeat, the
    supervisor's ``cluster.json``, the local cluster's role logs). With a
    local ``workdir`` it is the workdir itself. With a remote one
    (``gs://``, ``ram://``...) it is under ``$PSREC_RUN_STATE_DIR`` when
    set, else ``<tmp>/psrec-run-state/<scheme>/<bucket and path>``: the
    same folder for every process of the job on this machine (a restarted
    coordinator finds its supervisor's heartbeat), and never a remote write
    every second."""
    if not is_uri(workdir):
        return Path(local(workdir))
    base = os.environ.get(STATE_ENV) or os.path.join(
        tempfile.gettempdir(), "psrec-run-state")
    rest = split_root(str(workdir))[1]
    parts = [re.sub(r"[^A-Za-z0-9._-]", "_", p)
             for p in rest.split("/") if p not in ("", ".", "..")]
    return Path(base, scheme(workdir), *parts)
