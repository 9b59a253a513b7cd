"""What a run left on disk, read without TensorFlow and without a cluster:
``psrec runs`` lists the workdirs of a folder, ``psrec show`` summarises
one.

A workdir is a folder with ``checkpoints/job.json`` (what ``psrec train``
records before its first step). Everything else is read when present:
``summary.json`` (the summary of the last finished ``psrec train``),
``checkpoints/best.json`` (the best checkpoint), the ``ckpt-N`` checkpoints
(the steps done, also for a run that has not finished) and the versions
under ``export/`` (``psrec train``'s export). Only JSON and file names are
read, so a listing is instant and never touches a running job.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path
from typing import Any

from psrec.errors import ConfigError
from psrec.errors import did_you_mean
from psrec.launch.job.config import JOB_FILE
from psrec.launch.job.config import JobConfig
from psrec.options import field_default
from psrec.options import field_named

#: The folder of ``psrec train``'s default ``--workdir``: the one ``psrec
#: runs`` lists by default.
DEFAULT_WORKDIR = str(field_default(field_named(JobConfig, "workdir")))
RUNS_FOLDER = str(Path(DEFAULT_WORKDIR).parent)

SUMMARY_FILE = "summary.json"  # launch.job.run writes it
_BEST_FILE = "best.json"  # ps_cluster.checkpoint.best's record (TensorFlow)
_CKPT_INDEX = re.compile(r"^ckpt-(\d+)\.index$")


class NotAWorkdirError(ConfigError):
    """The folder holds no run (exit 2)."""


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One run as its files describe it."""

    path: Path
    job: dict[str, Any]
    summary: dict[str, Any] | None
    best: dict[str, Any] | None
    steps: int | None
    exports: tuple[int, ...]
    changed: float  # seconds since the epoch

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def model(self) -> str:
        if self.job.get("retrieval") is not None:
            return "retrieval"
        return str(self.job.get("model_name", "?"))

    @property
    def spec(self) -> str:
        spec = self.job.get("spec")
        return str(spec.get("name", "?")) if isinstance(spec, dict) else "?"

    @property
    def data(self) -> str:
        followed = (self.job.get("follow") or {}).get("dir")
        if followed:
            done = len((self.summary or {}).get("partitions") or [])
            return f"--follow {followed} ({done} partitions done)"
        if self.job.get("data"):
            return str(self.job["data"])
        rows = (self.job.get("synthetic") or {}).get("rows")
        return "generated" + (f" ({rows:,} synthetic rows)"
                              if isinstance(rows, int) else "")

    def best_text(self) -> str:
        """The best checkpoint's metric, else the last evaluation's, else
        why there is none."""
        if self.best is not None:
            return (f"{self.best['metric']} {self.best['value']:.4f} "
                    f"(step {self.best['step']})")
        final = _metrics(self.summary)
        if final:
            name, value = next(iter(final.items()))
            return f"{name} {value:.4f} (last eval)"
        test = _last_test(self.summary)
        if test:
            return f"auc {test['auc']:.4f} (last partition's test)"
        if self.summary is not None:
            return "no evaluation"
        return "-"

    def cells(self) -> tuple[str, ...]:
        """One row of ``psrec runs``: name, model, data, steps done, best
        metric, export versions, last change."""
        exports = ",".join(map(str, self.exports)) or "-"
        steps = "-" if self.steps is None else str(self.steps)
        return (self.name, self.model, self.data, steps, self.best_text(),
                exports, _when(self.changed))

    def details(self) -> str:
        """``psrec show``'s text."""
        lines = [f"run {self.path}",
                 f"  spec:        {self.spec}",
                 f"  model:       {self.model}",
                 f"  data:        {self.data}",
                 f"  steps done:  {'-' if self.steps is None else self.steps}"]
        if self.best is not None:  # a retrieval run's: its metrics
            figures = self.best.get("metrics") or {
                "AUC": self.best["auc"], "logloss": self.best["logloss"]}
            lines.append(
                f"  best:        step {self.best['step']}, " + ", ".join(
                    f"{k} {v:.4f}" for k, v in figures.items())
                + f" ({self.best['checkpoint']}, by {self.best['metric']})")
        else:
            lines.append("  best:        none recorded")
        final = _metrics(self.summary)
        if final:
            lines.append(f"  final eval:  step {self.summary['step']}: " +
                         ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
        elif _last_test(self.summary):
            record = self.summary["partitions"][-1]
            lines.append(
                f"  last test:   partition {record['partition']} at step "
                f"{record['eval_step']} (before training on it): " + ", ".join(
                    f"{k} {v:.4f}" for k, v in record["test"].items()
                    if k in ("auc", "logloss", "calibration", "gauc")))
        elif self.summary is not None:
            lines.append("  final eval:  none (no eval split)")
        exports = ", ".join(str(self.path / "export" / str(v))
                            for v in self.exports)
        lines.append(f"  exports:     {exports or 'none'}")
        if self.summary is not None:
            lines.append(f"  wall time:   {self.summary['seconds']:.1f} s "
                         f"(steps {self.summary['start_step']} -> "
                         f"{self.summary['step']}, last psrec train)")
        else:
            lines.append(f"  wall time:   unknown (no {SUMMARY_FILE}: no "
                         "psrec train finished here)")
        lines.append(f"  changed:     {_when(self.changed)}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        final = _metrics(self.summary)
        return {"workdir": str(self.path), "name": self.name,
                "spec": self.spec, "model": self.model, "data": self.data,
                "steps": self.steps, "best": self.best,
                "final_eval": final or None,
                "exports": [str(self.path / "export" / str(v))
                            for v in self.exports],
                "seconds": (self.summary or {}).get("seconds"),
                "changed": self.changed}


def is_workdir(folder: Path) -> bool:
    return (folder / "checkpoints" / JOB_FILE).is_file()


def read_run(folder: str | Path) -> RunRecord:
    """The run in ``folder``; a :class:`NotAWorkdirError` naming the file
    that is missing, or the one that cannot be read."""
    path = Path(folder)
    job_file = path / "checkpoints" / JOB_FILE
    if not job_file.is_file():
        siblings = [str(p) for p in sorted(path.parent.iterdir())
                    if (p / "checkpoints" / JOB_FILE).is_file()] if (
            path.parent.is_dir()) else []
        raise NotAWorkdirError(
            f"{path} is not a psrec workdir: {job_file} not found (psrec "
            "train --workdir DIR writes it); list the runs of a folder with "
            f"`psrec runs FOLDER`{did_you_mean(path, siblings) or '.'}")
    job = _json(job_file)
    if not isinstance(job, dict):
        raise NotAWorkdirError(f"{job_file} holds no job (a JSON object).")
    summary = _json(path / SUMMARY_FILE, optional=True)
    best = _json(path / "checkpoints" / _BEST_FILE, optional=True)
    steps = [int(m.group(1)) for f in (path / "checkpoints").iterdir()
             if (m := _CKPT_INDEX.match(f.name))]
    if isinstance(summary, dict) and isinstance(summary.get("step"), int):
        steps.append(summary["step"])
    export = path / "export"
    exports = tuple(sorted(
        int(v.name) for v in export.iterdir()
        if v.name.isdigit() and (v / "saved_model.pb").is_file())
    ) if export.is_dir() else ()
    changed = max(f.stat().st_mtime for folder in (path, path / "checkpoints")
                  for f in (folder, *folder.iterdir()))
    return RunRecord(path=path, job=job,
                     summary=summary if isinstance(summary, dict) else None,
                     best=best if isinstance(best, dict) else None,
                     steps=max(steps) if steps else None, exports=exports,
                     changed=changed)


def find_runs(folder: str | Path) -> list[RunRecord]:
    """The runs of ``folder`` (``folder`` itself when it is a workdir), by
    name; a :class:`NotAWorkdirError` when it holds none."""
    path = Path(folder)
    if not path.is_dir():
        raise NotAWorkdirError(
            f"{path} is not a folder: give the folder of your runs (psrec "
            f"train's --workdir is {DEFAULT_WORKDIR} by default).")
    if is_workdir(path):
        return [read_run(path)]
    runs = [read_run(p) for p in sorted(path.iterdir())
            if p.is_dir() and is_workdir(p)]
    if not runs:
        raise NotAWorkdirError(
            f"{path} holds no runs: no folder in it has checkpoints/"
            f"{JOB_FILE} (psrec train --workdir {path}/NAME makes one).")
    return runs


def _json(path: Path, optional: bool = False) -> Any:
    if optional and not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise NotAWorkdirError(f"{path} cannot be read ({error}).") from None


def _metrics(summary: dict[str, Any] | None) -> dict[str, float]:
    """The final evaluation's headline figures in ``summary.json`` (of a
    multi-task run: ``TASK:METRIC`` of every task)."""
    found = (summary or {}).get("eval")
    if not isinstance(found, dict):
        return {}
    tasks = found.get("tasks")
    if isinstance(tasks, list) and tasks:  # several labels: each task's
        return {f"{task.get('name')}:{k}": float(task[k])
                for task in tasks if isinstance(task, dict)
                for k in ("auc", "logloss", "rmse")
                if isinstance(task.get(k), (int, float))}
    names = (("rmse",) if isinstance(found.get("rmse"), (int, float))
             else ("auc", "logloss", "mrr"))  # regression: no AUC
    figures = {k: float(found[k]) for k in names
               if isinstance(found.get(k), (int, float))}
    recall = found.get("recall")
    if isinstance(recall, dict):
        figures.update({f"recall@{k}": float(v) for k, v in recall.items()})
    return figures


def _last_test(summary: dict[str, Any] | None) -> dict[str, float]:
    """``--follow``: the last partition's test-before-train metrics with
    an AUC ({} otherwise)."""
    records = (summary or {}).get("partitions") or []
    test = records[-1].get("test", {}) if records else {}
    return test if "auc" in test else {}


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))
