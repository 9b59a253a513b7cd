"""The data and the ``psrec train`` command line shared by the fault and
watchdog tests: 20,000 synthetic Criteo rows in 4 shards (20% eval), 200
steps of 128 rows, 5 steps per closure, a checkpoint every 50 steps.

The faults are injected by step ~150 at the latest (test_faults' PS kill
after ckpt-100); what runs after a fault only has to reach the last step,
so 200 steps (not more: CI time) leave room for each scenario."""

from __future__ import annotations

from pathlib import Path

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.ingest.synthetic import write_synthetic_parquet
from psrec.features import criteo

STEPS = 200
EVERY = 50


def synthetic_run_data(root: Path) -> Path:
    """Converts the synthetic rows under ``root``; the TFRecord folder."""
    spec = criteo()
    files = write_synthetic_parquet(spec, root / "parquet", 20_000, files=2)
    convert(files, spec, root / "tfrecord",
            ConversionOptions(shards=4, eval_fraction=0.2))
    return root / "tfrecord"


def train_args(workdir: Path, data: Path, *extra: str) -> list[str]:
    return ["train", "--workdir", str(workdir), "--data", str(data),
            "--steps", str(STEPS), "--batch-size", "128",
            "--steps-per-closure", "5", "--checkpoint-every", str(EVERY),
            "--log-every", "10", "--no-export", "--keep-checkpoints", "10",
            *extra]
