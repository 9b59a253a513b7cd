"""The best checkpoint of a run: kept out of rotation, recorded atomically,
and the choice of a checkpoint by name (``latest``, ``best``, ``ckpt-N``).

Every evaluation boundary is a checkpoint boundary. When the evaluation
improved the tracked metric (``--keep-best``: ``auc``/``logloss`` of a
ranking run, ``mrr``/``recall@K`` of a retrieval run, ``TASK:METRIC`` of a
multi-task one), the files of the
checkpoint just saved are hard-linked (copied where a link is impossible)
into ``checkpoints/best/`` as ``best-<step>.*``, and then ``best.json``
beside the checkpoints is replaced atomically, naming them with the step and
the metrics. ``tf.train.CheckpointManager`` deletes only the files of the
checkpoints it wrote into ``checkpoints/``, so the best survives
``--keep-checkpoints`` rotation. The previous best's files are removed only
after the record names the new one: a crash in between leaves extra files,
never a record naming missing ones. A resumed run reads the record, so the
best-so-far (and the early-stopping count) carries over.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import tensorflow as tf

from psrec.data.format.files import write_json_atomic
from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.errors import did_you_mean
from psrec.models.retrieval.config import RETRIEVAL_METRICS
from psrec.ps_cluster.checkpoint.names import CHECKPOINT_NAME
from psrec.ps_cluster.checkpoint.names import check_checkpoint_name
from psrec.ps_cluster.checkpoint.names import kept_checkpoints
from psrec.ps_cluster.evaluation.metrics import EvalResult
from psrec.ps_cluster.evaluation.watched import higher_is_better
from psrec.ps_cluster.evaluation.watched import split_keep_best
from psrec.uri import name as uri_name
from psrec.uri_path import UriPath
from psrec.uri_path import as_path

BEST_FILE = "best.json"
BEST_DIR = "best"


@dataclasses.dataclass(frozen=True)
class BestRecord:
    """``best.json``: the checkpoint with the best evaluation so far.

    Attributes:
      checkpoint: its prefix, relative to the checkpoint folder
        (``best/best-<step>``).
      source: the rotated checkpoint it was linked from (``ckpt-<step>``).
      metric: ``logloss`` (lower is better), ``auc``, ``mrr`` or
        ``recall@K`` (higher is better).
      auc, logloss: the ranking figures (None for a retrieval run).
      evals_without_improvement: evaluations since (for early stopping).
      metrics: a retrieval run's figures by name (``recall@K``, ``mrr``).
    """

    checkpoint: str
    source: str
    step: int
    metric: str
    value: float
    auc: float | None
    logloss: float | None
    count: int
    evals_without_improvement: int = 0
    metrics: dict[str, float] | None = None

    def path(self, directory: str | Path) -> str:
        return str(as_path(directory) / self.checkpoint)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BestRecord:
        return cls(**data)

    def figures(self) -> str:
        """``AUC 0.7, logloss 0.5`` or a retrieval run's ``recall@1 ...,
        mrr ...``."""
        if self.metrics is not None:
            return ", ".join(f"{name} {value:.4f}"
                             for name, value in self.metrics.items())
        return f"AUC {self.auc:.4f}, logloss {self.logloss:.4f}"

    def summary(self) -> str:
        if split_keep_best(self.metric)[0] is not None:  # TASK:METRIC
            return (f"step {self.step}, {self.metric} {self.value:.4f} "
                    f"({self.checkpoint})")
        return f"step {self.step}, {self.figures()} ({self.checkpoint})"


def read_best(directory: str | Path) -> BestRecord | None:
    """The record in ``directory``, None when there is none; a
    :class:`DataError` when it is unreadable or names missing files."""
    path = as_path(directory) / BEST_FILE
    if not path.is_file():
        return None
    try:
        record = BestRecord.from_dict(json.loads(path.read_text()))
    except (ValueError, TypeError) as error:
        raise DataError(f"{path} is not a best-checkpoint record ({error}); "
                        "delete it to start a new one.") from error
    if not as_path(record.path(directory) + ".index").is_file():
        raise DataError(f"{path} names {record.checkpoint}, whose files are "
                        f"missing in {directory}; delete {BEST_FILE} (or use "
                        "--checkpoint latest).")
    return record


def improves(metric: str, value: float, best: float | None) -> bool:
    """True if ``value`` is better than ``best`` (NaN never is)."""
    if not math.isfinite(value):
        return False
    if best is None or not math.isfinite(best):
        return True
    return value > best if higher_is_better(metric) else value < best


def metric_value(result: Any, metric: str) -> float:
    """The value of ``metric`` (``LoopConfig.keep_best``) in an eval
    result: the first task's ``auc``/``logloss`` or ``TASK:METRIC``'s (a
    single label's from the result's own fields) of a ranking one,
    ``mrr``/``recall@K`` of a retrieval one (its ``named``)."""
    if metric in RETRIEVAL_METRICS:
        return result.named()[metric]
    task, name = split_keep_best(metric)
    if task is not None and result.tasks:
        return float(result.task(task).get(name, math.nan))
    value = getattr(result, name, None)
    return math.nan if value is None else float(value)


def _files_of(prefix: str) -> list[Path | UriPath]:
    """A checkpoint's files: data shards first, the index last."""
    prefix_path = as_path(prefix)
    files = sorted(prefix_path.parent.glob(prefix_path.name + ".*"))
    return sorted(files, key=lambda f: f.suffix == ".index")


