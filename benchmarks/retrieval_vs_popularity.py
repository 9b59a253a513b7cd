"""Two-tower retrieval against the popularity baseline, over seeds.

Converts the MovieLens-100k sample as the retrieval tutorial does
(``psrec ingest movielens``, then ``psrec convert --spec movielens-retrieval
--split hash --eval-fraction 0.2``; ``--split time`` converts a split by
time instead: ``--split tail --order-by timestamp``, the latest 20% of the
ratings held out), then
runs ``psrec train --task retrieval --batch-size 512`` (the tutorial's
command: the sized default length, the best checkpoint by MRR exported) with each configuration's flags added, once per
configuration and seed, each in a subprocess and its own workdir
(``--work/runs/``, kept, beside its output: ``--work/runs/*.log``), and
reads the final exact evaluation from the run's
``summary.json``: recall@1/5/10/50/100 and MRR over every held-out pair
against the catalogue (less the user's train movies: the default; a
configuration with ``--no-exclude-seen`` ranks against the whole
catalogue), with the popularity baseline of the same pairs under the same
rule (every candidate ranked by its train-split positives) that psrec
reports beside them.

Each result is appended as one JSON line to ``--results`` (a run already
there is not run again, so an interrupted benchmark resumes); at the end
the Markdown table is printed: per configuration the mean of each metric
over the seeds, its spread (max - min) and the margin over popularity (the
worst seed's figure minus the baseline's). Run from the repository root::

    .venv/bin/python benchmarks/retrieval_vs_popularity.py \\
        --work /tmp/rvp --results /tmp/rvp/results.jsonl --seeds 0 1 2

``--config NAME='FLAGS'`` replaces the configurations (default: the
defaults, ``--no-candidate-bias``, ``--epochs 5`` and ``--epochs 20``);
``--strategy``
(default ``ps``, the tutorial's local cluster; ``one-device`` is faster);
``--seen`` also restores each run's model and measures why the head of the
ranking is hard to win here (:func:`seen_items`). ``--table`` prints the
tables of ``--results`` without running anything.
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
TUTORIAL = ["--batch-size", "512"]
CONFIGS = {"defaults": "", "--no-candidate-bias": "--no-candidate-bias",
           "--epochs 5": "--epochs 5", "--epochs 20": "--epochs 20"}
METRICS = tuple((f"recall@{k}", ("recall", str(k)))
                for k in (1, 5, 10, 50, 100)) + (("MRR", ("mrr",)),)


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
    """One ``psrec train --task retrieval``; the eval of its exported
    checkpoint: the best one's (``--keep-best``, MRR by default) where the
    run kept one, else the final eval."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.parent.mkdir(parents=True, exist_ok=True)
    _run([_psrec(), "train", "--task", "retrieval", "--data", str(data),
          "--workdir", str(workdir), *TUTORIAL, "--strategy", strategy,
          "--seed", str(seed), *flags], log=workdir.with_suffix(".log"))
    summary = json.loads((workdir / "summary.json").read_text())
    result, best = dict(summary["eval"]), summary.get("best")
    if best and best.get("metrics"):
        result["recall"] = {name.split("@")[1]: value for name, value
                            in best["metrics"].items() if "@" in name}
        result["mrr"] = best["metrics"]["mrr"]
    return {"eval": result, "seconds": summary["seconds"],
            "step": summary["step"], "best_step": best and best["step"],
            "epochs": summary["epochs"]}


