"""PSTrainer: model, optimizers, checkpoints and the loop on a PS cluster."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable

import tensorflow as tf

from psrec.data.dataset import DatasetFn
from psrec.data.dataset import InputConfig
from psrec.data.dataset import make_train_dataset_fn
from psrec.data.manifest import Manifest
from psrec.features.spec import FeatureSpec
from psrec.models.config import ModelConfig
from psrec.models.optim import OptimizerConfig
from psrec.models.optim import build_optimizers
from psrec.models.ranking import RankingModel
from psrec.models.ranking import build_model
from psrec.ps_cluster.checkpoint import CheckpointKeeper
from psrec.ps_cluster.checkpoint import Progress
from psrec.ps_cluster.metrics import EvalResult
from psrec.ps_cluster.partitioning import PartitionConfig
from psrec.ps_cluster.spec import ClusterSpec
from psrec.ps_cluster.strategy import build_coordinator
from psrec.ps_cluster.strategy import build_strategy
from psrec.ps_cluster.train_loop import ClosureLoop
from psrec.ps_cluster.train_loop import LoopConfig
from psrec.ps_cluster.train_loop import evaluate
from psrec.ps_cluster.train_loop import make_eval_closure
from psrec.ps_cluster.train_loop import make_train_closure


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """Outcome of :meth:`PSTrainer.train`."""

    start_step: int
    step: int
    executed_steps: int
    examples: int
    seconds: float
    final_loss: float
    eval: EvalResult | None
    checkpoint: str | None
    closure_seconds: tuple[float, ...] = ()
    closures_per_worker: dict[int, int] = dataclasses.field(
        default_factory=dict)

    @property
    def examples_per_sec(self) -> float:
        return self.examples / self.seconds if self.seconds else 0.0


def create_optimizer_slots(optimizer, variables: list[tf.Variable]) -> None:
    """Creates an optimizer's slots now (under the strategy scope), so that a
    restore fills them before training instead of deferring silently."""
    optimizer._create_all_weights(variables)  # pylint: disable=protected-access


class PSTrainer:
    """Trains a ranking model on a parameter-server cluster.

    Args:
      cluster: the PS/worker cluster (servers already running).
      spec: the feature spec.
      model_config: the architecture.
      optimizer_config: optimizers and learning rates.
      input_config: batch size and shuffling.
      partition: how tables are sharded across PS tasks.
      checkpoint_dir: where the coordinator writes checkpoints (None: none).
      keep_checkpoints: how many recent checkpoints are kept.
    """

    def __init__(self, cluster: ClusterSpec, spec: FeatureSpec,
                 model_config: ModelConfig,
                 optimizer_config: OptimizerConfig = OptimizerConfig(),
                 input_config: InputConfig = InputConfig(),
                 partition: PartitionConfig = PartitionConfig(),
                 checkpoint_dir: str | Path | None = None,
                 keep_checkpoints: int = 3) -> None:
        self.cluster = cluster
        self.spec = spec
        self.input_config = input_config
        self.strategy = build_strategy(cluster, partition)
        self.coordinator = build_coordinator(self.strategy)
        with self.strategy.scope():
            self.model: RankingModel = build_model(spec, model_config)
            self.sparse_optimizer, self.dense_optimizer = build_optimizers(
                optimizer_config, input_config.batch_size)
            create_optimizer_slots(self.sparse_optimizer,
                                   self.model.embedding_variables())
            create_optimizer_slots(self.dense_optimizer,
                                   self.model.dense_variables())
        self.progress = Progress()  # on the coordinator, outside the scope
        self.checkpoint = tf.train.Checkpoint(
            model=self.model, sparse_optimizer=self.sparse_optimizer,
            dense_optimizer=self.dense_optimizer, progress=self.progress)
        self.keeper = None
        if checkpoint_dir is not None:
            self.keeper = CheckpointKeeper(
                checkpoint_dir, self.checkpoint,
                optimizers={"sparse_optimizer": self.sparse_optimizer,
                            "dense_optimizer": self.dense_optimizer},
                tables=table_checkpoint_keys(self.model),
                max_to_keep=keep_checkpoints)

    @property
    def executed_steps(self) -> int:
        """Optimizer updates actually applied (>= scheduled steps when a
        closure was re-run after a worker loss: at-least-once)."""
        return int(self.dense_optimizer.iterations.numpy())

    def restore(self) -> str | None:
        """Restores the latest checkpoint (verified); returns its path."""
        if self.keeper is None:
            return None
        path = self.keeper.restore()
        if path is not None:
            self.progress.resumes.assign_add(1)
        return path

    def save(self) -> str | None:
        if self.keeper is None:
            return None
        return self.keeper.save(int(self.progress.step.numpy()))

    def evaluate(self, manifest: Manifest, batch_size: int | None = None
                 ) -> EvalResult:
        closure = make_eval_closure(self.model, self.spec,
                                    batch_size or self.input_config.batch_size,
                                    manifest.block_rows)
        return evaluate(self.coordinator, closure, manifest.files("eval"))

    def dataset_fn(self, manifest: Manifest) -> DatasetFn:
        """The training ``dataset_fn`` of ``manifest``; its shuffle seed is
        offset by the number of resumes so a resumed run sees a new order."""
        resumes = int(self.progress.resumes.numpy())
        config = dataclasses.replace(
            self.input_config, seed=self.input_config.seed + 7919 * resumes)
        return make_train_dataset_fn(manifest, self.spec, config,
                                     ps_workers=self.cluster.num_workers)

    def train(self, dataset_fn: DatasetFn, loop: LoopConfig,
              eval_manifest: Manifest | None = None,
              on_progress: Callable[[int, float, int], None] | None = None,
              on_boundary: Callable[[int, EvalResult | None, str | None],
                                    None] | None = None,
              heartbeat: Callable[[], None] | None = None
              ) -> TrainResult:
        """Trains from the current progress step up to ``loop.steps``.

        Args:
          dataset_fn: per-worker training input (see :meth:`dataset_fn`).
          loop: scheduling configuration.
          on_progress: ``(step, loss, examples)`` per finished closure.
          eval_manifest: evaluated at eval boundaries and at the end.
          on_boundary: ``(step, eval result or None, checkpoint path or
            None)`` at each join boundary.
          heartbeat: called whenever work completes (closure, eval,
            checkpoint); feeds the stall watchdog.
        """
        beat = heartbeat or (lambda: None)
        self.loop = closures = ClosureLoop(
            self.coordinator,
            lambda steps: make_train_closure(
                self.strategy, self.model, self.sparse_optimizer,
                self.dense_optimizer, self.spec, steps),
            dataset_fn, self.cluster.num_workers, loop)
        start = int(self.progress.step.numpy())
        step, examples, last_loss = start, 0, float("nan")
        began = time.perf_counter()
        eval_result, path = None, None
        has_eval = eval_manifest is not None and bool(
            eval_manifest.files("eval"))

        def on_result(at: int, loss_sum: float, count: int) -> None:
            nonlocal examples, last_loss
            examples += count
            steps = max(1, count // max(1, self.input_config.batch_size))
            last_loss = loss_sum / steps
            self.progress.step.assign(at)
            self.progress.examples.assign_add(count)
            beat()
            if on_progress is not None:
                on_progress(at, last_loss, count)

        while step < loop.steps:
            target = _next_boundary(step, loop)
            step = closures.run(step, target, on_result)
            eval_result = None
            if has_eval and (step >= loop.steps or (
                    loop.eval_every and step % loop.eval_every == 0)):
                eval_result = self.evaluate(eval_manifest)
                beat()
            saved = None
            if step >= loop.steps or (loop.checkpoint_every and
                                      step % loop.checkpoint_every == 0):
                saved = path = self.save()
                beat()
            if on_boundary is not None:
                on_boundary(step, eval_result, saved)
        if start >= loop.steps and self.keeper is not None:  # already done
            path = self.keeper.latest
            if has_eval:
                eval_result = self.evaluate(eval_manifest)
        return TrainResult(
            start_step=start, step=step, executed_steps=self.executed_steps,
            examples=examples, seconds=time.perf_counter() - began,
            final_loss=last_loss, eval=eval_result, checkpoint=path,
            closure_seconds=tuple(closures.closure_seconds),
            closures_per_worker=dict(closures.closures_per_pipeline))

    def describe_pending(self) -> str:
        """Closures in flight and per-worker progress (for the watchdog)."""
        loop = getattr(self, "loop", None)
        if loop is None:
            return "training loop not started"
        now = time.monotonic()
        workers = "; ".join(
            f"worker {w}: {loop.closures_per_pipeline[w]} closures finished, "
            + (f"last {now - loop.last_result_at[w]:.0f} s ago"
               if w in loop.last_result_at else "none yet")
            for w in range(self.cluster.num_workers))
        return (f"{loop.in_flight} closure(s) scheduled and not collected "
                f"(the oldest is awaited); step "
                f"{int(self.progress.step.numpy())}; {workers}. A worker "
                "whose last result is oldest holds the stalled closure.")


def _next_boundary(step: int, loop: LoopConfig) -> int:
    """The next step at which to join: eval, checkpoint or the end."""
    candidates = [loop.steps]
    for every in (loop.eval_every, loop.checkpoint_every):
        if every:
            candidates.append((step // every + 1) * every)
    return min(c for c in candidates if c > step)


def table_checkpoint_keys(model: RankingModel) -> dict[str, object]:
    """Checkpoint key prefix of every table variable -> the variable."""
    return {f"model/sparse_arch/{name}": variable
            for name, variable in model.sparse_arch.tables.items()}
