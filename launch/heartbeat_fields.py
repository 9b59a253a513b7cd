"""What the coordinator's heartbeat adds for the metrics server
(:mod:`psrec.launch.metrics_http`): examples trained, the last loss and
eval, when the latest checkpoint was written and how long the last save
took.

Written with each heartbeat (at most every 0.5 s), read by whichever
process serves ``/metrics``::

    {"examples": 204800, "loss": 0.4712,
     "eval": {"auc": 0.7412, "logloss": 0.4650, "step": 200},
     "checkpoint_time": 1767225600.1, "checkpoint_seconds": 0.8}
"""

from __future__ import annotations

import math
from typing import Any


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
        seconds = getattr(trainer, "last_save_seconds", None)
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
        for name in ("auc", "logloss"):  # a retrieval eval has neither
            try:
                value = float(getattr(result, name))
            except (AttributeError, TypeError, ValueError):
                continue
            if math.isfinite(value):
                data["eval"][name] = value
    return data
