"""A dynamic table's maintenance as TensorFlow ops on the table's own PS.

:func:`maintenance_ops` is traced into a ``tf.function`` under
``tf.device(<the PS holding the table's maps and row statistics>)``: the
pending counts, ``row_ids``, ``freq`` and ``last_seen`` are read, sorted and
updated where they live. The coordinator only launches the function (at a
join boundary: it stays the maps' only writer) and receives the rows given
to newly admitted ids (O(admitted)) and the number evicted, never the
statistics themselves: a 100M-row table's ~2.4 GB of statistics do not cross
the network at every maintenance.

The choices are those of the numpy version it replaces: ids seen
``admit_threshold`` times are admitted most seen first (ties: the pending
table's order) into free rows (lowest first), then into evicted rows:
``lfu`` takes the rows read least often (ties: least recently), only while
a row was read less often than the id waiting for it; ``ttl`` takes rows
not read for more than ``ttl_steps``, the longest unread first. After it at
most ``capacity`` ids stay pending: the least seen are forgotten.
"""

from __future__ import annotations

import tensorflow as tf


def _stable_order(values: tf.Tensor) -> tf.Tensor:
    """Indices sorting ``values`` ascending, ties kept in their order."""
    return tf.argsort(values, stable=True)


def _lfu_victims(table, used: tf.Tensor, waiting: tf.Tensor) -> tf.Tensor:
    """The coldest used rows (fewest reads, then least recent), as long as
    each was read fewer times than the waiting id it would go to."""
    freq = tf.gather(table.freq, used)
    last = tf.gather(table.last_seen, used)
    by_last = _stable_order(last)
    order = tf.gather(by_last, _stable_order(tf.gather(freq, by_last)))
    order = order[:tf.size(waiting)]
    colder = tf.gather(freq, order) < waiting[:tf.size(order)]
    # the rows before the first one not colder than its waiting id
    take = tf.reduce_sum(tf.math.cumprod(tf.cast(colder, tf.int32)))
    return tf.gather(used, order[:take])


def _ttl_victims(table, used: tf.Tensor, waiting: tf.Tensor,
                 step: tf.Tensor) -> tf.Tensor:
    """Used rows not read for more than ``ttl_steps``, oldest first."""
    last = tf.gather(table.last_seen, used)
    old = step - last > table.config.ttl_steps
    old_rows, old_last = tf.boolean_mask(used, old), tf.boolean_mask(last,
                                                                     old)
    return tf.gather(old_rows, _stable_order(old_last))[:tf.size(waiting)]


def _victims(table, waiting: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
    """Rows to evict for the ``waiting`` ids' counts (highest first) that
    found no free row; nothing is sorted when none waits."""
    def choose():
        used = tf.where(table.row_ids.read_value() >= 0)[:, 0]
        if table.config.evict == "ttl":
            return _ttl_victims(table, used, waiting, step)
        return _lfu_victims(table, used, waiting)

    return tf.cond(tf.size(waiting) > 0, choose,
                   lambda: tf.zeros([0], tf.int64))


def _prune(table, keys: tf.Tensor, counts: tf.Tensor) -> None:
    """Forgets the least seen pending ids beyond ``capacity``, so the
    pending table stays bounded however many ids stream by."""
    extra = tf.size(keys) - table.capacity

    def forget():
        coldest = _stable_order(counts)[:extra]
        table.counts.remove(tf.gather(keys, coldest))
        return tf.constant(0)

    tf.cond(extra > 0, forget, lambda: tf.constant(0))


def maintenance_ops(table, step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Admits, evicts and prunes ``table`` (a ``DynamicTable``) at
    ``step``; returns ``(rows given to admitted ids, rows evicted)``.

    Trace it under the table's device (``DynamicTable.maintain`` does):
    every op reads and writes state on that device.
    """
    table.clock.assign(step)
    keys, counts = (tf.reshape(t, [-1]) for t in table.counts.export())
    ready_at = tf.where(counts >= table.config.admit_threshold)[:, 0]
    ready_at = tf.gather(ready_at, _stable_order(-tf.gather(counts,
                                                            ready_at)))
    ids, seen = tf.gather(keys, ready_at), tf.gather(counts, ready_at)
    free = tf.where(table.row_ids.read_value() < 0)[:, 0]
    victims = _victims(table, seen[tf.size(free):], step)
    rows = tf.concat([free, victims], 0)[:tf.size(ids)]
    admitted = tf.size(rows)
    ids, seen, ready_at = ids[:admitted], seen[:admitted], ready_at[:admitted]
    table.map.remove(tf.gather(table.row_ids, victims))
    table.map.insert(ids, rows)
    table.counts.remove(ids)
    waiting = tf.tensor_scatter_nd_update(
        tf.ones_like(keys, tf.bool), ready_at[:, None],
        tf.zeros([admitted], tf.bool))
    _prune(table, tf.boolean_mask(keys, waiting),
           tf.boolean_mask(counts, waiting))
    table.row_ids.scatter_update(tf.IndexedSlices(ids, rows))
    table.freq.scatter_update(tf.IndexedSlices(seen, rows))
    table.last_seen.scatter_update(tf.IndexedSlices(
        tf.fill(tf.shape(rows), step), rows))
    table.admitted.assign_add(tf.cast(admitted, tf.int64))
    table.evicted.assign_add(tf.cast(tf.size(victims), tf.int64))
    return rows, tf.size(victims)
