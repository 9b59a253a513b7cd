"""The coordinator's training loop on a ParameterServerStrategy.

The coordinator creates per-worker datasets with the data package's
``dataset_fn``, schedules closures of K training steps each
(``steps_per_closure``; one RPC round trip per K steps, the PS tutorial's
advice for speed), keeps a bounded number of closures in flight and reads
their loss/example counts from ``RemoteValue``s that are already due, so the
queue never drains while it logs. ``join`` happens only at evaluation and
checkpoint boundaries.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Callable

import numpy as np
import tensorflow as tf

from psrec.data.dataset import PIPELINE_COLUMN
from psrec.data.dataset import DatasetFn
from psrec.data.dataset import make_eval_dataset
from psrec.features.spec import ID_COLUMN
from psrec.features.spec import FeatureSpec
from psrec.models.ranking import RankingModel
from psrec.ps_cluster.metrics import EvalResult
from psrec.ps_cluster.metrics import batch_statistics
from psrec.ps_cluster.metrics import merge
from psrec.ps_cluster.metrics import zero_statistics


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Scheduling of a training run.

    Attributes:
      steps: total training steps (the run ends at this global step).
      steps_per_closure: training steps per scheduled closure (K).
      in_flight_per_worker: closures queued ahead per worker before the
        coordinator waits on the oldest one.
      log_every: steps between progress updates.
      eval_every: steps between evaluations (0: only at the end).
      checkpoint_every: steps between checkpoints (0: only at the end).
    """

    steps: int = 1000
    steps_per_closure: int = 10
    in_flight_per_worker: int = 4
    log_every: int = 100
    eval_every: int = 0
    checkpoint_every: int = 500

    def __post_init__(self) -> None:
        for key in ("steps", "steps_per_closure", "in_flight_per_worker",
                    "log_every"):
            if getattr(self, key) < 1:
                raise ValueError(f"`{key}` = {getattr(self, key)!r} must be "
                                 ">= 1.")
        for key in ("eval_every", "checkpoint_every"):
            if getattr(self, key) < 0:
                raise ValueError(f"`{key}` = {getattr(self, key)!r} must be "
                                 ">= 0.")


def make_train_closure(strategy: tf.distribute.Strategy, model: RankingModel,
                       sparse_optimizer, dense_optimizer, spec: FeatureSpec,
                       steps: int) -> Callable:
    """A ``tf.function`` running ``steps`` training steps on one worker.

    Returns ``(loss_sum, examples, seconds, pipeline)`` over the steps;
    ``seconds`` is the closure's wall time measured on the worker (steps
    incl. PS RPCs) and ``pipeline`` the input pipeline (worker) that ran it.
    """
    label = spec.label.name

    def step(batch: dict[str, tf.Tensor]):
        with tf.GradientTape() as tape:
            logits = model(batch, training=True)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                batch[label], logits))
        tables = model.embedding_variables()  # shards, not ShardedVariables
        dense = model.dense_variables()
        grads = tape.gradient(loss, tables + dense)
        sparse_optimizer.apply_gradients(zip(grads[:len(tables)], tables))
        dense_optimizer.apply_gradients(zip(grads[len(tables):], dense))
        return loss, tf.size(batch[label], out_type=tf.int64)

    @tf.function
    def train_closure(iterator):
        began = tf.timestamp()
        with tf.control_dependencies([began]):  # order the two timestamps
            loss_sum = tf.constant(0.0)
            examples = tf.constant(0, tf.int64)
        pipeline = tf.constant(-1, tf.int64)
        for _ in tf.range(steps):
            batch = next(iterator)
            loss, count = strategy.run(step, args=(batch,))
            loss_sum += strategy.reduce("SUM", loss, axis=None)
            examples += strategy.reduce("SUM", count, axis=None)
            if PIPELINE_COLUMN in batch:
                pipeline = batch[PIPELINE_COLUMN]
        with tf.control_dependencies([loss_sum, examples]):
            ended = tf.timestamp()
        return loss_sum, examples, ended - began, pipeline

    return train_closure


def make_eval_closure(model: RankingModel, spec: FeatureSpec,
                      batch_size: int, block_rows: int) -> Callable:
    """A ``tf.function`` evaluating one whole eval shard file.

    Each shard is one closure, so a retried closure (worker lost) still
    counts every example of its shard exactly once: only the successful
    execution's result reaches the coordinator.
    """
    label = spec.label.name

    @tf.function
    def eval_closure(path: tf.Tensor):
        dataset = make_eval_dataset(path, spec, batch_size, block_rows)

        def add(state, batch):
            stats = batch_statistics(batch[label], model(batch), batch[ID_COLUMN])
            return {k: state[k] + stats[k] for k in state}

        return dataset.reduce(zero_statistics(), add)

    return eval_closure


class ClosureLoop:
    """Schedules training closures and collects their results in order.

    Args:
      coordinator: the ``ClusterCoordinator``.
      build_closure: ``steps -> closure`` (:func:`make_train_closure` bound
        to a model); closures are built once per distinct step count.
      dataset_fn: the per-worker ``dataset_fn``.
      num_workers: worker count (sets how many closures stay in flight).
      config: the loop configuration.
    """

    def __init__(self, coordinator, build_closure: Callable[[int], Callable],
                 dataset_fn: DatasetFn, num_workers: int,
                 config: LoopConfig) -> None:
        self.coordinator = coordinator
        self.config = config
        self._build = build_closure
        self._closures: dict[int, Callable] = {}
        self._iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
        self._max_in_flight = max(1, num_workers) * config.in_flight_per_worker
        self._pending: collections.deque = collections.deque()
        self.collected_closures = 0
        self.closure_seconds: list[float] = []  # worker-side, per closure
        # Closures finished per input pipeline (= per worker): shows which
        # workers do the work, e.g. that a restarted worker works again.
        self.closures_per_pipeline: collections.Counter = collections.Counter()
        self.last_result_at: dict[int, float] = {}  # pipeline -> monotonic

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def run(self, start_step: int, end_step: int,
            on_result: Callable[[int, float, int], None]) -> int:
        """Schedules closures from ``start_step`` up to ``end_step`` and
        joins. ``on_result(step, loss_sum, examples)`` is called for every
        finished closure, in scheduling order. Returns the step reached."""
        step = start_step
        k = self.config.steps_per_closure
        while step < end_step:
            steps = min(k, end_step - step)
            if steps not in self._closures:  # K, and maybe a shorter tail
                self._closures[steps] = self._build(steps)
            value = self.coordinator.schedule(self._closures[steps],
                                              args=(self._iterator,))
            step += steps
            self._pending.append((step, value))
            while len(self._pending) > self._max_in_flight:
                self._collect_one(on_result)
        self.coordinator.join()
        while self._pending:
            self._collect_one(on_result)
        return step

    def _collect_one(self, on_result) -> None:
        step, value = self._pending.popleft()
        loss_sum, examples, seconds, pipeline = value.fetch()
        self.collected_closures += 1
        self.closure_seconds.append(float(seconds))
        self.closures_per_pipeline[int(pipeline)] += 1
        self.last_result_at[int(pipeline)] = time.monotonic()
        on_result(step, float(loss_sum), int(examples))


def evaluate(coordinator, eval_closure: Callable,
             files: list[str]) -> EvalResult:
    """Schedules one eval closure per shard file and merges the results."""
    values = [coordinator.schedule(eval_closure, args=(tf.constant(f),))
              for f in files]
    coordinator.join()
    parts = [{k: np.asarray(v) for k, v in value.fetch().items()}
             for value in values]
    return merge(parts)

