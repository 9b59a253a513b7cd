"""Default-flag quality: psrec's optimizer choices beside a plain Adam baseline.

For one converted psrec data folder (``psrec convert ... --out DATA``):

1. **baseline** -- a single-process ``tf_keras`` model trained with plain
   ``tf_keras.optimizers.Adam`` on *every* variable (tables and towers
   alike). It is psrec's own model (``psrec.models.build.build_model`` with
   the named ``ModelConfig`` and the train split's positive rate) on psrec's
   own decoded batches (``psrec.data.input.dataset.make_eval_dataset`` over
   the train shards, held in memory and shuffled once an epoch), so the
   feature transforms are the same; only the optimizer and the loop differ.
   It evaluates the eval split once an epoch (psrec's histogram AUC,
   ``psrec.ps_cluster.evaluation.metrics``) and stops after ``--patience``
   evaluations without a better AUC; its best eval AUC is reported.
2. **psrec** -- ``psrec train --strategy one-device`` in a subprocess, once
   per configuration of the grid (the default flags first, then one change
   at a time: the sparse optimizer, the sparse and dense learning rates, the
   model), and the default flags once under the default ``--strategy ps``
   (its local cluster). Every run sizes its length from the data and keeps
   its best checkpoint (the defaults); the figures are the exported
   checkpoint's, read from the run's ``summary.json``.

Each result is appended as one JSON line to ``--results`` (a run already
there is not run again, so an interrupted benchmark resumes); at the end
the table of the data set is printed in Markdown: configuration, best eval
AUC, its logloss, the steps run, and the AUC difference to the Adam
baseline of the same model. Run from the repository root::

    TF_USE_LEGACY_KERAS=1 .venv/bin/python benchmarks/quality_baseline.py \\
        --data /tmp/qb/criteo/data --name criteo --results /tmp/qb/results.jsonl

``--table`` prints the table of ``--results`` without running anything.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from psrec.models.ranking.config import DEFAULT_MODEL

# One default configuration, then one change at a time (flag lists).
GRID: dict[str, list[str]] = {
    # (the tables of docs/benchmarks.md were measured when the default
    # --sparse-lr was 0.05; since, 0.2 is the default)
    "default flags": [],
    "--sparse-lr 0.05": ["--sparse-lr", "0.05"],
    "--sparse-optimizer rowwise_adagrad": ["--sparse-optimizer",
                                           "rowwise_adagrad"],
    "--sparse-optimizer ftrl": ["--sparse-optimizer", "ftrl"],
    "--sparse-lr 0.02": ["--sparse-lr", "0.02"],
    "--sparse-lr 0.1": ["--sparse-lr", "0.1"],
    "--sparse-lr 0.2": ["--sparse-lr", "0.2"],
    "--sparse-lr 0.5": ["--sparse-lr", "0.5"],
    "--dense-lr 0.003": ["--dense-lr", "0.003"],
    # (and when the default model was dcn: then `--model deepfm` was a row)
    "--model dcn": ["--model", "dcn"],
    "--model dlrm": ["--model", "dlrm"],
    # the baseline's length: up to 20 epochs, 3 evaluations of patience
    # (an evaluation about once an epoch: EPOCH is the epoch's steps,
    # rounded to a multiple of the default --steps-per-closure 10)
    "--epochs 20 --early-stop-patience 3": [
        "--epochs", "20", "--early-stop-patience", "3",
        "--eval-every", "EPOCH"],
}
DEFAULT = next(iter(GRID))
PS_DEFAULT = "default flags, --strategy ps (1 worker + 1 PS)"


def _model_of(flags: list[str]) -> str:
    return (flags[flags.index("--model") + 1] if "--model" in flags
            else DEFAULT_MODEL)


def _load_split(manifest, spec, split: str) -> dict:
    """Every decoded row of ``split`` as numpy arrays (psrec's decoding)."""
    import numpy as np

    from psrec.data.input.dataset import make_eval_dataset

    parts: dict[str, list] = {}
    for batch in make_eval_dataset(manifest.files(split), spec, 4096,
                                   manifest.block_rows):
        for key, value in batch.items():
            parts.setdefault(key, []).append(value.numpy())
    return {key: np.concatenate(values) for key, values in parts.items()}


def baseline(data: Path, model_name: str, seed: int, lr: float,
             batch_size: int, max_epochs: int, patience: int) -> dict:
    """The plain-Adam single-process run; its best eval epoch."""
    import tensorflow as tf
    import tf_keras

    from psrec.data.format.manifest import Manifest
    from psrec.features.spec.spec import ID_COLUMN
    from psrec.models.build import build_model
    from psrec.models.ranking.config import model_config
    from psrec.ps_cluster.evaluation.metrics import batch_statistics
    from psrec.ps_cluster.evaluation.metrics import merge

    tf.keras.utils.set_random_seed(seed)
    manifest = Manifest.load(data / "manifest.json")
    spec = manifest.load_spec()
    label = spec.label.name
    train = _load_split(manifest, spec, "train")
    rows = len(train[label])
    train_ds = (tf.data.Dataset.from_tensor_slices(train)
                .shuffle(rows, seed=seed, reshuffle_each_iteration=True)
                .batch(batch_size))
    eval_ds = tf.data.Dataset.from_tensor_slices(
        _load_split(manifest, spec, "eval")).batch(4096)
    model = build_model(spec, model_config(model_name),
                        manifest.positive_rate("train"))
    optimizer = tf_keras.optimizers.Adam(learning_rate=lr)

    @tf.function
    def step(batch):
        with tf.GradientTape() as tape:
            logits = model(batch, training=True)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=batch[label], logits=logits))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables),
                                      variables))
        return loss

    @tf.function
    def evaluate(batch):
        return batch_statistics(batch[label], model(batch, training=False),
                                batch[ID_COLUMN])

    best, steps, waited, started = None, 0, 0, time.perf_counter()
    for epoch in range(1, max_epochs + 1):
        for batch in train_ds:
            step(batch)
            steps += 1
        result = merge([{k: v.numpy() for k, v in evaluate(b).items()}
                        for b in eval_ds])
        print(f"  baseline {model_name} seed {seed} epoch {epoch}: "
              f"AUC {result.auc:.4f} logloss {result.logloss:.4f}",
              file=sys.stderr)
        if best is None or result.auc > best["auc"]:
            best = {"auc": result.auc, "logloss": result.logloss,
                    "best_step": steps, "epoch": epoch}
            waited = 0
        else:
            waited += 1
            if waited >= patience:
                break
    return {**best, "steps": steps,
            "seconds": round(time.perf_counter() - started, 1)}