def _link_or_copy(source: Path | UriPath, target: Path | UriPath) -> None:
    target.unlink(missing_ok=True)
    if isinstance(source, UriPath):  # a store: no links
        source.copy_to(target)
        return
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


class BestTracker:
    """Keeps the best checkpoint of a run (on the chief only); ``patience``
    evaluations without improvement end the run (0: off)."""

    def __init__(self, directory: str | Path, metric: str,
                 patience: int = 0) -> None:
        self.directory = as_path(directory)
        self.metric = metric
        self.patience = patience
        record = read_best(self.directory)
        # A record of another metric is not comparable: start a new one.
        self.record = (record if record is not None
                       and record.metric == metric else None)

    @property
    def exhausted(self) -> bool:
        """Early stopping is due: ``patience`` evaluations in a row did not
        improve the best."""
        return bool(self.patience and self.record is not None and
                    self.record.evals_without_improvement >= self.patience)

    def update(self, step: int, result: EvalResult, saved: str) -> bool:
        """Considers the evaluation of checkpoint ``saved`` (at ``step``);
        returns True when it is the new best."""
        value = metric_value(result, self.metric)
        best = self.record.value if self.record is not None else None
        if not improves(self.metric, value, best):
            if self.record is not None:
                self.record = dataclasses.replace(
                    self.record, evals_without_improvement=(
                        self.record.evals_without_improvement + 1))
                write_json_atomic(self.directory / BEST_FILE,
                                  self.record.to_dict())
            return False
        folder = self.directory / BEST_DIR
        folder.mkdir(parents=True, exist_ok=True)
        name = f"best-{step}"
        source = as_path(saved)
        files = _files_of(saved)
        if not files:
            raise DataError(f"checkpoint {saved} has no files to keep as the "
                            "best checkpoint.")
        for file in files:
            _link_or_copy(file, folder / (name + file.name[len(source.name):]))
        ranking = self.metric not in RETRIEVAL_METRICS  # incl. TASK:METRIC
        self.record = BestRecord(
            checkpoint=f"{BEST_DIR}/{name}", source=source.name, step=step,
            metric=self.metric, value=float(value),
            auc=float(result.auc) if ranking else None,
            logloss=float(result.logloss) if ranking else None,
            count=int(result.count),
            metrics=None if ranking else result.named())
        write_json_atomic(self.directory / BEST_FILE, self.record.to_dict())
        for file in folder.iterdir():  # earlier bests, only now
            if not file.name.startswith(name + "."):
                file.unlink(missing_ok=True)
        return True


@dataclasses.dataclass(frozen=True)
class ChosenCheckpoint:
    """A checkpoint chosen by :func:`choose_checkpoint`: its prefix, its
    name (``best/best-80``, ``ckpt-400``), its step, and the best record
    when it is the best checkpoint."""

    path: str
    name: str
    step: int
    best: BestRecord | None = None

    def describe(self) -> str:
        text = f"checkpoint {self.name} (step {self.step}"
        if self.best is not None and split_keep_best(
                self.best.metric)[0] is not None:  # TASK:METRIC
            text += (f", the best: eval {self.best.metric} "
                     f"{self.best.value:.4f}")
        elif self.best is not None:
            text += f", the best: eval {self.best.figures()}"
        return text + ")"


def choose_checkpoint(directory: str | Path, which: str | None = None
                      ) -> ChosenCheckpoint:
    """``latest``, ``best`` or ``ckpt-N`` of a checkpoint folder (None: the
    best when ``best.json`` exists, else the latest); an unknown name or no
    such checkpoint is a ConfigError (exit 2)."""
    directory = as_path(directory)
    record = read_best(directory)
    if which is None:
        which = "best" if record is not None else "latest"
    if which == "best":
        if record is None:
            raise ConfigError(
                f"no {BEST_FILE} in {directory}: the run recorded no best "
                "checkpoint (no eval split, or --keep-best none); use "
                "--checkpoint latest.")
        return ChosenCheckpoint(record.path(directory), record.checkpoint,
                                record.step, record)
    if which == "latest":
        path = tf.train.latest_checkpoint(str(directory))
        if path is None:
            raise ConfigError(f"no checkpoint in {directory}.")
        name = uri_name(path)
        step = int(name.rsplit("-", 1)[-1])
        same = record if record is not None and record.source == name else None
        return ChosenCheckpoint(path, name, step, same)
    check_checkpoint_name(directory, which)
    step = int(CHECKPOINT_NAME.match(which).group(1))
    path = directory / which
    if (directory / (which + ".index")).is_file():
        same = record if record is not None and record.source == which else (
            None)
        return ChosenCheckpoint(str(path), which, step, same)
    if record is not None and record.step == step:
        return ChosenCheckpoint(record.path(directory), record.checkpoint,
                                step, record)
    kept = kept_checkpoints(directory)
    raise ConfigError(f"`--checkpoint` = {which!r}: no such checkpoint in "
                      f"{directory} (kept: {', '.join(kept) or 'none'}"
                      f"{'; best: ckpt-' + str(record.step) if record else ''}"
                      f"){did_you_mean(which, kept) or '.'}")

