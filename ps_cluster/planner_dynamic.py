"""The bytes of the dynamic tables' own state, for the sharding planner.

A ``mode: dynamic`` table's rows (``capacity + 1``) and their optimizer
slots are planned as any table's. Its maps and per-row statistics
(``psrec.models.dynamic_table``) come on top, one part per embedding shard,
on the PS task that holds that shard (``models.dynamic_shards``), sized by
the shard's rows:

* the id -> row map shard: at most one entry per row of the shard, an
  int64 key and value, about :data:`HASH_ENTRY_BYTES` each with the hash
  table's overhead;
* the pending counts shard: at most one entry per row after each
  maintenance (the least seen are forgotten; between two maintenances it
  may grow by the ids of ``maintenance_every`` steps);
* ``row_ids``, ``freq`` and ``last_seen``: 8 bytes per row each.
"""

from __future__ import annotations

from psrec.features.spec import FeatureSpec

HASH_ENTRY_BYTES = 32  # int64 key + int64 value, at ~50% load
ROW_STAT_BYTES = 3 * 8  # row_ids, freq, last_seen


def dynamic_table_bytes(rows: int) -> int:
    """Bytes of the maps and row statistics of ``rows`` rows of a dynamic
    table (one shard's, or a whole table's)."""
    return rows * (2 * HASH_ENTRY_BYTES + ROW_STAT_BYTES)


def dynamic_names(spec: FeatureSpec) -> frozenset[str]:
    """The names of the table variables whose shards carry dynamic state
    (a dynamic table's wide twin has none)."""
    return frozenset(t.name for t in spec.tables if t.dynamic)
