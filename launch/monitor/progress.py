"""Progress display and TensorBoard scalars written by the coordinator."""

from __future__ import annotations

import collections
import sys
import time
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Mapping
from typing import TextIO

import tensorflow as tf

from psrec.ps_cluster.checkpoint.best import BestRecord
from psrec.ps_cluster.evaluation.metrics import EvalResult
from psrec.uri_path import shown_path


class ProgressReporter:
    """A one-line progress bar (step, loss, examples/s, ETA) on a terminal,
    or one line per ``log_every`` steps when the output is a file, plus
    TensorBoard scalars (loss, examples/s and per-worker examples/s over the
    last ``rate_window`` seconds, learning rates, AUC and logloss at every
    eval) and the run's hyper-parameters (the hparams plugin).

    Args:
      total_steps: the step the run ends at.
      start_step: the step the run starts (resumes) at.
      log_dir: TensorBoard folder, or None for none.
      learning_rates: ``{name: schedule}`` to log at each update.
      stream: where to write (default stderr).
      extra: returns text appended to each line (e.g. per-worker counts).
      per_worker: returns the examples trained per worker so far (PS).
      hparams: the run's hyper-parameters (bool, int, float or str values).
      clock: seconds (monotonic); tests pass their own.
    """

    def __init__(self, total_steps: int, start_step: int = 0,
                 log_dir: str | Path | None = None,
                 learning_rates: dict | None = None, log_every: int = 100,
                 stream: TextIO | None = None,
                 extra: Callable[[], str] | None = None,
                 per_worker: Callable[[], Mapping[int, int]] | None = None,
                 hparams: Mapping[str, Any] | None = None,
                 rate_window: float = 5.0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.total = total_steps
        self.start_step = start_step
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.log_every = log_every
        self.learning_rates = learning_rates or {}
        self.writer = (tf.summary.create_file_writer(str(log_dir))
                       if log_dir is not None else None)
        self._clock = clock
        self._began = clock()
        self._examples = 0
        self._rate_window = rate_window
        self._rate = RateWindow(rate_window, self._began)
        self._speed = 0.0
        self._per_worker = per_worker
        self._worker_rates: dict[int, RateWindow] = {}
        self.last_eval: EvalResult | None = None
        self.last_eval_step: int | None = None
        self._last_draw = 0.0
        self._line_open = False  # a terminal bar not yet ended by a newline
        self._last_logged_step = start_step
        self.loss = float("nan")
        self._extra = extra
        if self.writer is not None and hparams:
            from tensorboard.plugins.hparams import api as hp
            with self.writer.as_default():
                hp.hparams(dict(hparams))

    def examples_per_sec(self) -> float:
        """Examples/s over the last ``rate_window`` seconds (at the last
        update)."""
        return self._speed

    def update(self, step: int, loss: float, examples: int) -> None:
        self._examples += examples
        self.loss = loss
        now = self._clock()
        speed = self._speed = self._rate.add(now, self._examples)
        if self.writer is not None:
            with self.writer.as_default(step=step):
                tf.summary.scalar("train/loss", loss)
                tf.summary.scalar("train/examples_per_sec", speed)
                for worker, rate in self._worker_speeds(now).items():
                    tf.summary.scalar(
                        f"train/worker_examples_per_sec/worker_{worker}",
                        rate)
                for name, schedule in self.learning_rates.items():
                    tf.summary.scalar(f"train/learning_rate/{name}",
                                      schedule(step))
        if self.tty and (now - self._last_draw > 0.2 or step >= self.total):
            self._last_draw = now
            self.stream.write("\r" + self._line(step, loss, speed))
            self.stream.flush()
            self._line_open = True
        elif not self.tty and (step - self._last_logged_step >= self.log_every
                               or step >= self.total):
            self._last_logged_step = step
            self.stream.write(self._line(step, loss, speed) + "\n")
            self.stream.flush()

    def _worker_speeds(self, now: float) -> dict[int, float]:
        """Each worker's examples/s over the rate window."""
        if self._per_worker is None:
            return {}
        speeds = {}
        for worker, total in sorted(self._per_worker().items()):
            window = self._worker_rates.setdefault(
                worker, RateWindow(self._rate_window, self._began))
            speeds[worker] = window.add(now, total)
        return speeds

    def _line(self, step: int, loss: float, speed: float) -> str:
        done = (step - self.start_step) / max(1, self.total - self.start_step)
        width = 24
        filled = int(width * min(1.0, done))
        bar = ("=" * filled + ">")[:width].ljust(width)
        elapsed = self._clock() - self._began
        eta = elapsed / done - elapsed if done > 0 else float("nan")
        extra = f" {self._extra()}" if self._extra else ""
        return (f"step {step}/{self.total} [{bar}] loss {loss:.4f} "
                f"{speed:,.0f} ex/s ETA {eta:4.0f}s{extra}")

    def boundary(self, step: int, result: EvalResult | None,
                 checkpoint: str | None = None) -> None:
        self._end_line()
        if result is not None:
            self.last_eval, self.last_eval_step = result, step
            self.stream.write(f"step {step}: {result.summary()}\n")
            if self.writer is not None:
                scalars = (result.scalars() if hasattr(result, "scalars")
                           else {"auc": result.auc,
                                 "logloss": result.logloss})  # ranking
                with self.writer.as_default(step=step):
                    for name, value in scalars.items():
                        tf.summary.scalar(f"eval/{name}", value)
        if checkpoint is not None:
            self.stream.write(
                f"step {step}: checkpoint {shown_path(checkpoint)}\n")
        self.stream.flush()

    def best(self, record: BestRecord) -> None:
        """A new best checkpoint was recorded (``--keep-best``)."""
        self.stream.write(f"step {record.step}: new best {record.metric} "
                          f"{record.value:.4f}, kept as {record.checkpoint}\n")
        self.stream.flush()

    def _end_line(self) -> None:
        """Ends the terminal bar's line, so what is written next (an eval,
        the interrupted line, an error) starts a line of its own."""
        if self._line_open:
            self.stream.write("\n")
            self.stream.flush()
            self._line_open = False

    def close(self) -> None:
        self._end_line()
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()


# Instantaneous rates of growing counts (examples trained), for the
# progress line and TensorBoard: the rate over the last few seconds, not the
# average since the start (which hides a slowdown for as long as the run has
# lasted).

class RateWindow:
    """The rate of a growing total over (at least) the last ``seconds``,
    the first rate measured from ``began`` (when the count was 0)."""

    def __init__(self, seconds: float, began: float) -> None:
        self.seconds = seconds
        self._points: collections.deque = collections.deque([(began, 0)])

    def add(self, now: float, total: float) -> float:
        """Records ``total`` at ``now``; returns the rate per second from
        the last point at or before ``now - seconds`` (the first point while
        the run is younger than the window) to now."""
        points = self._points
        points.append((now, total))
        while len(points) > 2 and points[1][0] <= now - self.seconds:
            points.popleft()
        then, before = points[0]
        return (total - before) / (now - then) if now > then else 0.0
