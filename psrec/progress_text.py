"""A plain-text display of :mod:`psrec.progress`: one bar per pass on a
text stream, with no TensorFlow and no dependency.

Each pass first prints its label with the unit (``convert (rows)``; byte
counts are shown in MiB), then a bar in Keras's style: ``350/700
[==============>...............] - ETA: 3s``, ending with the time the
pass took. On a terminal the bar is redrawn in place at most every
``TTY_INTERVAL`` seconds; on anything else (a log file, a pipe) a line is
printed at most every ``NON_TTY_INTERVAL`` seconds, plus the final line.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TextIO

from psrec.progress import Progress
from psrec.progress import Task

NON_TTY_INTERVAL = 10.0  # seconds between lines when not on a terminal
TTY_INTERVAL = 0.1  # seconds between redraws on a terminal
BAR_WIDTH = 30
_MIB = 1 << 20


class TextProgress(Progress):
    """Bars on ``stream`` (default: ``sys.stderr`` at the time a pass
    starts), drawn at most every ``interval`` seconds (default: by whether
    the stream is a terminal)."""

    def __init__(self, stream: TextIO | None = None,
                 interval: float | None = None) -> None:
        self.stream = stream
        self.interval = interval

    def task(self, label: str, total: int | None, unit: str = "rows"
             ) -> Task:
        stream = self.stream or sys.stderr
        tty = bool(getattr(stream, "isatty", lambda: False)())
        if total == 0:
            return Task()  # nothing to wait for
        interval = self.interval
        if interval is None:
            interval = TTY_INTERVAL if tty else NON_TTY_INTERVAL
        return _TextTask(stream, tty, interval, label, total, unit)


def bar_line(current: int, target: int | None, seconds: float,
             final: bool) -> str:
    """One drawing of a bar: ``current`` of ``target`` (None: unknown),
    ``seconds`` since the pass started."""
    if target is None:
        text = f"{current:7d}/Unknown"
    else:
        digits = len(str(target))
        filled = int(BAR_WIDTH * min(current, target) / target)
        bar = "=" * max(filled - 1, 0)
        if filled:
            bar += ">" if current < target else "="
        text = (f"{current:{digits}d}/{target} "
                f"[{bar}{'.' * (BAR_WIDTH - filled)}]")
    if final:
        return f"{text} - {_duration(seconds)}"
    if target is not None and 0 < current < target:
        left = seconds * (target - current) / current
        return f"{text} - ETA: {_duration(left)}"
    return text


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    if seconds >= 60:
        return f"{seconds // 60}:{seconds % 60:02d}"
    return f"{seconds}s"


class _TextTask(Task):
    def __init__(self, stream: TextIO, tty: bool, interval: float,
                 label: str, total: int | None, unit: str) -> None:
        self.stream, self.tty, self.interval = stream, tty, interval
        self.done, self.closed, self.total = 0, False, total
        self.scale = _MIB if unit == "bytes" else 1
        shown = "MiB" if unit == "bytes" else unit
        self.target = None if total is None else math.ceil(total / self.scale)
        self.start = time.monotonic()
        self.last_draw = -math.inf
        self.width = 0  # of the last drawing on a terminal
        print(f"{label} ({shown})", file=stream, flush=True)
        self._draw(final=False)

    def _shown(self) -> int:
        if self.total is not None and self.done >= self.total:
            return self.target or 0
        current = self.done // self.scale
        return current if self.target is None else min(current, self.target)

    def _draw(self, final: bool) -> None:
        now = time.monotonic()
        if not final and now - self.last_draw < self.interval:
            return
        self.last_draw = now
        line = bar_line(self._shown(), self.target, now - self.start, final)
        if self.tty:
            pad = " " * max(self.width - len(line), 0)
            self.width = len(line)
            self.stream.write(f"\r{line}{pad}" + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def advance(self, n: int = 1) -> None:
        if self.closed or n == 0:
            return
        self.done += n
        self._draw(final=False)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._draw(final=True)