def psrec_run(data: Path, workdir: Path, flags: list[str], seed: int,
              strategy: str) -> dict:
    """One ``psrec train`` in a subprocess; its exported (best) eval."""
    psrec = Path(sys.executable).with_name("psrec")
    if "EPOCH" in flags:
        manifest = json.loads((data / "manifest.json").read_text())
        rows = sum(s["rows"] for s in manifest["shards"]["train"])
        epoch = max(10, round(math.ceil(rows / 1024) / 10) * 10)
        flags = [str(epoch) if f == "EPOCH" else f for f in flags]
    cmd = [str(psrec), "train", "--data", str(data), "--workdir",
           str(workdir), "--seed", str(seed), *flags]
    cmd += (["--strategy", "one-device"] if strategy == "one-device"
            else ["--workers", "1"])
    shutil.rmtree(workdir, ignore_errors=True)  # a fresh run, no resume
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n"
                         f"{done.stderr[-2000:]}")
    summary = json.loads((workdir / "summary.json").read_text())
    best = summary["best"]
    return {"auc": best["auc"], "logloss": best["logloss"],
            "best_step": best["step"], "steps": summary["step"],
            "seconds": round(time.perf_counter() - started, 1),
            "command": " ".join(cmd[1:])}


def _read(results: Path) -> list[dict]:
    if not results.exists():
        return []
    return [json.loads(line) for line in results.read_text().splitlines()
            if line.strip()]


def _done(records: list[dict], **key) -> bool:
    return any(all(r.get(k) == v for k, v in key.items()) for r in records)


