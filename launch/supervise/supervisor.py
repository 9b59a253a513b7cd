"""The supervisor behind ``psrec train`` on a local cluster.

It runs the PS and worker roles (``LocalCluster``), the coordinator and
the local tf.data service as separate OS processes and keeps the job alive
through failures: it restarts only the role that failed
(:mod:`psrec.launch.supervise.failure` names it), within per-role budgets
(:class:`RestartLimits`), watches the coordinator's heartbeat for stalls,
forwards SIGTERM/SIGINT, and passes a permanent exit code through. What it
promises in each failure, and the test that proves it:
``docs/reliability.md``.

Every process it starts is stopped, by pid, on every exit path, and each
child is also bound to the supervisor's life with ``PR_SET_PDEATHSIG``.
"""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from psrec.errors import EXIT_INTERRUPTED
from psrec.errors import EXIT_RETRYABLE
from psrec.errors import EXIT_TERMINATED
from psrec.errors import is_retryable
from psrec.launch.job.config import JobConfig
from psrec.launch.job.run import job_process_command
from psrec.launch.local.cluster import LocalCluster
from psrec.launch.local.cluster import spawn
from psrec.launch.local.cluster import stop_processes
from psrec.launch.monitor.heartbeat import HeartbeatMonitor
from psrec.launch.monitor.heartbeat import heartbeat_path
from psrec.launch.supervise.failure import Failure
from psrec.launch.supervise.failure import classify
from psrec.launch.supervise.failure import frozen_roles
from psrec.launch.supervise.failure import is_frozen
from psrec.launch.supervise.restart_policy import BUDGET_FLAGS
from psrec.launch.supervise.restart_policy import RestartBudget
from psrec.launch.supervise.restart_policy import SupervisorConfig
from psrec.ps_cluster.cluster.tf_config import TaskInfo

# Seconds a new coordinator may take to publish its first heartbeat
# (importing TensorFlow on a loaded machine), when above the stall limit.
STARTUP_ALLOWANCE = 120.0


