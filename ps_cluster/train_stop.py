"""What the trainer does around its loop that is not training: timed
checkpoint saves, the checkpoint of an interrupted run (SIGTERM), and the
description of pending work the stall watchdog prints."""

from __future__ import annotations

import time
from typing import Callable


def timed_save(trainer, beat: Callable[[str], None]) -> str | None:
    """``trainer.save()`` in the ``checkpoint`` heartbeat phase; records its
    duration in ``trainer.last_save_seconds`` (the next interrupted run's
    estimate of whether a save fits its grace period)."""
    beat("checkpoint")
    began = time.perf_counter()
    saved = trainer.save()
    trainer.last_save_seconds = time.perf_counter() - began
    beat("training")
    return saved


def save_at_stop(trainer, allowed: Callable[[float | None], bool] | None,
                 beat: Callable[[str], None]) -> bool:
    """The checkpoint of an interrupted run, at the step reached. True when
    one exists at that step afterwards (saved now, or already there);
    False when there are no checkpoints or ``allowed(last save seconds)``
    refuses (no time left for a save)."""
    if trainer.keeper is None:
        return False
    step = int(trainer.progress.step.numpy())
    latest = trainer.keeper.latest
    if latest is not None and latest.endswith(f"-{step}"):
        return True
    if allowed is not None and not allowed(
            getattr(trainer, "last_save_seconds", None)):
        return False
    return timed_save(trainer, beat) is not None or not trainer.chief


def describe_pending(trainer) -> str:
    """Work in flight and per-worker progress (for the watchdog)."""
    executor = trainer.executor
    if executor is None:
        return "training loop not started"
    now = time.monotonic()
    done, last = executor.closures_per_pipeline, executor.last_result_at
    workers = "; ".join(
        f"worker {w}: {done[w]} closures finished, " + (
            f"last {now - last[w]:.0f} s ago" if w in last else "none yet")
        for w in (range(trainer.num_workers) if trainer.is_ps
                  else sorted(done)))
    unit = ("closure(s) scheduled and not collected" if trainer.is_ps
            else "call(s) in flight")
    return (f"{executor.in_flight} {unit} (the oldest is awaited); step "
            f"{int(trainer.progress.step.numpy())}; "
            f"{workers or 'no results yet'}. A worker whose last result "
            "is oldest holds the stalled closure.")
