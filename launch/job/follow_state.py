"""The partitions of a followed log and the follow state that makes each
one trained exactly once (``psrec train --follow DIR``). Plain Python.

**Partitions.** Every sub-folder of DIR whose name does not start with
``.`` or ``_`` is a partition (``DIR/dt=2026-12-01/``), taken in name order.
A partition is *ready* when its ``manifest.json`` exists: ``psrec convert``
writes it last, after every shard is renamed into place, so a ready
partition is complete. Partitions are processed strictly in name order: the
first one not ready stops the walk (it is awaited; a later ready one is not
trained before it), so a day is never trained before the day before it.

**The state** (``checkpoints/follow.json``, replaced atomically) lists the
partitions done and the one in progress with its phase:

* ``train``: evaluated (its test-before-train metrics recorded, with the
  step they were measured at) and being trained from ``start_step`` to
  ``end_step``;
* ``export``: trained; the checkpoint at ``end_step`` exists, the export is
  due;
* done: exported (its version recorded) or ``--no-export``.

The protocol keeps the state and the checkpoint in agreement whatever
instant a crash picks (docs/reliability.md): the checkpoint at ``end_step``
is saved *before* the state says ``export``, and the state says ``train``
only once the evaluation is recorded and *before* the first step. So the
latest checkpoint's step ``S`` always satisfies, on restart,
``start_step <= S <= end_step`` for a partition in ``train`` (resume the
partition from S; S = end_step: its training finished, go to ``export``),
``S >= end_step`` for one in ``export`` or done, and ``S`` = the last done
partition's ``end_step`` when none is in progress. Anything else (a rolled
back or deleted checkpoint folder) is refused: :func:`FollowState.check_step`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

from psrec.data.format.files import write_json_atomic
from psrec.data.format.manifest import MANIFEST_NAME
from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.uri_path import UriPath
from psrec.uri_path import as_path

STATE_FILE = "follow.json"
PHASES = ("train", "export", "done")
#: The test-before-train metrics a partition record keeps.
TEST_METRICS = ("count", "auc", "logloss", "calibration", "positive_rate",
                "gauc")


class FollowStateError(DataError):
    """The follow state and the checkpoints disagree (exit 1)."""


@dataclasses.dataclass(frozen=True)
class Partition:
    """One partition folder of a followed log."""

    name: str
    path: Path | UriPath

    @property
    def ready(self) -> bool:
        return (self.path / MANIFEST_NAME).is_file()

    def describe_waiting(self) -> str:
        """Why it is not ready, in one line (a raw Parquet partition is
        named as such)."""
        parquet = [p for p in self.path.iterdir()
                   if p.name.endswith(".parquet")]
        if parquet:
            return (f"{self.path} holds {len(parquet)} Parquet file(s) but no "
                    f"{MANIFEST_NAME}: --follow trains converted partitions; "
                    f"convert it (`psrec convert {self.path} --spec SPEC --out "
                    "FOLDER`, into its own partition folder)")
        return (f"{self.path} has no {MANIFEST_NAME} yet (`psrec convert` "
                "writes it last)")


def partitions(root: str | Path) -> list[Partition]:
    """The partition folders of ``root`` in name order (ready or not)."""
    folder = as_path(root)
    if not folder.is_dir():
        raise ConfigError(
            f"--follow {root}: not a folder; give the folder that holds the "
            "partitions (e.g. logs/ holding logs/dt=2026-12-01/).")
    found = [Partition(p.name, p) for p in folder.iterdir()
             if p.is_dir() and not p.name.startswith((".", "_"))]
    return sorted(found, key=lambda p: p.name)


def pending(root: str | Path, done: set[str]
            ) -> tuple[list[Partition], Partition | None]:
    """The ready partitions not in ``done``, in name order, up to the first
    one that is not ready (returned second: awaited; None when every
    partition is ready)."""
    ready: list[Partition] = []
    for partition in partitions(root):
        if partition.name in done:
            continue
        if not partition.ready:
            return ready, partition
        ready.append(partition)
    return ready, None


def test_metrics(result) -> dict[str, float]:
    """The test-before-train figures of an ``EvalResult`` (finite ones)."""
    data: dict[str, float] = {}
    for name in TEST_METRICS:
        value = getattr(result, name, None)
        if value is None:
            continue
        value = float(value)
        if math.isfinite(value):
            data[name] = int(value) if name == "count" else value
    return data


@dataclasses.dataclass(frozen=True)
class PartitionRecord:
    """One partition's progress through test, train and export.

    Attributes:
      test: its test-before-train metrics (:data:`TEST_METRICS`) on every
        row of the partition (train and eval splits), measured at
        ``eval_step``, the model's step before any of its rows trained.
      start_step, end_step: the global steps it trains from and to.
      began: wall-clock time its evaluation began; ``seconds`` runs from
        there to its export (restarts included).
    """

    partition: str
    phase: str
    rows: int
    test: dict[str, float]
    eval_step: int
    start_step: int
    end_step: int
    began: float
    seconds: float = 0.0
    checkpoint: str | None = None
    export_version: int | None = None

    @property
    def steps(self) -> int:
        return self.end_step - self.start_step

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "steps": self.steps}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PartitionRecord:
        data = {k: v for k, v in data.items() if k != "steps"}
        return cls(**data)

    def advanced(self, phase: str, **changes: Any) -> PartitionRecord:
        if phase not in PHASES:
            raise ValueError(f"unknown follow phase {phase!r}")
        return dataclasses.replace(self, phase=phase, **changes)

    def finished(self, export_version: int | None) -> PartitionRecord:
        return self.advanced("done", export_version=export_version,
                             seconds=time.time() - self.began)


@dataclasses.dataclass(frozen=True)
class FollowState:
    """The partitions done (in the order trained) and the one in
    progress."""

    dir: str
    done: tuple[PartitionRecord, ...] = ()
    current: PartitionRecord | None = None

    @property
    def done_names(self) -> set[str]:
        return {r.partition for r in self.done}

    @property
    def last_step(self) -> int:
        """The step the model is at once the state's work is saved."""
        if self.current is not None:
            return self.current.start_step
        return self.done[-1].end_step if self.done else 0

    def to_dict(self) -> dict[str, Any]:
        return {"dir": self.dir, "done": [r.to_dict() for r in self.done],
                "current": (self.current.to_dict() if self.current
                            else None)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FollowState:
        return cls(dir=data["dir"], done=tuple(
            PartitionRecord.from_dict(r) for r in data["done"]),
            current=(PartitionRecord.from_dict(data["current"])
                     if data.get("current") else None))

    def save(self, checkpoint_dir: str | Path) -> Path | UriPath:
        """Replaces ``checkpoint_dir/follow.json`` atomically."""
        return write_json_atomic(as_path(checkpoint_dir) / STATE_FILE,
                                 self.to_dict())

    @classmethod
    def load(cls, checkpoint_dir: str | Path, follow_dir: str
             ) -> FollowState:
        """The recorded state; a fresh one when there is none."""
        path = as_path(checkpoint_dir) / STATE_FILE
        if not path.is_file():
            return cls(dir=str(follow_dir))
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise FollowStateError(
                f"{path} cannot be read ({error!r}): the record of which "
                "partitions were trained is lost; restore it from a backup, "
                "or follow into a new workdir.") from None

    def with_current(self, record: PartitionRecord | None) -> FollowState:
        return dataclasses.replace(self, current=record)

    def with_done(self, record: PartitionRecord) -> FollowState:
        return FollowState(self.dir, self.done + (record,), None)

    def check_step(self, step: int, path: str | Path) -> None:
        """Refuses a restored step ``step`` that the state cannot have been
        written beside (the module docstring's protocol)."""
        current = self.current
        if current is None:
            ok = step == self.last_step
            want = f"step {self.last_step}"
        elif current.phase == "train":
            ok = current.start_step <= step <= current.end_step
            want = (f"a step in [{current.start_step}, {current.end_step}] "
                    f"(partition {current.partition} in training)")
        else:
            ok = step >= current.end_step
            want = f"step >= {current.end_step}"
        if not ok:
            raise FollowStateError(
                f"{path} and the latest checkpoint disagree: the checkpoint "
                f"is at step {step}, the follow state needs {want}. The "
                "checkpoint folder was rolled back or changed by hand; "
                "restore it, or follow into a new workdir.")


def partition_table(records: list[dict[str, Any]]) -> list[str]:
    """The per-partition table of a summary (``PartitionRecord.to_dict``
    rows): partition, rows, test-before-train AUC / logloss / calibration
    (and GAUC when measured), train steps, seconds, export version."""
    if not records:
        return []
    gauc = any("gauc" in r["test"] for r in records)
    width = max(9, *(len(r["partition"]) for r in records))
    head = (f"{'partition':<{width}} {'rows':>9} {'test AUC':>8} "
            f"{'logloss':>8} {'calib':>6}" + (f" {'GAUC':>7}" if gauc else "")
            + f" {'steps':>6} {'seconds':>8} {'export':>6}")
    lines = [head]
    for r in records:
        test = r["test"]

        def cell(name: str, width: int, digits: int) -> str:
            value = test.get(name)
            return (f"{value:>{width}.{digits}f}" if value is not None
                    else f"{'n/a':>{width}}")
        version = r.get("export_version")
        lines.append(
            f"{r['partition']:<{width}} {r['rows']:>9,} "
            f"{cell('auc', 8, 4)} {cell('logloss', 8, 4)} "
            f"{cell('calibration', 6, 2)}"
            + (f" {cell('gauc', 7, 4)}" if gauc else "")
            + f" {r['steps']:>6} {r['seconds']:>8.1f} "
            f"{'-' if version is None else version:>6}")
    return lines
