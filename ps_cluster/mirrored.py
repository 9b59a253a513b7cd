"""Synchronous data parallelism: MirroredStrategy and MultiWorkerMirroredStrategy.

The same feature specs, models and ``dataset_fn`` as the parameter-server
path, for models whose tables fit on every device:

* every replica holds the whole model (tables are plain mirrored variables;
  no partitioner) and gradients are all-reduced each update (table
  gradients stay ``IndexedSlices`` and are all-gathered);
* input comes from ``strategy.distribute_datasets_from_function`` with the
  same ``dataset_fn``, so files are sharded by input pipeline (one pipeline
  per worker) and each replica reads ``global batch / replicas`` rows;
* the learning rates are scaled to the global batch (times the
  accumulation steps) with the PS path's warmup;
* options: gradient accumulation over k micro-batches, mixed precision
  (``mixed_float16`` on GPU with dynamic loss scaling, ``mixed_bfloat16``
  on CPU; logits and loss stay float32), synchronized batch norm (a model
  option, :attr:`models.config.ModelConfig.batch_norm`);
* checkpoints: the chief writes them; every other worker saves into a
  throw-away folder (saving may run collectives, so all must take part)
  and deletes it. Restores read the chief's folder, verified by value.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Callable

import tensorflow as tf
import tf_keras

from psrec.data.dataset import DatasetFn
from psrec.data.dataset import InputConfig
from psrec.errors import ConfigError
from psrec.features.spec import FeatureSpec
from psrec.models.accumulation import add_gradients
from psrec.models.accumulation import zero_non_finite
from psrec.models.config import ModelConfig
from psrec.models.embedding import WIDE_SUFFIX
from psrec.models.optim import OptimizerConfig
from psrec.models.optim import build_optimizers
from psrec.models.ranking import RankingModel
from psrec.models.ranking import build_model
from psrec.models.sizing import DEFAULT_MEMORY_FRACTION
from psrec.models.sizing import check_fits
from psrec.models.sizing import device_memory_bytes
from psrec.models.sizing import estimate_replicated_bytes
from psrec.ps_cluster.checkpoint import CheckpointKeeper
from psrec.ps_cluster.checkpoint import Progress
from psrec.ps_cluster.spec import TFConfig
from psrec.ps_cluster.train_loop import LoopConfig

STRATEGIES = ("mirrored", "multi-worker-mirrored")
COLLECTIVES = ("auto", "ring", "nccl")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


class MirroredConfigError(ConfigError):
    """An option of the mirrored path is invalid here; names it and the value."""


# -- devices and strategies ---------------------------------------------------


def split_cpu(count: int) -> list[str]:
    """Splits the host CPU into ``count`` logical devices (tests, and
    CPU-only machines that want several replicas). Must run before
    TensorFlow initializes its devices.

    Raises:
      MirroredConfigError: ``count`` < 1, or devices already initialized.
    """
    if count < 1:
        raise MirroredConfigError(f"`cpu_replicas` = {count!r} must be >= 1.")
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError as error:
        current = len(tf.config.list_logical_devices("CPU"))
        if current == count:
            return [d.name for d in tf.config.list_logical_devices("CPU")]
        raise MirroredConfigError(
            f"`cpu_replicas` = {count} cannot apply: TensorFlow already "
            f"initialized {current} CPU device(s) in this process; split the "
            "CPU before any other TensorFlow call (e.g. in a fresh "
            "process).") from error
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def has_gpu() -> bool:
    return bool(tf.config.list_physical_devices("GPU"))


def mixed_precision_policy(enabled: bool) -> str:
    """``mixed_float16`` on GPU, ``mixed_bfloat16`` on CPU, or ``float32``."""
    if not enabled:
        return "float32"
    return "mixed_float16" if has_gpu() else "mixed_bfloat16"


def _check_collective(strategy: str, collective: str) -> None:
    if strategy not in STRATEGIES:
        raise MirroredConfigError(
            f"`--strategy` = {strategy!r} is not one of "
            f"{', '.join(STRATEGIES)}.")
    if collective not in COLLECTIVES:
        raise MirroredConfigError(
            f"`--collective` = {collective!r} is not one of "
            f"{', '.join(COLLECTIVES)}.")
    if collective == "nccl" and not has_gpu():
        raise MirroredConfigError(
            "`--collective` = 'nccl' needs GPUs and this machine has none; "
            "use --collective auto or ring.")
    if strategy == "mirrored" and collective == "ring":
        raise MirroredConfigError(
            "`--collective` = 'ring' selects the collective implementation "
            "of --strategy multi-worker-mirrored; with --strategy mirrored "
            "use auto (NCCL on GPUs, collective all-reduce on CPU) or nccl.")


def build_strategy(strategy: str = "mirrored", collective: str = "auto",
                   devices: list[str] | None = None,
                   tf_config: TFConfig | None = None,
                   allow_remote: bool = False) -> tf.distribute.Strategy:
    """The strategy of ``--strategy`` / ``--collective``.

    ``mirrored``: the given devices, else every GPU, else every logical CPU
    device. ``multi-worker-mirrored``: the cluster and task of ``tf_config``
    (default: ``TF_CONFIG``), validated like the PS path's cluster specs;
    create it before any other TensorFlow op of the process.

    Raises:
      MirroredConfigError: bad strategy/collective, or no TF_CONFIG task.
      ClusterSpecError: an invalid or unsafe cluster.
    """
    _check_collective(strategy, collective)
    if strategy == "mirrored":
        if devices is None and not has_gpu():
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
        ops = tf.distribute.NcclAllReduce() if collective == "nccl" else None
        return tf.distribute.MirroredStrategy(devices=devices,
                                              cross_device_ops=ops)
    config = tf_config or TFConfig.from_env()
    if config is None or config.task is None:
        raise MirroredConfigError(
            "--strategy multi-worker-mirrored needs TF_CONFIG with this "
            "worker's task (each worker runs the same command with its own "
            "TF_CONFIG; `psrec tf-config` writes them), or no TF_CONFIG to "
            "start local workers.")
    config.validate(strategy="multi-worker-mirrored",
                    allow_remote=allow_remote)
    implementation = tf.distribute.experimental.CommunicationImplementation
    options = tf.distribute.experimental.CommunicationOptions(
        implementation={"auto": implementation.AUTO,
                        "ring": implementation.RING,
                        "nccl": implementation.NCCL}[collective])
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(config.cluster.to_tf_cluster_dict()),
        task_type=config.to_dict()["task"]["type"],
        task_id=config.task.index, rpc_layer="grpc")
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver, communication_options=options)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """The chief writes checkpoints: the ``chief`` task, else worker 0."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    if resolver.task_type == "chief":
        return True
    jobs = resolver.cluster_spec().as_dict()
    return (resolver.task_type == "worker" and resolver.task_id == 0
            and "chief" not in jobs)


