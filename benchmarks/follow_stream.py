"""``psrec train --follow`` over two real streams, with a frozen model
beside the followed one.

* ``movielens``: the MovieLens 100K ratings, ingested in time order by
  ``psrec ingest movielens``, split into weekly partitions
  (``dt=YYYY-MM-DD``: the week's first day, UTC), each converted with the
  ``movielens`` spec;
* ``drift``: ``--days`` days of ``psrec synth --drift R --day D`` (the click
  model turns by R radians a day), each converted with the ``criteo``
  spec.

Each partition is converted with ``--eval-fraction 0`` (the test before
train reads every row anyway). The followed run is ``psrec train --follow
LOG --once`` (one device); the frozen run follows the first
``--frozen-after`` partitions only (``--follow-until``) and is then
evaluated on every later partition, on every row, as the followed run's
test is. Prints the commands it runs and one markdown table::

    python benchmarks/follow_stream.py movielens --out /tmp/follow-ml
    python benchmarks/follow_stream.py drift --days 8 --rows 20000 \\
        --drift 0.25 --out /tmp/follow-drift
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
MOVIELENS = REPO.parent / "shared" / "data" / "movielens-100k"
WEEK = 7 * 86400


def _psrec(*args: object) -> None:
    command = [sys.executable, "-m", "psrec", *map(str, args)]
    print("$ psrec " + " ".join(shlex.quote(str(a)) for a in args),
          flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def _convert(raw: Path, spec: str, out: Path) -> None:
    _psrec("convert", raw, "--spec", spec, "--out", out, "--shards", 1,
           "--eval-fraction", 0)


def movielens_partitions(out: Path) -> tuple[Path, str]:
    """Weekly converted partitions of the MovieLens 100K ratings."""
    _psrec("ingest", "movielens", MOVIELENS, "--out", out / "pq")
    table = pq.read_table(sorted((out / "pq").glob("*.parquet"))[0])
    stamps = table["timestamp"].to_numpy()
    first = int(stamps.min())
    start = first - first % 86400  # the first day, 00:00 UTC
    weeks = (stamps - start) // WEEK
    for week in sorted(set(weeks.tolist())):
        day = datetime.datetime.fromtimestamp(
            start + week * WEEK, datetime.timezone.utc).date()
        raw = out / "raw" / f"dt={day.isoformat()}"
        raw.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.filter(pa.array(weeks == week)),
                       raw / "ratings.parquet")
        _convert(raw, "movielens", out / "log" / raw.name)
    return out / "log", "movielens"


def drift_partitions(out: Path, days: int, rows: int, drift: float
                     ) -> tuple[Path, str]:
    """``days`` converted days of a drifting synthetic stream."""
    for day in range(days):
        raw = out / "raw" / f"day={day:03d}"
        _psrec("synth", "--spec", "criteo", "--rows", rows, "--files", 1,
               "--drift", drift, "--day", day, "--out", raw)
        _convert(raw, "criteo", out / "log" / raw.name)
    return out / "log", "criteo"


def follow(log: Path, workdir: Path, batch: int, *extra: object) -> dict:
    _psrec("train", "--strategy", "one-device", "--follow", log,
           "--workdir", workdir, "--batch-size", batch, "--no-export",
           *extra)
    return json.loads((workdir / "summary.json").read_text())


def frozen_tests(workdir: Path, log: Path, names: list[str]) -> dict:
    """The frozen run's latest checkpoint on every row of each partition."""
    from psrec.data.format.manifest import Manifest
    from psrec.launch.job.export import evaluate_checkpoint
    results = {}
    for name in names:
        result = evaluate_checkpoint(workdir / "checkpoints",
                                     Manifest.load(log / name), "train",
                                     checkpoint="latest")
        results[name] = result
    return results


def _main() -> None:
    from psrec.runtime import configure_environment
    configure_environment()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stream", choices=("movielens", "drift"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--days", type=int, default=8)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--drift", type=float, default=0.25)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--frozen-after", type=int, default=1,
                        help="partitions the frozen model trains on")
    args = parser.parse_args()
    if args.stream == "movielens":
        log, _ = movielens_partitions(args.out)
    else:
        log, _ = drift_partitions(args.out, args.days, args.rows, args.drift)
    names = sorted(p.name for p in log.iterdir())
    followed = follow(log, args.out / "followed", args.batch_size, "--once")
    frozen_until = names[args.frozen_after - 1]
    follow(log, args.out / "frozen", args.batch_size, "--follow-until",
           frozen_until)
    frozen = frozen_tests(args.out / "frozen", log,
                          names[args.frozen_after:])
    print("\n| partition | rows | followed: test AUC | logloss | calibration "
          "| train steps | seconds | frozen: AUC | logloss | calibration |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for record in followed["partitions"]:
        test, name = record["test"], record["partition"]
        cells = [name, f"{record['rows']:,}", f"{test.get('auc', 0):.4f}",
                 f"{test.get('logloss', 0):.4f}",
                 f"{test.get('calibration', 0):.2f}", str(record["steps"]),
                 f"{record['seconds']:.1f}"]
        if name in frozen:
            f = frozen[name]
            cells += [f"{f.auc:.4f}", f"{f.logloss:.4f}",
                      f"{f.calibration:.2f}"]
        else:
            cells += ["(trained on it)", "", ""]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    _main()
