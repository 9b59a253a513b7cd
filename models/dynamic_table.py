"""A dynamic, collisionless embedding table: raw 64-bit ids admitted to rows.

Per ``mode: dynamic`` table (``features.dynamic``) a :class:`DynamicTable`
holds, beside the table's ordinary (sharded) embedding variable of
``capacity + 1`` rows whose last row is the shared default row:

* ``map``: a ``MutableHashTable`` id -> row of the admitted ids;
* ``counts``: a ``MutableHashTable`` id -> times seen, of the ids waiting for
  admission (pending);
* ``row_ids`` (the id each row holds, -1: free -- the free list and the
  reverse map), ``freq`` (times each row was read in training, from its
  admission on) and ``last_seen`` (the step it was last read) variables,
  ``clock`` (the step of the last maintenance) and the ``admitted`` /
  ``evicted`` totals. After each maintenance at most ``capacity`` ids stay
  pending (the least seen are forgotten).

Both hash tables and the row statistics live on one PS task, chosen by an
explicit ``tf.device`` for the tables (under ``ParameterServerStrategy`` a
table created in the strategy's scope lands on the coordinator and fails
when workers use it) and colocation for the variables (the strategy places
variables round robin otherwise); round robin over the PS tasks by table
index; without PS tasks, on the local device.

Workers only read the map (:meth:`DynamicTable.rows`): an unknown id reads
the default row, whose gradient is dropped, and its count goes up by one
per occurrence (a read and an insert, not atomic: two closures counting the
same id at once may lose an increment, which only delays its admission).
Hit rows get ``freq``/``last_seen`` updates by scatter ops. Rows are
assigned only by :meth:`DynamicTable.maintain`, launched by the coordinator
at a join boundary (no closure in flight): it is the only writer of the map,
so two ids never share a row. The selection runs as ops on the table's PS
(``models.dynamic_select``); only the rows given out come back.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import tensorflow as tf

from psrec.features.columns import TableConfig
from psrec.models.dynamic_select import maintenance_ops


def table_device(index: int) -> str | None:
    """The device of the hash tables of table number ``index``: PS task
    ``index % PS count`` under ``ParameterServerStrategy``, else None
    (local)."""
    strategy = tf.distribute.get_strategy()
    if not isinstance(strategy, tf.distribute.ParameterServerStrategy):
        return None
    resolver = (strategy.cluster_resolver
                or getattr(strategy, "_cluster_resolver", None))
    num_ps = resolver.cluster_spec().num_tasks("ps")
    return f"/job:ps/replica:0/task:{index % num_ps}/device:CPU:0"


@dataclasses.dataclass(frozen=True)
class Maintenance:
    """What one maintenance did: rows given to newly admitted ids (their
    embedding and slots are reset by the caller) and rows evicted."""

    rows: np.ndarray
    admitted: int
    evicted: int


def _placed(device: str | None):
    return tf.device(device) if device else contextlib.nullcontext()


@dataclasses.dataclass(frozen=True)
class _Anchor:
    """What a variable is colocated with: a device (and a name for the
    strategy's log line)."""

    device: str
    name: str = "dynamic-table-maps"


def _colocated_variables(device: str | None):
    """Variables created inside go to ``device`` (the maps' PS).

    ``ParameterServerStrategy`` ignores ``tf.device`` for variables made in
    its scope (it places them round robin over the PS tasks: measured, a
    table's ``row_ids``, ``freq`` and ``last_seen`` landed on different PS
    tasks from its maps); it honours a variable's ``colocate_with``, which
    in eager mode means "on this object's device".
    """
    strategy = tf.distribute.get_strategy()
    if device is None or not isinstance(
            strategy, tf.distribute.ParameterServerStrategy):
        return contextlib.nullcontext()

    def creator(next_creator, **kwargs):
        kwargs["colocate_with"] = _Anchor(device)
        return next_creator(**kwargs)

    return tf.variable_creator_scope(creator)


class _Compiled:
    """The table's maintenance, a ``tf.function`` whose ops are placed on
    the table's device (held outside the table's tracked attributes, so a
    SavedModel of the model does not try to save it)."""

    def __init__(self, table: "DynamicTable") -> None:
        def maintain(step):
            with _placed(table.device):
                return maintenance_ops(table, step)

        self.maintain = tf.function(maintain, autograph=False)


class DynamicTable(tf.Module):
    """The id -> row map, pending counts and row statistics of one table.

    Args:
      config: the ``mode: dynamic`` table.
      device: where the hash tables live (a PS task's CPU), None: local.
      initializer: ``shape -> values`` of fresh rows (the table's).
    """

    def __init__(self, config: TableConfig, device: str | None = None,
                 initializer=None) -> None:
        super().__init__(name=f"dynamic_{config.name}")
        self.config = config
        self.initializer = initializer or tf.zeros
        self.capacity = config.capacity
        self.device = device
        with _placed(device):
            self.map = tf.lookup.experimental.MutableHashTable(
                tf.int64, tf.int64, default_value=-1,
                name=f"{config.name}_map")
            self.counts = tf.lookup.experimental.MutableHashTable(
                tf.int64, tf.int64, default_value=0,
                name=f"{config.name}_counts")
        self.serving_map = None  # a StaticHashTable after freeze()

        def variable(value, name: str) -> tf.Variable:
            return tf.Variable(value, trainable=False, name=name,
                               dtype=tf.int64)

        with _placed(device), _colocated_variables(device):
            self.row_ids = variable(
                lambda: tf.fill([self.capacity], np.int64(-1)), "row_ids")
            self.freq = variable(
                lambda: tf.zeros([self.capacity + 1], tf.int64), "freq")
            self.last_seen = variable(
                lambda: tf.zeros([self.capacity + 1], tf.int64), "last_seen")
            self.clock = variable(0, "clock")
            self.admitted = variable(0, "admitted")
            self.evicted = variable(0, "evicted")
        self._compiled = _Compiled(self)

    @property
    def default_row(self) -> int:
        return self.capacity

    def fresh_rows(self, count: int) -> tf.Tensor:
        """``[count, dim]`` initial values drawn anew (an unseeded Keras
        initializer returns the same values on every call: a fresh copy
        is made for each draw)."""
        init = self.initializer
        if hasattr(init, "get_config"):
            init = type(init).from_config(init.get_config())
        return tf.cast(init([count, self.config.dim]), tf.float32)

    # -- workers (inside the train step) -----------------------------------

    def rows(self, ids: tf.Tensor, training: bool = False) -> tf.Tensor:
        """Row indices for int64 raw ``ids`` of any shape (negative ids:
        padding, which reads the default row and is not counted). In
        training, also counts the unknown ids and updates the statistics
        of the rows read."""
        flat = tf.reshape(ids, [-1])
        unique, index, seen = tf.unique_with_counts(flat, out_idx=tf.int32)
        table = self.serving_map if self.serving_map is not None else self.map
        found = tf.reshape(table.lookup(unique), [-1])
        known = found >= 0
        if training:
            self._record(unique, tf.cast(seen, tf.int64), found, known)
        rows = tf.where(known, found, tf.constant(self.default_row,
                                                  tf.int64))
        return tf.reshape(tf.gather(rows, index), tf.shape(ids))

    def _record(self, unique, seen, found, known) -> None:
        pending = tf.logical_and(tf.logical_not(known), unique >= 0)
        new_ids = tf.boolean_mask(unique, pending)
        self.counts.insert(new_ids, self.counts.lookup(new_ids)
                           + tf.boolean_mask(seen, pending))
        hit = tf.boolean_mask(found, known)
        self.freq.scatter_add(tf.IndexedSlices(tf.boolean_mask(seen, known),
                                               hit))
        self.last_seen.scatter_max(tf.IndexedSlices(
            tf.fill(tf.shape(hit), self.clock.read_value()), hit))

    @staticmethod
    def drop_default_gradient(embeddings: tf.Tensor, rows: tf.Tensor,
                              default_row: int) -> tf.Tensor:
        """``embeddings`` (``rows.shape + [d]``) with no gradient flowing
        into the default row: ids not admitted do not train it."""
        is_default = tf.equal(rows, default_row)[..., None]
        return tf.where(is_default, tf.stop_gradient(embeddings), embeddings)

    # -- the coordinator (between closures) ----------------------------------

    def maintain(self, step: int) -> Maintenance:
        """Admits the pending ids seen ``admit_threshold`` times (most seen
        first) into free rows, evicting the coldest rows when none are
        free (``lfu``: rows read less often than the id waiting; ``ttl``:
        rows not read for more than ``ttl_steps``). Runs as ops on the
        table's device (``models.dynamic_select``): only the rows given
        out and the counts come back. Call only with no closure in
        flight."""
        rows, evicted = self._compiled.maintain(tf.constant(step, tf.int64))
        rows = rows.numpy()
        return Maintenance(rows, int(rows.size), int(evicted.numpy()))

    # -- export ------------------------------------------------------------

    def freeze(self) -> None:
        """Serves from a ``StaticHashTable`` snapshot of the map (for a
        SavedModel that runs with no cluster); unseen ids read the default
        row."""
        keys, rows = self.map.export()
        self.serving_map = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(keys, rows), default_value=-1)

    def stats(self) -> dict[str, int]:
        """Rows used/free, admitted, evicted and pending ids (eager)."""
        with _placed(self.device):  # counted where the rows live
            used = int(tf.math.count_nonzero(self.row_ids >= 0).numpy())
        return {"capacity": self.capacity, "rows_used": used,
                "rows_free": self.capacity - used,
                "admitted": int(self.admitted.numpy()),
                "evicted": int(self.evicted.numpy()),
                "pending": int(self.counts.size().numpy())}


