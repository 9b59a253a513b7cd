"""16-bit tables: their quality against float32 tables, and bytes per row.

Two parts:

* ``bytes`` (no data, no training): the bytes of one table row of
  training state (the row and its optimizer slots) for each sparse
  optimizer and table dtype at a dim, as the planner counts them
  (``models.optim.config.row_bytes``), beside the bytes of the variables
  a real one-device model holds for one such table (its variable and its
  slots, read from ``tf.Variable`` shapes and dtypes): the two must be
  equal.
* ``quality``: ``psrec train --strategy one-device`` on one converted data
  folder with ``--table-dtype`` float32 and bfloat16 for each seed
  (``quality_baseline.psrec_run``), the run length sized from the data, the
  exported best checkpoint's eval AUC and logloss (``summary.json``), one
  JSON line per run appended to ``--results`` (a run already there is not
  run again); at the end the table, with each 16-bit run's AUC difference
  to the float32 run of the same seed.

Run from the repository root::

    TF_USE_LEGACY_KERAS=1 .venv/bin/python benchmarks/table_dtype.py bytes
    TF_USE_LEGACY_KERAS=1 .venv/bin/python benchmarks/table_dtype.py quality \\
        --data /tmp/qb/criteo/data --name criteo --results /tmp/qb/dtype.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

# benchmarks/ is this script's folder: its runs are quality_baseline's
from quality_baseline import _done  # noqa: E402
from quality_baseline import _read  # noqa: E402
from quality_baseline import psrec_run  # noqa: E402
from quality_baseline import run_row  # noqa: E402

from psrec.features.spec.columns import TABLE_DTYPES  # noqa: E402


def bytes_table(dim: int, rows: int) -> str:
    """Bytes per row by optimizer x dtype: planned and as built."""
    from psrec.runtime import configure_environment
    configure_environment()
    import tensorflow as tf

    from psrec.models.optim.config import SPARSE_OPTIMIZERS
    from psrec.models.optim.config import row_bytes
    from psrec.models.optim.optimizers import make_optimizer
    lines = [f"bytes per row of training state (table row + optimizer "
             f"slots), dim {dim}:", "",
             "| optimizer | " + " | ".join(TABLE_DTYPES) + " | built ("
             + ", ".join(TABLE_DTYPES) + ") |",
             "|---|" + "---:|" * (len(TABLE_DTYPES) + 1)]
    for name in SPARSE_OPTIMIZERS:
        planned, built = [], []
        for dtype in TABLE_DTYPES:
            planned.append(row_bytes(name, dim, TABLE_DTYPES[dtype]))
            table = tf.Variable(tf.zeros([rows, dim], dtype), name="t")
            optimizer = make_optimizer(name, 0.1)
            optimizer._create_all_weights([table])  # noqa: SLF001
            variables = [table] + [optimizer.get_slot(table, slot)
                                   for slot in optimizer.get_slot_names()]
            total = sum(v.dtype.size * v.shape.num_elements()
                        for v in variables)
            built.append(total / rows)
        lines.append(f"| {name} | " + " | ".join(map(str, planned)) + " | "
                     + ", ".join(f"{b:g}" for b in built) + " |")
    return "\n".join(lines)


def quality_table(records: list[dict], name: str) -> str:
    mine = [r for r in records if r["dataset"] == name]
    base = {r["seed"]: r["auc"] for r in mine if r["dtype"] == "float32"}
    lines = [f"{name}:", "", "| --table-dtype | seed | best eval AUC | "
             "logloss | best at step / steps run | AUC - float32 (same "
             "seed) | wall s |", "|---|---|---|---|---|---|---|"]
    for r in sorted(mine, key=lambda r: (r["dtype"] != "float32", r["dtype"],
                                         r["seed"])):
        diff = ("" if r["dtype"] == "float32" or r["seed"] not in base
                else f"{r['auc'] - base[r['seed']]:+.4f}")
        lines.append(run_row(r["dtype"], r, diff))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("part", choices=("bytes", "quality"))
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--data", type=Path, help="converted data folder")
    parser.add_argument("--name", help="data set name")
    parser.add_argument("--results", type=Path,
                        help="JSON lines file (appended; resumes)")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--dtypes", default=",".join(TABLE_DTYPES))
    parser.add_argument("--flags", default="",
                        help="more psrec train flags, space-separated")
    parser.add_argument("--table", action="store_true",
                        help="only print the table of --results")
    args = parser.parse_args()
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    if args.part == "bytes":
        print(bytes_table(args.dim, args.rows))
        return
    if not (args.name and args.results):
        parser.error("quality needs --name and --results (and --data)")
    if not args.table:
        workdir = args.results.parent / f"dtype-runs-{args.name}"
        for seed in (int(s) for s in args.seeds.split(",")):
            for dtype in args.dtypes.split(","):
                key = {"dataset": args.name, "dtype": dtype, "seed": seed}
                if _done(_read(args.results), **key):
                    continue
                run_dir = workdir / f"{dtype}-s{seed}"
                entry = {**key, **psrec_run(
                    args.data.resolve(), run_dir,
                    ["--table-dtype", dtype, *args.flags.split()], seed,
                    "one-device")}
                shutil.rmtree(run_dir, ignore_errors=True)
                with args.results.open("a") as out:
                    out.write(json.dumps(entry) + "\n")
                print(json.dumps(entry), file=sys.stderr)
    print(quality_table(_read(args.results), args.name))


if __name__ == "__main__":
    main()
