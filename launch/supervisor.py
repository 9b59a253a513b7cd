"""The supervisor behind ``psrec train`` on a local cluster.

It runs the PS and worker roles (``LocalCluster``) and the coordinator as
separate OS processes and keeps the job alive through failures, on top of
what TensorFlow itself promises:

* a worker that dies is restarted on its port, with backoff; training goes
  on meanwhile (TF re-runs the lost closures elsewhere and rebuilds the
  worker's dataset when it is back);
* a PS that dies, or a coordinator that exits with a retryable code (PS
  unreachable, stall watchdog, killed), gets the PS tasks and the
  coordinator restarted; the coordinator restores the latest complete
  checkpoint and continues, losing at most one checkpoint interval;
* restarts are bounded (``max_restarts`` over the whole job); past that it
  stops with a message and the last failure's exit code;
* a coordinator exit with a permanent code (bad data, bad arguments, bad
  checkpoint) stops everything and is passed through.

Every process it starts is stopped, by pid, on every exit path, and each
child is also bound to the supervisor's life with ``PR_SET_PDEATHSIG``.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from psrec.errors import EXIT_RETRYABLE
from psrec.errors import check_at_least
from psrec.errors import is_retryable
from psrec.launch.local import LocalCluster
from psrec.launch.local import die_with_parent
from psrec.launch.local import stop_processes
from psrec.ps_cluster.tf_config import TaskInfo
from psrec.runtime import role_environment


@dataclasses.dataclass(frozen=True)
class SupervisorConfig:
    """Restart policy.

    Attributes:
      max_restarts: restarts allowed over the whole job (workers, PS and
        coordinator together).
      restart_workers: restart a worker that died (otherwise training goes
        on with the remaining workers).
      backoff: first backoff in seconds, doubled per restart, capped at 60.
    """

    max_restarts: int = 3
    restart_workers: bool = True
    backoff: float = 1.0

    def __post_init__(self) -> None:
        check_at_least(self, 0, "max_restarts")


class _Terminated(Exception):
    """SIGTERM received: unwind so every child is stopped."""


def _raise_terminated(signum, frame) -> None:  # noqa: ARG001
    raise _Terminated()


# The signal that interrupted the supervisor. CPython swallows an exception
# raised by a signal handler while an at-fork hook runs (``subprocess.Popen``
# forking a child: "Exception ignored in ... _releaseLock"), so a SIGINT or
# SIGTERM landing in that window would be lost; it is remembered here and
# raised again by the watch loop.
_SIGNALLED: list[int] = []


def _on_signal(signum, frame) -> None:
    _SIGNALLED.append(signum)
    _raise_signalled()


def _raise_signalled() -> None:
    if _SIGNALLED:
        if _SIGNALLED[0] == signal.SIGTERM:
            _raise_terminated(signal.SIGTERM, None)
        raise KeyboardInterrupt


def _stopped(pid: int) -> bool:
    """True when the process is stopped (SIGSTOP) -- alive but frozen."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