def local_replicas_sharing_memory(strategy: tf.distribute.Strategy) -> int:
    """Replicas of this worker whose copies share one memory: all local
    CPU replicas (logical devices share the host RAM), else 1."""
    devices = strategy.extended.worker_devices
    return len(devices) if all("CPU" in d.upper() for d in devices) else 1


# -- the trainer ----------------------------------------------------------------


def ids_per_example(spec: FeatureSpec, table: str) -> int:
    """Ids one example looks up in ``table`` (or its wide twin)."""
    base = table.removesuffix(WIDE_SUFFIX)
    return sum(f.max_length for f in spec.categorical if f.table == base)


def pad_slices(grad, rows: int):
    """A table gradient padded to exactly ``rows`` slices.

    Replicas touch different numbers of distinct rows, and all-gathering
    ``IndexedSlices`` of different sizes inside a ``tf.while`` loop of
    updates fails (measured: "Shape mismatch in the collective instance" on
    2 CPU replicas). Padding every replica to the same static bound (ids
    per example x per-replica batch x micro-batches) avoids it; the padding
    repeats a touched row with zero values, which the optimizers' duplicate
    summing turns into no change.
    """
    if grad is None or not isinstance(grad, tf.IndexedSlices):
        return grad
    indices = tf.cast(grad.indices, tf.int64)
    size = tf.shape(indices)[0]
    check = tf.debugging.assert_less_equal(
        size, rows, message="table gradient has more rows than the bound")
    with tf.control_dependencies([check]):
        pad = rows - size
    first = tf.concat([indices, tf.zeros([1], tf.int64)], 0)[0]
    indices = tf.concat([indices, tf.fill([pad], first)], 0)
    values = tf.concat([grad.values, tf.zeros(
        tf.stack([pad, tf.shape(grad.values)[1]]), grad.values.dtype)], 0)
    return tf.IndexedSlices(
        tf.ensure_shape(values, [rows] + grad.values.shape[1:].as_list()),
        tf.ensure_shape(indices, [rows]), grad.dense_shape)


