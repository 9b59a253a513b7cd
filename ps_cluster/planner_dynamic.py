"""The bytes of the dynamic tables' own state, for the sharding planner.

A ``mode: dynamic`` table's rows (``capacity + 1``) and their optimizer
slots are planned as any table's. Its maps and per-row statistics
(``psrec.models.dynamic_table``) come on top, counted on the PS task that
holds its maps (table index modulo the PS count):

* the id -> row map: at most ``capacity`` entries of an int64 key and
  value, about :data:`HASH_ENTRY_BYTES` each with the hash table's
  overhead;
* the pending counts: at most ``capacity`` entries after each maintenance
  (the least seen are forgotten; between two maintenances it may grow by
  the ids of ``maintenance_every`` steps);
* ``row_ids``, ``freq`` and ``last_seen``: 8 bytes per row each.
"""

from __future__ import annotations

import numpy as np

from psrec.features.spec import FeatureSpec

HASH_ENTRY_BYTES = 32  # int64 key + int64 value, at ~50% load
ROW_STAT_BYTES = 3 * 8  # row_ids, freq, last_seen


def dynamic_table_bytes(capacity: int) -> int:
    """Bytes of one dynamic table's maps and row statistics."""
    return capacity * (2 * HASH_ENTRY_BYTES + ROW_STAT_BYTES)


def dynamic_ps_bytes(spec: FeatureSpec, num_ps: int) -> np.ndarray:
    """Bytes of the dynamic tables' state on each of ``num_ps`` PS tasks."""
    per_ps = np.zeros(num_ps, np.int64)
    for index, table in enumerate(spec.tables):
        if table.dynamic:
            per_ps[index % num_ps] += dynamic_table_bytes(table.capacity)
    return per_ps
