"""Data checks run before training starts.

* :func:`check_disjoint_splits`: no example id is in both the train and the
  eval split (reads only the id column of every record).
* :func:`repair_corrupted_shards`: with ``--max-corrupt-records N``, shards
  whose sha256 no longer matches the manifest are scanned record by record;
  if at most N records are corrupted in total, training uses repaired
  copies holding every good record, and the skipped count is reported.
  Otherwise -- or with N = 0 -- the job refuses to start, naming the file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import tensorflow as tf

from psrec.data.manifest import SPLITS
from psrec.data.manifest import Manifest
from psrec.data.manifest import ManifestError
from psrec.data.manifest import ShardInfo
from psrec.data.records import corruption_named
from psrec.data.repair import ScanResult
from psrec.data.repair import scan_records
from psrec.errors import ConfigError
from psrec.features.spec import ID_COLUMN
from psrec.progress import SILENT
from psrec.progress import Progress
from psrec.progress import Task


class SplitOverlapError(ConfigError):
    """Eval examples also appear in the train split."""


def _ids(files: list[str], task: Task) -> np.ndarray:
    if not files:
        return np.zeros([0], np.int64)
    features = {ID_COLUMN: tf.io.FixedLenFeature([], tf.string)}
    dataset = tf.data.TFRecordDataset(files).batch(256).map(
        lambda r: tf.io.decode_raw(tf.strings.reduce_join(
            tf.io.parse_example(r, features)[ID_COLUMN]), tf.int64))
    parts = []
    with corruption_named(files):
        for ids in dataset:
            parts.append(ids.numpy())
            task.advance(len(parts[-1]))
    return np.concatenate(parts) if parts else np.zeros([0], np.int64)


def check_disjoint_splits(manifest: Manifest, *,
                          progress: Progress = SILENT) -> int:
    """Raises if any id is in both splits; returns the eval row count.
    ``progress`` is told the ids read (total: the rows of both splits)."""
    evals = manifest.rows("eval")  # none: only the eval files are read
    total = evals + manifest.rows("train") if evals else 0
    with progress.task("checking that train and eval share no example", total,
                       "rows") as task:
        eval_ids = _ids(manifest.files("eval"), task)
        if not len(eval_ids):
            return 0
        train_ids = _ids(manifest.files("train"), task)
    both = np.intersect1d(train_ids, eval_ids)
    if len(both):
        raise SplitOverlapError(
            f"{manifest.root}: {len(both)} example id(s) are in both the "
            f"train and the eval split (first: {both[:5].tolist()}); evaluate "
            "on held-out data: convert again with --eval-fraction.")
    return len(eval_ids)


@dataclasses.dataclass(frozen=True)
class RepairReport:
    """Corrupted records skipped, per file."""

    scans: tuple[ScanResult, ...]

    @property
    def skipped(self) -> int:
        return sum(s.corrupted + (1 if s.unreadable_from is not None else 0)
                   for s in self.scans)

    def summary(self) -> str:
        lines = [f"skipped {self.skipped} corrupted record(s):"]
        for scan in self.scans:
            tail = (f"; unreadable from byte {scan.unreadable_from}"
                    if scan.unreadable_from is not None else "")
            lines.append(f"  {scan.path}: {scan.corrupted} corrupted, "
                         f"{scan.good} good{tail}")
        return "\n".join(lines)


def _mismatches(manifest: Manifest, checksums: bool, progress: Progress
                ) -> list[tuple[str, ShardInfo, str]]:
    """``manifest.mismatches``, one shard at a time so that ``progress`` is
    told the bytes checked (with ``checksums``: read and hashed)."""
    if not checksums:
        return manifest.mismatches(checksums=False)
    shards = [(split, shard) for split in SPLITS
              for shard in manifest.shards.get(split, ())]
    found = []
    with progress.task(f"checking the sha256 of {len(shards)} shards",
                       sum(shard.bytes for _, shard in shards),
                       "bytes") as task:
        for split, shard in shards:
            one = dataclasses.replace(manifest, shards={
                name: (shard,) if name == split else () for name in SPLITS})
            found += one.mismatches(checksums=True)
            task.advance(shard.bytes)
    return found


def repair_corrupted_shards(manifest: Manifest, out_dir: str | Path,
                            max_records: int, *, checksums: bool = True,
                            progress: Progress = SILENT
                            ) -> tuple[Manifest, RepairReport | None]:
    """Returns a manifest safe to train on, or raises naming the file.

    Args:
      manifest: the converted data.
      out_dir: where repaired copies are written.
      max_records: corrupted records that may be skipped in total.
      checksums: compare sha256 (otherwise only presence and size).
      progress: told the bytes checked by the sha256 pass.
    """
    problems = _mismatches(manifest, checksums, progress)
    if not problems:
        return manifest, None
    if max_records <= 0:
        raise ManifestError(problems[0][2] + " (or allow a bounded skip with "
                            "--max-corrupt-records N)")
    scans, replaced = [], {}
    for _, shard, message in problems:
        path = manifest.root / shard.file
        if not path.is_file():
            raise ManifestError(message)
        repaired = Path(out_dir) / shard.file
        scan = scan_records(path, repaired)
        if scan.clean:  # same records, other bytes: not corruption
            raise ManifestError(message)
        scans.append(scan)
        replaced[shard.file] = str(repaired.resolve())
    report = RepairReport(tuple(scans))
    if report.skipped > max_records:
        worst = max(scans, key=lambda s: s.corrupted)
        raise ManifestError(
            f"{report.skipped} corrupted record(s) found, above "
            f"--max-corrupt-records {max_records} (e.g. {worst.path}: "
            f"{worst.corrupted}); convert again.")
    return manifest.with_files(replaced), report