class Supervisor:
    """Runs one supervised training job.

    Args:
      cluster: the (not yet started) local cluster.
      coordinator_command: the coordinator's command line (see
        :func:`supervise`); the supervisor appends ``--cluster FILE``.
      workdir: where ``cluster.json`` and role logs go.
    """

    def __init__(self, cluster: LocalCluster,
                 coordinator_command: Sequence[str],
                 config: SupervisorConfig, workdir: str | Path,
                 log=None, data_service=None) -> None:
        self.cluster = cluster
        self.data_service = data_service  # kept alive: see .keep()
        self.command = list(coordinator_command)
        self.config = config
        self.workdir = Path(workdir)
        # Status lines go to stderr: stdout is the run's result (--json).
        self.log = log or functools.partial(print, file=sys.stderr,
                                            flush=True)
        self.budget = RestartBudget(config.limits)
        self.monitor = HeartbeatMonitor(heartbeat_path(self.workdir),
                                        config.stall_deadline() or 0.0)
        self.coordinator: subprocess.Popen | None = None
        self._due: dict[TaskInfo, float] = {}  # worker restarts scheduled

    def run(self) -> int:
        clear()
        previous = signal.signal(signal.SIGTERM, on_signal)
        previous_int = signal.getsignal(signal.SIGINT)
        if previous_int is signal.default_int_handler:  # not when ignored
            signal.signal(signal.SIGINT, on_signal)
        try:
            with self.cluster:
                if self.data_service is not None:  # started beside the roles
                    self.data_service.wait_ready()
                self.log(f"local cluster: {self.cluster.cluster.num_workers} "
                         f"workers + {self.cluster.cluster.num_ps} PS on "
                         f"127.0.0.1 (pids "
                         f"{', '.join(map(str, self.cluster.pids()))})")
                try:
                    return self._loop()
                except Terminated:
                    return self._shut_down(signal.SIGTERM)
                except KeyboardInterrupt:
                    return self._shut_down(signal.SIGINT)
        except Terminated:
            self.log("psrec train: terminated (SIGTERM); stopped all "
                     "processes")
            return EXIT_TERMINATED
        finally:
            self._stop_coordinator()
            signal.signal(signal.SIGTERM, previous)
            if previous_int is signal.default_int_handler:
                signal.signal(signal.SIGINT, previous_int)

    # -- the loop ------------------------------------------------------------

    def _loop(self) -> int:
        cluster_file = self.workdir / "cluster.json"
        cluster_file.parent.mkdir(parents=True, exist_ok=True)
        while True:
            live = self.cluster.live_spec()
            if not live.num_workers:
                self.log("psrec supervisor: no worker left (every worker "
                         "died; --no-restart-workers or the worker restart "
                         "budget); stopping: rerun to resume from the "
                         "latest checkpoint")
                return EXIT_RETRYABLE
            # The workers given up are left out (see LocalCluster.live_spec).
            cluster_file.write_text(json.dumps(
                live.to_tf_cluster_dict()) + "\n")
            self.coordinator = spawn(
                [*self.command, "--cluster", str(cluster_file)])
            self.log(f"psrec supervisor: coordinator pid "
                     f"{self.coordinator.pid}")
            self.monitor.reset()
            code, failure = self._watch()
            if code == 0:
                return 0
            if not is_retryable(code):
                self.log(f"psrec supervisor: coordinator failed permanently "
                         f"(exit {code}); not restarting")
                return code
            if failure is None:  # probe the roles: which one failed?
                failure = classify(self.cluster.cluster,
                                   self.cluster.processes, set(self._due))
            if failure.role == "coordinator" and self._restart_frozen_data(
                    code):
                continue  # the coordinator's restart is the data's
            if not self._recover(failure, code):
                return code

    def _restart_frozen_data(self, code: int) -> bool:
        """A frozen (SIGSTOPped) local tf.data service stalls every
        closure, so the coordinator stalls while every PS and worker is
        healthy: the service is the failed role. It is killed and restarted
        from its journal on the data_service budget (the coordinator's is
        not spent); True when it was frozen."""
        if self.data_service is None or not (
                self.data_service.kill_if_frozen()):
            return False
        self.data_service.keep(lambda role, why: self._spend(
            role, f"coordinator exit {code}; failed role: data_service "
            f"(the tf.data service was frozen): {why}"))
        return True

    def _recover(self, failure: Failure, code: int) -> bool:
        """Restarts what failed (the coordinator is restarted by the loop);
        False when that role's budget is spent."""
        why = (f"coordinator exit {code}; failed role: {failure.role} "
               f"({failure.seen})")
        if failure.role == "worker" and not self.config.restart_workers:
            self._drop_workers(failure.tasks, why)
            return True
        if failure.role == "worker":
            for task in failure.tasks:
                if task not in self._due and not self._spend(
                        "worker", f"{why}; restarting "
                        f"worker-{task.index}"):
                    return False
                self._due.pop(task, None)
                self._replace([task], "worker")
            return True
        if not self._spend(failure.role, why):
            return False
        if failure.role == "ps":
            self._replace(list(failure.tasks), "ps")
        else:
            time.sleep(self.budget.backoff("coordinator", self.config.backoff))
        self._restart_frozen_workers()
        return True

    def _watch(self) -> tuple[int, Failure | None]:
        """Waits for the coordinator, restarting dead workers meanwhile,
        watching its heartbeat. Returns (exit code, the failure when known);
        a dead PS or a stall stops the coordinator and returns a retryable
        code."""
        assert self.coordinator is not None
        deadline = self.config.stall_deadline()
        while True:
            raise_signalled()  # one that hit a fork was swallowed there
            if self.data_service is not None:
                self.data_service.keep(self._spend)
            try:
                code = self.coordinator.wait(timeout=0.2)
                if not is_retryable(code):  # the run ends here
                    self._report_late_deaths()
                return code, None
            except subprocess.TimeoutExpired:
                pass
            if deadline is not None and self.monitor.poll() >= (
                    deadline if self.monitor.last is not None
                    else max(deadline, STARTUP_ALLOWANCE)):
                return self._stalled()
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
                             f"{process.returncode}); restarting it and "
                             "the coordinator from the latest checkpoint")
                    self._stop_coordinator()
                    return EXIT_RETRYABLE, Failure(
                        "ps", (task,), f"ps-{task.index} exited "
                        f"({process.returncode})")
                self._handle_dead_worker(task, process.returncode)
                if not self.cluster.live_spec().num_workers:
                    # It would wait forever; no closure can finish, so no
                    # graceful save either.
                    self._stop_coordinator(grace=0.0)
                    return EXIT_RETRYABLE, Failure("worker", (), "none left")
            self._start_due_workers()

    def _stalled(self) -> tuple[int, Failure]:
        """No heartbeat: say what is known, kill the coordinator (it may be
        frozen or blocked holding the GIL) and name the failed role."""
        assert self.coordinator is not None
        idle = self.monitor.poll()
        frozen = frozen_roles(self.cluster.processes)
        if is_frozen(self.coordinator.pid):
            frozen = "coordinator" + ("" if frozen == "none" else
                                      f", {frozen}")
        if self.data_service is not None and self.data_service.frozen():
            frozen = "data-service" + ("" if frozen == "none" else
                                       f", {frozen}")
        failure = classify(self.cluster.cluster, self.cluster.processes,
                           set(self._due))
        self.log(f"psrec supervisor: stall: no heartbeat from the "
                 f"coordinator for {idle:.0f} s (--stall-timeout "
                 f"{self.config.stall_timeout:g}); {self.monitor.describe()}; "
                 f"frozen processes: {frozen}; killing the coordinator (pid "
                 f"{self.coordinator.pid})")
        self.coordinator.kill()
        self.coordinator.wait()
        if failure.role == "coordinator":
            failure = Failure("coordinator", (), "stalled in phase "
                              f"{(self.monitor.last or {}).get('phase')}")
        return EXIT_RETRYABLE, failure

    def _shut_down(self, signum: int) -> int:
        """SIGTERM/SIGINT: the coordinator gets the signal and
        ``grace_period`` seconds to save a checkpoint and print its line;
        then everything stops."""
        code = (EXIT_INTERRUPTED if signum == signal.SIGINT
                else EXIT_TERMINATED)
        coordinator = self.coordinator
        grace = self.config.grace_period
        if coordinator is not None and coordinator.poll() is None:
            coordinator.send_signal(signum)
            try:
                exited = coordinator.wait(timeout=grace)
                if exited == 0:
                    return 0  # it had just finished
                if exited in (code, 1, 2, 138):
                    return code  # it printed its one line
            except subprocess.TimeoutExpired:
                coordinator.kill()
                coordinator.wait()
        beat = self.monitor.last or {}
        verb = "interrupted" if signum == signal.SIGINT else "terminated"
        self.log(f"psrec train: {verb} ({signal.Signals(signum).name}): no "
                 f"final checkpoint within --grace-period {grace:g} s; "
                 f"latest {beat.get('checkpoint')} (step {beat.get('step')})")
        return code

    def _report_late_deaths(self) -> None:
        """At the run's end, names the workers that died after the last
        look but before the coordinator exited (a loss in the run's last
        moments, or one a busy machine let the 0.2 s poll miss): the output
        says every loss, also when no restart follows."""
        for task, process in list(self.cluster.processes.items()):
            if (task.type == "worker" and task not in self._due
                    and process.poll() is not None):
                self.log(f"psrec supervisor: worker-{task.index} died (exit "
                         f"{process.returncode}) before the coordinator "
                         "exited; the run ends without it")

    def _handle_dead_worker(self, task: TaskInfo, code: int) -> None:
        if task in self._due:
            return
        if not self.config.restart_workers:
            self.log(f"psrec supervisor: worker-{task.index} died (exit "
                     f"{code}); not restarted (--no-restart-workers), "
                     "training continues on the other workers")
            self.cluster.processes.pop(task)
            return
        if not self._spend("worker", f"worker-{task.index} died (exit "
                           f"{code})"):
            self.cluster.processes.pop(task)
            return
        self._due[task] = time.monotonic() + self.budget.backoff(
            "worker", self.config.backoff)

    def _drop_workers(self, tasks: Sequence[TaskInfo], why: str) -> None:
        """``--no-restart-workers``: the failed workers stay down (a frozen
        one is killed); the coordinator restarts on the others."""
        if not tasks:
            return
        for task in tasks:
            process = self.cluster.processes.pop(task, None)
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        left = self.cluster.live_spec().num_workers
        self.log(f"psrec supervisor: {why}; "
                 f"{', '.join(t.name for t in tasks)} not restarted "
                 f"(--no-restart-workers); restarting the coordinator on the "
                 f"{left} remaining worker(s)")

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

    def _spend(self, role: str, why: str) -> bool:
        """Takes one restart from ``role``'s budget, saying so."""
        if not self.budget.spend(role):
            self.log(f"psrec supervisor: {why}; giving up: the {role} "
                     f"restart budget is spent ({self.budget.used[role]}/"
                     f"{self.budget.limit(role)}, {BUDGET_FLAGS[role]})")
            return False
        self.log(f"psrec supervisor: {why}; {self.budget.describe(role)}")
        return True

    def _replace(self, tasks: list[TaskInfo], role: str) -> None:
        """Kills ``tasks`` still alive (frozen), waits the role's backoff,
        starts them again on their ports."""
        for task in tasks:
            process = self.cluster.processes.get(task)
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        time.sleep(self.budget.backoff(role, self.config.backoff))
        for task in tasks:
            process = self.cluster.start_task(task)
            self.log(f"psrec supervisor: {task.name} restarted "
                     f"(pid {process.pid})")
        self.cluster.wait_ready(tasks)

    def _restart_frozen_workers(self) -> None:
        """A stalled (SIGSTOPped) worker looks alive; replace it."""
        for task, process in list(self.cluster.processes.items()):
            if task.type == "worker" and is_frozen(process.pid):
                why = f"worker-{task.index} is stopped (frozen)"
                if not self.config.restart_workers:
                    self._drop_workers([task], why)
                    continue
                self.log(f"psrec supervisor: {why}; replacing it")
                self._replace([task], "worker")

    def _stop_coordinator(self, grace: float = 10.0) -> None:
        stop_processes([self.coordinator], grace)


