"""Row-wise Adagrad (``models.optim.rowwise``): its update against a numpy
reference, one accumulator per row."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from psrec.models.optim.rowwise import RowwiseAdagrad

LR, INITIAL, EPSILON = 0.3, 0.1, 1e-7


def _reference(table, acc, rows, grads):
    """FBGEMM's EXACT_ROWWISE_ADAGRAD on the unique rows (duplicates
    summed first)."""
    table, acc = table.copy(), acc.copy()
    summed = {}
    for row, grad in zip(rows, grads):
        summed[row] = summed.get(row, 0.0) + grad
    for row, grad in summed.items():
        acc[row] += np.mean(grad ** 2)
        table[row] -= LR * grad / (np.sqrt(acc[row]) + EPSILON)
    return table, acc


def test_the_rowwise_update_equals_a_numpy_reference():
    rng = np.random.default_rng(0)
    start = rng.normal(size=(6, 4)).astype(np.float32)
    table = tf.Variable(start)
    optimizer = RowwiseAdagrad(LR, initial_accumulator_value=INITIAL,
                               epsilon=EPSILON)
    want_table = start.astype(np.float64)
    want_acc = np.full((6, 1), INITIAL)
    for step in range(3):
        rows = np.array([1, 4, 1, step], np.int64)  # row 1 twice
        grads = rng.normal(size=(4, 4)).astype(np.float32)
        optimizer.apply_gradients([(tf.IndexedSlices(
            tf.constant(grads), tf.constant(rows), tf.constant([6, 4])),
            table)])
        want_table, want_acc = _reference(want_table, want_acc, rows,
                                          grads.astype(np.float64))
        accumulator = optimizer.get_slot(table, "accumulator")
        assert accumulator.shape == (6, 1)
        np.testing.assert_allclose(accumulator.numpy(), want_acc, rtol=1e-5)
        np.testing.assert_allclose(table.numpy(), want_table, rtol=1e-5,
                                   atol=1e-6)
    # Rows never touched keep their values and accumulators.
    assert np.array_equal(table.numpy()[5], start[5])
    assert accumulator.numpy()[5, 0] == np.float32(INITIAL)
    # A dense gradient updates every row the same way.
    grad = rng.normal(size=(6, 4)).astype(np.float32)
    optimizer.apply_gradients([(tf.constant(grad), table)])
    want_table, want_acc = _reference(want_table, want_acc, range(6),
                                      grad.astype(np.float64))
    np.testing.assert_allclose(accumulator.numpy(), want_acc, rtol=1e-5)
    np.testing.assert_allclose(table.numpy(), want_table, rtol=1e-5,
                               atol=1e-6)


def test_a_dynamic_table_s_reset_rows_refill_their_row_accumulators():
    """``models.dynamic.table.reset_rows`` (eviction and admission) resets
    the ``[shard_rows, 1]`` accumulator of the reset rows, shard by shard,
    and leaves the others."""
    import types

    from psrec.models.dynamic.table import reset_rows
    shards = [tf.Variable(tf.zeros([3, 4])), tf.Variable(tf.zeros([2, 4]))]
    optimizer = RowwiseAdagrad(LR, initial_accumulator_value=INITIAL)
    optimizer._create_all_weights(shards)  # noqa: SLF001
    for shard in shards:
        optimizer.get_slot(shard, "accumulator").assign(
            tf.fill([shard.shape[0], 1], 9.0))
    values = tf.fill([2, 4], 5.0)
    reset_rows(types.SimpleNamespace(variables=shards), np.array([1, 4]),
               values, optimizer)
    accumulators = np.concatenate([
        optimizer.get_slot(s, "accumulator").numpy() for s in shards])
    assert accumulators.shape == (5, 1)
    assert accumulators[:, 0].tolist() == pytest.approx(
        [9.0, INITIAL, 9.0, 9.0, INITIAL])
    rows = np.concatenate([s.numpy() for s in shards])
    assert (rows[[1, 4]] == 5.0).all() and (rows[[0, 2, 3]] == 0.0).all()
