"""A local cluster: PS and worker roles as separate OS processes on loopback.

TensorFlow's servers listen on all interfaces whatever address they are
given, so a ``LocalCluster`` only starts in a private network namespace
(see :mod:`psrec.launch.local.netns`; ``psrec train`` enters one), unless
``allow_exposed`` is set: then the coordinator's port is fixed in the
cluster spec too (``chief``) so that :meth:`LocalCluster.exposed_warning`
can name every port.

``LocalCluster`` starts each role as ``python -m psrec server ...`` (with
:func:`spawn`, the one way psrec starts a child process) bound to a free
port on 127.0.0.1, waits until every port accepts connections (failing
with the role's log tail if a role dies), and stops every process it
started, by pid, when the ``with`` block exits for any reason; each child
also dies with the launcher (``PR_SET_PDEATHSIG``), so not even a
SIGKILLed coordinator leaves servers behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Iterable
from typing import Mapping

from psrec.errors import ConfigError
from psrec.errors import RetryableError
from psrec.errors import is_retryable
from psrec.launch.local.netns import exposed_warning
from psrec.launch.local.netns import exposure
from psrec.ps_cluster.cluster.probe import accepts
from psrec.ps_cluster.cluster.tf_config import ClusterSpec
from psrec.ps_cluster.cluster.tf_config import TaskInfo
from psrec.ps_cluster.cluster.tf_config import TFConfig
from psrec.ps_cluster.cluster.tf_config import free_loopback_ports
from psrec.ps_cluster.cluster.tf_config import loopback_cluster
from psrec.runtime import role_environment

_PR_SET_PDEATHSIG = 1


def visible_gpus() -> list[str]:
    """GPU ids this launcher may hand out: ``CUDA_VISIBLE_DEVICES`` when set,
    else what ``nvidia-smi -L`` lists (no TensorFlow import)."""
    preset = os.environ.get("CUDA_VISIBLE_DEVICES")
    if preset is not None:
        return [g for g in preset.split(",") if g.strip()]
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                                 text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(listing.splitlines())
            if line.startswith("GPU ")]


def worker_gpus(index: int, num_workers: int, gpus: list[str]) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` of worker ``index``: an equal share of
    the GPUs (ParameterServerStrategy needs the same count on every worker),
    or one shared GPU each when there are fewer GPUs than workers; None when
    there is no GPU (the worker computes on its CPU)."""
    if not gpus:
        return None
    share = max(1, len(gpus) // num_workers)
    first = index * share
    return ",".join(gpus[(first + j) % len(gpus)] for j in range(share))


class RoleStartError(RetryableError):
    """A role process was killed or never listened (a restart may help)."""


class RoleConfigError(ConfigError):
    """A role process exited with a permanent code before listening (a bad
    installation, configuration or argument: a restart cannot help)."""


def die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(
            _PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the launcher's own cleanup still applies


def psrec_command(module: str = "psrec", *args: str) -> list[str]:
    """The command line of a psrec child process: ``python -P -m MODULE
    ARGS`` (``-P``: the working directory is not put on ``sys.path``, so no
    file of the user's -- a ``models.py``, a ``data.py`` -- can shadow a
    module psrec or a library it uses imports)."""
    return [sys.executable, "-P", "-m", module, *args]


def spawn(command: list[str], log: Path | None = None,
          env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """Starts one child process of a psrec launcher: bound to the
    launcher's life (``PR_SET_PDEATHSIG``), in ``env`` (default:
    :func:`psrec.runtime.role_environment`). With ``log`` its output is
    appended to that file and it gets no stdin; without, it shares this
    process's standard streams (the coordinator: its lines and its result
    are the run's)."""
    env = dict(role_environment() if env is None else env)
    if log is None:
        return subprocess.Popen(command, env=env, preexec_fn=die_with_parent)
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env,
                                preexec_fn=die_with_parent)


def wait_listening(name: str, process: subprocess.Popen, address: str,
                   log: Path, deadline: float, within: float) -> None:
    """Blocks until ``address`` accepts a TCP connection, waiting on the
    role's process between attempts (no fixed sleeps).

    Raises:
      RoleStartError: not listening by ``deadline`` (``time.monotonic``;
        ``within``: its seconds from the start, for the message),
        or the process exited with a retryable code before listening.
      RoleConfigError: it exited with a permanent code before listening.
    """
    while not accepts(address):
        if time.monotonic() > deadline:
            raise RoleStartError(
                f"{name} did not listen on {address} within {within:.0f} s; "
                f"log tail:\n{tail_log(log)}")
        try:  # wait on the process itself between attempts
            code = process.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            continue
        error = RoleStartError if is_retryable(code) else RoleConfigError
        raise error(f"{name} exited with code {code} before listening; log "
                    f"tail:\n{tail_log(log)}")


def tail_log(path: Path, lines: int = 20) -> str:
    """The last lines of a role's log, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class LocalCluster:
    """PS and worker processes on 127.0.0.1, stopped on exit.

    Args:
      log_dir: where each role writes ``<type>-<index>.log``.
      start_timeout: seconds to wait for all ports to accept connections.
      allow_exposed: start even outside a private network namespace
        (``exposed`` then holds why there is none).

    Raises:
      ExposedError: not in a private network namespace and not
        ``allow_exposed``.
    """

    def __init__(self, num_workers: int = 2, num_ps: int = 1, *,
                 log_dir: str | Path, start_timeout: float = 120.0,
                 allow_exposed: bool = False) -> None:
        if num_workers < 1 or num_ps < 1:
            raise ValueError(
                f"a PS cluster needs >= 1 worker and >= 1 PS (got "
                f"--workers {num_workers} --ps {num_ps}).")
        self.exposed = exposure(allow_exposed)
        if self.exposed is None:
            self.cluster: ClusterSpec = loopback_cluster(num_workers, num_ps)
        else:  # the coordinator's port too, to name it in the warning
            ports = free_loopback_ports(num_workers + num_ps + 1)
            self.cluster = ClusterSpec.build(
                ps=[f"127.0.0.1:{p}" for p in ports[num_workers:-1]],
                workers=[f"127.0.0.1:{p}" for p in ports[:num_workers]],
                chief=f"127.0.0.1:{ports[-1]}")
        self.log_dir = Path(log_dir)
        self.start_timeout = start_timeout
        self.processes: dict[TaskInfo, subprocess.Popen] = {}
        self._gpus = visible_gpus()

    # -- lifecycle ---------------------------------------------------------

    def __enter__(self) -> "LocalCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None,
                 error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for task in self.cluster.tasks():
            if task.type in ("ps", "worker"):
                self.start_task(task)
        self.wait_ready()

    def start_task(self, task: TaskInfo) -> subprocess.Popen:
        """Starts (or restarts) one role process."""
        env = role_environment()
        env["TF_CONFIG"] = TFConfig(self.cluster, task).to_json()
        if task.type == "ps":
            env["CUDA_VISIBLE_DEVICES"] = ""  # PS tasks only hold variables
        else:
            share = worker_gpus(task.index, self.cluster.num_workers,
                                self._gpus)
            if share is not None:
                env["CUDA_VISIBLE_DEVICES"] = share
        process = spawn(psrec_command("psrec", "server"),
                        self.log_dir / f"{task.name}.log", env)
        self.processes[task] = process
        return process

    def wait_ready(self, tasks: list[TaskInfo] | None = None) -> None:
        """Blocks until each task's port accepts a TCP connection."""
        deadline = time.monotonic() + self.start_timeout
        for task in tasks or list(self.processes):
            name = task.name
            wait_listening(name, self.processes[task],
                           self.cluster.address_of(task),
                           self.log_dir / f"{name}.log", deadline,
                           self.start_timeout)

    def live_spec(self) -> ClusterSpec:
        """The spec the coordinator connects to: every PS, and the workers
        still running or due back (a dropped worker is left out: TensorFlow
        cannot connect to a cluster with a task down; the rest are
        renumbered, which the workers accept)."""
        spec = self.cluster
        return ClusterSpec.build(
            ps=spec.ps, chief=spec.chief,
            workers=[spec.address_of(t) for t in spec.tasks()
                     if t.type == "worker" and t in self.processes])

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes.values()]

    def exposed_warning(self) -> str:
        """Every port of the cluster and who can reach it (``exposed``)."""
        ports = {"coordinator" if t.type == "chief" else t.name:
                 int(self.cluster.address_of(t).rsplit(":", 1)[1])
                 for t in self.cluster.tasks()}
        return exposed_warning(ports, self.exposed or "")

    def stop(self, grace: float = 5.0) -> None:
        """Terminates every started process by pid; kills stragglers."""
        stop_processes(self.processes.values(), grace)


def stop_processes(processes: Iterable[subprocess.Popen],
                   grace: float = 5.0) -> None:
    """SIGTERM to each live process, SIGKILL to those still alive after
    ``grace`` seconds; returns when all have exited."""
    processes = [p for p in processes if p is not None]
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + grace
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
