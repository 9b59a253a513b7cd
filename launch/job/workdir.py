"""A workdir belongs to one job, trained by one ``psrec train`` at a time.

Before anything is written there, :func:`check_same_job` compares the job
recorded in the workdir (``checkpoints/job.json``) with the one requested:
a different spec, model, optimizer kind, task or data is a
:class:`WorkdirMismatchError` (exit 2) naming each field, its recorded and
its requested value, and the fix. The followed folder (``--follow``) is
part of the job: following another folder, or following after training on
``--data`` (or the reverse), is refused too. What a resume may change
(steps, eval and checkpoint cadence, ``--once`` / ``--follow-until``,
logging, learning rates, batch size, cluster shape, strategy, timeouts) is
not compared. :func:`workdir_lock` then takes the
workdir's lock (``train.lock`` in its local run-state folder, an exclusive
``flock`` held for the run's life by the one process that took it; the
file holds its pid); a second ``psrec train`` is a
:class:`WorkdirBusyError` (exit 2) naming that pid. A dead holder's lock is
released by the kernel with its file descriptor.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Any
from typing import Iterator

from psrec.errors import ConfigError
from psrec.errors import PsrecError
from psrec.features.spec.spec import FeatureSpec
from psrec.launch.job.config import JOB_FILE
from psrec.launch.job.config import FollowConfig
from psrec.launch.job.config import JobConfig
from psrec.launch.job.config import SyntheticData
from psrec.models.optim.config import OptimizerConfig
from psrec.models.ranking.config import ModelConfig
from psrec.models.retrieval.config import RetrievalConfig
from psrec.models.retrieval.config import as_recorded
from psrec.options import qualified
from psrec.uri_path import as_path

LOCK_FILE = "train.lock"

#: The fields of the recorded job's sub-configurations that make it the
#: same job (the checkpoint's variables and the data depend on them).
#: ``ModelConfig`` is compared whole; ``SyntheticData.seed`` is left out:
#: ``--seed`` is also the shuffle seed, which a resume may change.
_OPTIMIZER_IDENTITY = ("sparse", "dense")
_RETRIEVAL_IDENTITY = ("tower_mlp", "output_dim", "candidate_bias")
_SYNTHETIC_IDENTITY = ("rows", "eval_fraction", "files", "shards")


class WorkdirMismatchError(ConfigError):
    """The workdir holds another job than the one requested."""


class WorkdirBusyError(ConfigError):
    """Another ``psrec train`` holds the workdir's lock."""


def job_differences(recorded: dict[str, Any], config: JobConfig
                    ) -> list[tuple[str, str, str]]:
    """``(field, recorded, requested)`` for each identity field (see the
    module docstring) of the recorded job's data (``job.json``) that
    ``config`` does not share; values as they are shown. A field the record
    lacks (an older psrec) is not compared."""
    requested = json.loads(json.dumps(config.to_dict()))
    found: list[tuple[str, str, str]] = []
    if "spec" in recorded:
        before, after = _spec_label(recorded["spec"]), _spec_label(
            requested["spec"])
        if before != after:
            found.append((qualified(JobConfig, "spec"), before, after))
    if recorded.get("model_name", requested["model_name"]) != (
            requested["model_name"]):
        found.append((qualified(JobConfig, "model_name"),
                      repr(recorded["model_name"]),
                      repr(requested["model_name"])))
    elif isinstance(recorded.get("model"), dict) and recorded.get(
            "retrieval") is None:  # the preset's fields follow its name
        found += _leaves(ModelConfig, recorded["model"], requested["model"])
    if "retrieval" in recorded:
        before, after = recorded["retrieval"], requested["retrieval"]
        if (before is None) != (after is None):
            found.append(("the task", _task(before), _task(after)))
        elif before is not None:
            found += _leaves(RetrievalConfig, as_recorded(before), after,
                             _RETRIEVAL_IDENTITY)
    if isinstance(recorded.get("optimizer"), dict):
        found += _leaves(OptimizerConfig, recorded["optimizer"],
                         requested["optimizer"], _OPTIMIZER_IDENTITY)
    if "data" in recorded:
        before = _data_path(recorded["data"], config)
        after = _data_path(requested["data"], config)
        if before != after:
            found.append((qualified(JobConfig, "data"),
                          _data_label(recorded["data"], before),
                          _data_label(requested["data"], after)))
        elif recorded["data"] is None and requested["data"] is None and (
                isinstance(recorded.get("synthetic"), dict)):
            found += _leaves(SyntheticData, recorded["synthetic"],
                             requested["synthetic"], _SYNTHETIC_IDENTITY)
    if "follow" in recorded or requested["follow"]["dir"] is not None:
        before = _follow_dir((recorded.get("follow") or {}).get("dir"))
        after = _follow_dir(requested["follow"]["dir"])
        if before != after:
            found.append((qualified(FollowConfig, "dir"), before, after))
    return found


