"""Seconds of one dynamic-table maintenance at capacity, in one process.

A table of ``--capacity`` rows cut into ``--shards`` local shards is filled
(every row used, random ``freq`` / ``last_seen`` with many ties), then
``--waiting`` ids per round wait for admission seen more often than any row
(LFU: each evicts one row; TTL: every row is old enough), and one
maintenance (``DynamicTable.maintain``: selection, map and statistics
updates) is timed; the median of ``--repeats`` rounds is printed, after one
untimed round (tracing). ``--selection sort`` times the selection this
replaced (stable sorts of all used rows by every key, then a cut),
``topk`` the current one (``models.dynamic.select.coldest``); both pick the
same rows (``tests/test_dynamic_select.py``).

    python benchmarks/dynamic_maintenance.py --capacity 10000000 --shards 2

Prints one JSON line per (evict, selection). The id -> row map is left
empty (evicted ids are removed from it whether present or not): its
insert/remove cost is O(admitted) in both versions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def _sort_coldest(keys, k):
    """The selection before top-k: stable sorts by every key, a cut."""
    import tensorflow as tf
    order = tf.range(tf.size(keys[0], out_type=tf.int64))
    for key in reversed(keys):
        order = tf.gather(order, tf.argsort(tf.gather(key, order),
                                            stable=True))
    return order[:tf.cast(k, tf.int32)]


def _table(capacity: int, shards: int, evict: str):
    from psrec.features.spec.columns import TableConfig
    from psrec.models.dynamic.shards import ShardLayout
    from psrec.models.dynamic.table import DynamicTable
    from psrec.models.dynamic.table import parts
    config = TableConfig("t", dim=16, mode="dynamic", capacity=capacity,
                         evict=evict, ttl_steps=1 if evict == "ttl" else None,
                         maintenance_every=100)
    rows = capacity + 1
    sizes = [rows // shards] * (shards - 1)
    sizes.append(rows - sum(sizes))
    table = DynamicTable(config, ShardLayout(tuple(sizes),
                                             (None,) * shards))
    rng = np.random.default_rng(0)
    start = 0
    for k, size in enumerate(sizes):
        used = np.arange(start, start + size, dtype=np.int64)
        if k == shards - 1:
            used[-1] = -2  # the default row
        parts(table.row_ids)[k].assign(used)
        parts(table.freq)[k].assign(rng.integers(1, 1000, size))
        parts(table.last_seen)[k].assign(rng.integers(0, 50, size))
        start += size
    return table


def _round(table, waiting: int, step: int, first_id: int) -> float:
    """Times one maintenance with ``waiting`` ids ready per shard (each
    counted by its own shard's pending table, as if routed there)."""
    import tensorflow as tf
    ids = np.arange(first_id, first_id + waiting * len(table.map.shards),
                    dtype=np.int64) * 2 ** 20  # far above any row id
    for k, counts in enumerate(table.counts.shards):
        mine = ids[k::len(table.map.shards)]
        counts.insert(tf.constant(mine), tf.fill([mine.size],
                                                 tf.constant(10 ** 6,
                                                             tf.int64)))
    began = time.perf_counter()
    done = table.maintain(step)
    seconds = time.perf_counter() - began
    if done.evicted != done.admitted:
        raise SystemExit(f"expected every admission to evict: {done}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--waiting", type=int, default=1000,
                        help="ids ready for admission per shard and round")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--selection", choices=("sort", "topk", "both"),
                        default="both")
    parser.add_argument("--evict", choices=("lfu", "ttl", "both"),
                        default="both")
    args = parser.parse_args()
    from psrec.runtime import configure_environment
    configure_environment()
    from psrec.models.dynamic import select as dynamic_select
    topk = dynamic_select.coldest
    selections = ("sort", "topk") if args.selection == "both" else (
        args.selection,)
    evicts = ("lfu", "ttl") if args.evict == "both" else (args.evict,)
    for evict in evicts:
        for selection in selections:
            dynamic_select.coldest = (_sort_coldest if selection == "sort"
                                      else topk)
            table = _table(args.capacity, args.shards, evict)
            times = [_round(table, args.waiting, 100 * (r + 1),
                            r * args.waiting * args.shards + 1)
                     for r in range(args.repeats + 1)]
            print(json.dumps({
                "capacity": args.capacity, "shards": args.shards,
                "evict": evict, "selection": selection,
                "waiting_per_shard": args.waiting,
                "seconds_median": round(statistics.median(times[1:]), 3),
                "seconds": [round(t, 3) for t in times[1:]],
                "first_with_tracing": round(times[0], 3)}), flush=True)
            del table


if __name__ == "__main__":
    main()
