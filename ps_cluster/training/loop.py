"""How training steps are executed: the only strategy-specific part of the
trainer.

* :class:`ClosureExecutor` (``ParameterServerStrategy``): the coordinator
  schedules closures of K steps each (one RPC round trip per K steps, the
  PS tutorial's advice for speed) on a ``ClusterCoordinator``, keeps a
  bounded number in flight and reads results from ``RemoteValue``\\ s that
  are already due, so the queue never drains while it logs; it joins only
  at evaluation and checkpoint boundaries.
* :class:`DirectExecutor` (mirrored strategies, one device, no strategy):
  the same function is called directly on a distributed iterator.

Both report ``(step, loss_sum, examples)`` per finished call, in order.
Evaluation is one function call per eval shard (one scheduled closure under
PS), so a retried closure still counts each example exactly once.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import math
import threading
import time
from typing import Callable

import numpy as np
import tensorflow as tf

from psrec.data.input.dataset import DatasetFn
from psrec.data.input.dataset import make_eval_dataset
from psrec.features.spec.spec import FeatureSpec
from psrec.ps_cluster.evaluation.breakdown import Breakdown
from psrec.ps_cluster.evaluation.metrics import EvalResult
from psrec.ps_cluster.evaluation.metrics import eval_statistics
from psrec.ps_cluster.evaluation.metrics import merge
from psrec.ps_cluster.evaluation.metrics import zero_eval_statistics
from psrec.ps_cluster.training.config import LoopConfig
from psrec.ps_cluster.training.coverage import CoverageTally
from psrec.ps_cluster.training.maintenance import Maintainer
from psrec.ps_cluster.training.step import NonFiniteLossError

OnResult = Callable[[int, float, int], None]


def steps_per_epoch(train_rows: int, rows_per_step: int) -> int:
    """Steps of one pass over ``train_rows``: ``ceil(rows / rows per
    step)``, at least 1."""
    return max(1, math.ceil(train_rows / max(1, rows_per_step)))


def steps_for_epochs(epochs: float, per_epoch: int) -> int:
    """The step count of ``epochs`` passes (rounded up, at least 1)."""
    return max(1, math.ceil(epochs * per_epoch - 1e-9))


@dataclasses.dataclass(frozen=True)
class LoopHooks:
    """What a trainer adds to an executor's loop.

    Attributes:
      should_stop: checked before each call: True stops scheduling
        (SIGTERM); ``run()`` then returns the step reached, short of
        ``end``.
      tally: a :class:`~psrec.ps_cluster.training.coverage.CoverageTally`
        fed with the ids and epochs a counting train function returns
        (None: not counted).
      maintainer: a :class:`~psrec.ps_cluster.training.maintenance.
        Maintainer`: calls end at its steps, which it runs at once with no
        call in flight (None: no dynamic tables).
    """

    should_stop: Callable[[], bool] = lambda: False
    tally: CoverageTally | None = None
    maintainer: Maintainer | None = None


class _Executor:
    """Runs ``build(steps)`` functions from ``start`` to ``end`` step."""

    def __init__(self, build: Callable[[int], Callable], config: LoopConfig,
                 hooks: LoopHooks) -> None:
        self.config = config
        self._build = build  # the caller keeps what it built (Trainer)
        self.closure_seconds: list[float] = []  # where the function ran
        # Calls finished per input pipeline (= per PS worker): shows which
        # workers do the work, e.g. that a restarted worker works again.
        self.closures_per_pipeline: collections.Counter = (
            collections.Counter())
        self.examples_per_pipeline: collections.Counter = (
            collections.Counter())  # per-worker throughput (TensorBoard)
        self.last_result_at: dict[int, float] = {}  # pipeline -> monotonic
        self.in_flight = 0
        self.should_stop = hooks.should_stop
        self.tally = hooks.tally
        self.maintainer = hooks.maintainer

    def _record(self, step: int, values, on_result: OnResult) -> None:
        loss_sum, examples, seconds, pipeline, not_run, *rows = values
        if rows and self.tally is not None:
            self.tally.add(*rows)
        if int(not_run):  # that update was not applied: stop here
            raise NonFiniteLossError(step - int(not_run) + 1)
        self.closure_seconds.append(float(seconds))
        self.closures_per_pipeline[int(pipeline)] += 1
        self.examples_per_pipeline[int(pipeline)] += int(examples)
        self.last_result_at[int(pipeline)] = time.monotonic()
        on_result(step, float(loss_sum), int(examples))

    def _chunks(self, start: int, end: int):
        step = start
        while step < end and not self.should_stop():
            stop = end
            if self.maintainer is not None:
                stop = min(end, self.maintainer.next_due(step))
            steps = min(self.config.steps_per_closure, stop - step)
            step += steps
            yield steps, step

    def _maintenance_due(self, step: int) -> bool:
        return self.maintainer is not None and self.maintainer.due(step)


class ClosureExecutor(_Executor):
    """Schedules the train function as closures on a ClusterCoordinator.

    Args:
      build: ``steps -> tf.function(iterator)``.
      num_workers: worker count (sets how many closures stay in flight).
      hooks: the trainer's stop check, coverage tally and maintainer.
    """

    def __init__(self, coordinator, build: Callable[[int], Callable],
                 dataset_fn: DatasetFn, num_workers: int,
                 config: LoopConfig, hooks: LoopHooks = LoopHooks()) -> None:
        super().__init__(build, config, hooks)
        self.coordinator = coordinator
        self._iterator = iter(coordinator.create_per_worker_dataset(
            dataset_fn))
        self._max_in_flight = max(1, num_workers) * (
            config.in_flight_per_worker)
        # (step, fetched result) in step order, each fetched as it finishes
        self._pending: collections.deque = collections.deque()

    def run(self, start: int, end: int, on_result: OnResult) -> int:
        """Schedules closures from ``start`` up to ``end`` (or until
        :attr:`should_stop`), joins; returns the step reached.

        At most ``max_in_flight`` closures are unfinished; finished ones
        wait (reported in step order) behind an older one still running,
        so one stuck worker (a network partition) does not stop scheduling
        for the others until the next join."""
        reached = start
        for steps, step in self._chunks(start, end):
            value = self.coordinator.schedule(self._build(steps),
                                              args=(self._iterator,))
            self._pending.append(
                (step, fetched(functools.partial(self._fetch, value))))
            reached = step
            self.in_flight = len(self._pending)
            self._collect_finished(on_result)
            while sum(not f.done() for _, f in self._pending) > (
                    self._max_in_flight):
                concurrent.futures.wait(
                    [f for _, f in self._pending if not f.done()],
                    return_when=concurrent.futures.FIRST_COMPLETED)
                self._collect_finished(on_result)
            if self._maintenance_due(step):  # the map's only writer
                self.coordinator.join()
                while self._pending:
                    self._collect_one(on_result)
                self.maintainer(step)
        self.coordinator.join()
        while self._pending:
            self._collect_one(on_result)
        return reached

    def _collect_finished(self, on_result: OnResult) -> None:
        """Reports the oldest results that have finished, in order."""
        while self._pending and self._pending[0][1].done():
            self._collect_one(on_result)

    def _collect_one(self, on_result: OnResult) -> None:
        step, result = self._pending.popleft()
        self.in_flight = len(self._pending)
        self._record(step, result.result(), on_result)

    def _fetch(self, value):
        """The closure's results, also when its worker was lost while
        TensorFlow copied them to the coordinator (run in a fetch thread).

        TensorFlow marks a closure's value ready as soon as it has run, and
        then its worker thread copies the results here; a fetch in between
        copies them itself. When the worker dies in that window both copies
        fail: the worker thread takes it for a worker failure and puts the
        closure back (it runs again on another worker, at-least-once, as
        any closure of a lost worker), but the fetch raised UNAVAILABLE and
        ended the job (exit 138). Here the fetch waits for that re-run
        (``join``: it returns once the loop stops scheduling, at the latest
        at its next join) and takes its results.
        """
        try:
            return value.fetch()
        except (tf.errors.UnavailableError, tf.errors.AbortedError,
                tf.errors.CancelledError) as error:
            if not _from_a_worker(error):
                raise
        self.coordinator.join()
        return value.fetch()


def _from_a_worker(error: tf.errors.OpError) -> bool:
    """The error came from an unreachable worker, not a PS (whose loss ends
    the job), as TensorFlow's coordinator tells them apart."""
    text = str(error)
    return ("from remote target /job:worker/" in text
            and "from remote target /job:ps" not in text)


