"""The non-finite guard of the train step (``ps_cluster/training/step.py``):
one scalar -- the float32 sum of every aggregated gradient value and the
loss -- decides whether the whole update is applied.

Under float32 a NaN in one gradient (a table's ``IndexedSlices`` or a dense
weight's) or an inf in the loss skips the update -- tables, dense weights,
optimizer slots and iteration counters unchanged -- and the train function
counts the step as not run; a finite step applies. Checked under the
``one-device`` strategy and under ParameterServerStrategy (closures on a
worker of the in-process cluster). Mixed float16's skip-and-halve is
``tests/test_step.py::test_fp16_overflow_skips_tables_dense_and_slots_on_every_replica``.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from psrec.features import criteo
from psrec.ps_cluster.training.step import finite_flag

SPEC = criteo(buckets=50, dim=4)
BATCH = 16
POISONS = ("nan_in_a_table_gradient", "nan_in_a_dense_gradient",
           "inf_in_the_loss")


# -- the flag ---------------------------------------------------------------------


def _slices(values) -> tf.IndexedSlices:
    values = tf.constant(values, tf.float32)
    return tf.IndexedSlices(values, tf.range(tf.shape(values)[0]),
                            tf.constant([10, 2]))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_one_bad_value_anywhere_makes_the_flag_false(bad):
    dense = tf.ones([3, 3])
    table = _slices([[1.0, 2.0], [3.0, 4.0]])
    assert bool(finite_flag([table, dense, None], tf.constant(0.5)))
    poisoned = tf.tensor_scatter_nd_update(dense, [[1, 2]], [bad])
    assert not bool(finite_flag([table, poisoned], tf.constant(0.5)))
    assert not bool(finite_flag([_slices([[1.0, bad]]), dense],
                                tf.constant(0.5)))
    assert not bool(finite_flag([table, dense], tf.constant(bad)))
    assert bool(finite_flag([table, dense]))  # no loss given: not checked


def test_opposite_infinities_and_float16_values_are_caught():
    # +inf and -inf in two gradients sum to NaN: still not finite.
    assert not bool(finite_flag([tf.constant([np.inf]),
                                 tf.constant([-np.inf])]))
    # float16 values are summed in float32: 60000 + 60000 is finite there.
    half = tf.constant([60000.0, 60000.0], tf.float16)
    assert bool(finite_flag([half]))
    assert not bool(finite_flag([tf.constant([np.nan], tf.float16)]))


def test_an_update_whose_sum_overflows_float32_counts_as_not_finite():
    """Documented: finite values whose sum exceeds float32 (an exploding
    update) are reported as not finite, so that update is skipped too."""
    huge = tf.fill([4], 3e38)
    assert bool(finite_flag([huge[:1]]))
    assert not bool(finite_flag([huge]))


# -- the step under a strategy -----------------------------------------------------


@tf.custom_gradient
def _nan_gradient(x):
    """0 forward; NaN as the gradient of every element of ``x``."""
    def grad(upstream):
        return tf.fill(tf.shape(x), tf.constant(np.nan, x.dtype)) * upstream
    return tf.zeros([], x.dtype), grad


def _poisoned(trainer, poison: str):
    """The trainer's per-example loss with one poison added."""
    base, model = trainer.step.example_losses, trainer.model

    def losses(batch):
        per_example = base(batch)
        if poison == "inf_in_the_loss":  # one example; gradients finite
            first = tf.range(tf.size(per_example)) == 0
            return per_example + tf.where(first, np.inf, 0.0)
        if poison == "nan_in_a_dense_gradient":
            return per_example + _nan_gradient(
                tf.identity(model.dense_variables()[0]))
        if poison == "nan_in_a_table_gradient":
            embeddings, _ = model.sparse_arch(batch)
            return per_example + _nan_gradient(embeddings[0])
        return per_example
    return losses


def _state(trainer) -> dict[str, np.ndarray]:
    state = {}
    for var in (trainer.model.embedding_variables()
                + trainer.model.dense_variables()):
        state[var.name] = np.array(var.numpy())
    for name, optimizer in (("sparse", trainer.sparse_optimizer),
                            ("dense", trainer.dense_optimizer)):
        for var in optimizer.variables():  # slots and `iterations`
            state[f"{name}/{var.name}"] = np.array(var.numpy())
    return state


