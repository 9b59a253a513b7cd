"""A dynamic, collisionless embedding table: raw 64-bit ids admitted to rows.

The design (rows and shards, workers, maintenance, checkpoints) is in
``docs/feature-spec.md``, "Dynamic, collisionless tables". Per shard of the
table's embedding variable (``models.dynamic.shards``) a
:class:`DynamicTable` holds ``map`` (id -> global row of the admitted ids)
and ``counts`` (pending ids' times seen), and the ``ShardedVariable`` s
``row_ids`` (-1: free, -2: the default row), ``freq`` and ``last_seen``
cut as the embedding is; ``clock`` and the ``admitted`` / ``evicted``
totals live with shard 0. Hash tables are placed by an explicit
``tf.device`` (one created in the strategy's scope lands on the
coordinator). Workers only read the maps (:meth:`DynamicTable.rows`);
:meth:`DynamicTable.maintain`, at a join boundary, is their only writer.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from psrec.features.spec.columns import TableConfig
from psrec.models.dynamic.select import maintenance_ops
from psrec.models.dynamic.shards import ShardedMap
from psrec.models.dynamic.shards import ShardLayout
from psrec.models.dynamic.shards import colocated_with
from psrec.models.dynamic.shards import owner
from psrec.models.dynamic.shards import parts
from psrec.models.dynamic.shards import placed
from psrec.models.dynamic.shards import row_shard

FREE, DEFAULT = -1, -2  # row_ids of a free row and of the default row
_Sharded = tf.__internal__.distribute.ShardedVariable


@dataclasses.dataclass(frozen=True)
class Maintenance:
    """What one maintenance did: rows given to newly admitted ids (their
    embedding and slots are reset by the caller) and rows evicted."""

    rows: np.ndarray
    admitted: int
    evicted: int


@dataclasses.dataclass(frozen=True)
class Shard:
    """One shard's part of a table's state (what maintenance reads).

    ``row_ids``/``freq``/``last_seen`` are indexed by local row
    (``row - first_row``); ``map`` values are global rows."""

    config: TableConfig
    device: str | None
    first_row: int
    capacity: int
    map: tf.lookup.experimental.MutableHashTable
    counts: tf.lookup.experimental.MutableHashTable
    row_ids: tf.Variable
    freq: tf.Variable
    last_seen: tf.Variable


def _int64(value, name: str) -> tf.Variable:
    return tf.Variable(value, trainable=False, name=name, dtype=tf.int64)


def _row_ids(size: int, last: bool):
    """A shard's initial ``row_ids``: free rows (the default row, the
    table's last, marked so)."""
    if not last:
        return lambda: tf.fill([size], np.int64(FREE))
    return lambda: tf.concat([tf.fill([size - 1], np.int64(FREE)),
                              tf.constant([DEFAULT], tf.int64)], 0)


def _joined(pieces: list[tf.Variable], name: str):
    """One variable of ``pieces``: a ``ShardedVariable`` (saved as one
    tensor, restored to any sharding), or the piece itself when alone (a
    local model's, which a SavedModel saves as a plain variable)."""
    return pieces[0] if len(pieces) == 1 else _Sharded(pieces, name=name)


class _Compiled:
    """The table's maintenance, a ``tf.function`` whose ops are placed on
    the shards' devices (held outside the table's tracked attributes, so a
    SavedModel of the model does not try to save it)."""

    def __init__(self, table: "DynamicTable") -> None:
        def maintain(step):
            rows, evicted = [], []
            for shard in table.shards():
                with placed(shard.device):
                    r, e = maintenance_ops(shard, step)
                rows.append(r)
                evicted.append(e)
            with placed(table.layout.devices[0]):
                table.clock.assign(step)
                table.admitted.assign_add(tf.cast(tf.add_n(
                    [tf.size(r) for r in rows]), tf.int64))
                table.evicted.assign_add(tf.cast(tf.add_n(evicted),
                                                 tf.int64))
            return rows, evicted

        self.maintain = tf.function(maintain, autograph=False)


