"""MovieLens 100K, one task against two: "like" (rating >= 4, logloss) and
the rating itself (``loss: mse``), trained alone and together.

The raw ratings (``psrec ingest movielens``) get a ``like`` column (rating
>= 4, 0/1); three specs share the ``movielens`` preset's features and differ
in their labels only: ``like`` alone, ``rating`` alone (mse), and ``labels:
[like, rating]``. Each is converted with the same time split (the last 20%
of the ratings by ``timestamp`` are the eval split), so every run is scored
on the same eval rows. Then ``psrec train --strategy one-device`` runs, with
the same flags, fixed epochs and no best-checkpoint choice (``--keep-best
none``: the figures are the last evaluation's):

* like alone, rating alone;
* like + rating, ``--task-towers shared-bottom`` and ``mmoe``.

It prints a Markdown table: like AUC and logloss, rating RMSE. Run from the
repository root (``--work`` is scratch space; ``--model`` and ``--epochs``
go to every run)::

    TF_USE_LEGACY_KERAS=1 .venv/bin/python benchmarks/movielens_multitask.py \\
        --data ../shared/data/movielens-100k --work /tmp/ml-mt
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

RUNS = {  # name: (spec, extra flags)
    "like alone": ("like", []),
    "rating alone": ("rating", []),
    "like + rating, shared-bottom": ("both", ["--task-towers",
                                              "shared-bottom"]),
    "like + rating, mmoe": ("both", ["--task-towers", "mmoe"]),
}
LABELS = {"like": [{"name": "like"}],
          "rating": [{"name": "rating", "loss": "mse"}],
          "both": [{"name": "like"}, {"name": "rating", "loss": "mse"}]}


def _psrec(*args: object) -> None:
    command = [sys.executable, "-m", "psrec", *map(str, args)]
    print("$", " ".join(command[2:]), flush=True)
    subprocess.run(command, check=True, stdin=subprocess.DEVNULL)


def liked_ratings(data: Path, work: Path) -> Path:
    """The ratings (``psrec ingest movielens``: in time order) with a
    ``like`` column (rating >= 4, 0/1), written once under ``work``."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    raw = work / "raw"
    if not raw.exists():
        _psrec("ingest", "movielens", data, "--out", raw, "--no-progress")
    liked = work / "liked" / "ratings.parquet"
    if not liked.exists():
        table = pq.read_table(sorted(raw.glob("*.parquet")))
        table = table.append_column("like", pc.cast(pc.greater_equal(
            table.column("rating"), 4), pa.int64()))
        liked.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, liked)
    return liked


def convert_time_split(liked: Path, spec: dict, work: Path,
                       name: str) -> Path:
    """``liked`` converted with ``spec`` (a spec dict) under
    ``work/data-NAME`` (reused when there), the last 20% by time to eval."""
    from psrec.features.spec.spec import FeatureSpec
    folder = work / f"data-{name}"
    if not (folder / "manifest.json").exists():
        spec_path = work / f"spec-{name}.yaml"
        FeatureSpec.from_dict(spec).save(spec_path)
        _psrec("convert", liked, "--spec", spec_path, "--out", folder,
               "--eval-fraction", "0.2", "--order-by", "timestamp",
               "--overwrite", "--no-progress")
    return folder


def prepare(data: Path, work: Path) -> dict[str, Path]:
    """Ingests the ratings, adds ``like``, converts once per spec; returns
    ``{spec: data folder}``."""
    from psrec.features.spec.presets import movielens
    liked = liked_ratings(data, work)
    base = movielens().to_dict()
    del base["label"]
    return {name: convert_time_split(liked, {
        **base, "name": f"movielens-{name}", "labels": labels}, work, name)
        for name, labels in LABELS.items()}


def train(name: str, folder: Path, flags: list[str], work: Path,
          common: list[str], seed: int) -> dict:
    """One run (reused when its summary exists); its last eval's figures."""
    slug = name.replace(" ", "-").replace(",", "").replace("+", "and")
    workdir = work / (f"run-{slug}" + (f"-seed{seed}" if seed else ""))
    summary = workdir / "summary.json"
    if not summary.exists():
        began = time.monotonic()
        _psrec("train", "--data", folder, "--workdir", workdir, "--strategy",
               "one-device", "--keep-best", "none", "--no-export", "--seed",
               seed, *common, *flags)
        print(f"{name}: {time.monotonic() - began:.0f} s", flush=True)
    result = json.loads(summary.read_text())["eval"]
    tasks = {t["name"]: t for t in result.get("tasks") or ()}
    if not tasks:  # one label: the result's own fields
        tasks = {"like" if result.get("rmse") is None else "rating": result}
    return {"like_auc": tasks.get("like", {}).get("auc"),
            "like_logloss": tasks.get("like", {}).get("logloss"),
            "rating_rmse": tasks.get("rating", {}).get("rmse"),
            "eval_rows": result["count"]}


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def arguments(doc: str) -> argparse.Namespace:
    """The command line of a MovieLens comparison script."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True,
                        help="the MovieLens 100K folder (u.data, u.item...)")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--model", default="deepfm")
    parser.add_argument("--epochs", default="3")
    parser.add_argument("--batch-size", default="512")
    parser.add_argument("--seed", type=int, default=0,
                        help="psrec train --seed of every run")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    return args


def run_all(args: argparse.Namespace, runs: dict[str, tuple[Path, list]]
            ) -> dict[str, dict]:
    """Trains ``{name: (data folder, flags)}`` with the common flags;
    prints the setting line; returns each run's figures."""
    common = ["--model", args.model, "--epochs", args.epochs,
              "--batch-size", args.batch_size]
    rows = {name: train(name, folder, flags, args.work, common, args.seed)
            for name, (folder, flags) in runs.items()}
    print(f"\n--model {args.model} --epochs {args.epochs} --batch-size "
          f"{args.batch_size} --seed {args.seed}, one device; eval: the last "
          "20% of the ratings by time\n")
    return rows


def main() -> None:
    args = arguments(__doc__)
    folders = prepare(args.data, args.work)
    rows = run_all(args, {name: (folders[spec], flags)
                          for name, (spec, flags) in RUNS.items()})
    print("| run | like AUC | like logloss | rating RMSE |")
    print("|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {_cell(row['like_auc'])} | "
              f"{_cell(row['like_logloss'])} | {_cell(row['rating_rmse'])} |")


if __name__ == "__main__":
    main()
