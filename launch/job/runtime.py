"""The coordinator's side of supervision: its heartbeat, the pre-connect
probe, and a graceful SIGTERM/SIGINT.

* :func:`coordinator_heartbeat`: the ``heartbeat.json`` writer of a run
  (see :mod:`psrec.launch.monitor.heartbeat`); phases ``connecting`` ->
  ``restoring`` -> ``training``/``eval``/``checkpoint`` -> ``done``.
* :class:`StopRequest`: SIGTERM/SIGINT handlers for the graceful stop
  that ``--grace-period``'s help describes.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Callable

from psrec.errors import EXIT_INTERRUPTED
from psrec.errors import EXIT_TERMINATED
from psrec.errors import PsrecError
from psrec.launch.monitor.heartbeat import HeartbeatWriter
from psrec.launch.monitor.heartbeat import TrainerFields
from psrec.launch.monitor.heartbeat import heartbeat_path
from psrec.launch.monitor.heartbeat import reporter_fields


class TrainingInterrupted(PsrecError):
    """SIGTERM/SIGINT ended the run (after the checkpoint, if one fit).
    Retryable: 143 (SIGTERM) or 130 (SIGINT)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def coordinator_heartbeat(workdir: str | Path) -> HeartbeatWriter:
    """The run's heartbeat writer, already in phase ``connecting``."""
    writer = HeartbeatWriter(heartbeat_path(workdir))
    writer.publish("connecting")
    return writer


def attach_trainer(writer: HeartbeatWriter, trainer) -> None:
    """Adds per-worker progress, the latest checkpoint and the metrics'
    fields (:mod:`psrec.launch.monitor.heartbeat`) to each write; the phase
    becomes ``restoring``."""
    fields = TrainerFields(trainer)

    def details() -> dict:
        executor = trainer.executor
        data: dict = {"checkpoint": (trainer.keeper.latest
                                     if trainer.keeper else None),
                      **fields()}
        if executor is not None:
            now = time.monotonic()
            data["workers"] = {
                str(w): {"closures": n, "last_result_s": (
                    now - executor.last_result_at[w]
                    if w in executor.last_result_at else None)}
                for w, n in sorted(executor.closures_per_pipeline.items())}
            data["step"] = int(trainer.progress.step.numpy())
        return data
    writer.details = details
    writer.publish("restoring")


def attach_reporter(writer: HeartbeatWriter | None, reporter) -> None:
    """Adds the reporter's last loss and eval to each heartbeat."""
    if writer is None or reporter is None or writer.details is None:
        return
    trainer_details = writer.details
    writer.details = lambda: {**trainer_details(), **reporter_fields(reporter)}


def beat_all(writer: HeartbeatWriter | None, watchdog) -> Callable[[str], None]:
    """The trainer's heartbeat callback: the file and the in-process
    watchdog (which still dumps Python stacks when the GIL is free)."""
    def beat(phase: str) -> None:
        if watchdog is not None:
            watchdog.beat()
        if writer is not None:
            writer.publish(phase)
    return beat


_NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT"}


class StopRequest:
    """SIGTERM/SIGINT -> a stop the training loop polls (context manager;
    the previous handlers come back on exit). Outside the main thread it
    installs nothing and never requests a stop."""

    def __init__(self, grace_period: float) -> None:
        self.grace_period = grace_period
        self.signum: int | None = None
        self.at: float | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            for signum in _NAMES:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        if self.signum is None:
            self.signum, self.at = signum, time.monotonic()

    def requested(self) -> bool:
        return self.signum is not None

    def save_fits(self, last_save_seconds: float | None) -> bool:
        """A save is expected to end within the grace period: the last one
        took less than what is left of it (unknown: assume it fits)."""
        if self.at is None:
            return True
        left = self.grace_period - (time.monotonic() - self.at)
        return left > 0 and (last_save_seconds is None
                             or 1.5 * last_save_seconds < left)

    def error(self, step: int, checkpoint: str | None,
              saved: bool) -> TrainingInterrupted:
        name = _NAMES.get(self.signum, str(self.signum))
        code, verb = ((EXIT_TERMINATED, "terminated")
                      if self.signum == signal.SIGTERM
                      else (EXIT_INTERRUPTED, "interrupted"))
        if saved:
            what = f"checkpoint {checkpoint} at step {step}"
        else:
            what = (f"no checkpoint at step {step} (a save would not finish "
                    f"within --grace-period {self.grace_period:g} s); latest "
                    f"{checkpoint}")
        return TrainingInterrupted(f"{verb} ({name}): {what}", code)


def finish(writer: HeartbeatWriter | None, stop: StopRequest, trainer,
           interrupted_at: int | None) -> None:
    """Publishes the end of the run; raises :class:`TrainingInterrupted`
    when a signal ended it."""
    if interrupted_at is None:
        if writer is not None:
            writer.publish("done")
        return
    latest = trainer.keeper.latest if trainer.keeper else None
    if writer is not None:
        writer.publish("terminated", checkpoint=latest)
    raise stop.error(interrupted_at, latest, bool(
        latest and latest.endswith(f"-{interrupted_at}")))