class DynamicTable(tf.Module):
    """The id -> row maps, pending counts and row statistics of one table.

    Args:
      layout: its embedding variable's shards (``ShardLayout.of``); None:
        one local shard.
      initializer: ``shape -> values`` of fresh rows (the table's).
    """

    def __init__(self, config: TableConfig, layout: ShardLayout | None = None,
                 initializer=None) -> None:
        super().__init__(name=f"dynamic_{config.name}")
        self.config = config
        self.initializer = initializer or tf.zeros
        self.capacity = config.capacity
        self.layout = layout or ShardLayout.local(config.capacity + 1)
        if sum(self.layout.sizes) != self.capacity + 1:
            raise ValueError(f"dynamic table {config.name!r}: shards of "
                             f"{self.layout.sizes} rows, not capacity + 1 = "
                             f"{self.capacity + 1}")
        first, admitting = self.layout.first_rows, self.layout.admitting
        devices = self.layout.devices
        self.map = ShardedMap(f"{config.name}_map", devices, -1,
                              lambda keys, rows: row_shard(rows, first))
        self.counts = ShardedMap(f"{config.name}_counts", devices, 0,
                                 lambda keys, _: owner(keys, admitting))
        self.serving_map = None  # a StaticHashTable after freeze()
        anchors = self.layout.anchors or (None,) * len(devices)
        pieces = {"row_ids": [], "freq": [], "last_seen": []}
        for k, (size, anchor) in enumerate(zip(self.layout.sizes, anchors)):
            with placed(devices[k]), colocated_with(anchor):
                last = k == len(devices) - 1
                pieces["row_ids"].append(_int64(_row_ids(size, last),
                                               f"row_ids/part_{k}"))
                for name in ("freq", "last_seen"):
                    pieces[name].append(_int64(
                        lambda size=size: tf.zeros([size], tf.int64),
                        f"{name}/part_{k}"))
        self.row_ids = _joined(pieces["row_ids"], "row_ids")
        self.freq = _joined(pieces["freq"], "freq")
        self.last_seen = _joined(pieces["last_seen"], "last_seen")
        with placed(devices[0]), colocated_with(anchors[0]):
            self.clock = _int64(0, "clock")
            self.admitted = _int64(0, "admitted")
            self.evicted = _int64(0, "evicted")
        self._compiled = _Compiled(self)

    def shards(self) -> list[Shard]:
        """Each shard's state (the maintenance's view)."""
        return [Shard(self.config, self.layout.devices[k],
                      self.layout.first_rows[k], self.layout.capacities[k],
                      self.map.shards[k], self.counts.shards[k],
                      parts(self.row_ids)[k], parts(self.freq)[k],
                      parts(self.last_seen)[k])
                for k in range(len(self.layout.sizes))]

    @property
    def device(self) -> str | None:
        """The device of shard 0 (the clock and totals)."""
        return self.layout.devices[0]

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
        if self.serving_map is not None:
            found = tf.reshape(self.serving_map.lookup(unique), [-1])
        else:  # every shard: an id is in one at most (-1 elsewhere)
            found = tf.reduce_max(tf.stack(
                [tf.reshape(t.lookup(unique), [-1])
                 for t in self.map.shards]), 0)
        rows = self._seen(unique, seen, found, training)
        return tf.reshape(tf.gather(rows, index), tf.shape(ids))

    def gathers_from(self, variable) -> bool:
        """Whether :meth:`embed` can read ``variable``: a table variable
        cut as this table's layout, and no frozen serving map (a
        SavedModel's, or a quantized table: :meth:`rows`, then a lookup)."""
        return (self.serving_map is None
                and isinstance(variable, (tf.Variable, _Sharded))
                and tuple(int(p.shape[0]) for p in parts(variable))
                == self.layout.sizes)

    def embed(self, variable, ids: tf.Tensor, training: bool = False
              ) -> tuple[tf.Tensor, tf.Tensor]:
        """The rows of ``variable`` (this table's embedding, see
        :meth:`gathers_from`) for int64 raw ``ids`` of any shape:
        ``(embeddings, rows)``, ``ids.shape + [dim]`` and ``ids.shape``;
        the same values, counts and statistics as :meth:`rows` followed by
        a gather, and no gradient into the default row
        (:meth:`drop_default_gradient`).

        One round trip per shard: the distinct ids go to each shard's PS,
        where the map lookup and the gather of the rows that shard holds
        run together (a map shard holds only ids whose row is in its
        embedding shard); the rows found and the gathered values come
        back. The last shard also sends the default row (for the ids no
        shard knows; it gets a zero gradient every step)."""
        flat = tf.reshape(ids, [-1])
        unique, index, seen = tf.unique_with_counts(flat, out_idx=tf.int32)
        found, positions, values = [], [], []
        shards = parts(variable)
        last = len(shards) - 1
        for k, (device, table, shard, first) in enumerate(zip(
                self.layout.devices, self.map.shards, shards,
                self.layout.first_rows)):
            with placed(device):
                rows = tf.reshape(table.lookup(unique), [-1])
                mine = rows >= 0
                positions.append(tf.cast(tf.where(mine)[:, 0], tf.int32))
                values.append(tf.gather(shard,
                                        tf.boolean_mask(rows, mine) - first))
                if k == last:
                    default = tf.gather(shard, [self.default_row - first])
            found.append(rows)
        found = tf.reduce_max(tf.stack(found), 0)
        rows = self._seen(unique, seen, found, training)
        unknown = tf.cast(tf.where(found < 0)[:, 0], tf.int32)
        by_unique = tf.dynamic_stitch(
            positions + [unknown],
            values + [tf.tile(default, [tf.size(unknown), 1])])
        shape = tf.shape(ids)
        rows = tf.reshape(tf.gather(rows, index), shape)
        embeddings = tf.reshape(tf.gather(by_unique, index), tf.concat(
            [shape, tf.shape(by_unique)[1:]], 0))
        return (self.drop_default_gradient(embeddings, rows,
                                           self.default_row), rows)

    def _seen(self, unique, seen, found, training: bool) -> tf.Tensor:
        """The row of each distinct id (the default row for the ids no
        shard knows); in training, first records them (:meth:`_record`)."""
        known = found >= 0
        if training:
            self._record(unique, tf.cast(seen, tf.int64), found, known)
        return tf.where(known, found, tf.constant(self.default_row,
                                                  tf.int64))

    def _record(self, unique, seen, found, known) -> None:
        """Counts the unknown ids and updates the statistics of the rows
        read, shard by shard, each shard's ops placed on its PS: the ids,
        counts and rows found are sent there once (not a lookup's result sent
        back to the worker and an insert sent out again)."""
        pending = tf.logical_and(tf.logical_not(known), unique >= 0)
        clock = self.clock.read_value()
        admitting, first_rows = self.layout.admitting, self.layout.first_rows
        for k, device in enumerate(self.layout.devices):
            with placed(device):
                if k in admitting:
                    self._count(k, unique, seen, pending)
                mine = tf.logical_and(known, tf.equal(
                    row_shard(found, first_rows), k))
                local = tf.boolean_mask(found, mine) - first_rows[k]
                parts(self.freq)[k].scatter_add(tf.IndexedSlices(
                    tf.boolean_mask(seen, mine), local))
                parts(self.last_seen)[k].scatter_max(tf.IndexedSlices(
                    tf.fill(tf.shape(local), clock), local))

    def _count(self, k: int, unique, seen, pending) -> None:
        """Adds ``seen`` to the pending counts of the ``pending`` ids that
        shard ``k`` counts (:func:`owner`)."""
        mine = tf.logical_and(pending, tf.equal(
            owner(unique, self.layout.admitting), k))
        ids, table = tf.boolean_mask(unique, mine), self.counts.shards[k]
        table.insert(ids, table.lookup(ids) + tf.boolean_mask(seen, mine))

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
        rows not read for more than ``ttl_steps``), each shard within its
        own rows. Runs as ops on the shards' devices
        (``models.dynamic.select``): only the rows given out and the
        counts come back. Call only with no closure in flight."""
        rows, evicted = self._compiled.maintain(tf.constant(step, tf.int64))
        rows = np.concatenate([r.numpy() for r in rows]).astype(np.int64)
        return Maintenance(rows, int(rows.size),
                           sum(int(e.numpy()) for e in evicted))

    # -- export ------------------------------------------------------------

    def freeze(self) -> None:
        """Serves from a ``StaticHashTable`` snapshot of the map (for a
        SavedModel that runs with no cluster); unseen ids read the default
        row."""
        keys, rows = self.map.export()
        self.serving_map = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(keys, rows), default_value=-1)

    def stats(self) -> dict[str, int]:
        """Rows used/free, admitted, evicted and pending ids, in total and
        per shard (``shards``: rows used and ids pending per shard,
        counted on each shard's PS)."""
        used = []
        for device, part in zip(self.layout.devices, parts(self.row_ids)):
            with placed(device):
                used.append(int(tf.math.count_nonzero(part >= 0).numpy()))
        return {"capacity": self.capacity, "rows_used": sum(used),
                "rows_free": self.capacity - sum(used),
                "admitted": int(self.admitted.numpy()),
                "evicted": int(self.evicted.numpy()),
                "pending": int(self.counts.size().numpy()),
                "shards": [{"rows_used": u, "pending": p} for u, p in zip(
                    used, self.counts.shard_sizes())]}


def freeze_tables(model) -> None:
    """Freezes the dynamic tables of ``model`` (:meth:`DynamicTable.freeze`),
    if it has any."""
    arch = getattr(model, "sparse_arch", None)
    for table in getattr(arch, "dynamic_tables", {}).values():
        table.freeze()


def slot_initial_value(optimizer, slot: str) -> float:
    """The value a fresh slot of ``optimizer`` starts at (Adagrad's,
    row-wise Adagrad's and FTRL's accumulators:
    ``initial_accumulator_value``; others 0)."""
    if slot == "accumulator":
        return float(getattr(optimizer, "_initial_accumulator_value", 0.0))
    return 0.0


def reset_rows(variable, rows: np.ndarray, values: tf.Tensor,
               optimizer=None) -> None:
    """Assigns ``values`` to the global ``rows`` of a (sharded) table and
    resets the rows' optimizer slots to their initial value, shard by
    shard (eager, from the coordinator); a slot of one value per row
    (row-wise Adagrad's ``[shard_rows, 1]``) is reset row by row too."""
    shards = parts(variable)
    start = 0
    for shard in shards:
        size = int(shard.shape[0])
        inside = (rows >= start) & (rows < start + size)
        if inside.any():
            local = tf.constant(rows[inside] - start)
            shard.scatter_update(tf.IndexedSlices(tf.cast(  # 16-bit tables
                tf.gather(values, np.flatnonzero(inside)), shard.dtype),
                local))
            for slot in (optimizer.get_slot_names() if optimizer else ()):
                holder = optimizer.get_slot(shard, slot)
                fill = tf.fill([local.shape[0]] + holder.shape[1:].as_list(),
                               slot_initial_value(optimizer, slot))
                holder.scatter_update(tf.IndexedSlices(
                    tf.cast(fill, holder.dtype), local))
        start += size
