"""Exactly-once evaluation under a worker loss, with real processes.

``psrec train`` (supervisor + PS + 2 workers + coordinator as OS processes)
trains briefly, then evaluates a large eval split as one closure per shard.
A worker is SIGKILLed while it computes those closures; the closures it
held are re-run elsewhere, and the merged result must still count every
eval example exactly once and equal a fault-free evaluation of the same
weights.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.format.manifest import Manifest
from psrec.data.ingest.synthetic import write_synthetic_parquet
from psrec.data.input.dataset import make_eval_dataset
from psrec.features import criteo
from psrec.features.spec.spec import ID_COLUMN
from psrec.launch.job.export import evaluate_checkpoint
from tests._proc import PsrecRun
from tests._proc import assert_no_leftovers
from tests._proc import wait_for_cpu

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROWS = 100_000
EVAL_FRACTION = 0.8  # 80,000 eval rows: ~10 s of eval on 2 CPU cores
EVAL_SHARDS = 16  # closures: both workers hold some when one is killed
STEPS = 120  # ~2 epochs of the 20,000 train rows: AUC ~0.6
# TensorFlow's ClusterCoordinator logs this when a closure fails because
# its worker is gone; the closure is then put back and run elsewhere.
WORKER_1_FAILED = r"Worker /job:worker/replica:0/task:1 failed with"


@pytest.fixture(scope="module")
def eval_heavy_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eval-heavy")
    spec = criteo()
    files = write_synthetic_parquet(spec, root / "parquet", ROWS, files=2)
    convert(files, spec, root / "tfrecord", ConversionOptions(
        shards=4, eval_fraction=EVAL_FRACTION, eval_shards=EVAL_SHARDS))
    return root / "tfrecord"


def _eval_split_truth(manifest: Manifest) -> dict[str, float]:
    """Rows, id sum and positives of the eval split, read here once."""
    spec = criteo()
    ids, labels = [], []
    for batch in make_eval_dataset(manifest.files("eval"), spec, 4096,
                                   manifest.block_rows):
        ids.append(batch[ID_COLUMN].numpy())
        labels.append(batch[spec.label.name].numpy())
    ids = np.concatenate(ids)
    assert len(np.unique(ids)) == len(ids)  # ids identify examples
    return {"count": len(ids), "id_sum": int(ids.sum()),
            "positives": float(np.concatenate(labels).sum())}


def test_worker_killed_during_eval_counts_each_eval_example_once(
        tmp_path, eval_heavy_data):
    manifest = Manifest.load(eval_heavy_data)
    truth = _eval_split_truth(manifest)
    assert truth["count"] == manifest.rows("eval") == 80_000
    assert len(manifest.files("eval")) == EVAL_SHARDS
    workdir = tmp_path / "work"
    run = PsrecRun(["train", "--workdir", workdir, "--data", eval_heavy_data,
                    "--steps", STEPS, "--batch-size", 256,
                    "--steps-per-closure", 5, "--log-every", 10,
                    "--checkpoint-every", STEPS, "--no-export",
                    "--eval-every", 0])  # the final eval only: CI time
    try:
        # The last progress line comes after training's join; the final
        # evaluation is scheduled right after it.
        run.wait_for(rf"^step {STEPS}/{STEPS} ", timeout=400)
        joined = len(run.lines)
        victim = run.role_pids[2]  # ps-0, worker-0, worker-1
        # Busy again after the join: computing eval closures.
        wait_for_cpu(victim, 0.5, timeout=120)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        assert run.wait(400) == 0, run.output[-4000:]
        output = run.output
        # The kill hit the evaluation: its result came after the kill, and
        # a closure failed on the dead worker after training had joined.
        eval_line = run.wait_for(rf"^step {STEPS}: eval: ", 1)
        assert run.time_of(re.escape(eval_line.group(0))) > killed_at
        run.wait_for(WORKER_1_FAILED, 1, after=joined)
        # The loss is said: by the supervisor's own look ("worker-1 died",
        # then its restart), or, when the coordinator stopped on it first
        # (a retryable exit; seen once in a loaded suite, where the
        # restarted coordinator, with no checkpoint yet, trained again from
        # step 0 and evaluated), by the failed-role line naming it.
        assert re.search(r"worker-1 died|failed role: worker "
                         r"\(worker-1 exited", output), output[-4000:]
        summary = json.loads((workdir / "summary.json").read_text())
        result = summary["eval"]
        # Each eval example counted exactly once.
        assert result["count"] == manifest.rows("eval") == truth["count"]
        assert result["id_sum"] == truth["id_sum"]
        assert result["positives"] == truth["positives"]
        # And the metrics equal a fault-free evaluation of the same weights
        # (the final checkpoint is saved after the final evaluation).
        offline = evaluate_checkpoint(workdir / "checkpoints", manifest,
                                      checkpoint="latest")
        assert offline.count == result["count"]
        assert offline.id_sum == result["id_sum"]
        assert 0.55 < result["auc"] < 1.0  # it learned; no NaN
        assert result["auc"] == pytest.approx(offline.auc, abs=1e-3)
        assert result["logloss"] == pytest.approx(offline.logloss, rel=1e-3)
        print(f"\nworker killed during eval: eval finished "
              f"{run.time_of(re.escape(eval_line.group(0))) - killed_at:.1f}"
              f" s after the kill; AUC {result['auc']:.4f} (fault-free "
              f"{offline.auc:.4f}) on {result['count']} examples")
    finally:
        run.kill()
        assert_no_leftovers(run, workdir)