class Supervisor:
    """Runs one supervised training job.

    Args:
      cluster: the (not yet started) local cluster.
      coordinator_argv: ``psrec`` arguments of the coordinator; the
        supervisor appends ``--cluster FILE``.
      config: the restart policy.
      workdir: where ``cluster.json`` and role logs go.
    """

    def __init__(self, cluster: LocalCluster, coordinator_argv: Sequence[str],
                 config: SupervisorConfig, workdir: str | Path,
                 log=print) -> None:
        self.cluster = cluster
        self.argv = list(coordinator_argv)
        self.config = config
        self.workdir = Path(workdir)
        self.log = log
        self.restarts = 0
        self.coordinator: subprocess.Popen | None = None
        self._due: dict[TaskInfo, float] = {}  # worker restarts scheduled

    def run(self) -> int:
        _SIGNALLED.clear()
        previous = signal.signal(signal.SIGTERM, _on_signal)
        previous_int = signal.getsignal(signal.SIGINT)
        if previous_int is signal.default_int_handler:  # not when ignored
            signal.signal(signal.SIGINT, _on_signal)
        try:
            with self.cluster:
                self.log(f"local cluster: {self.cluster.cluster.num_workers} "
                         f"workers + {self.cluster.cluster.num_ps} PS on "
                         f"127.0.0.1 (pids "
                         f"{', '.join(map(str, self.cluster.pids()))})")
                return self._loop()
        except _Terminated:
            self.log("psrec: terminated (SIGTERM); stopped all processes")
            return 143
        finally:
            self._stop_coordinator()
            signal.signal(signal.SIGTERM, previous)
            if previous_int is signal.default_int_handler:
                signal.signal(signal.SIGINT, previous_int)

    # -- the loop ------------------------------------------------------------

    def _loop(self) -> int:
        cluster_file = self.workdir / "cluster.json"
        cluster_file.parent.mkdir(parents=True, exist_ok=True)
        cluster_file.write_text(json.dumps(
            self.cluster.cluster.to_tf_cluster_dict()) + "\n")
        while True:
            self.coordinator = subprocess.Popen(
                [sys.executable, "-P", "-m", "psrec", *self.argv,
                 "--cluster", str(cluster_file)],
                env=role_environment(), preexec_fn=die_with_parent)
            self.log(f"psrec supervisor: coordinator pid "
                     f"{self.coordinator.pid}")
            code, why = self._watch()
            if code == 0:
                return 0
            if not is_retryable(code):
                self.log(f"psrec supervisor: coordinator failed permanently "
                         f"(exit {code}); not restarting")
                return code
            if not self._spend_restart(f"{why} (exit {code})"):
                return code
            self._restart_ps()
            self._restart_frozen_workers()

    def _watch(self) -> tuple[int, str]:
        """Waits for the coordinator, restarting dead workers meanwhile.

        Returns (exit code, reason). A dead PS stops the coordinator and
        returns a retryable code.
        """
        assert self.coordinator is not None
        while True:
            _raise_signalled()  # one that hit a fork was swallowed there
            try:
                code = self.coordinator.wait(timeout=0.2)
                return code, "coordinator exited"
            except subprocess.TimeoutExpired:
                pass
            for task, process in list(self.cluster.processes.items()):
                if process.poll() is None:
                    continue
                if task.type == "ps" and not is_retryable(
                        process.returncode):
                    self.log(f"psrec supervisor: ps-{task.index} failed "
                             f"permanently (exit {process.returncode}); "
                             "stopping the job")
                    self._stop_coordinator()
                    return process.returncode, f"ps-{task.index} failed"
                if task.type == "ps":
                    self.log(f"psrec supervisor: ps-{task.index} died (exit "
                             f"{process.returncode}); restarting PS tasks and "
                             "the coordinator from the latest checkpoint")
                    self._stop_coordinator()
                    return EXIT_RETRYABLE, f"ps-{task.index} lost"
                self._handle_dead_worker(task, process.returncode)
            self._start_due_workers()

    def _handle_dead_worker(self, task: TaskInfo, code: int) -> None:
        if task in self._due:
            return
        if not self.config.restart_workers:
            self.log(f"psrec supervisor: worker-{task.index} died (exit "
                     f"{code}); not restarted (--no-restart-workers), "
                     "training continues on the other workers")
            self.cluster.processes.pop(task)
            return
        if not self._spend_restart(f"worker-{task.index} died (exit {code})"):
            self.cluster.processes.pop(task)
            return
        self._due[task] = time.monotonic() + self._backoff()

    def _start_due_workers(self) -> None:
        now = time.monotonic()
        for task, due in list(self._due.items()):
            if now >= due:
                del self._due[task]
                self.cluster.start_task(task)
                self.cluster.wait_ready([task])
                self.log(f"psrec supervisor: worker-{task.index} restarted "
                         f"(pid {self.cluster.processes[task].pid})")

    # -- helpers -------------------------------------------------------------

    def _backoff(self) -> float:
        return min(60.0, self.config.backoff * 2 ** max(0, self.restarts - 1))

    def _spend_restart(self, why: str) -> bool:
        if self.restarts >= self.config.max_restarts:
            self.log(f"psrec supervisor: {why}; giving up after "
                     f"{self.restarts} restart(s) (--max-restarts "
                     f"{self.config.max_restarts})")
            return False
        self.restarts += 1
        self.log(f"psrec supervisor: {why}; restart {self.restarts}/"
                 f"{self.config.max_restarts}")
        return True

    def _restart_ps(self) -> None:
        tasks = [t for t in self.cluster.processes if t.type == "ps"]
        for task in tasks:
            process = self.cluster.processes[task]
            if process.poll() is None:
                process.kill()
                process.wait()
        time.sleep(self._backoff())
        for task in tasks:
            process = self.cluster.start_task(task)
            self.log(f"psrec supervisor: ps-{task.index} restarted (pid "
                     f"{process.pid})")
        self.cluster.wait_ready(tasks)

    def _restart_frozen_workers(self) -> None:
        """A stalled (SIGSTOPped) worker looks alive; replace it."""
        for task, process in list(self.cluster.processes.items()):
            if task.type == "worker" and _stopped(process.pid):
                self.log(f"psrec supervisor: worker-{task.index} is stopped "
                         "(frozen); replacing it")
                process.kill()
                process.wait()
                process = self.cluster.start_task(task)
                self.cluster.wait_ready([task])
                self.log(f"psrec supervisor: worker-{task.index} restarted "
                         f"(pid {process.pid})")

    def _stop_coordinator(self, grace: float = 10.0) -> None:
        stop_processes([self.coordinator], grace)


def supervise(cluster: LocalCluster, coordinator_argv: Sequence[str],
              config: SupervisorConfig, workdir: str | Path) -> int:
    """Runs the job under a :class:`Supervisor`; returns its exit code."""
    return Supervisor(cluster, coordinator_argv, config, workdir).run()

