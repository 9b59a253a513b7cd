"""The trainer: one model, optimizers, checkpoints and loop for every
strategy. Only how a step is executed depends on it
(:mod:`psrec.ps_cluster.training.loop`): closures on a ``ClusterCoordinator``
under ``ParameterServerStrategy``, direct calls of the same ``tf.function``
otherwise."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
import time
from pathlib import Path
from typing import Callable
from typing import Iterator

import tensorflow as tf
import tf_keras

from psrec.data.convert.sampling import logit_shift
from psrec.data.format.manifest import Manifest
from psrec.data.input.config import InputConfig
from psrec.data.input.dataset import DatasetFn
from psrec.data.input.dataset import make_train_dataset_fn
from psrec.errors import check
from psrec.errors import check_choice
from psrec.features.spec.spec import FeatureSpec
from psrec.models.build import build_model
from psrec.models.embedding.sparse_arch import WIDE_SUFFIX
from psrec.models.embedding.sparse_arch import table_variables
from psrec.models.optim.config import DEFAULT_GROUP
from psrec.models.optim.config import OptimizerConfig
from psrec.models.optim.optimizers import build_optimizers
from psrec.models.optim.optimizers import build_table_optimizers
from psrec.models.ranking.config import ModelConfig
from psrec.models.ranking.model import RankingModel
from psrec.models.ranking.model import shifted_outputs
from psrec.ps_cluster.checkpoint.best import BestRecord
from psrec.ps_cluster.checkpoint.best import BestTracker
from psrec.ps_cluster.checkpoint.changes import ChangeTracker
from psrec.ps_cluster.checkpoint.keeper import CheckpointKeeper
from psrec.ps_cluster.checkpoint.keeper import Progress
from psrec.ps_cluster.checkpoint.keeper import io_options
from psrec.ps_cluster.checkpoint.warm_start import apply_warm_start
from psrec.ps_cluster.cluster.strategy import StrategyError
from psrec.ps_cluster.cluster.strategy import cluster_resolver
from psrec.ps_cluster.cluster.strategy import is_chief
from psrec.ps_cluster.evaluation.breakdown import Breakdown
from psrec.ps_cluster.evaluation.metrics import EvalResult
from psrec.ps_cluster.evaluation.metrics import merge
from psrec.ps_cluster.training.config import LoopConfig
from psrec.ps_cluster.training.config import can_stop_early
from psrec.ps_cluster.training.coverage import new_tally
from psrec.ps_cluster.training.loop import ClosureExecutor
from psrec.ps_cluster.training.loop import DirectExecutor
from psrec.ps_cluster.training.loop import LoopHooks
from psrec.ps_cluster.training.loop import evaluate_files
from psrec.ps_cluster.training.loop import make_eval_function
from psrec.ps_cluster.training.maintenance import dynamic_maintainer
from psrec.ps_cluster.training.step import DynamicLossScale
from psrec.ps_cluster.training.step import TrainStep
from psrec.ps_cluster.training.step import ids_per_example
from psrec.ps_cluster.training.step import make_train_function
from psrec.ps_cluster.training.step import pad_slices
from psrec.uri_path import as_path

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """Outcome of :meth:`Trainer.train`."""

    start_step: int
    step: int
    executed_steps: int  # optimizer updates applied by this call (>= step -
    # start_step: a closure re-run after a worker loss updates twice)
    examples: int
    seconds: float
    final_loss: float
    eval: EvalResult | None
    checkpoint: str | None
    replicas: int = 1
    closure_seconds: tuple[float, ...] = ()
    closures_per_worker: dict[int, int] = dataclasses.field(
        default_factory=dict)
    best: BestRecord | None = None
    stopped_early_at: int | None = None
    interrupted_at: int | None = None  # should_stop ended the run here
    coverage: tuple = ()  # EpochCoverage per epoch (rows of the split seen)

    @property
    def examples_per_sec(self) -> float:
        return self.examples / self.seconds if self.seconds else 0.0


@contextlib.contextmanager
def _policy(precision: str) -> Iterator[None]:
    previous = tf_keras.mixed_precision.global_policy()
    tf_keras.mixed_precision.set_global_policy(precision)
    try:
        yield
    finally:
        tf_keras.mixed_precision.set_global_policy(previous)


class Trainer:
    """Trains a ranking model under any ``tf.distribute`` strategy.

    Args:
      strategy: a ``ParameterServerStrategy`` (this process coordinates),
        ``MirroredStrategy``, ``MultiWorkerMirroredStrategy`` or
        ``OneDeviceStrategy`` (see :mod:`psrec.ps_cluster.cluster.strategy`).
      optimizer_config: learning rates are scaled to the rows of one update
        (``batch_size * micro_batches``).
      input_config: ``batch_size`` is the rows of one step: of one worker's
        step under PS, of the global step under the mirrored strategies.
      micro_batches: batches whose gradients are summed per update.
      precision: ``float32``, ``mixed_float16`` or ``mixed_bfloat16``.
      checkpoint_dir: where the chief writes checkpoints (None: none).
      positive_rate: the train split's share of positives, where the output
        bias starts (its logit); None starts at 0.5.
      label_means: the train means of the ``loss: mse`` labels, where
        their outputs start (``Manifest.label_means``; None: at 0).
      neg_sample_rate: the share of negatives the train data kept: evaluation
        adds ``log(neg_sample_rate)`` to the logits, so logloss and
        calibration are those of calibrated predictions (AUC is unchanged).
      track_changes: flag the rows each update writes, on each table
        shard's PS (:class:`ChangeTracker`), for delta checkpoints
        (``LoopConfig.delta_every``).
    """

    def __init__(self, strategy: tf.distribute.Strategy, spec: FeatureSpec,
                 model_config: ModelConfig,
                 optimizer_config: OptimizerConfig = OptimizerConfig(),
                 input_config: InputConfig = InputConfig(), *,
                 micro_batches: int = 1, precision: str = "float32",
                 checkpoint_dir: str | Path | None = None,
                 keep_checkpoints: int = 3, checkpoint_writers: str = "auto",
                 positive_rate: float | None = None,
                 label_means: dict[str, float] | None = None,
                 neg_sample_rate: float = 1.0,
                 track_changes: bool = False) -> None:
        check(micro_batches >= 1, "micro_batches", micro_batches,
              "must be >= 1", StrategyError)
        check_choice("precision", precision, PRECISIONS, StrategyError)
        self.strategy = strategy
        self.spec = spec
        self.breakdown = Breakdown()  # train() sets its loop's
        self.input_config = input_config
        self.micro_batches = micro_batches
        self.precision = precision
        self.logit_shift = logit_shift(neg_sample_rate)
        self.replicas = strategy.num_replicas_in_sync
        self.is_ps = isinstance(strategy,
                                tf.distribute.ParameterServerStrategy)
        if not self.is_ps and input_config.batch_size % self.replicas:
            raise StrategyError(
                f"`InputConfig.batch_size` = {input_config.batch_size} (the global "
                f"batch) must be a multiple of the {self.replicas} replicas "
                "in sync.")
        self.chief = is_chief(strategy)
        self.coordinator = (
            tf.distribute.coordinator.ClusterCoordinator(strategy)
            if self.is_ps else None)
        with _policy(precision), strategy.scope():
            self.model: RankingModel = build_model(
                spec, model_config, positive_rate, label_means)
            rows = input_config.batch_size * micro_batches
            _, self.dense_optimizer = build_optimizers(optimizer_config,
                                                       rows)
            # One optimizer per (optimizer, lr) of the tables; the flags'
            # is `sparse_optimizer` (checkpoints before per-table ones).
            self.sparse_optimizers, self.table_optimizers = (
                build_table_optimizers(optimizer_config, rows, spec.tables,
                                       single_writer=not self.is_ps))
            self.sparse_optimizer = self.sparse_optimizers[DEFAULT_GROUP]
            self.loss_scale = (DynamicLossScale()
                               if precision == "mixed_float16" else None)
            # Slots now, under the scope, so a restore fills them before
            # training instead of deferring silently.
            for optimizer in self.sparse_optimizers.values():
                optimizer._create_all_weights(  # noqa: SLF001
                    self._variables_of(optimizer))
            self.dense_optimizer._create_all_weights(  # noqa: SLF001
                self.model.dense_variables())
            # Not in the checkpoint: a restored state has no changed row.
            self.changes = (ChangeTracker(table_checkpoint_keys(self.model))
                            if track_changes else None)
        self.progress = Progress()  # on the coordinator, outside the scope
        state = {"model": self.model, **self.sparse_optimizers,
                 "dense_optimizer": self.dense_optimizer,
                 "progress": self.progress}
        if self.loss_scale is not None:
            state["loss_scale"] = self.loss_scale
        self.checkpoint = tf.train.Checkpoint(**state)
        self.checkpoint_dir = checkpoint_dir and as_path(checkpoint_dir)
        self.keeper = None if self.checkpoint_dir is None else (
            CheckpointKeeper(
                self.checkpoint_dir, self.checkpoint,
                optimizers={**self.sparse_optimizers,
                            "dense_optimizer": self.dense_optimizer},
                tables=table_checkpoint_keys(self.model), strategy=strategy,
                max_to_keep=keep_checkpoints, writers=checkpoint_writers,
                dynamic=dynamic_checkpoint_keys(self.model)))
        self.step = TrainStep(
            self.model, self.sparse_optimizer, self.dense_optimizer,
            spec.labels if spec.multi_task else spec.label,
            loss_scale=self.loss_scale,
            prepare_table_grads=self._padding(),
            table_optimizers=self.table_optimizers,
            on_table_update=self.changes and self.changes.mark)
        self.executor = self.eval_beat = None  # set by train()
        self._train_functions: dict[tuple[int, bool], Callable] = {}
        self.coverage_rows: int | None = None  # set by dataset_fn
        # Seconds the last checkpoint save took (None: none yet); an
        # interrupted run's estimate of whether a save fits its grace period.
        self.last_save_seconds: float | None = None

    def _variables_of(self, optimizer) -> list[tf.Variable]:
        """The table shard variables ``optimizer`` trains (with the wide
        twins of its tables)."""
        return [shard for name, variable in
                self.model.sparse_arch.tables.items()
                if self.table_optimizers.get(name.removesuffix(WIDE_SUFFIX))
                is optimizer for shard in table_variables(variable)]

    def _padding(self) -> Callable[[list], list] | None:
        """Replicated strategies all-gather table gradients inside a
        ``tf.while`` loop, which needs one static size on every replica:
        the rows one update looks up in each table."""
        if self.is_ps or self.replicas == 1:
            return None
        per_replica = self.input_config.batch_size // self.replicas
        rows = [self.micro_batches * (
            per_replica * ids_per_example(self.spec, name)
            + self._extra_lookups(name))
            for name in self.model.sparse_arch.tables]
        return lambda grads: [pad_slices(g, r) for g, r in zip(grads, rows)]

    def _extra_lookups(self, table: str) -> int:
        """Rows of ``table`` one replica's micro-batch looks up besides its
        examples' own ids (none for ranking)."""
        return 0

    @property
    def num_workers(self) -> int:
        """Worker tasks of the cluster (1 without a cluster)."""
        resolver = cluster_resolver(self.strategy)
        if resolver is None:
            return 1
        return max(1, resolver.cluster_spec().num_tasks("worker"))

    @property
    def executed_steps(self) -> int:
        """Optimizer updates actually applied (>= scheduled steps when a
        closure was re-run after a worker loss: at-least-once)."""
        return int(self.dense_optimizer.iterations.numpy())

    # -- checkpoints ------------------------------------------------------------

    def restore(self) -> str | None:
        """Restores the latest checkpoint (verified by value); returns its
        path, None when there is none."""
        if self.keeper is None or self.keeper.latest is None:
            return None
        path = self.keeper.restore()
        self.progress.resumes.assign_add(1)
        return path

    def warm_start(self, path: str, plan, *, reset_optimizer: bool = False):
        """Fills the fresh state from another run's checkpoint ``path`` by
        ``plan`` (a ``WarmStartPlan``), verified by value; the progress
        stays at step 0. Returns the ``WarmStartResult``."""
        return apply_warm_start(
            self.checkpoint, str(path), plan,
            reset_optimizer=reset_optimizer,
            io_device=io_options().experimental_io_device or "/device:CPU:0")

    def save(self) -> str | None:
        """Saves a checkpoint; returns its path on the chief. Every worker
        of a multi-worker strategy calls this together (saving may run
        collectives): the others write into a scratch folder, deleted at
        once, and get None."""
        if self.keeper is None:
            return None
        step = int(self.progress.step.numpy())
        if self.chief:
            path = self.keeper.save(step)
            if self.changes is not None:
                self.changes.clear()
            return path
        resolver = self.strategy.cluster_resolver
        scratch = self.checkpoint_dir.parent / (
            f".{self.checkpoint_dir.name}-{resolver.task_type}-"
            f"{resolver.task_id}-scratch")
        try:
            CheckpointKeeper(scratch, self.checkpoint).save(step)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return None

    def mark_reset_rows(self, table: str, rows) -> None:
        """Flags the ``rows`` of ``table`` that dynamic-table maintenance
        reset (fresh values and slots) as changed."""
        self.changes.mark_rows(table_key(table), rows)

    def save_delta(self) -> str | None:
        """Saves a delta checkpoint (the rows changed since the last save);
        a full one when there is no base yet (nothing saved or restored by
        this process). Returns its path."""
        if self.keeper is None:
            return None
        if self.changes is None or self.keeper.last_link is None:
            return self.save()
        return self.keeper.save_delta(int(self.progress.step.numpy()),
                                      self.changes)  # clears what it wrote

    # -- data and evaluation -------------------------------------------------------

    def dataset_fn(self, manifest: Manifest, **options) -> DatasetFn:
        """The training ``dataset_fn`` of ``manifest``; its shuffle seed is
        offset by the number of resumes so a resumed run sees a new order.
        Under PS (static input) each worker reads the files of its own
        worker index; ``options`` go to ``make_train_dataset_fn``."""
        resumes = int(self.progress.resumes.numpy())
        config = dataclasses.replace(
            self.input_config, seed=self.input_config.seed + 7919 * resumes)
        self.coverage_rows = manifest.rows("train")
        return make_train_dataset_fn(
            manifest, self.spec, config,
            ps_workers=self.num_workers if self.is_ps else None, **options)

    def evaluate(self, manifest: Manifest, batch_size: int | None = None,
                 split: str | tuple[str, ...] = "eval") -> EvalResult:
        """Every example of ``split`` (or of several splits: a followed
        partition's test before train reads all of its rows) once, one
        call or closure per shard, with the task's metrics
        (:meth:`_eval_function`)."""
        splits = (split,) if isinstance(split, str) else split
        function, combine = self._eval_function(
            batch_size or self.input_config.batch_size, manifest.block_rows,
            splits)
        return evaluate_files(function,
                              [f for s in splits for f in manifest.files(s)],
                              self.coordinator, combine=combine,
                              on_part=self.eval_beat)

    def _eval_function(self, batch_size: int, block_rows: int,
                       splits: tuple[str, ...] = ("eval",)
                       ) -> tuple[Callable, Callable]:
        """The per-shard eval function of ``splits`` and the merge of its
        statistics: ranking metrics on logits corrected for the negative
        sampling of the train data."""
        model, shift = self.model, self.logit_shift
        breakdown = self.breakdown
        return make_eval_function(
            functools.partial(shifted_outputs, model, self.spec, shift)
            if shift else model, self.spec, batch_size, block_rows,
            breakdown), functools.partial(merge, breakdown=breakdown,
                                          spec=self.spec)

    # -- training -------------------------------------------------------------

    def _executor(self, dataset_fn: DatasetFn, loop: LoopConfig,
                  should_stop: Callable[[], bool] | None):
        build = functools.partial(
            self._train_function,
            with_rows=self.coverage_rows is not None)  # count rows: psrec's
        hooks = LoopHooks(should_stop=should_stop or (lambda: False),
                          tally=new_tally(
                              self.coverage_rows,
                              self.input_config.batch_size
                              * self.micro_batches, self.num_workers),
                          maintainer=dynamic_maintainer(self))
        if self.is_ps:
            return ClosureExecutor(self.coordinator, build, dataset_fn,
                                   self.num_workers, loop, hooks)
        return DirectExecutor(self.strategy, build, dataset_fn, loop, hooks)

    def _train_function(self, steps: int, with_rows: bool) -> Callable:
        """The traced train function of ``steps`` steps (``K``, and maybe a
        shorter tail), kept across :meth:`train` calls: a later call (the
        timed run of ``psrec bench``, the next partition of a continuous
        run) reuses the trace and what the workers already hold of it."""
        key = (steps, with_rows)
        if key not in self._train_functions:
            self._train_functions[key] = make_train_function(
                self.strategy, self.step, steps,
                micro_batches=self.micro_batches, with_rows=with_rows)
        return self._train_functions[key]

    def best_tracker(self, loop: LoopConfig) -> BestTracker | None:
        """The chief's keeper of the best checkpoint (None: no checkpoints,
        not the chief, or ``keep_best`` is ``none``)."""
        if (self.keeper is None or not self.chief
                or loop.keep_best == "none"):
            return None
        return BestTracker(self.checkpoint_dir, loop.keep_best,
                           loop.early_stop_patience)

    def train(self, dataset_fn: DatasetFn, loop: LoopConfig,
              eval_manifest: Manifest | None = None,
              on_progress: Callable[[int, float, int], None] | None = None,
              on_boundary: Callable[[int, EvalResult | None, str | None],
                                    None] | None = None,
              heartbeat: Callable[[str], None] | None = None,
              on_best: Callable[[BestRecord], None] | None = None,
              should_stop: Callable[[], bool] | None = None,
              save_on_stop: Callable[[float | None], bool] | None = None
              ) -> TrainResult:
        """Trains from the current progress step up to ``loop.steps``, or
        until early stopping ends it.

        Args:
          eval_manifest: evaluated at eval boundaries and at the end (by the
            chief only, under a multi-worker strategy); each eval boundary is
            also a checkpoint, kept as the best when the eval improved
            ``loop.keep_best``.
          on_progress: ``(step, mean loss, examples)`` per finished call.
          on_boundary: ``(step, eval result or None, checkpoint path or None)``
            at each join boundary.
          heartbeat: ``(phase)`` whenever work completes or a phase
            (``training``, ``eval``, ``checkpoint``) begins.
          on_best: ``(record)`` when a new best checkpoint is recorded.
          should_stop: checked before each call; True (SIGTERM) stops
            scheduling, drains the calls in flight and ends the run there
            (``interrupted_at``), saving a checkpoint at that step when
            ``save_on_stop(last save's seconds or None)`` allows it.
        """
        beat = heartbeat or (lambda phase: None)
        self.eval_beat, loop = (lambda: beat("eval")), loop.resolved()
        self.breakdown = loop.breakdown()  # GAUC / slices of each eval
        check(not loop.early_stop_patience
              or can_stop_early(self.is_ps, self.num_workers),
              "LoopConfig.early_stop_patience",
              loop.early_stop_patience, "is not supported with several "
              "workers of a replicated strategy (only the chief evaluates)",
              StrategyError)
        self.executor = executor = self._executor(dataset_fn, loop,
                                                  should_stop)
        interrupted = None
        start = int(self.progress.step.numpy())
        updates_before = self.executed_steps  # restored with the step
        step, examples, last_loss = start, 0, float("nan")
        began = time.perf_counter()
        eval_result, path = None, None
        # The same on every worker (each saves at eval boundaries); only
        # the chief evaluates.
        evals = eval_manifest is not None and bool(
            eval_manifest.files("eval"))
        has_eval = self.chief and evals
        tracker = self.best_tracker(loop) if has_eval else None
        stopped = (start if tracker is not None and tracker.exhausted
                   else None)

        def on_result(at: int, loss_sum: float, count: int) -> None:
            nonlocal examples, last_loss
            examples += count
            last_loss = loss_sum / max(1, count // max(
                1, self.input_config.batch_size * self.micro_batches))
            self.progress.step.assign(at)
            self.progress.examples.assign_add(count)
            beat("training")
            if on_progress is not None:
                on_progress(at, last_loss, count)

        while step < loop.steps and stopped is None:
            beat("training")
            boundary = loop.next_boundary(step)
            step = executor.run(step, boundary, on_result)
            if step < boundary:  # should_stop: drained; save and end here
                interrupted = step
                if self._save_at_stop(save_on_stop, beat):
                    path = self.keeper.latest
                break
            eval_result = None
            eval_due = evals and (step >= loop.steps
                                  or loop.is_eval_step(step))
            if has_eval and eval_due:
                beat("eval")
                eval_result = self.evaluate(eval_manifest)
            saved = None
            due = ("full" if step >= loop.steps or eval_due
                   else loop.save_due(step))
            if due is not None:
                saved = self._timed_save(beat, delta=due == "delta")
                path = saved or path
            if on_boundary is not None:
                on_boundary(step, eval_result, saved)
            if tracker is not None and eval_result is not None and saved:
                if tracker.update(step, eval_result, saved) and on_best:
                    on_best(tracker.record)
                if tracker.exhausted and step < loop.steps:
                    stopped = step
        if step == start and self.keeper is not None and (
                interrupted is None):  # already done
            path = self.keeper.latest
            if has_eval:
                eval_result = self.evaluate(eval_manifest)
        return TrainResult(
            start_step=start, step=step,
            executed_steps=self.executed_steps - updates_before,
            examples=examples, seconds=time.perf_counter() - began,
            final_loss=last_loss, eval=eval_result, checkpoint=path,
            replicas=self.replicas,
            closure_seconds=tuple(executor.closure_seconds),
            closures_per_worker=dict(executor.closures_per_pipeline),
            best=tracker.record if tracker is not None else None,
            stopped_early_at=stopped, interrupted_at=interrupted,
            coverage=tuple(executor.tally.epochs()) if executor.tally else ())

    # -- around the loop: timed saves, the checkpoint of an interrupted
    # run (SIGTERM), the pending work the stall watchdog prints ---------------

    def _timed_save(self, beat: Callable[[str], None], *,
                    delta: bool = False) -> str | None:
        """:meth:`save` (``delta``: :meth:`save_delta`) in the
        ``checkpoint`` heartbeat phase; records its duration in
        :attr:`last_save_seconds`."""
        beat("checkpoint")
        began = time.perf_counter()
        saved = self.save_delta() if delta else self.save()
        self.last_save_seconds = time.perf_counter() - began
        beat("training")
        return saved

    def _save_at_stop(self, allowed: Callable[[float | None], bool] | None,
                      beat: Callable[[str], None]) -> bool:
        """The checkpoint of an interrupted run, at the step reached. True
        when one exists at that step afterwards (saved now, or already
        there); False when there are no checkpoints or ``allowed(last save
        seconds)`` refuses (no time left for a save)."""
        if self.keeper is None:
            return False
        step = int(self.progress.step.numpy())
        latest = self.keeper.latest
        if latest is not None and latest.endswith(f"-{step}"):
            return True
        if allowed is not None and not allowed(self.last_save_seconds):
            return False
        return self._timed_save(beat) is not None or not self.chief

    def describe_pending(self) -> str:
        """Work in flight and per-worker progress (for the watchdog)."""
        executor = self.executor
        if executor is None:
            return "training loop not started"
        now = time.monotonic()
        done, last = executor.closures_per_pipeline, executor.last_result_at
        workers = "; ".join(
            f"worker {w}: {done[w]} closures finished, " + (
                f"last {now - last[w]:.0f} s ago" if w in last
                else "none yet")
            for w in (range(self.num_workers) if self.is_ps
                      else sorted(done)))
        unit = ("closure(s) scheduled and not collected" if self.is_ps
                else "call(s) in flight")
        return (f"{executor.in_flight} {unit} (the oldest is awaited); step "
                f"{int(self.progress.step.numpy())}; "
                f"{workers or 'no results yet'}. A worker whose last result "
                "is oldest holds the stalled closure.")


def table_key(name: str) -> str:
    """The checkpoint key prefix of table ``name``."""
    return f"model/sparse_arch/{name}"


def table_checkpoint_keys(model: RankingModel) -> dict[str, object]:
    """Checkpoint key prefix of every table variable -> the variable."""
    return {table_key(name): variable
            for name, variable in model.sparse_arch.tables.items()}


def dynamic_checkpoint_keys(model: RankingModel) -> dict[str, object]:
    """Checkpoint key prefix of every dynamic table's embedding -> its
    ``DynamicTable``."""
    dynamic = getattr(model.sparse_arch, "dynamic_tables", {})
    return {table_key(name): table for name, table in dynamic.items()}
