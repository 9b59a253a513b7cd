"""Stall watchdog: exits the coordinator (retryable) when training stops
making progress, after dumping what it was doing.

The training loop calls :meth:`Watchdog.beat` whenever a closure result,
an evaluation or a checkpoint completes. If no beat arrives for
``timeout`` seconds, the watchdog writes every Python thread's stack and a
description of the pending work (closures in flight, which workers still
accept connections) and exits the process with ``EXIT_RETRYABLE``, so a
Kubernetes liveness probe or psrec's supervisor restarts a hung job.

It is a thread of the process it watches, so it cannot fire while that
process is frozen (SIGSTOP) or while its main thread blocks in a
TensorFlow call that holds the GIL: the supervisor also watches the
heartbeat file (``psrec.launch.monitor.heartbeat``), a few seconds later.
This one gives the Python stacks of the stalled process, and covers a
coordinator run without the supervisor (``psrec train --cluster``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import Callable

from psrec.errors import EXIT_RETRYABLE
from psrec.errors import check


class Watchdog:
    """Background thread that ends a stalled process.

    Args:
      describe: returns a text about pending work, printed when it fires.
      exit: called with the exit code (default ``os._exit``: a stalled
        process may hold threads that would never join).
    """

    def __init__(self, timeout: float, describe: Callable[[], str],
                 exit: Callable[[int], None] = os._exit) -> None:
        check(timeout > 0, "stall_timeout", timeout, "must be > 0")
        self.timeout = timeout
        self._describe = describe
        self._exit = exit
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="psrec-watchdog",
                                        daemon=True)
        self.fired = False

    def start(self) -> "Watchdog":
        self.beat()
        self._thread.start()
        return self

    def beat(self) -> None:
        self._last = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout / 4)):
            idle = time.monotonic() - self._last
            if idle >= self.timeout:
                self.fire(idle)
                return

    def fire(self, idle: float) -> None:
        self.fired = True
        err = sys.stderr
        err.write(f"\npsrec watchdog: no training progress for {idle:.0f} s "
                  f"(--stall-timeout {self.timeout:g}); pending work:\n")
        try:
            err.write(self._describe() + "\n")
        except Exception as error:  # noqa: BLE001 -- best effort while dying
            err.write(f"(could not describe pending work: {error!r})\n")
        err.write("Python stacks of the coordinator:\n")
        err.flush()
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            err.write(f"--- thread {names.get(ident, ident)}\n")
            err.write("".join(traceback.format_stack(frame)))
        err.write(f"psrec watchdog: exiting with retryable code "
                  f"{EXIT_RETRYABLE}\n")
        err.flush()
        self._exit(EXIT_RETRYABLE)