@dataclasses.dataclass(frozen=True)
class MirroredResult:
    """Outcome of :meth:`MirroredTrainer.train`."""

    start_step: int
    step: int
    examples: int
    seconds: float
    final_loss: float
    losses: tuple[float, ...]
    checkpoint: str | None
    replicas: int
    global_batch_size: int

    @property
    def examples_per_sec(self) -> float:
        return self.examples / self.seconds if self.seconds else 0.0


class MirroredTrainer:
    """Trains a ranking model with a mirrored strategy.

    Args:
      strategy: a ``MirroredStrategy``, ``MultiWorkerMirroredStrategy`` or
        ``OneDeviceStrategy`` (see :func:`build_strategy`).
      spec: the feature spec.
      model_config: the architecture (``batch_norm="sync"`` for synchronized
        batch normalization).
      optimizer_config: optimizers; learning rates are scaled to
        ``batch_size * grad_accum_steps``.
      input_config: ``batch_size`` is the GLOBAL batch of one micro-batch
        (per replica: ``batch_size / replicas``).
      grad_accum_steps: micro-batches summed per update (k).
      precision: ``float32``, ``mixed_float16`` or ``mixed_bfloat16``.
      checkpoint_dir: the chief's checkpoint folder (None: none).
      memory_fraction: the size guard's budget (None: no guard).
      keep_checkpoints: recent checkpoints the chief keeps.

    Raises:
      MirroredConfigError: a batch size that does not split over replicas,
        bad accumulation steps or precision.
      ModelTooLargeError: tables and slots do not fit (``--strategy ps``).
    """

    def __init__(self, strategy: tf.distribute.Strategy, spec: FeatureSpec,
                 model_config: ModelConfig,
                 optimizer_config: OptimizerConfig = OptimizerConfig(),
                 input_config: InputConfig = InputConfig(), *,
                 grad_accum_steps: int = 1, precision: str = "float32",
                 checkpoint_dir: str | Path | None = None,
                 memory_fraction: float | None = DEFAULT_MEMORY_FRACTION,
                 keep_checkpoints: int = 3) -> None:
        self.strategy = strategy
        self.spec = spec
        self.input_config = input_config
        self.replicas = strategy.num_replicas_in_sync
        if input_config.batch_size % self.replicas:
            raise MirroredConfigError(
                f"`--batch-size` = {input_config.batch_size} (the global "
                f"batch) must be a multiple of the {self.replicas} replicas "
                "in sync.")
        if grad_accum_steps < 1:
            raise MirroredConfigError(
                f"`--grad-accum-steps` = {grad_accum_steps!r} must be >= 1.")
        if precision not in PRECISIONS:
            raise MirroredConfigError(
                f"`precision` = {precision!r} is not one of "
                f"{', '.join(PRECISIONS)}.")
        self.grad_accum_steps = grad_accum_steps
        self.precision = precision
        self.chief = is_chief(strategy)
        if memory_fraction is not None:
            check_fits(estimate_replicated_bytes(spec, model_config,
                                                 optimizer_config),
                       device_memory_bytes(), memory_fraction,
                       local_replicas_sharing_memory(strategy))
        previous = tf_keras.mixed_precision.global_policy()
        tf_keras.mixed_precision.set_global_policy(precision)
        try:
            with strategy.scope():
                self.model: RankingModel = build_model(spec, model_config)
                self.sparse_optimizer, self.dense_optimizer = build_optimizers(
                    optimizer_config,
                    input_config.batch_size * grad_accum_steps)
                self.loss_scale = None
                if precision == "mixed_float16":
                    self.loss_scale = (
                        tf_keras.mixed_precision.LossScaleOptimizer(
                            self.dense_optimizer))
                    self.dense_optimizer = self.loss_scale
                self.sparse_optimizer._create_all_weights(  # noqa: SLF001
                    self.model.embedding_variables())
                self.dense_optimizer._create_all_weights(  # noqa: SLF001
                    self.model.dense_variables())
        finally:
            tf_keras.mixed_precision.set_global_policy(previous)
        self.progress = Progress()
        self.checkpoint = tf.train.Checkpoint(
            model=self.model, sparse_optimizer=self.sparse_optimizer,
            dense_optimizer=self.dense_optimizer, progress=self.progress)
        self.checkpoint_dir = (Path(checkpoint_dir) if checkpoint_dir
                               is not None else None)
        self.keeper = (CheckpointKeeper(self.checkpoint_dir, self.checkpoint,
                                        max_to_keep=keep_checkpoints)
                       if self.checkpoint_dir is not None else None)
        self._functions: dict[int, Callable] = {}
        self.scratch_saves = 0
        per_replica = input_config.batch_size // self.replicas
        self._slice_rows = [
            per_replica * grad_accum_steps * ids_per_example(spec, name)
            for name in self.model.sparse_arch.tables]

    @property
    def global_batch_size(self) -> int:
        return self.input_config.batch_size

    # -- checkpoints ------------------------------------------------------------

    def restore(self) -> str | None:
        """Restores the chief's latest checkpoint on every worker (verified
        by value); returns its path."""
        if self.keeper is None or self.keeper.latest is None:
            return None
        path = self.keeper.restore(self.keeper.latest)
        self.progress.resumes.assign_add(1)
        return path

    def save(self) -> str | None:
        """Every worker calls this together: the chief writes the real
        checkpoint; the others write into a temporary folder, deleted at
        once. Returns the chief's path (None on other workers)."""
        if self.keeper is None:
            return None
        step = int(self.progress.step.numpy())
        if self.chief:
            return self.keeper.save(step)
        scratch = self.scratch_dir
        try:
            CheckpointKeeper(scratch, self.checkpoint).save(step)
            self.scratch_saves += 1
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return None

    @property
    def scratch_dir(self) -> Path:
        """Where a non-chief worker saves (deleted after each save)."""
        resolver = self.strategy.cluster_resolver
        name = f"{resolver.task_type}-{resolver.task_id}"
        return self.checkpoint_dir.parent / (
            f".{self.checkpoint_dir.name}-{name}-scratch")

    # -- training ----------------------------------------------------------------

    def _replica_step(self, batches: list[dict[str, tf.Tensor]]):
        label = self.spec.label.name
        tables = self.model.embedding_variables()
        dense = self.model.dense_variables()
        variables = tables + dense
        scale = self.global_batch_size * self.grad_accum_steps
        total, loss_sum, count = None, tf.constant(0.0), tf.constant(
            0, tf.int64)
        for batch in batches:
            with tf.GradientTape() as tape:
                logits = tf.cast(self.model(batch, training=True), tf.float32)
                per_example = tf.nn.sigmoid_cross_entropy_with_logits(
                    labels=tf.cast(batch[label], tf.float32), logits=logits)
                loss = tf.reduce_sum(per_example) / scale
                scaled = (self.loss_scale.get_scaled_loss(loss)
                          if self.loss_scale is not None else loss)
            grads = tape.gradient(scaled, variables)
            total = add_gradients(total, grads)
            loss_sum += loss
            count += tf.size(batch[label], out_type=tf.int64)
        if self.replicas > 1:
            total[:len(tables)] = [
                pad_slices(g, rows) for g, rows in
                zip(total[:len(tables)], self._slice_rows)]
        if self.loss_scale is not None:
            total = self.loss_scale.get_unscaled_gradients(total)
            # The dense LossScaleOptimizer skips a non-finite step and
            # lowers the scale; the tables then get no update from it.
            total[:len(tables)] = [zero_non_finite(g)
                                   for g in total[:len(tables)]]
        self.sparse_optimizer.apply_gradients(zip(total[:len(tables)],
                                                  tables))
        self.dense_optimizer.apply_gradients(zip(total[len(tables):], dense))
        return loss_sum, count

    def train_function(self, steps: int) -> Callable:
        """A ``tf.function(iterator)`` running ``steps`` updates; returns
        ``(loss_sum, examples)`` summed over them (loss per example)."""
        if steps in self._functions:
            return self._functions[steps]
        k = self.grad_accum_steps
        strategy = self.strategy

        @tf.function
        def train(iterator):
            loss_sum = tf.constant(0.0)
            examples = tf.constant(0, tf.int64)
            for _ in tf.range(steps):
                batches = [next(iterator) for _ in range(k)]
                loss, count = strategy.run(self._replica_step,
                                           args=(batches,))
                loss_sum += strategy.reduce("SUM", loss, axis=None)
                examples += strategy.reduce("SUM", count, axis=None)
            return loss_sum, examples

        self._functions[steps] = train
        return train

    def distribute(self, dataset_fn: DatasetFn):
        """An iterator over ``distribute_datasets_from_function``."""
        return iter(self.strategy.distribute_datasets_from_function(
            dataset_fn))

    def train(self, dataset_fn: DatasetFn, loop: LoopConfig,
              on_progress: Callable[[int, float, int], None] | None = None,
              on_boundary: Callable[[int, str | None], None] | None = None
              ) -> MirroredResult:
        """Trains from the current progress step up to ``loop.steps``,
        ``loop.steps_per_closure`` updates per ``tf.function`` call, and
        checkpoints every ``loop.checkpoint_every`` steps and at the end.

        ``on_progress(step, mean loss, examples)`` after every call;
        ``on_boundary(step, checkpoint path)`` after every checkpoint.
        """
        iterator = self.distribute(dataset_fn)
        start = int(self.progress.step.numpy())
        step, examples, losses = start, 0, []
        path = self.keeper.latest if self.keeper is not None else None
        began = time.perf_counter()
        while step < loop.steps:
            target = loop.steps
            if loop.checkpoint_every:
                target = min(target, (step // loop.checkpoint_every + 1)
                             * loop.checkpoint_every)
            while step < target:
                steps = min(loop.steps_per_closure, target - step)
                loss_sum, count = self.train_function(steps)(iterator)
                step += steps
                examples += int(count)
                losses.append(float(loss_sum) / steps)
                self.progress.step.assign(step)
                self.progress.examples.assign_add(int(count))
                if on_progress is not None:
                    on_progress(step, losses[-1], int(count))
            saved = self.save()
            path = saved or path
            if on_boundary is not None:
                on_boundary(step, saved)
        return MirroredResult(
            start_step=start, step=step, examples=examples,
            seconds=time.perf_counter() - began,
            final_loss=losses[-1] if losses else float("nan"),
            losses=tuple(losses), checkpoint=path, replicas=self.replicas,
            global_batch_size=self.global_batch_size)
