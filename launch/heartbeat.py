"""The coordinator's heartbeat: what it is doing, published to a file that
a separate process watches.

The coordinator writes ``heartbeat.json`` in the run folder (temp file +
rename, so a reader never sees half a file) at each phase change and after
each finished closure (at most every :data:`MIN_INTERVAL` seconds within a
phase)::

    {"seq": 17, "phase": "training", "step": 85, "time": 1767.2,
     "pid": 4242, "workers": {"0": {"closures": 9, "last_result_s": 0.4}},
     "checkpoint": "/run/checkpoints/ckpt-50"}

``seq`` grows by one per write. Phases: ``connecting`` (probing the
cluster, building the strategy, creating variables), ``restoring``,
``training``, ``eval``, ``checkpoint``, ``done``, ``terminating``,
``terminated``.

A watcher (the supervisor, or a later ``/healthz`` endpoint) reads it with
:func:`read_heartbeat` and decides staleness with :class:`HeartbeatMonitor`:
the clock is the watcher's own, started when it last saw ``seq`` change, so
it works even when the coordinator is frozen (SIGSTOP) or blocked in a call
that holds the GIL -- the failure an in-process watchdog thread cannot see.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any
from typing import Callable

from psrec.data.files import atomic_output

HEARTBEAT_FILE = "heartbeat.json"
MIN_INTERVAL = 0.5  # seconds between writes within one phase
PHASES = ("connecting", "restoring", "training", "eval", "checkpoint", "done",
          "terminating", "terminated")


def heartbeat_path(workdir: str | Path) -> Path:
    return Path(workdir) / HEARTBEAT_FILE


class HeartbeatWriter:
    """Publishes the coordinator's phase and step.

    Args:
      path: the heartbeat file.
      details: returns extra fields (per-worker progress) for each write.
    """

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
    """Decides when a heartbeat is stale, on the watcher's own clock.

    Args:
      path: the heartbeat file.
      timeout: seconds without a new ``seq`` before :meth:`stale` is true.
    """

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
        data = read_heartbeat(self.path)
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
