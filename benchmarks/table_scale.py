"""Issue 11's speed targets, measured in one session: ``psrec bench`` and
the tutorial-style baseline at two table sizes, and psrec in one process.

Each round runs, in this order: baseline 100k, psrec 100k, baseline 2M,
psrec 2M, psrec one process 100k (buckets per feature; 26 features share
one table, so 100k = 2.6M rows and 2M = 52M rows of dim 16). Rounds repeat
that order (A B A B), and the ratios are taken within a round, then their
median: absolute figures swing ~2x between runs on a shared machine, ratios
much less. Peak RSS is each process's maximum resident set (``/usr/bin/time
-f %M``; an in-process cluster lives in one process, so it is the whole
cluster's).

    python benchmarks/table_scale.py --rounds 2 [--big 2000000] [--steps 300]

psrec runs ``--model dcn``, the baseline's towers. Prints one JSON line per
run and a final table of the targets: psrec / baseline at 100k (issue 22:
>= 1.8; issue 11 asked 2.2) and at 2M (issue 22: >= 1.6); psrec 2M / psrec
100k (>= 0.9); psrec / psrec one process (>= 1.0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT.parent / "shared" / "bench" / "tutorial_baseline.py"


def _run(name: str, command: list[str]) -> dict:
    """Runs one benchmark process; its JSON line plus peak RSS (GiB)."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        done = subprocess.run(
            ["/usr/bin/time", "-o", rss.name, "-f", "%M", *command],
            capture_output=True, text=True, check=False)
        peak_kib = int(rss.read().split()[-1])
    lines = [line for line in done.stdout.splitlines()
             if "examples_per_sec" in line]
    if done.returncode != 0 or not lines:
        sys.exit(f"{name} failed (exit {done.returncode}):\n"
                 f"{done.stderr[-3000:]}")
    result = json.loads(lines[-1])
    result.update(run=name, peak_rss_gib=round(peak_kib / 2**20, 2))
    print(json.dumps(result), flush=True)
    return result


def _round(args: argparse.Namespace) -> dict[str, dict]:
    python = sys.executable
    common = ["--steps", str(args.steps)]
    model = ["--model", "dcn"]  # the baseline's towers (DCN-v2 + MLP)
    runs: dict[str, dict] = {}
    for buckets in (args.small, args.big):
        size = ["--buckets", str(buckets)]
        runs[f"baseline {buckets}"] = _run(
            f"baseline {buckets}",
            [python, str(args.baseline), *common, *size])
        runs[f"psrec {buckets}"] = _run(
            f"psrec {buckets}",
            [python, "-m", "psrec", "bench", "--json", *model, *common,
             *size])
    runs["single"] = _run(
        f"psrec single-process {args.small}",
        [python, "-m", "psrec", "bench", "--json", "--single-process",
         *model, *common, "--buckets", str(args.small)])
    return runs


def _ratios(runs: dict[str, dict], args: argparse.Namespace
            ) -> dict[str, float]:
    def rate(key: str) -> float:
        return runs[key]["examples_per_sec"]
    small, big = args.small, args.big
    return {
        f"psrec/baseline at {small}": rate(f"psrec {small}")
        / rate(f"baseline {small}"),
        f"psrec/baseline at {big}": rate(f"psrec {big}")
        / rate(f"baseline {big}"),
        f"psrec {big} / psrec {small}": rate(f"psrec {big}")
        / rate(f"psrec {small}"),
        "psrec cluster / one process": rate(f"psrec {small}")
        / rate("single"),
    }


TARGETS = (1.8, 1.6, 0.9, 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--small", type=int, default=100_000)
    parser.add_argument("--big", type=int, default=2_000_000)
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    args = parser.parse_args()
    os.chdir(ROOT)
    per_round = [_ratios(_round(args), args) for _ in range(args.rounds)]
    print(f"{'ratio':34} {'per round':28} median  target")
    for (name, _), target in zip(per_round[0].items(), TARGETS):
        values = [r[name] for r in per_round]
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name:34} {shown:28} {statistics.median(values):5.2f}"
              f"  >= {target}")


if __name__ == "__main__":
    main()
