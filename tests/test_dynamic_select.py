"""The top-k victim selection of dynamic tables (``models.dynamic.select``)
picks exactly what stable sorts by every key would, ties included."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from psrec.models.dynamic.select import coldest


def test_coldest_equals_stable_sorts_with_many_ties():
    rng = np.random.default_rng(0)
    for _ in range(80):
        n, high = int(rng.integers(0, 60)), int(rng.integers(1, 6))
        freq, last = rng.integers(0, high, n), rng.integers(0, high, n)
        k = int(rng.integers(0, 70))  # also 0 and more than n
        lfu = coldest([tf.constant(freq), tf.constant(last)], tf.constant(k))
        assert lfu.numpy().tolist() == np.lexsort(
            (np.arange(n), last, freq))[:k].tolist()
        ttl = coldest([tf.constant(last)], tf.constant(k))
        assert ttl.numpy().tolist() == np.argsort(
            last, kind="stable")[:k].tolist()


def test_coldest_in_a_function_on_large_keys():
    freq = tf.constant([2 ** 40, 3, 3, 2 ** 40, 0], tf.int64)
    last = tf.constant([5, 9, 1, 4, 7], tf.int64)
    pick = tf.function(lambda k: coldest([freq, last], k))
    assert pick(tf.constant(4)).numpy().tolist() == [4, 2, 1, 3]
    assert pick(tf.constant(0)).numpy().tolist() == []