def freeze_tables(model) -> None:
    """Freezes the dynamic tables of ``model`` (:meth:`DynamicTable.freeze`),
    if it has any."""
    arch = getattr(model, "sparse_arch", None)
    for table in getattr(arch, "dynamic_tables", {}).values():
        table.freeze()


def slot_initial_value(optimizer, slot: str) -> float:
    """The value a fresh slot of ``optimizer`` starts at (Adagrad's and
    FTRL's accumulators: ``initial_accumulator_value``; others 0)."""
    if slot == "accumulator":
        return float(getattr(optimizer, "_initial_accumulator_value", 0.0))
    return 0.0


def reset_rows(variable, rows: np.ndarray, values: tf.Tensor,
               optimizer=None) -> None:
    """Assigns ``values`` to the global ``rows`` of a (sharded) table and
    resets the rows' optimizer slots to their initial value, shard by
    shard (eager, from the coordinator)."""
    shards = list(getattr(variable, "variables", [variable]))
    start = 0
    for shard in shards:
        size = int(shard.shape[0])
        inside = (rows >= start) & (rows < start + size)
        if inside.any():
            local = tf.constant(rows[inside] - start)
            shard.scatter_update(tf.IndexedSlices(
                tf.gather(values, np.flatnonzero(inside)), local))
            for slot in (optimizer.get_slot_names() if optimizer else ()):
                holder = optimizer.get_slot(shard, slot)
                fill = tf.fill([local.shape[0], int(shard.shape[1])],
                               slot_initial_value(optimizer, slot))
                holder.scatter_update(tf.IndexedSlices(
                    tf.cast(fill, holder.dtype), local))
        start += size
