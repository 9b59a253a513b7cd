"""The shards of a dynamic table: one map, pending table and statistics
shard per embedding shard, on the PS task holding that shard's rows.

Shard ``k`` of the id -> row map holds the admitted ids whose (global) row
lies in embedding shard ``k``'s range, its pending table the waiting ids
whose owner is ``k`` (:func:`owner`); why, and what is per shard:
``docs/feature-spec.md``, "Dynamic, collisionless tables".

:class:`ShardedMap` saves the shards of one map as ONE table (the keys and
values of all shards, ``<path>/.ATTRIBUTES/table-keys`` / ``table-values``,
the form a single ``MutableHashTable`` saves, after a marker pair of key
-1 so that an empty map still saves a tensor): a restore routes each pair
to the shard that owns it now (the map: by row; pending counts: by id).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable
from typing import Sequence

import numpy as np
import tensorflow as tf

_KEYS, _VALUES = "table-keys", "table-values"
MARKER = -1  # the key (and value) of the pair a saved map starts with


def parts(variable) -> list[tf.Variable]:
    """The shard variables of a (possibly sharded) variable."""
    return list(getattr(variable, "variables", [variable]))


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """Where the rows of a dynamic table's embedding shards are.

    Attributes:
      sizes: rows of each embedding shard (the last holds the default row,
        the table's last row).
      devices: each shard's device (None: local).
      anchors: each shard's embedding variable (what its statistics are
        colocated with); empty: local (no placement).
    """

    sizes: tuple[int, ...]
    devices: tuple[str | None, ...]
    anchors: tuple = ()

    @classmethod
    def of(cls, variable) -> "ShardLayout":
        """The layout of a (sharded) embedding variable; under
        ``ParameterServerStrategy`` each shard's PS device."""
        shards = parts(variable)
        on_ps = isinstance(tf.distribute.get_strategy(),
                           tf.distribute.ParameterServerStrategy)
        return cls(tuple(int(p.shape[0]) for p in shards),
                   tuple(p.device if on_ps else None for p in shards),
                   tuple(shards) if on_ps else ())

    @classmethod
    def local(cls, rows: int) -> "ShardLayout":
        return cls((rows,), (None,))

    @property
    def first_rows(self) -> tuple[int, ...]:
        return tuple(int(s) for s in np.cumsum((0,) + self.sizes[:-1]))

    @property
    def capacities(self) -> tuple[int, ...]:
        """Rows each shard can give to ids (the default row excepted)."""
        return self.sizes[:-1] + (self.sizes[-1] - 1,)

    @property
    def admitting(self) -> tuple[int, ...]:
        """The shards with rows to give (a tiny table's last shard may hold
        the default row alone)."""
        return tuple(k for k, c in enumerate(self.capacities) if c > 0)


def saved_pairs(keys, values) -> tuple[tf.Tensor, tf.Tensor]:
    """The pairs of a saved map: its keys and values without the marker
    pair (key :data:`MARKER`: ids are never negative)."""
    keys, values = tf.reshape(keys, [-1]), tf.reshape(values, [-1])
    kept = keys >= 0
    return tf.boolean_mask(keys, kept), tf.boolean_mask(values, kept)


def owner(ids: tf.Tensor, admitting: Sequence[int]) -> tf.Tensor:
    """The shard whose pending table counts each (non-negative) id."""
    slot = tf.math.floormod(ids, len(admitting))
    return tf.gather(tf.constant(admitting, tf.int32), slot)


def row_shard(rows: tf.Tensor, first_rows: Sequence[int]) -> tf.Tensor:
    """The shard holding each global row."""
    return tf.searchsorted(tf.constant(first_rows[1:], tf.int64), rows,
                           side="right", out_type=tf.int32)


def placed(device: str | None):
    return tf.device(device) if device else contextlib.nullcontext()


def colocated_with(anchor):
    """Variables created inside are placed with ``anchor`` (an embedding
    shard) under ``ParameterServerStrategy``, which ignores ``tf.device``
    for variables (measured: it spreads them round robin over the PS
    tasks)."""
    if anchor is None:
        return contextlib.nullcontext()
    return tf.distribute.get_strategy().extended.colocate_vars_with(anchor)


class ShardedMap(tf.__internal__.tracking.Trackable):
    """One ``MutableHashTable`` (int64 -> int64) per shard, saved as one.

    Args:
      devices: each shard's device (None: local).
      default_value: what a lookup of a missing key returns.
      route: ``(keys, values) -> shard`` of restored pairs.
    """

    def __init__(self, name: str, devices: Sequence[str | None],
                 default_value: int,
                 route: Callable[[tf.Tensor, tf.Tensor], tf.Tensor]) -> None:
        self.devices = tuple(devices)
        self._route = route
        self.shards = []  # not tracked: saved through this object only
        for k, device in enumerate(self.devices):
            with placed(device):
                self.shards.append(tf.lookup.experimental.MutableHashTable(
                    tf.int64, tf.int64, default_value=default_value,
                    name=f"{name}_{k}"))
        self.key_dtype = self.value_dtype = tf.int64

    def export(self) -> tuple[tf.Tensor, tf.Tensor]:
        """The keys and values of all shards (each exported on its PS)."""
        pairs = []
        for device, table in zip(self.devices, self.shards):
            with placed(device):
                pairs.append(table.export())
        return (tf.concat([tf.reshape(k, [-1]) for k, _ in pairs], 0),
                tf.concat([tf.reshape(v, [-1]) for _, v in pairs], 0))

    def size(self) -> tf.Tensor:
        return tf.add_n([t.size() for t in self.shards])

    def shard_sizes(self) -> list[int]:
        return [int(t.size().numpy()) for t in self.shards]

    def import_pairs(self, keys: tf.Tensor, values: tf.Tensor) -> None:
        """Replaces the contents with ``keys`` -> ``values``, each pair in
        the shard that owns it now (the saved marker pair left out)."""
        keys, values = saved_pairs(keys, values)
        parts = tf.dynamic_partition(
            tf.stack([keys, values], 1), self._route(keys, values),
            len(self.shards))
        for device, table, part in zip(self.devices, self.shards, parts):
            with placed(device):
                tf.raw_ops.LookupTableImportV2(
                    table_handle=table.resource_handle, keys=part[:, 0],
                    values=part[:, 1])

    # -- checkpoints: one table, whatever the shard count -----------------

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        """No children in a checkpoint (the shards are saved as one table,
        by this object); in a SavedModel the shard tables themselves, which
        the model's traced functions capture."""
        if save_type == "savedmodel":
            return {f"shard_{k}": t for k, t in enumerate(self.shards)}
        return {}

    def _serialize_to_tensors(self):
        if not (tf.executing_eagerly() or tf.inside_function()):
            return {}  # a SavedModel's graph: the shard tables save there
        keys, values = self.export()
        # A marker pair first: a save cut into slices
        # (``MaxShardSizePolicy``) drops an empty tensor, and a restore
        # then finds no key for an empty map (measured: an empty pending
        # table, every id admitted, failed the restore's check).
        return {_KEYS: tf.concat([[MARKER], keys], 0),
                _VALUES: tf.concat([[MARKER], values], 0)}

    def _restore_from_tensors(self, restored_tensors):
        self.import_pairs(restored_tensors[_KEYS], restored_tensors[_VALUES])
        return tf.no_op()