def _changed(before: dict, after: dict) -> list[str]:
    assert before.keys() == after.keys()
    return [key for key in before if not np.array_equal(before[key],
                                                        after[key])]


def _trainer(strategy):
    from psrec.data.input.config import InputConfig
    from psrec.models.optim.config import OptimizerConfig
    from psrec.models.ranking.config import ModelConfig
    from psrec.ps_cluster.training.trainer import Trainer
    # Adagrad tables, Adam dense weights (the default): both keep slots.
    return Trainer(strategy, SPEC, ModelConfig(interaction="cross",
                                               top_mlp=(8,), cross_layers=1),
                   OptimizerConfig(base_batch_size=BATCH, warmup_steps=0),
                   InputConfig(batch_size=BATCH))


def _run_one_step(trainer, poison: str | None) -> tuple[dict, dict, tuple]:
    """One update with ``poison`` (None: finite): the state before and
    after and the train function's ``(loss_sum, examples, not_run)``."""
    from psrec.ps_cluster.training.step import TrainStep
    from psrec.ps_cluster.training.step import make_train_function
    from tests._ps_helpers import in_order_dataset_fn
    from tests._ps_helpers import synthetic_rows
    step = trainer.step
    if poison is not None:
        step = TrainStep(trainer.model, trainer.sparse_optimizer,
                         trainer.dense_optimizer, SPEC.label,
                         example_losses=_poisoned(trainer, poison))
    assert step.stops_on_non_finite  # float32
    function = make_train_function(trainer.strategy, step, 1)
    dataset_fn = in_order_dataset_fn(synthetic_rows(SPEC, 4 * BATCH, seed=2),
                                     BATCH)
    before = _state(trainer)
    if trainer.coordinator is not None:  # a closure on a PS worker
        iterator = iter(trainer.coordinator.create_per_worker_dataset(
            dataset_fn))
        result = trainer.coordinator.schedule(function, args=(iterator,))
        trainer.coordinator.join()
        result = result.fetch()
    else:
        iterator = iter(trainer.strategy.distribute_datasets_from_function(
            dataset_fn))
        result = function(iterator)
    loss_sum, examples, _, _, not_run = result
    return before, _state(trainer), (float(loss_sum), int(examples),
                                     int(not_run))


def _check(trainer, poison: str | None) -> None:
    before, after, (loss_sum, examples, not_run) = _run_one_step(trainer,
                                                                 poison)
    if poison is None:  # applied: tables, dense weights, slots, iterations
        changed = _changed(before, after)
        tables = {v.name for v in trainer.model.embedding_variables()}
        dense = {v.name for v in trainer.model.dense_variables()}
        assert tables & set(changed) and dense & set(changed), changed
        assert {k for k in changed if k.startswith("sparse/")}
        assert {k for k in changed if k.startswith("dense/")}
        assert not_run == 0 and examples == BATCH
        assert np.isfinite(loss_sum)
        return
    assert _changed(before, after) == []  # nothing applied, anywhere
    assert len(before) >= 8  # tables, dense weights, slots, iterations
    assert all(np.isfinite(v).all() for v in after.values())
    assert not_run == 1  # the step is counted as not run
    assert (loss_sum, examples) == (0.0, 0)  # and not logged


@pytest.fixture(scope="module")
def one_device_trainer():
    from psrec.ps_cluster.cluster.strategy import build_replicated_strategy
    return _trainer(build_replicated_strategy("one-device"))


@pytest.mark.parametrize("poison", POISONS)
def test_one_device_skips_a_non_finite_update(one_device_trainer, poison):
    _check(one_device_trainer, poison)


def test_one_device_applies_a_finite_update(one_device_trainer):
    _check(one_device_trainer, None)


@pytest.fixture(scope="module")
def ps_trainer(ps_cluster):
    from psrec.ps_cluster.cluster.partition_config import PartitionConfig
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    return _trainer(build_ps_strategy(ps_cluster,
                                      PartitionConfig(kind="fixed")))


@pytest.mark.cluster
@pytest.mark.parametrize("poison", POISONS)
def test_ps_worker_skips_a_non_finite_update(ps_trainer, poison):
    _check(ps_trainer, poison)


@pytest.mark.cluster
def test_ps_worker_applies_a_finite_update(ps_trainer):
    _check(ps_trainer, None)
