"""A dynamic table shard's maintenance as TensorFlow ops on its own PS.

:func:`maintenance_ops` is traced into a ``tf.function`` under
``tf.device(<the PS holding the shard's map, pending table and row
statistics>)``, once per shard (``models.dynamic.shards``); the coordinator
receives only the rows given out and the numbers evicted (the design:
``docs/feature-spec.md``, "Dynamic, collisionless tables").

Ids seen ``admit_threshold`` times are admitted most seen first (ties: the
pending table's order) into free rows (lowest first), then into evicted
rows: ``lfu`` the least read (ties: least recently), only while read less
often than the id waiting; ``ttl`` rows unread for more than
``ttl_steps``, the longest unread first. Victims are a top-k of the
coldest (:func:`coldest`), not a sort of the shard's used rows.
"""

from __future__ import annotations

import tensorflow as tf


def _stable_order(values: tf.Tensor) -> tf.Tensor:
    """Indices sorting ``values`` ascending, ties kept in their order."""
    return tf.argsort(values, stable=True)


def _kth_smallest(key: tf.Tensor, among: tf.Tensor, k: tf.Tensor
                  ) -> tf.Tensor:
    """The ``k``-th smallest (1-based, ``k >= 1``) of ``key`` where
    ``among``, by a top-k (O(n log k)), not a sort."""
    lowest = tf.constant(tf.int64.min, tf.int64)
    negated = tf.where(among, -key, lowest)
    return -tf.math.top_k(negated, k, sorted=True).values[k - 1]


def coldest(keys: list[tf.Tensor], k: tf.Tensor) -> tf.Tensor:
    """Indices of the ``k`` smallest entries by ``(keys[0], keys[1], ...,
    index)`` (int64 keys, lexicographic; ties at last: the lower index),
    in that order; fewer when there are fewer entries.

    The same result as stable sorts by every key and a cut at ``k``, for
    O(n log k) instead of O(n log n): per key a top-k finds the ``k``-th
    value among the entries still tied; those below it are taken, those
    equal stay tied for the next key; the remaining ties go by index.
    Only the ``k`` taken are sorted.
    """
    k = tf.minimum(tf.cast(k, tf.int32), tf.size(keys[0]))

    def select():
        tied = tf.ones_like(keys[0], tf.bool)
        taken = tf.zeros_like(keys[0], tf.bool)
        need = k
        for key in keys:
            kth = _kth_smallest(key, tied, tf.maximum(need, 1))
            below = tf.logical_and(tied, key < kth)
            taken = tf.logical_or(taken, below)
            need -= tf.reduce_sum(tf.cast(below, tf.int32))
            tied = tf.logical_and(tied, tf.equal(key, kth))
        first = tf.math.cumsum(tf.cast(tied, tf.int32)) <= need
        taken = tf.logical_or(taken, tf.logical_and(tied, first))
        order = tf.where(taken)[:, 0]  # index order
        for key in reversed(keys):  # stable: ties keep the previous order
            order = tf.gather(order, _stable_order(tf.gather(key, order)))
        return order

    return tf.cond(k > 0, select, lambda: tf.zeros([0], tf.int64))


def _lfu_victims(shard, used: tf.Tensor, waiting: tf.Tensor) -> tf.Tensor:
    """The coldest used rows (fewest reads, then least recent), as long as
    each was read fewer times than the waiting id it would go to."""
    freq = tf.gather(shard.freq, used)
    last = tf.gather(shard.last_seen, used)
    order = coldest([freq, last], tf.size(waiting))
    colder = tf.gather(freq, order) < waiting[:tf.size(order)]
    # the rows before the first one not colder than its waiting id
    take = tf.reduce_sum(tf.math.cumprod(tf.cast(colder, tf.int32)))
    return tf.gather(used, order[:take])


def _ttl_victims(shard, used: tf.Tensor, waiting: tf.Tensor,
                 step: tf.Tensor) -> tf.Tensor:
    """Used rows not read for more than ``ttl_steps``, oldest first."""
    last = tf.gather(shard.last_seen, used)
    old = step - last > shard.config.ttl_steps
    old_rows, old_last = tf.boolean_mask(used, old), tf.boolean_mask(last,
                                                                     old)
    return tf.gather(old_rows, coldest([old_last], tf.size(waiting)))


def _victims(shard, waiting: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
    """Local rows to evict for the ``waiting`` ids' counts (highest first)
    that found no free row; nothing is sorted when none waits."""
    def choose():
        used = tf.where(shard.row_ids.read_value() >= 0)[:, 0]
        if shard.config.evict == "ttl":
            return _ttl_victims(shard, used, waiting, step)
        return _lfu_victims(shard, used, waiting)

    return tf.cond(tf.size(waiting) > 0, choose,
                   lambda: tf.zeros([0], tf.int64))


def _prune(shard, keys: tf.Tensor, counts: tf.Tensor) -> None:
    """Forgets the least seen pending ids beyond ``capacity``, so the
    pending table stays bounded however many ids stream by."""
    extra = tf.size(keys) - shard.capacity

    def forget():
        shard.counts.remove(tf.gather(keys, coldest([counts], extra)))
        return tf.constant(0)

    tf.cond(extra > 0, forget, lambda: tf.constant(0))


def maintenance_ops(shard, step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Admits, evicts and prunes one shard (a ``dynamic_table.Shard``) of a
    dynamic table at ``step``, within its own rows; returns ``(global rows
    given to admitted ids, rows evicted)``. Trace it under the shard's device
    (``DynamicTable.maintain`` does): every op reads and writes state there.
    """
    keys, counts = (tf.reshape(t, [-1]) for t in shard.counts.export())
    ready_at = tf.where(counts >= shard.config.admit_threshold)[:, 0]
    ready_at = tf.gather(ready_at, _stable_order(-tf.gather(counts,
                                                            ready_at)))
    ids, seen = tf.gather(keys, ready_at), tf.gather(counts, ready_at)
    free = tf.where(tf.equal(shard.row_ids.read_value(), -1))[:, 0]
    victims = _victims(shard, seen[tf.size(free):], step)
    local = tf.concat([free, victims], 0)[:tf.size(ids)]
    rows = local + shard.first_row
    admitted = tf.size(local)
    ids, seen, ready_at = ids[:admitted], seen[:admitted], ready_at[:admitted]
    shard.map.remove(tf.gather(shard.row_ids, victims))
    shard.map.insert(ids, rows)
    shard.counts.remove(ids)
    waiting = tf.tensor_scatter_nd_update(
        tf.ones_like(keys, tf.bool), ready_at[:, None],
        tf.zeros([admitted], tf.bool))
    _prune(shard, tf.boolean_mask(keys, waiting),
           tf.boolean_mask(counts, waiting))
    shard.row_ids.scatter_update(tf.IndexedSlices(ids, local))
    shard.freq.scatter_update(tf.IndexedSlices(seen, local))
    shard.last_seen.scatter_update(tf.IndexedSlices(
        tf.fill(tf.shape(local), step), local))
    return rows, tf.size(victims)
