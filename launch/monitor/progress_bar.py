"""The CLI's progress display: :class:`psrec.progress.Progress` drawn with
``tf_keras.utils.Progbar`` on stderr.

Progbar writes to ``sys.stdout``; every call into it runs under
``contextlib.redirect_stdout(stream)`` so ``--json`` output on stdout stays
one JSON object. On a terminal the bar is redrawn in place; when stderr is
not a terminal (a log file, a pipe) a line is printed at most every
``NON_TTY_INTERVAL`` seconds, plus the final line. Each pass first prints
its label with the unit (``convert (rows)``); byte counts are shown in MiB.
The training-step bar is a different one (``launch.monitor.progress``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from typing import TextIO

from psrec.progress import SILENT
from psrec.progress import Progress
from psrec.progress import Task

NON_TTY_INTERVAL = 10.0  # seconds between lines when not on a terminal
TTY_INTERVAL = 0.1  # seconds between redraws on a terminal
_MIB = 1 << 20


class ProgressBar(Progress):
    """Progress bars on ``stream`` (default: ``sys.stderr`` at the time a
    pass starts)."""

    def __init__(self, stream: TextIO | None = None,
                 interval: float | None = None) -> None:
        self.stream = stream
        self.interval = interval

    def task(self, label: str, total: int | None, unit: str = "rows"
             ) -> Task:
        stream = self.stream or sys.stderr
        tty = bool(getattr(stream, "isatty", lambda: False)())
        if total == 0:
            return Task()  # nothing to wait for (Progbar cannot draw 0/0)
        interval = self.interval
        if interval is None:
            interval = TTY_INTERVAL if tty else NON_TTY_INTERVAL
        return _BarTask(stream, tty, interval, label, total, unit)


class _BarTask(Task):
    def __init__(self, stream: TextIO, tty: bool, interval: float,
                 label: str, total: int | None, unit: str) -> None:
        self.stream, self.done, self.closed = stream, 0, False
        self.total = total
        self.scale = _MIB if unit == "bytes" else 1
        shown = "MiB" if unit == "bytes" else unit
        target = None if total is None else math.ceil(total / self.scale)
        self.target = target
        # Importing tf_keras (TensorFlow) takes seconds in a command that
        # has not needed it yet (ingest, spec infer): on a terminal the
        # label comes first. Without one, Progbar's first line starts with
        # a newline, which ends the label's line (after TensorFlow's logs).
        if tty:
            print(f"{label} ({shown})", file=stream, flush=True)
        from tf_keras.utils import Progbar
        if not tty:
            print(f"{label} ({shown})", end="", file=stream, flush=True)
        with contextlib.redirect_stdout(stream):
            self.bar = Progbar(target, interval=interval,
                               unit_name=shown.rstrip("s") or shown)
            # Progbar decides redraw-or-newline from sys.stdout and the
            # loaded modules (always "redraw" on POSIX); we know the stream.
            self.bar._dynamic_display = tty
            self.bar.update(0)

    def _shown(self) -> int:
        if self.total is not None and self.done >= self.total:
            return self.target or 0
        current = self.done // self.scale
        return current if self.target is None else min(current, self.target)

    def advance(self, n: int = 1) -> None:
        if self.closed or n == 0:
            return
        self.done += n
        with contextlib.redirect_stdout(self.stream):
            self.bar.update(self._shown(), finalize=False)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.redirect_stdout(self.stream):
            self.bar.update(self._shown(), finalize=True)
        self.stream.flush()


def add_progress_flag(parser: argparse.ArgumentParser) -> None:
    """``--no-progress``: no progress bars on stderr."""
    parser.add_argument("--no-progress", action="store_true",
                        help="draw no progress bars (they go to stderr; "
                        "without a terminal, a line every "
                        f"{NON_TTY_INTERVAL:.0f} s)")


def progress_for(args: argparse.Namespace) -> Progress:
    """The command's progress display: bars on stderr unless
    ``--no-progress``."""
    return SILENT if getattr(args, "no_progress", False) else ProgressBar()