def supervise(cluster: LocalCluster, job: JobConfig,
              config: SupervisorConfig, workdir: str | Path,
              metrics=None, data_service=None,
              json_output: bool = False) -> int:
    """Runs ``job`` under a :class:`Supervisor`; returns its exit code.

    The coordinator is a job process (``python -P -m
    psrec.launch.cli.job_process coordinator WORKDIR/coordinator/job.json
    --cluster WORKDIR/cluster.json``) handed ``job`` as it is -- its input
    mode resolved, the local tf.data service's address in its
    ``data_service`` -- and the data this supervisor's caller checked
    (``record_verified``). ``json_output``: it prints its result as ``psrec
    train --json`` does. With a ``metrics`` socket the supervisor serves
    ``/metrics`` (restarts per role included) and ``/healthz``; the
    coordinator never serves them."""
    from psrec.launch.monitor.metrics_http import serving
    command = job_process_command(job, "coordinator",
                                  Path(workdir) / "coordinator",
                                  *(["--json"] if json_output else []))
    supervisor = Supervisor(cluster, command, config, workdir,
                            data_service=data_service)
    with serving(metrics, workdir, config.stall_timeout, supervisor.log,
                 restarts=lambda: supervisor.budget.total):
        return supervisor.run()


# SIGTERM/SIGINT for the supervisor: handlers that unwind its loop, and
# a latch for a signal that landed while a child was being forked.
#
# CPython swallows an exception raised by a signal handler while an at-fork
# hook runs (``subprocess.Popen`` forking a child: "Exception ignored in ...
# _releaseLock"), so a SIGINT or SIGTERM landing in that window would be
# lost; :func:`on_signal` remembers it and :func:`raise_signalled`, called by
# the watch loop, raises it again.

class Terminated(Exception):
    """SIGTERM received: unwind so every child is stopped."""


# The signals received since the last :func:`clear`.
_SIGNALLED: list[int] = []


def clear() -> None:
    """Forgets earlier signals (a new supervised run starts)."""
    _SIGNALLED.clear()


def on_signal(signum, frame) -> None:  # noqa: ARG001
    """The SIGTERM/SIGINT handler: remembers, then raises."""
    _SIGNALLED.append(signum)
    raise_signalled()


def raise_signalled() -> None:
    """Raises :class:`Terminated` (SIGTERM) or ``KeyboardInterrupt``
    (SIGINT) when a signal was received, else nothing."""
    if _SIGNALLED:
        if _SIGNALLED[0] == signal.SIGTERM:
            raise Terminated()
        raise KeyboardInterrupt
