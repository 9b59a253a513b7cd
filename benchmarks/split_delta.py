"""Bytes and time of a split export's delta against its full table dump.

A table of ``--rows`` rows x ``--dim`` float32 (a hashed table's state,
held in memory as the restored model holds it) is written as the full
Parquet dump of ``psrec export --split`` (``bundle.TableWriter``, streamed
a row group at a time: the "base"). Then ``--changed`` of its rows (a
fraction, drawn at random) get new values and, in the same process:

* **full**: the new state written as a full dump;
* **delta**: what ``--delta-since`` does per table: the base dump read back
  and compared with the new state by value, streamed (``bundle.diff``), and
  the changed rows written;
* **apply**: what ``psrec apply-delta`` does: base + delta merged into a
  full dump (``bundle.apply``), checked byte-equal to **full**.

Each is timed ``--repeat`` times (median). One JSON line on stdout::

    {"rows": ..., "dim": ..., "changed_rows": ..., "full_bytes": ...,
     "delta_bytes": ..., "bytes_ratio": ..., "full_s": ..., "delta_s": ...,
     "apply_s": ..., "time_ratio": ..., "applied_equals_full": true}

Usage: ``.venv/bin/python benchmarks/split_delta.py [--rows 4000000]
[--dim 16] [--changed 0.01] [--repeat 3]``. Needs about 3 x rows x dim x 4
bytes of memory and twice that of temporary disk.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psrec.models.serving.bundle import ROW_GROUP_ROWS  # noqa: E402
from psrec.models.serving.bundle import DiffCounts  # noqa: E402
from psrec.models.serving.bundle import TableWriter  # noqa: E402
from psrec.models.serving.bundle import apply  # noqa: E402
from psrec.models.serving.bundle import diff  # noqa: E402
from psrec.models.serving.bundle import read_blocks  # noqa: E402


def _blocks(table: np.ndarray):
    for start in range(0, len(table), ROW_GROUP_ROWS):
        block = table[start:start + ROW_GROUP_ROWS]
        yield np.arange(start, start + len(block), dtype=np.int64), block


def _write(path: Path, blocks, dim: int | None) -> int:
    writer = TableWriter(path, "t", dim)
    for keys, vectors in blocks:
        writer.write(keys, vectors)
    writer.close()
    return writer.rows


def _timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--changed", type=float, default=0.01)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    old = rng.normal(0, 0.05, (args.rows, args.dim)).astype(np.float32)
    new = old.copy()
    touched = rng.choice(args.rows, int(args.rows * args.changed),
                         replace=False)
    new[touched] += rng.normal(0, 0.01, (touched.size, args.dim)).astype(
        np.float32)
    with tempfile.TemporaryDirectory(prefix="split-delta-") as tmp:
        root = Path(tmp)
        base, full = root / "base.parquet", root / "full.parquet"
        delta, applied = root / "delta.parquet", root / "applied.parquet"
        _write(base, _blocks(old), args.dim)
        counts = DiffCounts()

        def write_delta() -> None:
            counts.__init__()
            upserts = (block for block, _ in diff(
                read_blocks(base, args.dim), _blocks(new), args.dim, counts))
            _write(delta, upserts, args.dim)

        def write_applied() -> None:
            _write(applied, apply(read_blocks(base, args.dim),
                                  read_blocks(delta, args.dim), iter(()),
                                  args.dim), args.dim)

        times = {"full": [], "delta": [], "apply": []}
        for _ in range(args.repeat):
            times["full"].append(_timed(lambda: _write(
                full, _blocks(new), args.dim)))
            times["delta"].append(_timed(write_delta))
            times["apply"].append(_timed(write_applied))
            print(json.dumps({k: round(v[-1], 3) for k, v in times.items()}),
                  file=sys.stderr)
        median = {k: statistics.median(v) for k, v in times.items()}
        result = {
            "rows": args.rows, "dim": args.dim,
            "changed_rows": counts.changed,
            "full_bytes": full.stat().st_size,
            "delta_bytes": delta.stat().st_size,
            "bytes_ratio": round(delta.stat().st_size / full.stat().st_size,
                                 4),
            "full_s": round(median["full"], 3),
            "delta_s": round(median["delta"], 3),
            "apply_s": round(median["apply"], 3),
            "time_ratio": round(median["delta"] / median["full"], 3),
            "applied_equals_full": _sha(applied) == _sha(full)}
    assert result["changed_rows"] == touched.size
    print(json.dumps(result))


if __name__ == "__main__":
    main()
