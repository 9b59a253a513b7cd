"""The one training step of psrec, for every strategy.

:func:`make_train_function` builds the ``tf.function(iterator)`` that runs
``steps`` optimizer updates. Under ``ParameterServerStrategy`` it is the
closure the coordinator schedules on a worker; under the mirrored
strategies, one device or no strategy it is called directly. ``psrec
advise`` and ``psrec bench`` time the same function.

Loss normalisation: each replica's loss is its summed per-example loss
divided by the GLOBAL batch (``tf.nn.compute_average_loss``: the replica's
rows times the replicas in sync) and by the micro-batches per update, so
the all-reduced (summed) gradients are those of the mean over every row of
the update. A worker with several GPUs under PS, or a mirrored run, thus
takes the same step size and logs the same loss as one device would.
With several labels (a multi-task spec) the loss is the weighted sum of the
tasks' losses, each normalised by the rows of the global batch that have
its label (:meth:`TrainStep._multi_task_loss`).

Mixed float16 (GPU): the loss is scaled by a dynamic loss scale; when any
gradient of any replica is not finite, the whole update -- tables and dense
weights, on every replica -- is skipped and the scale halved, as Keras'
``LossScaleOptimizer`` does for one optimizer. float32: a non-finite loss
or gradient is never applied; the run ends naming the step
(:class:`NonFiniteLossError`).
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from psrec.data.input.dataset import EPOCH_COLUMN
from psrec.data.input.dataset import PIPELINE_COLUMN
from psrec.errors import ConfigError
from psrec.features.spec.spec import ID_COLUMN
from psrec.features.spec.spec import FeatureSpec
from psrec.models.embedding.sparse_arch import WIDE_SUFFIX
from psrec.models.optim.accumulation import add_gradients
from psrec.models.ranking.model import RankingModel
from psrec.models.ranking.model import task_labels

Batch = dict[str, tf.Tensor]


class NonFiniteLossError(ConfigError):
    """A float32 training step had a non-finite loss or gradient; the step
    was not applied and the run stops (exit 2)."""

    def __init__(self, step: int, checkpoint: str | None = None) -> None:
        self.step = step
        super().__init__(self.describe(step, checkpoint))

    @staticmethod
    def describe(step: int, checkpoint: str | None) -> str:
        last = (f"The last good checkpoint is {checkpoint}" if checkpoint
                else "No checkpoint was written before it")
        return (f"step {step}: the loss or a gradient is not finite (NaN or "
                f"inf); the update was not applied and training stopped. "
                f"{last}: lower the learning rates or fix the data, then "
                "rerun (training resumes from the latest checkpoint).")

    def with_checkpoint(self, checkpoint: str | None) -> NonFiniteLossError:
        return NonFiniteLossError(self.step, checkpoint)


class DynamicLossScale(tf.Module):
    """A dynamic loss scale shared by both optimizers (mixed float16); it
    doubles after ``growth_steps`` finite updates in a row."""

    def __init__(self, initial: float = 2.0 ** 15,
                 growth_steps: int = 2000) -> None:
        super().__init__(name="loss_scale")
        self.growth_steps = growth_steps
        aggregation = tf.VariableAggregation.ONLY_FIRST_REPLICA
        self.scale = tf.Variable(initial, dtype=tf.float32, trainable=False,
                                 aggregation=aggregation, name="scale")
        self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False,
                                      aggregation=aggregation,
                                      name="good_steps")

    def update(self, finite: tf.Tensor) -> tf.Operation:
        """Halves the scale after an overflow, doubles it after
        ``growth_steps`` finite updates (call in cross-replica context)."""
        grow = tf.logical_and(finite,
                              self.good_steps + 1 >= self.growth_steps)
        new_scale = tf.where(
            finite, tf.where(grow, self.scale * 2.0, self.scale),
            tf.maximum(1.0, self.scale / 2.0))
        new_good = tf.where(tf.logical_and(finite, tf.logical_not(grow)),
                            self.good_steps + 1, tf.zeros_like(
                                self.good_steps))
        return tf.group(self.scale.assign(new_scale),
                        self.good_steps.assign(new_good))


def finite_flag(grads: list, loss: tf.Tensor | None = None) -> tf.Tensor:
    """True iff every value of ``grads`` (the values of ``IndexedSlices``)
    and ``loss`` is finite, from ONE scalar: their float32 sum.

    A NaN or an inf anywhere makes the sum NaN or inf, and a sum of finite
    values is finite unless it overflows float32 (|sum| > 3.4e38): such an
    exploding update is reported as not finite too, which is the wanted
    outcome. One ``reduce_sum`` per gradient and one ``is_finite`` replace
    an ``is_finite`` (a boolean copy of every gradient) and a
    ``reduce_all`` per gradient (measured about 3x cheaper:
    docs/benchmarks.md, the step's cost)."""
    parts = [tf.reduce_sum(tf.cast(
        g.values if isinstance(g, tf.IndexedSlices) else g, tf.float32))
        for g in grads if g is not None]
    if loss is not None:
        parts.append(tf.cast(tf.reshape(loss, []), tf.float32))
    if not parts:
        return tf.constant(True)
    return tf.math.is_finite(tf.add_n(parts))


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


class TrainStep:
    """One optimizer update on one replica (call inside ``strategy.run``).

    Args:
      sparse_optimizer: trains ``model.embedding_variables()`` of the
        tables ``table_optimizers`` does not name.
      dense_optimizer: trains ``model.dense_variables()``.
      label: the label column, or the spec's ``LabelConfig`` (its ``loss``
        ``mse`` trains on the squared error of the model's output), or the
        spec's ``labels`` (several tasks: :meth:`_multi_task_loss`).
      loss_scale: a :class:`DynamicLossScale` under mixed float16, else None.
      prepare_table_grads: optional ``grads -> grads`` applied to the table
        gradients before the update (the mirrored path pads them to a
        static size for the all-gather).
      example_losses: ``batch -> [B]`` per-example losses of the task
        (retrieval: a sampled softmax); None: the logloss of the model's
        logits against ``label``.
      table_optimizers: table name -> the optimizer that trains it (and
        its wide twin), one ``apply_gradients`` per distinct optimizer
        (``models.optim.optimizers.build_table_optimizers``).
      on_table_update: ``table grads -> None``, called in the apply right
        after the sparse update (``ChangeTracker.mark``: flags the rows
        written, on each shard's PS).
    """

    def __init__(self, model: RankingModel, sparse_optimizer,
                 dense_optimizer, label: str, *,
                 loss_scale: DynamicLossScale | None = None,
                 prepare_table_grads: Callable[[list], list] | None = None,
                 example_losses: Callable[[Batch], tf.Tensor] | None = None,
                 table_optimizers: dict | None = None,
                 on_table_update: Callable[[list], None] | None = None
                 ) -> None:
        self.model = model
        self.sparse_optimizer = sparse_optimizer
        self.table_optimizers = dict(table_optimizers or {})
        self.dense_optimizer = dense_optimizer
        labels = (tuple(label) if isinstance(label, (tuple, list))
                  else (label,))
        self.labels = labels
        self.label = getattr(labels[0], "name", labels[0])
        self.regression = getattr(labels[0], "loss", "logloss") == "mse"
        self.loss_scale = loss_scale
        self._prepare = prepare_table_grads
        self._on_table_update = on_table_update
        self.example_losses = example_losses or self._label_loss

    def _label_loss(self, batch: Batch) -> tf.Tensor:
        """The logloss of the logits, or (``mse``) the squared error of
        the output as a prediction of the label."""
        output = tf.cast(self.model(batch, training=True), tf.float32)
        label = tf.cast(batch[self.label], tf.float32)
        if self.regression:
            return tf.square(output - label)
        return tf.nn.sigmoid_cross_entropy_with_logits(labels=label,
                                                       logits=output)

    def batch_loss(self, batch: Batch) -> tf.Tensor:
        """This replica's share of the batch's loss: the per-example losses
        summed and divided by the GLOBAL batch; with several tasks, the
        weighted sum of each task's loss (:meth:`_multi_task_loss`)."""
        if len(self.labels) > 1:
            return self._multi_task_loss(batch)
        return tf.nn.compute_average_loss(self.example_losses(batch))

    def _multi_task_loss(self, batch: Batch) -> tf.Tensor:
        """``sum_t weight_t * loss_t``, where ``loss_t`` is task t's summed
        loss over the rows that have its label divided by the count of such
        rows in the GLOBAL batch (all-reduced over the replicas in sync; a
        missing label is NaN in the records). A row without task t's label
        contributes nothing to ``loss_t`` or its gradients; with every label
        present ``loss_t`` is the global-batch mean, as for one label."""
        outputs = self.model(batch, training=True)
        targets = task_labels(self.model.spec, batch)  # NaN -> 0, masked
        sums, counts = [], []
        for label in self.labels:
            value, present = targets[label.name]
            output = tf.cast(outputs[label.name], tf.float32)
            per_example = (tf.square(output - value) if label.regression
                           else tf.nn.sigmoid_cross_entropy_with_logits(
                               labels=value, logits=output))
            weights = tf.cast(present, tf.float32)
            sums.append(tf.reduce_sum(per_example * weights))
            counts.append(tf.reduce_sum(weights))
        counts = tf.distribute.get_replica_context().all_reduce(
            "SUM", tf.stack(counts))
        return tf.add_n([
            label.weight * total / tf.maximum(counts[t], 1.0)
            for t, (label, total) in enumerate(zip(self.labels, sums))])

    @property
    def stops_on_non_finite(self) -> bool:
        """float32: a non-finite loss or gradient ends the run (mixed
        float16 skips the update and lowers the loss scale instead)."""
        return self.loss_scale is None

    def __call__(self, batches: list[Batch]
                 ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Gradients of ``len(batches)`` micro-batches summed into one update.

        Returns this replica's share of the update's mean loss, its row
        count (both summed over replicas by the caller) and 1 when the
        update was not applied because a loss or gradient of some replica
        is not finite under float32 (else 0; the same on every replica).
        """
        tables = self.model.embedding_variables()
        dense = self.model.dense_variables()
        total, loss_sum = None, tf.constant(0.0)
        count = tf.constant(0, tf.int64)
        for batch in batches:
            with tf.GradientTape() as tape:
                loss = self.batch_loss(batch) / len(batches)
                scaled = (loss * self.loss_scale.scale
                          if self.loss_scale is not None else loss)
            # Shards, not ShardedVariables: the tape rejects the latter.
            total = add_gradients(total, tape.gradient(scaled,
                                                       tables + dense))
            loss_sum += loss
            count += tf.size(batch[self.label], out_type=tf.int64)
        table_grads, dense_grads = total[:len(tables)], total[len(tables):]
        if self._prepare is not None:
            table_grads = self._prepare(table_grads)
        finite = self._apply_if_finite(table_grads, dense_grads, tables,
                                       dense, loss_sum)
        skipped = tf.cast(tf.logical_not(finite), tf.int64)
        if not self.stops_on_non_finite:
            skipped = tf.zeros_like(skipped)  # float16: skipping is normal
        return loss_sum, count, skipped

    def _apply_if_finite(self, table_grads, dense_grads, tables, dense,
                         loss) -> tf.Tensor:
        """All-reduces the (unscaled) gradients, then in cross-replica
        context applies both optimizers only if every value of every
        replica -- and under float32 the loss -- is finite (a ``tf.cond``
        around ``apply_gradients`` must not sit in a replica context: it
        calls ``merge_call``). Returns that all-finite flag."""
        context = tf.distribute.get_replica_context()
        grads = table_grads + dense_grads
        if self.loss_scale is not None:
            inverse = 1.0 / self.loss_scale.scale
            grads = [None if g is None else (
                tf.IndexedSlices(g.values * inverse, g.indices, g.dense_shape)
                if isinstance(g, tf.IndexedSlices) else g * inverse)
                for g in grads]
        # ParameterServerStrategy refuses pre-aggregated gradients: there
        # each replica checks its own and the flags are all-reduced.
        ps = isinstance(tf.distribute.get_strategy(),
                        tf.distribute.ParameterServerStrategy)
        if not ps:
            grads = context.all_reduce("SUM", grads)
        finite = finite_flag(grads,
                             loss if self.stops_on_non_finite else None)
        finite = tf.equal(context.all_reduce("SUM", tf.cast(
            tf.logical_not(finite), tf.float32)), 0.0)
        split = len(table_grads)

        groups = self._table_groups(grads[:split], tables)

        def apply_in_replica(grads):
            for optimizer, indices in groups:
                optimizer.apply_gradients(
                    [(grads[i], tables[i]) for i in indices],
                    experimental_aggregate_gradients=ps)
            if self._on_table_update is not None:
                self._on_table_update(grads[:split])
            self.dense_optimizer.apply_gradients(
                zip(grads[split:], dense),
                experimental_aggregate_gradients=ps)

        def cross_replica(strategy, grads, finite):
            def apply():
                strategy.extended.call_for_each_replica(apply_in_replica,
                                                        args=(grads,))
                return tf.constant(True)

            def skip():
                if self.loss_scale is not None:
                    # apply_gradients counts iterations; a skipped update too.
                    self.dense_optimizer.iterations.assign_add(1)
                    for optimizer, _ in groups:
                        optimizer.iterations.assign_add(1)
                return tf.constant(False)

            finite = strategy.experimental_local_results(finite)[0]
            applied = tf.cond(finite, apply, skip)
            if self.loss_scale is None:
                return applied
            with tf.control_dependencies([applied]):
                return self.loss_scale.update(finite)

        done = context.merge_call(cross_replica, args=(grads, finite))
        with tf.control_dependencies([done]):
            return tf.identity(finite)

    def _table_groups(self, table_grads: list, tables: list
                      ) -> list[tuple[object, list[int]]]:
        """``(optimizer, indices of its table variables)`` per optimizer
        (``table_optimizers``, else ``sparse_optimizer``), in order, for the
        variables with a gradient (a group without any is left out:
        ``apply_gradients`` refuses an update of nothing)."""
        owner = {}
        for name, variable in self.model.sparse_arch.tables.items():
            optimizer = self.table_optimizers.get(
                name.removesuffix(WIDE_SUFFIX), self.sparse_optimizer)
            for shard in getattr(variable, "variables", [variable]):
                owner[id(shard)] = optimizer
        groups: dict[int, tuple[object, list[int]]] = {}
        for index, (grad, variable) in enumerate(zip(table_grads, tables)):
            if grad is None:
                continue
            optimizer = owner.get(id(variable), self.sparse_optimizer)
            groups.setdefault(id(optimizer), (optimizer, []))[1].append(
                index)
        return list(groups.values())


def make_train_function(strategy: tf.distribute.Strategy, step: TrainStep,
                        steps: int, micro_batches: int = 1, *,
                        with_rows: bool = False) -> Callable:
    """A ``tf.function(iterator)`` running ``steps`` updates of ``step``.

    Returns ``(loss_sum, examples, seconds, pipeline, not_run)``: the
    per-update mean losses summed over the updates applied, the rows trained
    on, the wall time where the function ran (on a PS worker: with its PS
    round trips), the input pipeline (worker) that fed it (-1 unknown) and
    the updates not applied (float32, a non-finite loss or gradient): the
    function stops at that update, so ``not_run`` counts it and every later
    one (0: all applied). With ``with_rows`` it also returns the ids and
    epochs of the rows of the updates applied
    (``psrec.ps_cluster.training.coverage`` tallies them).
    """

    @tf.function
    def train(iterator):
        began = tf.timestamp()
        with tf.control_dependencies([began]):  # order the two timestamps
            loss_sum = tf.constant(0.0)
            examples = tf.constant(0, tf.int64)
        pipeline = tf.constant(-1, tf.int64)
        not_run = tf.constant(0, tf.int64)
        ids, epochs = _row_arrays()  # written only when with_rows
        for index in tf.range(steps, dtype=tf.int64):
            batches = [next(iterator) for _ in range(micro_batches)]
            loss, count, skipped = strategy.run(step, args=(batches,))
            first = strategy.experimental_local_results(batches[0])[0]
            if PIPELINE_COLUMN in first:
                pipeline = first[PIPELINE_COLUMN]
            if strategy.reduce("SUM", skipped, axis=None) > 0:
                not_run = steps - index
                break
            loss_sum += strategy.reduce("SUM", loss, axis=None)
            examples += strategy.reduce("SUM", count, axis=None)
            if with_rows:
                ids, epochs = _log_rows(strategy, batches, ids, epochs)
        with tf.control_dependencies([loss_sum, examples, not_run]):
            ended = tf.timestamp()
        result = (loss_sum, examples, ended - began, pipeline, not_run)
        if not with_rows:
            return result
        return result + (_concat(ids), _concat(epochs))

    return train


def _row_arrays() -> tuple[tf.TensorArray, tf.TensorArray]:
    """Empty logs of the ids and epochs of the rows trained on (one vector
    per batch)."""
    return tuple(tf.TensorArray(tf.int64, size=0, dynamic_size=True,
                                infer_shape=False, element_shape=[None])
                 for _ in range(2))


def _log_rows(strategy: tf.distribute.Strategy, batches: list,
              ids: tf.TensorArray, epochs: tf.TensorArray
              ) -> tuple[tf.TensorArray, tf.TensorArray]:
    for batch in batches:
        for part in strategy.experimental_local_results(batch):
            ids = ids.write(ids.size(), part[ID_COLUMN])
            epochs = epochs.write(epochs.size(),
                                  tf.cast(part[EPOCH_COLUMN], tf.int64))
    return ids, epochs


def _concat(array: tf.TensorArray) -> tf.Tensor:
    """The logged rows (an empty vector when nothing was written: the
    first update of the call was not applied)."""
    return tf.cond(array.size() > 0, array.concat,
                   lambda: tf.zeros([0], tf.int64))