def _follow_dir(folder: str | None) -> str:
    """A followed folder as compared and shown (resolved)."""
    if folder is None:
        return "none (not following)"
    path = as_path(folder)
    return repr(str(path.resolve() if isinstance(path, Path) else path))


def check_same_job(config: JobConfig) -> None:
    """Refuses ``config`` when its workdir records another job (reads only:
    nothing is written); a workdir without a recorded job passes."""
    path = config.checkpoint_dir / JOB_FILE  # where psrec train records it
    if not path.is_file():
        return
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise WorkdirMismatchError(
            f"{path} cannot be read ({error}): the workdir's recorded job is "
            f"unknown; train in another `{qualified(JobConfig, 'workdir')}`, "
            "or move that file away if the folder is yours to reuse."
        ) from None
    if not isinstance(recorded, dict):
        raise WorkdirMismatchError(
            f"{path} holds no job (a JSON object); train in another "
            f"`{qualified(JobConfig, 'workdir')}`.")
    differences = job_differences(recorded, config)
    if not differences:
        return
    what = "; ".join(f"`{name}` recorded {before}, requested {after}"
                     for name, before, after in differences)
    resume = ", ".join(f"`{name}` = {before}"
                       for name, before, _ in differences)
    raise WorkdirMismatchError(
        f"{config.workdir} holds another job ({path}): {what}. A workdir "
        "belongs to one job: train this one in another "
        f"`{qualified(JobConfig, 'workdir')}`, or resume the recorded one "
        f"with {resume}.")


def lock_file(config: JobConfig) -> Path:
    """The lock of ``config``'s workdir, in its local run-state folder (the
    workdir itself when it is local)."""
    return Path(config.state_dir) / LOCK_FILE


def lock_holder(path: Path) -> int | None:
    """The pid recorded in the lock file ``path`` (None: none yet)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


@contextlib.contextmanager
def workdir_lock(config: JobConfig) -> Iterator[Path]:
    """Holds ``config``'s workdir for this process until the block ends
    (or the process dies); a workdir held by another process is a
    :class:`WorkdirBusyError` naming its pid. Only the process that runs the
    job takes it: the roles and job processes it starts do not."""
    path = lock_file(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = lock_holder(path)
            raise WorkdirBusyError(
                f"{config.workdir} is in use by another psrec train (pid "
                f"{holder if holder is not None else 'unknown'}, lock {path}):"
                " a workdir is trained by one process at a time; wait for it "
                "to end (or stop it), or train in another "
                f"`{qualified(JobConfig, 'workdir')}`.") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)  # still held: no reader sees a stale pid
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def claim_workdir(config: JobConfig, lock: bool = True) -> Iterator[None]:
    """:func:`check_same_job` before anything is written, then (with
    ``lock``) :func:`workdir_lock`, checking the job again under the lock
    (another run may have recorded one in between)."""
    check_same_job(config)
    if not lock:
        yield
        return
    with workdir_lock(config):
        check_same_job(config)
        yield


def _leaves(cls: type, before: dict[str, Any], after: dict[str, Any],
            names: tuple[str, ...] | None = None
            ) -> list[tuple[str, str, str]]:
    return [(qualified(cls, name), repr(_plain(before.get(name))),
             repr(_plain(after.get(name))))
            for name in (names or sorted(set(before) | set(after)))
            if name in before and before.get(name) != after.get(name)]


def _plain(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _task(retrieval: Any) -> str:
    return "'ranking'" if retrieval is None else "'retrieval'"


def _spec_label(data: Any) -> str:
    """The spec's name and fingerprint (its identity), as shown."""
    try:
        spec = FeatureSpec.from_dict(data)
        return f"{spec.name!r} (fingerprint {spec.fingerprint()[:12]})"
    except (PsrecError, OSError, TypeError, ValueError, KeyError):
        # a spec this psrec cannot read (a vocabulary file moved away)
        name = data.get("name") if isinstance(data, dict) else None
        return f"{name!r} (unreadable here)"


def _data_path(data: str | None, config: JobConfig) -> str:
    """The data folder a job reads: ``--data`` (a manifest file means its
    folder), or the workdir's generated data."""
    path = (as_path(config.workdir) / "data" / "tfrecord" if data is None
            else as_path(data))
    if not isinstance(path, Path):  # a URI
        text = str(path).rstrip("/")
        return text[:-len("/manifest.json")] if text.endswith(
            "/manifest.json") else text
    path = path.resolve()
    return str(path.parent if path.name == "manifest.json" else path)


def _data_label(data: str | None, path: str) -> str:
    return ("none (the workdir's generated data)" if data is None
            else repr(path))