def fetched(fetch: Callable[[], object]) -> concurrent.futures.Future:
    """A future of ``fetch()`` (a ``RemoteValue``'s), run by a daemon
    thread: it blocks only itself while the closure runs, and never holds
    up the interpreter's exit (a closure on a lost worker may never
    finish)."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fetch())
        except BaseException as error:  # re-raised by result()
            future.set_exception(error)

    threading.Thread(target=run, name="psrec-fetch", daemon=True).start()
    return future


class DirectExecutor(_Executor):
    """Calls the train function in this process on a distributed iterator
    (``strategy.distribute_datasets_from_function``)."""

    def __init__(self, strategy: tf.distribute.Strategy,
                 build: Callable[[int], Callable], dataset_fn: DatasetFn,
                 config: LoopConfig, hooks: LoopHooks = LoopHooks()) -> None:
        super().__init__(build, config, hooks)
        self._iterator = iter(strategy.distribute_datasets_from_function(
            dataset_fn))

    def run(self, start: int, end: int, on_result: OnResult) -> int:
        reached = start
        for steps, step in self._chunks(start, end):
            self.in_flight = 1
            values = self._build(steps)(self._iterator)
            self.in_flight = 0
            self._record(step, values, on_result)
            reached = step
            if self._maintenance_due(step):
                self.maintainer(step)
        return reached


def make_eval_function(model, spec: FeatureSpec, batch_size: int,
                       block_rows: int,
                       breakdown: Breakdown = Breakdown()) -> Callable:
    """A ``tf.function(path)`` with the statistics of one eval shard file:
    every task's (``eval_statistics``), with ``breakdown`` also the first
    task's per-group sums -- computed where the closure runs, only the
    fixed-size sums travel."""

    @tf.function
    def evaluate_shard(path: tf.Tensor):
        dataset = make_eval_dataset(path, spec, batch_size, block_rows)

        def add(state, batch):
            stats = eval_statistics(spec, model(batch), batch, breakdown)
            return {k: state[k] + stats[k] for k in state}

        return dataset.reduce(zero_eval_statistics(spec, breakdown), add)

    return evaluate_shard


def evaluate_files(eval_fn: Callable, files: list[str],
                   coordinator=None, combine: Callable = merge,
                   on_part: Callable[[], None] | None = None) -> EvalResult:
    """Runs ``eval_fn`` once per shard file -- as closures on
    ``coordinator`` when given, else here -- and merges the statistics
    (``combine``: the ranking metrics, or the retrieval task's).

    ``on_part`` is called as each shard's statistics arrive (the
    heartbeat: a long evaluation keeps beating shard by shard, so only a
    shard that never finishes looks like a stall)."""
    parts = []
    if coordinator is None:
        for f in files:
            parts.append(eval_fn(tf.constant(f)))
            if on_part is not None:
                on_part()
    else:
        values = [coordinator.schedule(eval_fn, args=(tf.constant(f),))
                  for f in files]
        for value in values:  # in order; each blocks until its shard is done
            parts.append(value.fetch())
            if on_part is not None:
                on_part()
        coordinator.join()  # raises any error of a scheduled closure
    return combine([{k: np.asarray(v) for k, v in part.items()}
                    for part in parts])
