"""Two-tower retrieval against the popularity baseline, over seeds.

Converts the MovieLens-100k sample as the retrieval tutorial does
(``psrec ingest movielens``, then ``psrec convert --spec movielens-retrieval
--split hash --eval-fraction 0.2``; ``--split time`` converts a split by
time instead: ``--split tail --order-by timestamp``, the latest 20% of the
ratings held out), then
runs ``psrec train --task retrieval --epochs 20 --batch-size 512`` (the
tutorial's command) with each configuration's flags added, once per
configuration and seed, each in a subprocess and its own workdir
(``--work/runs/``, kept, beside its output: ``--work/runs/*.log``), and
reads the final exact evaluation from the run's
``summary.json``: recall@10/50/100 and MRR over every held-out pair against
the whole catalogue, with the popularity baseline of the same pairs (every
candidate ranked by its train-split positives) that psrec reports beside
them.

Each result is appended as one JSON line to ``--results`` (a run already
there is not run again, so an interrupted benchmark resumes); at the end
the Markdown table is printed: per configuration the mean of each metric
over the seeds, its spread (max - min) and the margin over popularity (the
worst seed's figure minus the baseline's). Run from the repository root::

    .venv/bin/python benchmarks/retrieval_vs_popularity.py \\
        --work /tmp/rvp --results /tmp/rvp/results.jsonl --seeds 0 1 2

``--config NAME='FLAGS'`` replaces the configurations (default: the
defaults, ``--no-candidate-bias`` and ``--epochs 5``); ``--strategy``
(default ``ps``, the tutorial's local cluster; ``one-device`` is faster);
``--table`` prints the table of ``--results`` without running anything.
The model's initial values are not seeded: a seed is ``--seed`` (the
shuffle) and one more independent run.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT.parent / "shared" / "data" / "movielens-100k"
#: The tutorial's training flags (docs/tutorials/retrieval.md).
TUTORIAL = ["--epochs", "20", "--batch-size", "512"]
CONFIGS = {"defaults": "", "--no-candidate-bias": "--no-candidate-bias",
           "--epochs 5": "--epochs 5"}
METRICS = (("recall@10", ("recall", "10")), ("recall@50", ("recall", "50")),
           ("recall@100", ("recall", "100")), ("MRR", ("mrr",)))


def _psrec() -> str:
    return str(Path(sys.executable).with_name("psrec"))


def _run(cmd: list[str], log: Path | None = None) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if log is not None:
        log.write_text(done.stdout + done.stderr)
    if done.returncode:
        sys.exit(f"{shlex.join(cmd)} exited {done.returncode}:\n"
                 f"{done.stdout[-2000:]}{done.stderr[-2000:]}")


def convert(work: Path, split: str) -> Path:
    """The tutorial's data (``--split hash``) or a split by time."""
    raw, data = work / "raw", work / f"retrieval-{split}"
    if not (raw / "movielens.parquet").exists():
        _run([_psrec(), "ingest", "movielens", str(SAMPLE), "--out",
              str(raw)])
    if not (data / "manifest.json").exists():
        flags = (["--split", "hash"] if split == "hash"
                 else ["--split", "tail", "--order-by", "timestamp"])
        _run([_psrec(), "convert", str(raw), "--spec", "movielens-retrieval",
              *flags, "--eval-fraction", "0.2", "--out", str(data)])
    return data


def train(data: Path, workdir: Path, flags: list[str], seed: int,
          strategy: str) -> dict:
    """One ``psrec train --task retrieval``; its final eval."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.parent.mkdir(parents=True, exist_ok=True)
    _run([_psrec(), "train", "--task", "retrieval", "--data", str(data),
          "--workdir", str(workdir), *TUTORIAL, "--strategy", strategy,
          "--seed", str(seed), *flags], log=workdir.with_suffix(".log"))
    summary = json.loads((workdir / "summary.json").read_text())
    return {"eval": summary["eval"], "seconds": summary["seconds"]}


def _value(result: dict, path: tuple[str, ...]) -> float:
    for key in path:
        result = result[key]
    return float(result)


def table(records: list[dict]) -> str:
    """Markdown: per (split, configuration), each metric's mean over the
    seeds, its spread and the worst seed's margin over popularity."""
    lines = ["| split | configuration | seeds | " + " | ".join(
        f"{name} mean (spread) [worst - popularity]"
        for name, _ in METRICS) + " |",
             "|---|---|---|" + "---|" * len(METRICS)]
    groups: dict[tuple[str, str], list[dict]] = {}
    for record in records:
        groups.setdefault((record["split"], record["config"]),
                          []).append(record)
    baselines = {}
    for (split, name), runs in groups.items():
        cells = []
        for metric, path in METRICS:
            values = [_value(r["eval"], path) for r in runs]
            base = _value(runs[0]["eval"]["popularity"], path)
            baselines[split] = baselines.get(split, {}) | {metric: base}
            cells.append(f"{statistics.mean(values):.4f} "
                         f"({max(values) - min(values):.4f}) "
                         f"[{min(values) - base:+.4f}]")
        lines.append(f"| {split} | {name} | {len(runs)} | "
                     + " | ".join(cells) + " |")
    for split, base in baselines.items():
        lines.append(f"| {split} | popularity baseline | - | " + " | ".join(
            f"{base[metric]:.4f}" for metric, _ in METRICS) + " |")
    return "\n".join(lines)


def _read(results: Path) -> list[dict]:
    if not results.exists():
        return []
    return [json.loads(line) for line in results.read_text().splitlines()
            if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/rvp"))
    parser.add_argument("--results", type=Path,
                        default=Path("/tmp/rvp/results.jsonl"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--split", choices=("hash", "time"), nargs="+",
                        default=["hash"])
    parser.add_argument("--strategy", default="ps")
    parser.add_argument("--config", action="append", default=[],
                        metavar="NAME=FLAGS")
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args()
    configs = (dict(c.split("=", 1) for c in args.config) if args.config
               else CONFIGS)
    records = _read(args.results)
    if not args.table:
        args.work.mkdir(parents=True, exist_ok=True)
        for split in args.split:
            data = convert(args.work, split)
            for name, flags in configs.items():
                for seed in args.seeds:
                    key = {"split": split, "config": name, "seed": seed,
                           "strategy": args.strategy}
                    if any(all(r.get(k) == v for k, v in key.items())
                           for r in records):
                        continue
                    workdir = args.work / "runs" / f"{split}-{len(records)}"
                    result = train(data, workdir, shlex.split(flags), seed,
                                   args.strategy)
                    record = {**key, "flags": flags, **result,
                              "workdir": str(workdir)}
                    records.append(record)
                    with args.results.open("a") as out:
                        out.write(json.dumps(record) + "\n")
                    print(json.dumps({**key, **{
                        m: round(_value(result["eval"], p), 4)
                        for m, p in METRICS}}), flush=True)
    print(table(records))


if __name__ == "__main__":
    main()
