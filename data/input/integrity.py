"""Data checks run before training starts.

* :func:`check_disjoint_splits`: no example id is in both the train and the
  eval split (reads only the id column of every record).
* :func:`repair_corrupted_shards`: with ``--max-corrupt-records N``, shards
  whose sha256 no longer matches the manifest are scanned record by record;
  if at most N records are lost in total, training uses repaired copies
  holding every good record, and the records and rows lost are reported per
  file. A lost record is a corrupted one or, in a truncated file, every
  record after the cut; the rows lost are the manifest's rows of the shard
  minus the rows of its good records. Otherwise -- or with N = 0 -- the
  job refuses to start, naming each file and the rows it would lose.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import tensorflow as tf

from psrec.data.format.manifest import SPLITS
from psrec.data.format.manifest import Manifest
from psrec.data.format.manifest import ManifestError
from psrec.data.format.manifest import ShardInfo
from psrec.data.format.records import ROWS_KEY
from psrec.data.format.records import corruption_named
from psrec.data.format.repair import ScanResult
from psrec.data.format.repair import scan_records
from psrec.errors import ConfigError
from psrec.features.spec.spec import ID_COLUMN
from psrec.progress import SILENT
from psrec.progress import Progress
from psrec.progress import Task
from psrec.uri_path import as_path


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
class ShardLoss:
    """What skipping the corrupted records of one shard loses.

    Attributes:
      scan: the record-level scan (good, corrupted, where framing broke).
      rows: rows the manifest records for the shard.
      kept_rows: rows of the good records (the repaired copy).
      records_lost: every record not kept, counted from the lost rows (every
        block holds ``block_rows`` rows but the split's last).
    """

    scan: ScanResult
    split: str
    rows: int
    kept_rows: int
    records_lost: int

    @property
    def rows_lost(self) -> int:
        return self.rows - self.kept_rows


@dataclasses.dataclass(frozen=True)
class RepairReport:
    """Records and rows lost by skipping corrupted records, per file.

    Attributes:
      split_rows: rows of each split in the manifest (the share lost is
        reported against them).
    """

    losses: tuple[ShardLoss, ...]
    split_rows: dict[str, int]

    @property
    def skipped(self) -> int:
        """Records lost in total (the unit of ``--max-corrupt-records``)."""
        return sum(loss.records_lost for loss in self.losses)

    def rows_lost(self, split: str | None = None) -> int:
        return sum(loss.rows_lost for loss in self.losses
                   if split in (None, loss.split))

    def _per_split(self) -> str:
        return ", ".join(
            f"{self.rows_lost(split)} of {self.split_rows[split]} {split} "
            f"rows ({_share(self.rows_lost(split), self.split_rows[split])})"
            for split in SPLITS
            if any(loss.split == split for loss in self.losses))

    def files(self) -> list[str]:
        lines = []
        for loss in self.losses:
            scan = loss.scan
            after = loss.records_lost - scan.corrupted
            tail = (f", {after} unreadable after byte {scan.unreadable_from}"
                    " (truncated or broken framing)"
                    if scan.unreadable_from is not None else "")
            lines.append(
                f"  {scan.path}: {scan.corrupted} corrupted{tail}, "
                f"{scan.good} good; {loss.rows_lost} of {loss.rows} rows "
                f"lost ({_share(loss.rows_lost, loss.rows)})")
        return lines

    def summary(self) -> str:
        return "\n".join([f"skipped {self.skipped} corrupted record(s): "
                          f"{self._per_split()} lost:"] + self.files())

    def to_dict(self) -> dict[str, object]:
        return {"records_lost": self.skipped,
                "rows_lost": {split: self.rows_lost(split)
                              for split in SPLITS},
                "files": {loss.scan.path: {
                    "split": loss.split, "rows": loss.rows,
                    "rows_lost": loss.rows_lost,
                    "records_lost": loss.records_lost,
                    "corrupted": loss.scan.corrupted,
                    "unreadable_from": loss.scan.unreadable_from}
                    for loss in self.losses}}


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.2%}" if whole else "n/a"


def _rows_in(path: Path) -> int:
    """Rows of the block records of a (repaired, clean) TFRecord file."""
    features = {ROWS_KEY: tf.io.FixedLenFeature([1], tf.int64)}
    dataset = tf.data.TFRecordDataset(str(path)).batch(256).map(
        lambda r: tf.reduce_sum(tf.io.parse_example(r, features)[ROWS_KEY]))
    return int(sum(int(n) for n in dataset))


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

    Repaired copies are written to ``out_dir``; ``max_records`` records may
    be lost in total; without ``checksums`` only presence and size are
    compared (``progress`` is told the bytes of the sha256 pass).
    """
    problems = _mismatches(manifest, checksums, progress)
    if not problems:
        return manifest, None
    if max_records <= 0:
        raise ManifestError(problems[0][2] + " (or allow a bounded skip with "
                            "--max-corrupt-records N)")
    losses, replaced = [], {}
    for split, shard, message in problems:
        path = manifest.path_of(shard.file)
        if not path.is_file():
            raise ManifestError(message)
        repaired = as_path(out_dir) / shard.file
        scan = scan_records(path, repaired)
        if scan.clean:  # same records, other bytes: not corruption
            raise ManifestError(message)
        kept = _rows_in(repaired)
        lost = max(0, shard.rows - kept)
        records = max(scan.corrupted + (scan.unreadable_from is not None),
                      -(-lost // manifest.block_rows))
        losses.append(ShardLoss(scan, split, shard.rows, kept, records))
        replaced[shard.file] = str(repaired.resolve())
    report = RepairReport(tuple(losses), {split: manifest.rows(split)
                                          for split in SPLITS})
    if report.skipped > max_records:
        raise ManifestError(
            f"{report.skipped} corrupted record(s) found, above "
            f"--max-corrupt-records {max_records}: skipping them would lose "
            f"{report._per_split()}: " + ";".join(report.files())
            + ". Convert again.")
    return manifest.with_files(replaced), report
