"""A synthetic retrieval catalogue with a known ground truth, shared by the
retrieval tests.

``GROUPS`` groups of ``USERS_PER_GROUP`` users and ``ITEMS_PER_GROUP``
items; a user interacts only with the items of its group (uniformly), so
the ideal model puts a held-out item among the user's ``ITEMS_PER_GROUP``
best candidates: recall@10 is 1 for it (the catalogue holds ``GROUPS *
ITEMS_PER_GROUP`` items). Users carry their group and items their category
(= group) as features, so a model can learn the structure from a few
hundred steps.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

GROUPS = 40
USERS_PER_GROUP = 10
ITEMS_PER_GROUP = 5
ROWS = 12_000


def retrieval_spec_dict() -> dict:
    """The spec (as a spec file holds it) of the synthetic catalogue."""
    return {
        "name": "synthetic-retrieval",
        "label": {"name": "label"},
        "tables": [{"name": "users", "rows": 4000, "dim": 16},
                   {"name": "items", "rows": 4000, "dim": 16},
                   {"name": "groups", "rows": 200, "dim": 16}],
        "dense": [],
        "categorical": [
            {"name": "user_id", "table": "users", "dtype": "int64",
             "hash_buckets": 4000},
            {"name": "user_group", "table": "groups", "hash_buckets": 100},
            {"name": "item_id", "table": "items", "dtype": "int64",
             "hash_buckets": 4000},
            {"name": "category", "table": "groups", "hash_buckets": 100,
             "row_offset": 100}],
        "towers": {"query": ["user_id", "user_group"],
                   "candidate": ["item_id", "category"],
                   "candidate_id": "item_id"},
    }


def write_retrieval_parquet(path: str | Path, rows: int = ROWS,
                            seed: int = 0) -> Path:
    """``rows`` (user, item) interactions of the synthetic catalogue."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, GROUPS * USERS_PER_GROUP, rows)
    group = users // USERS_PER_GROUP
    items = group * ITEMS_PER_GROUP + rng.integers(0, ITEMS_PER_GROUP, rows)
    table = pa.table({
        "label": pa.array(np.ones(rows, np.int64)),
        "user_id": pa.array(users + 1000, pa.int64()),
        "user_group": pa.array([f"g{g}" for g in group]),
        "item_id": pa.array(items + 5000, pa.int64()),
        "category": pa.array([f"g{g}" for g in group]),
    })
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def catalogue_size() -> int:
    return GROUPS * ITEMS_PER_GROUP