def run_row(label: str, record: dict, diff: str) -> str:
    """One run's row of a results table: its label and seed, best eval
    AUC and logloss, best step / steps run, ``diff`` and its seconds."""
    return (f"| {label} | {record['seed']} | {record['auc']:.4f} | "
            f"{record['logloss']:.4f} | {record['best_step']} / "
            f"{record['steps']} | {diff} | {record['seconds']} |")


def table(records: list[dict], name: str) -> str:
    """The Markdown table of data set ``name``."""
    mine = [r for r in records if r["dataset"] == name]
    base: dict[str, list[float]] = {}
    for r in mine:
        if r["kind"] == "baseline":
            base.setdefault(r["model"], []).append(r["auc"])
    lines = [f"{name}:", "",
             "| configuration | seed | best eval AUC | logloss | best at "
             "step / steps run | AUC - Adam baseline (same model) | "
             "wall s |", "|---|---|---|---|---|---|---|"]
    for r in mine:
        label = (f"Adam baseline, {r['model']}, lr {r['lr']}"
                 if r["kind"] == "baseline" else r["config"])
        ref = base.get(r["model"])
        diff = ("" if r["kind"] == "baseline" or not ref
                else f"{r['auc'] - sum(ref) / len(ref):+.4f}")
        lines.append(run_row(label, r, diff))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, help="converted data folder")
    parser.add_argument("--name", required=True, help="data set name")
    parser.add_argument("--results", type=Path, required=True,
                        help="JSON lines file (appended; resumes)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="run folders (default: beside --results)")
    parser.add_argument("--seeds", default="0,1",
                        help="seeds of the default configuration and the "
                        "baseline (the other configurations: the first)")
    parser.add_argument("--configs", default=None,
                        help="';'-separated grid keys to run (default: all)")
    parser.add_argument("--baseline-models", default="dcn,deepfm,dlrm")
    parser.add_argument("--baseline-lr", type=float, default=0.001)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--max-epochs", type=int, default=20)
    parser.add_argument("--patience", type=int, default=3)
    parser.add_argument("--all-seeds", action="store_true",
                        help="run every configuration with every seed")
    parser.add_argument("--no-ps", action="store_true",
                        help="skip the --strategy ps run")
    parser.add_argument("--table", action="store_true",
                        help="only print the table of --results")
    args = parser.parse_args()
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    if args.table:
        print(table(_read(args.results), args.name))
        return
    data = args.data.resolve()
    workdir = args.workdir or args.results.parent / f"runs-{args.name}"
    seeds = [int(s) for s in args.seeds.split(",")]
    configs = list(GRID) if args.configs is None else [
        c for c in GRID if c in args.configs.split(";")]

    def record(entry: dict) -> None:
        with args.results.open("a") as out:
            out.write(json.dumps(entry) + "\n")
        print(json.dumps(entry), file=sys.stderr)

    plan = []
    for seed in seeds:
        for model in args.baseline_models.split(","):
            if model and (seed == seeds[0] or model == DEFAULT_MODEL):
                plan.append(("baseline", model, seed, None))
    for config in configs:
        for seed in (seeds if config == DEFAULT or args.all_seeds
                     else seeds[:1]):
            plan.append(("psrec", config, seed, "one-device"))
    if not args.no_ps:
        plan.append(("psrec", PS_DEFAULT, seeds[0], "ps"))
    for kind, what, seed, strategy in plan:
        records = _read(args.results)
        if kind == "baseline":
            key = {"dataset": args.name, "kind": kind, "model": what,
                   "seed": seed, "lr": args.baseline_lr}
            if not _done(records, **key):
                record({**key, **baseline(
                    data, what, seed, args.baseline_lr, args.batch_size,
                    args.max_epochs, args.patience)})
            continue
        key = {"dataset": args.name, "kind": kind, "config": what,
               "seed": seed}
        if _done(records, **key):
            continue
        flags = GRID.get(what, [])
        slug = "".join(c if c.isalnum() else "-" for c in what)[:60]
        run_dir = workdir / f"{slug}-s{seed}"
        record({**key, "model": _model_of(flags), **psrec_run(
            data, run_dir, flags, seed, strategy)})
    print(table(_read(args.results), args.name))


if __name__ == "__main__":
    main()
