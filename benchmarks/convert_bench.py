"""Single-core throughput of ``psrec convert`` and of parsing its shards.

Generates N synthetic Criteo rows (``criteo()`` preset, default buckets) as
Parquet in a temporary folder -- not timed -- then, restricted to one CPU
core, times:

* ``psrec.data.convert.convert.convert`` (schema check, row checks, hashing of the 26
  categorical columns, block encoding, sharded TFRecord writing, sha256 and
  manifest): rows read per second;
* reading every train shard back with ``psrec.data.input.dataset.make_eval_dataset``
  (batch 4096): rows parsed per second.

Each measurement is repeated ``--repeat`` times and the median is reported as
one JSON line on stdout::

    {"convert_rows_per_sec": ..., "parse_rows_per_sec": ..., "rows": ...,
     "cores": 1}

Usage: ``python benchmarks/convert_bench.py [--rows 500000] [--repeat 3]``
(or ``make bench``).
"""

from __future__ import annotations

import os

# Thread pools read these when the libraries load, so they are set first.
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
              "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
    os.environ[_name] = "1"

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psrec.runtime import configure_environment  # noqa: E402

configure_environment()

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402


def _log(message: str) -> None:
    print(f"[convert_bench] {message}", file=sys.stderr, flush=True)


def _restrict_to_one_core() -> None:
    """Pins the process to one core and sizes every thread pool to 1.

    Must run before TensorFlow executes its first op.
    """
    if hasattr(os, "sched_setaffinity"):
        core = {min(os.sched_getaffinity(0))}
        os.sched_setaffinity(0, core)  # this thread and every later one
        # Threads started earlier (Arrow's pool, used by the generation) are
        # pinned one by one (Linux: a thread id is a valid pid here).
        tasks = Path("/proc/self/task")
        for tid in (tasks.iterdir() if tasks.is_dir() else ()):
            try:
                os.sched_setaffinity(int(tid.name), core)
            except OSError:
                pass  # the thread has exited
    import pyarrow as pa
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=500_000,
                        help="synthetic Criteo rows (default 500000)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="timed repetitions; the median is reported")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--block-rows", type=int, default=256)
    parser.add_argument("--files", type=int, default=4,
                        help="Parquet input files")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.rows < 1 or args.repeat < 1:
        parser.error("--rows and --repeat must be >= 1")

    from psrec.data.ingest.synthetic import write_synthetic_parquet
    from psrec.features import criteo

    spec = criteo()
    work = Path(tempfile.mkdtemp(prefix="psrec-convert-bench-"))
    try:
        started = time.perf_counter()
        inputs = write_synthetic_parquet(spec, work / "parquet", args.rows,
                                         files=args.files, seed=args.seed)
        _log(f"generated {args.rows} rows in {len(inputs)} Parquet files in "
             f"{time.perf_counter() - started:.1f} s (not timed)")

        _restrict_to_one_core()
        from psrec.data.convert.convert import ConversionOptions
        from psrec.data.convert.convert import convert
        from psrec.data.input.dataset import make_eval_dataset
        from psrec.features.spec.spec import ID_COLUMN

        options = ConversionOptions(shards=args.shards,
                                    block_rows=args.block_rows)
        convert_rates, manifest = [], None
        for i in range(args.repeat):
            out = work / f"out-{i}"
            started = time.perf_counter()
            report = convert(inputs, spec, out, options)
            seconds = time.perf_counter() - started
            if report.rows_read != args.rows or report.bad_rows:
                raise RuntimeError(f"unexpected conversion: {report.summary()}")
            convert_rates.append(args.rows / seconds)
            _log(f"convert #{i + 1}: {seconds:.2f} s, "
                 f"{convert_rates[-1]:,.0f} rows/s")
            if manifest is not None:
                shutil.rmtree(manifest.root)
            manifest = report.manifest

        files = manifest.files("train")
        parse_rates = []
        for i in range(args.repeat):
            dataset = make_eval_dataset(files, spec, 4096, manifest.block_rows)
            rows = 0
            started = time.perf_counter()
            for batch in dataset:
                rows += int(batch[ID_COLUMN].shape[0])
            seconds = time.perf_counter() - started
            if rows != args.rows:
                raise RuntimeError(f"parsed {rows} rows, expected {args.rows}")
            parse_rates.append(rows / seconds)
            _log(f"parse #{i + 1}: {seconds:.2f} s, "
                 f"{parse_rates[-1]:,.0f} rows/s")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(json.dumps({
        "convert_rows_per_sec": round(statistics.median(convert_rates), 1),
        "parse_rows_per_sec": round(statistics.median(parse_rates), 1),
        "rows": args.rows,
        "cores": 1,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