def seen_items(workdir: Path, data: Path) -> dict:
    """Why the head of the ranking is hard to win on this split: in
    MovieLens a user rates a movie once, so a movie among the user's train
    pairs is never one of its held-out pairs, yet an evaluation against
    the whole catalogue (``--no-exclude-seen``) ranks those movies too.
    Restores the run's model and returns the share of each
    pair's model top 10 that are the user's own train movies, and recall@10
    / MRR of the model and of popularity with the user's train movies left
    out of the ranking (the protocol of most recommender papers)."""
    from psrec.runtime import configure_environment
    configure_environment()
    import numpy as np
    import tensorflow as tf

    from psrec.data.convert.catalogue import Catalogue
    from psrec.data.format.manifest import Manifest
    from psrec.data.input.dataset import make_eval_dataset
    from psrec.launch.job.export import restore_plain_model
    from psrec.ps_cluster.retrieval.metrics import popularity_ranks
    model, record, _ = restore_plain_model(workdir / "checkpoints")
    spec, manifest = record.spec, Manifest.load(data)
    catalogue = Catalogue.load(data, spec)
    index = {int(r): i for i, r in enumerate(catalogue.features["item_id"])}

    def pairs(split: str) -> dict[str, np.ndarray]:
        parts = []
        for batch in make_eval_dataset(manifest.files(split), spec, 4096,
                                       manifest.block_rows):
            kept = batch[spec.label.name].numpy().reshape(-1) > 0
            parts.append({k: v.numpy()[kept] for k, v in batch.items()})
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    train, held = pairs("train"), pairs("eval")
    seen: dict[int, list[int]] = {}
    for user, item in zip(train["user_id"].reshape(-1),
                          train["item_id"].reshape(-1)):
        seen.setdefault(int(user), []).append(index[int(item)])
    candidates = model.candidate_embedding(
        {k: tf.constant(v) for k, v in catalogue.features.items()}).numpy()
    popularity = -popularity_ranks(catalogue.train_counts).astype(float)
    ranks = {"model": [], "model_unseen": [], "popularity": [],
             "popularity_unseen": []}
    share = []
    for start in range(0, len(held["user_id"]), 4096):
        rows = {k: v[start:start + 4096] for k, v in held.items()}
        scores = model.query_embedding(
            {k: tf.constant(v) for k, v in rows.items()}).numpy() @ (
            candidates.T)
        for row, user, item in zip(scores, rows["user_id"].reshape(-1),
                                   rows["item_id"].reshape(-1)):
            own = np.zeros(len(row), bool)
            own[seen.get(int(user), [])] = True
            item = index[int(item)]
            for name, score in (("model", row), ("popularity", popularity)):
                above = score > score[item]
                ranks[name].append(above.sum())
                ranks[f"{name}_unseen"].append((above & ~own).sum())
            share.append(own[np.argpartition(-row, 10)[:10]].mean())
    out = {"own_train_share_of_top10": float(np.mean(share))}
    for name, values in ranks.items():
        values = np.asarray(values)
        out[name] = {"recall@10": float(np.mean(values < 10)),
                     "MRR": float(np.mean(1.0 / (values + 1)))}
    return out


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


def seen_table(records: list[dict]) -> str:
    """Markdown: per run, the share of the model's top 10 that are the
    user's own train movies, and recall@10 / MRR with and without them."""
    lines = ["| split | configuration | seed | own train movies in the "
             "model's top 10 | model recall@10, MRR | popularity | model, "
             "own train movies left out | popularity, left out |",
             "|---|---|---|---|---|---|---|---|"]
    for r in records:
        seen = r["seen"]
        cells = [f"{seen[n]['recall@10']:.4f}, {seen[n]['MRR']:.4f}"
                 for n in ("model", "popularity", "model_unseen",
                           "popularity_unseen")]
        lines.append(f"| {r['split']} | {r['config']} | {r['seed']} | "
                     f"{seen['own_train_share_of_top10']:.0%} | "
                     + " | ".join(cells) + " |")
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
    parser.add_argument("--seen", action="store_true",
                        help="also measure the users' own train movies in "
                        "the model's top 10 (seen_items)")
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
        if args.seen:  # every kept run not measured yet
            for record in records:
                if "seen" not in record and record.get("workdir") and (
                        Path(record["workdir"]).is_dir()):
                    record["seen"] = seen_items(
                        Path(record["workdir"]),
                        convert(args.work, record["split"]))
            args.results.write_text("".join(json.dumps(r) + "\n"
                                            for r in records))
    print(table(records))
    seen = [r for r in records if "seen" in r]
    if seen:
        print("\n" + seen_table(seen))


if __name__ == "__main__":
    main()
