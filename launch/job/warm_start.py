"""``psrec train --warm-start RUN_OR_CHECKPOINT``: the source of a warm
start, found and checked before any server starts (plain Python).

The source is a run's workdir (its latest checkpoint), its
``checkpoints/`` folder (the same) or one checkpoint prefix
(``.../checkpoints/ckpt-200``, ``.../checkpoints/best/best-150``); the
job it was trained with is the ``job.json`` of its checkpoints folder.
Refused in one line (exit 2), naming the path and the fix: a source that
does not exist, one without a checkpoint or ``job.json``, this run's own
workdir, and a source of the other task (retrieval vs ranking). The
feature plan (:mod:`psrec.ps_cluster.checkpoint.warm_plan`) is made here
too, so its refusals come before any server starts.

A warm start applies only to a workdir without a checkpoint of its own: a
rerun of a warm-started run resumes its own checkpoints
(:func:`resolve_warm_start` keeps the source its ``job.json`` records).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from psrec.errors import did_you_mean
from psrec.features.spec.spec import FeatureSpec
from psrec.launch.job.config import JOB_FILE
from psrec.launch.job.config import JobConfig
from psrec.models.optim.config import OptimizerConfig
from psrec.ps_cluster.checkpoint.warm_plan import WarmStartError
from psrec.ps_cluster.checkpoint.warm_plan import WarmStartPlan
from psrec.ps_cluster.checkpoint.warm_plan import plan_warm_start
from psrec.uri_path import as_path

_STATE_FILE = "checkpoint"  # tf.train.CheckpointManager's state file
_LATEST = re.compile(r'^model_checkpoint_path:\s*"(?P<path>[^"]+)"', re.M)


@dataclasses.dataclass(frozen=True)
class WarmSource:
    """A checked warm-start source: its checkpoint prefix, the job it was
    trained with (``job.json`` data) and the plan from its spec."""

    prefix: str
    job: dict
    plan: WarmStartPlan


def _error(source: str, problem: str, fix: str) -> WarmStartError:
    return WarmStartError(f"--warm-start {source}: {problem}; {fix}.")


def latest_prefix(folder) -> str | None:
    """The checkpoint ``folder``'s state file names (absolute), None
    without one."""
    state = as_path(folder) / _STATE_FILE
    if not state.is_file():
        return None
    match = _LATEST.search(state.read_text())
    if match is None:
        return None
    name = match.group("path")
    return name if name.startswith("/") or "://" in name else str(
        as_path(folder) / name)


def has_own_checkpoint(config: JobConfig) -> bool:
    """``config``'s workdir holds a checkpoint (then it resumes)."""
    return latest_prefix(config.checkpoint_dir) is not None


def _exists(prefix: str) -> bool:
    return as_path(prefix + ".index").is_file()


def _beside(path) -> list[str]:
    """The sources in ``path``'s folder a misspelt ``path`` may have meant:
    its checkpoint prefixes, and its folders that hold checkpoints or are
    runs."""
    folder = path.parent
    if not folder.is_dir():
        return []
    return [str(folder / p.stem) for p in folder.glob("ckpt-*.index")] + [
        str(p) for p in folder.iterdir()
        if (p / _STATE_FILE).is_file() or (p / "checkpoints").is_dir()]


def find_source(source: str) -> tuple[str, object]:
    """``(checkpoint prefix, its checkpoints folder)`` of ``source`` (see
    the module docstring)."""
    path = as_path(source)
    for folder in (path / "checkpoints", path):
        if (folder / _STATE_FILE).is_file():
            prefix = latest_prefix(folder)
            if prefix is None or not _exists(prefix):
                raise _error(source, f"{folder / _STATE_FILE} names no "
                             "checkpoint whose files exist",
                             "give one checkpoint prefix (ckpt-N) of that "
                             "folder")
            return prefix, folder
    if _exists(str(path)):
        folder = path.parent
        if folder.name == "best":  # a kept best checkpoint
            folder = folder.parent
        return str(path), folder
    if not path.exists():
        raise _error(source, "no such file or folder"
                     f"{did_you_mean(source, _beside(path))}",
                     "give another run's workdir, its checkpoints folder or "
                     "one checkpoint prefix (.../checkpoints/ckpt-N)")
    raise _error(source, "holds no checkpoint (no checkpoints/checkpoint "
                 "state file, no checkpoint prefix)",
                 "give the workdir of a run that saved one, its checkpoints "
                 "folder or one checkpoint prefix (.../checkpoints/ckpt-N)")


def _task(retrieval) -> str:
    """The task of a job whose retrieval settings are ``retrieval``."""
    return "retrieval" if retrieval is not None else "ranking"


def check_source(config: JobConfig, source: str) -> WarmSource:
    """The checked source of ``config``'s warm start (see the module
    docstring for what is refused)."""
    prefix, folder = find_source(source)
    own = Path(str(config.checkpoint_dir)).absolute()
    if "://" not in str(folder) and Path(str(folder)).absolute() == own:
        raise _error(source, "is this run's own workdir",
                     "a warm start starts a new workdir from another run; "
                     "to resume this one, drop --warm-start")
    record = as_path(folder) / JOB_FILE
    if not record.is_file():
        raise _error(source, f"{record} not found: the checkpoint has no "
                     "recorded job (psrec train writes job.json beside its "
                     "checkpoints)", "give a checkpoint psrec train wrote")
    try:
        job = json.loads(record.read_text())
        spec = FeatureSpec.from_dict(job["spec"])
        optimizer = OptimizerConfig.from_dict(job.get("optimizer") or {})
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise _error(source, f"{record} cannot be read ({error})",
                     "give a checkpoint psrec train wrote") from None
    theirs, mine = _task(job.get("retrieval")), _task(config.retrieval)
    if theirs != mine:
        raise _error(source, f"is a {theirs} run ({record}), this one "
                     f"is a {mine} run", f"warm-start from a {mine} run")
    return WarmSource(str(prefix), job, plan_warm_start(
        spec, config.spec, optimizer, config.optimizer))


def resolve_warm_start(config: JobConfig, log) -> JobConfig:
    """``config`` with ``warm_start`` the checked source's checkpoint
    prefix (recorded in ``job.json``), before any server starts. A workdir
    with a checkpoint of its own resumes it: the source its ``job.json``
    records is kept and the given one is not read (it may be gone)."""
    if has_own_checkpoint(config):
        record = config.checkpoint_dir / JOB_FILE
        recorded = None
        if record.is_file():
            recorded = json.loads(record.read_text()).get("warm_start")
        if config.warm_start is not None:
            log(f"--warm-start {config.warm_start}: not applied, "
                f"{config.workdir} has checkpoints of its own: resuming "
                "them")
        return dataclasses.replace(config, warm_start=recorded)
    if config.warm_start is None:
        return config
    checked = check_source(config, str(config.warm_start))
    return dataclasses.replace(config, warm_start=checked.prefix)
