"""Delta checkpoint benchmark: bytes and seconds of a delta save against a
full save of one N-row x 16 table on 2 PS, with 1% of its rows changed.

For each ``--rows`` value a child process (in-process servers cannot be
stopped, and each size needs its memory back) starts an in-process cluster
of 2 PS and 1 worker, builds psrec's ``Trainer`` (the Criteo layout: one
table of N rows x ``--dim``, row-wise Adagrad: one accumulator value per
row, the cheaper slot, so 100M rows fit this machine) with
``track_changes``, and in a local checkpoint folder (each PS writes its own
shards):

1. a full save (``Trainer.save``), timed, its files' bytes counted;
2. ``--touched`` (default 1%) of the rows, drawn at random, flagged as the
   sparse update flags them (``ChangeTracker.mark_rows``: the same flag
   variables on each shard's PS; no training steps, whose cost is not what
   is measured here);
3. a delta save (``Trainer.save_delta``), timed, its bytes counted
   (``--touched-rows N``: N rows whatever the table size, to show that a
   delta's cost follows the rows changed, not the table).

The checkpoint folder is deleted at the end of each size. One JSON line per
size on stdout, a table on stderr. Memory: rows x dim x 4 bytes (table) +
rows x 4 (slot) + rows (flags) in this process; take the machine's big
memory lock for 100M rows::

    flock /tmp/psrec-bigmem.lock .venv/bin/python benchmarks/delta_checkpoint.py \\
        --rows 10000000 50000000 100000000
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from psrec.runtime import configure_environment


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _one(args: argparse.Namespace) -> dict:
    configure_environment()
    import numpy as np

    from psrec.data.input.config import InputConfig
    from psrec.features.spec.presets import criteo
    from psrec.models.optim.config import OptimizerConfig
    from psrec.models.ranking.config import ModelConfig
    from psrec.ps_cluster.cluster.in_process import in_process_cluster
    from psrec.ps_cluster.cluster.partition_config import PartitionConfig
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    from psrec.ps_cluster.training.trainer import Trainer

    folder = Path(tempfile.mkdtemp(prefix="psrec-delta-bench-",
                                   dir=args.scratch))
    try:
        strategy = build_ps_strategy(in_process_cluster(1, 2),
                                     PartitionConfig(kind="fixed"))
        spec = criteo(buckets=args.one // 26, dim=args.dim)
        began = time.perf_counter()
        trainer = Trainer(strategy, spec,
                          ModelConfig(interaction="concat", top_mlp=(8,)),
                          OptimizerConfig(sparse="rowwise_adagrad"),
                          InputConfig(batch_size=256),
                          checkpoint_dir=folder / "checkpoints",
                          track_changes=True)
        init_s = time.perf_counter() - began
        rows = spec.tables[0].rows
        began = time.perf_counter()
        full = trainer.save()
        full_s = time.perf_counter() - began
        full_bytes = sum(p.stat().st_size for p in
                         (folder / "checkpoints").glob("ckpt-0.*"))
        count = (args.touched_rows if args.touched_rows is not None
                 else int(rows * args.touched))
        touched = np.random.default_rng(0).choice(rows, count, replace=False)
        prefix = next(iter(trainer.changes.flags))
        trainer.changes.mark_rows(prefix, np.sort(touched))
        trainer.progress.step.assign(1)
        began = time.perf_counter()
        delta = trainer.save_delta()
        delta_s = time.perf_counter() - began
        delta_bytes = _bytes(Path(delta))
        manifest = json.loads((Path(delta) / "manifest.json").read_text())
        written = sum(p["rows"] for p in manifest["parts"].values())
        assert written == touched.size, (written, touched.size)
        return {"rows": rows, "dim": args.dim, "ps": 2,
                "touched_rows": int(touched.size), "init_s": round(init_s, 1),
                "full_path": Path(full).name, "full_bytes": full_bytes,
                "full_s": round(full_s, 2), "delta_bytes": delta_bytes,
                "delta_s": round(delta_s, 2),
                "bytes_ratio": round(delta_bytes / full_bytes, 4),
                "time_ratio": round(delta_s / full_s, 4)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+",
                        default=[10_000_000, 50_000_000, 100_000_000])
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--touched", type=float, default=0.01,
                        help="share of the rows changed before the delta")
    parser.add_argument("--touched-rows", type=int, default=None,
                        help="rows changed before the delta, whatever the "
                        "table size (instead of --touched)")
    parser.add_argument("--scratch", default=None,
                        help="folder of the scratch checkpoints (default: "
                        "the system's temporary folder)")
    parser.add_argument("--one", type=int, default=None,
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(_one(args)), flush=True)
        return 0
    results = []
    for rows in args.rows:
        child = [sys.executable, "-P", __file__, "--one", str(rows),
                 "--dim", str(args.dim), "--touched", str(args.touched)]
        if args.touched_rows is not None:
            child += ["--touched-rows", str(args.touched_rows)]
        if args.scratch:
            child += ["--scratch", args.scratch]
        done = subprocess.run(child, capture_output=True, text=True,
                              check=False)
        if done.returncode:
            sys.stderr.write(done.stderr[-3000:])
            return done.returncode
        line = done.stdout.strip().splitlines()[-1]
        print(line, flush=True)
        results.append(json.loads(line))
    print(f"{'rows':>12} {'touched':>9} {'full GB':>8} {'full s':>7} "
          f"{'delta MB':>9} {'delta s':>8} {'bytes':>7} {'time':>7}",
          file=sys.stderr)
    for r in results:
        print(f"{r['rows']:>12,} {r['touched_rows']:>9,} "
              f"{r['full_bytes'] / 1e9:>8.2f} {r['full_s']:>7.1f} "
              f"{r['delta_bytes'] / 1e6:>9.1f} {r['delta_s']:>8.2f} "
              f"{r['bytes_ratio']:>7.2%} {r['time_ratio']:>7.2%}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
