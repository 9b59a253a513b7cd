"""Which role failed: the supervisor probes its processes after an error
before choosing the remedy.

A coordinator exit, or a stalled heartbeat, says that something failed,
not what. :func:`classify` looks at each role process -- exited, frozen
(SIGSTOP: state ``T`` in ``/proc``), or alive but not accepting
connections on its port -- and names the failed role: a PS (its state is
lost: the coordinator restarts from the latest checkpoint), a worker
(restart it; the coordinator's state is intact), or, when every role is
healthy, the coordinator itself.
"""

from __future__ import annotations

import dataclasses
import subprocess

from psrec.ps_cluster.cluster.probe import accepts
from psrec.ps_cluster.cluster.tf_config import ClusterSpec
from psrec.ps_cluster.cluster.tf_config import TaskInfo


def is_frozen(pid: int) -> bool:
    """True when the process is stopped (SIGSTOP) -- alive but frozen."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


@dataclasses.dataclass(frozen=True)
class Failure:
    """The role that failed, its failed tasks and what was seen."""

    role: str  # "ps", "worker" or "coordinator"
    tasks: tuple[TaskInfo, ...] = ()
    seen: str = ""


def task_state(cluster: ClusterSpec, task: TaskInfo,
               process: subprocess.Popen | None, probe: bool = True
               ) -> str | None:
    """What is wrong with one role process, or None when it is healthy."""
    name = task.name
    if process is None:
        return f"{name} is not running"
    if process.poll() is not None:
        return f"{name} exited ({process.returncode})"
    if is_frozen(process.pid):
        return f"{name} is frozen (stopped, pid {process.pid})"
    if probe and not accepts(cluster.address_of(task)):
        return f"{name} does not accept connections on " \
               f"{cluster.address_of(task)}"
    return None


def classify(cluster: ClusterSpec,
             processes: dict[TaskInfo, subprocess.Popen],
             pending: set[TaskInfo] = frozenset()) -> Failure:
    """The failed role: PS first (the costliest remedy covers the rest),
    then workers (``pending``: workers already awaiting a restart), else
    the coordinator. A worker absent from ``processes`` and not pending was
    given up (``--no-restart-workers``, budget spent): not a candidate."""
    for role in ("ps", "worker"):
        bad, seen = [], []
        for task in cluster.tasks():
            if task.type != role or (role == "worker" and task not in
                                     processes and task not in pending):
                continue
            if task in pending:
                bad.append(task)
                seen.append(f"{task.name} is restarting")
                continue
            state = task_state(cluster, task, processes.get(task))
            if state is not None:
                bad.append(task)
                seen.append(state)
        if bad:
            return Failure(role, tuple(bad), "; ".join(seen))
    return Failure("coordinator", (), "every PS and worker is healthy")


def frozen_roles(processes: dict[TaskInfo, subprocess.Popen]) -> str:
    """``ps-0, worker-1`` for the role processes that are frozen."""
    return ", ".join(t.name for t, p in processes.items()
                     if p.poll() is None and is_frozen(p.pid)) or "none"
