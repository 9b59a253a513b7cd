"""The supervisor's decisions without a cluster: heartbeat staleness,
per-role restart budgets, which role failed, the connect probe."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from psrec.launch.monitor.heartbeat import HeartbeatMonitor
from psrec.launch.monitor.heartbeat import HeartbeatWriter
from psrec.launch.monitor.heartbeat import read_heartbeat
from psrec.launch.supervise.failure import classify
from psrec.launch.supervise.failure import is_frozen
from psrec.launch.supervise.restart_policy import RestartBudget
from psrec.launch.supervise.restart_policy import RestartLimits
from psrec.ps_cluster.cluster.probe import ClusterUnavailableError
from psrec.ps_cluster.cluster.probe import unreachable_tasks
from psrec.ps_cluster.cluster.probe import wait_reachable
from psrec.ps_cluster.cluster.tf_config import ClusterSpec
from psrec.ps_cluster.cluster.tf_config import TaskInfo


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_budgets_are_per_role_and_refill_after_health():
    clock = _Clock()
    budget = RestartBudget(RestartLimits(worker=2, ps=1, coordinator=0,
                                         refill_after=60), clock=clock)
    assert budget.spend("worker") and budget.spend("worker")
    assert not budget.spend("worker")  # spent...
    assert budget.spend("ps")  # ...which leaves the PS budget whole
    assert not budget.spend("ps")
    assert not budget.spend("coordinator")
    clock.now += 61  # a minute without a worker failure
    assert budget.spend("worker")
    assert budget.describe("worker") == "worker restart 1/2"


def test_budget_never_refills_with_zero():
    clock = _Clock()
    budget = RestartBudget(RestartLimits(worker=1, refill_after=0),
                           clock=clock)
    assert budget.spend("worker")
    clock.now += 1e6
    assert not budget.spend("worker")


def test_heartbeat_file_and_monitor(tmp_path):
    path = tmp_path / "heartbeat.json"
    writer = HeartbeatWriter(path, details=lambda: {"workers": {
        "0": {"closures": 3, "last_result_s": 1.0}}})
    writer.publish("connecting")
    assert read_heartbeat(path)["phase"] == "connecting"
    writer.publish("training", step=40)
    data = read_heartbeat(path)
    assert (data["phase"], data["step"], data["seq"]) == ("training", 40, 2)
    assert not list(tmp_path.glob(".heartbeat.*"))  # temp files renamed
    with pytest.raises(ValueError):
        writer.publish("sleeping")
    monitor = HeartbeatMonitor(path, timeout=0.0)  # stale unless it changes
    monitor.poll()
    assert "phase training, last step 40" in monitor.describe()
    assert "worker 0: 3 closures" in monitor.describe()
    assert monitor.stale()  # nothing new since
    monitor.reset()
    assert monitor.last is None  # an old file is not the new coordinator's


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_probe_names_exactly_the_unreachable_tasks():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        up = listening.getsockname()[1]
        down = _free_port()
        cluster = ClusterSpec.from_dict({"ps": [f"127.0.0.1:{up}"],
                                         "worker": [f"127.0.0.1:{down}"]})
        assert unreachable_tasks(cluster) == [f"worker-0 (127.0.0.1:{down})"]
        with pytest.raises(ClusterUnavailableError,
                           match=rf"worker-0 \(127.0.0.1:{down}\)") as error:
            wait_reachable(cluster, timeout=0.5)
        assert "ps-0" not in str(error.value)
        assert error.value.exit_code == 138


@contextlib.contextmanager
def _listening_cluster():
    """One PS and two workers whose ports accept connections (real sockets
    on loopback): ``(cluster, sockets, [ps-0, worker-0, worker-1])``."""
    listening = [socket.socket() for _ in range(3)]
    try:
        for sock in listening:
            sock.bind(("127.0.0.1", 0))
            sock.listen()
        ports = [s.getsockname()[1] for s in listening]
        cluster = ClusterSpec.from_dict({
            "ps": [f"127.0.0.1:{ports[0]}"],
            "worker": [f"127.0.0.1:{p}" for p in ports[1:]]})
        yield cluster, listening, [TaskInfo("ps", 0), TaskInfo("worker", 0),
                                   TaskInfo("worker", 1)]
    finally:
        for sock in listening:
            sock.close()


def _freeze(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until the kernel shows it stopped (the stop
    is delivered asynchronously)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 30
    while not is_frozen(pid):
        assert time.monotonic() < deadline, "SIGSTOP never took effect"
        time.sleep(0.01)


def test_classify_names_the_failed_role(tmp_path):
    processes = []
    with _listening_cluster() as (cluster, listening, tasks):
        try:
            processes = [subprocess.Popen([sys.executable, "-c",
                                           "import time; time.sleep(60)"])
                         for _ in tasks]
            by_task = dict(zip(tasks, processes))
            assert classify(cluster, by_task).role == "coordinator"
            processes[2].kill()
            processes[2].wait()
            failure = classify(cluster, by_task)
            assert (failure.role, failure.tasks) == ("worker", (tasks[2],))
            assert "worker-1 exited (-9)" in failure.seen
            # a worker the supervisor gave up (--no-restart-workers) is no
            # candidate: every remaining role is healthy
            dropped = {t: p for t, p in by_task.items() if t != tasks[2]}
            assert classify(cluster, dropped).role == "coordinator"
            _freeze(processes[0].pid)  # a frozen PS outranks it
            failure = classify(cluster, by_task)
            assert (failure.role, failure.tasks) == ("ps", (tasks[0],))
            assert "ps-0 is frozen" in failure.seen
            processes[0].send_signal(signal.SIGCONT)
            listening[1].close()  # worker-0 alive but its port closed
            failure = classify(cluster, by_task, pending={tasks[2]})
            assert failure.role == "worker"
            assert "does not accept connections" in failure.seen
            assert "worker-1 is restarting" in failure.seen
        finally:
            for process in processes:
                process.kill()
                process.wait()


def test_flags_build_per_role_budgets():
    from psrec.launch.cli.main import build_parser
    from psrec.launch.cli.train import supervisor_config
    args = build_parser().parse_args(
        ["train", "--max-restarts", "2", "--max-ps-restarts", "5",
         "--stall-timeout", "40", "--grace-period", "10"])
    config = supervisor_config(args)
    assert (config.limits.worker, config.limits.ps,
            config.limits.coordinator, config.limits.data_service) == (
                2, 5, 2, 2)
    args = build_parser().parse_args(
        ["train", "--max-data-service-restarts", "4"])
    assert supervisor_config(args).limits.data_service == 4
    assert config.grace_period == 10.0
    assert config.stall_timeout == 40.0 and config.stall_deadline() > 40.0


def test_supervisor_status_lines_go_to_stderr(tmp_path, capsys):
    """stdout is the run's result (``psrec train --json`` prints one JSON
    object there); the supervisor's own lines must not land on it."""
    from psrec.launch.supervise.supervisor import Supervisor
    from psrec.launch.supervise.supervisor import SupervisorConfig
    supervisor = Supervisor(None, [], SupervisorConfig(), tmp_path)
    supervisor.log("psrec supervisor: coordinator pid 1")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "coordinator pid 1" in captured.err


def test_dead_data_service_past_its_budget_ends_the_job(tmp_path):
    """A local tf.data service process that died is restarted from the
    ``data_service`` budget; with that spent the job ends (138) with one
    line naming the pid, the signal and the flag, and nothing restarted."""
    from psrec.errors import RetryableError
    from psrec.launch.supervise.data_service import LocalDataService
    from psrec.launch.supervise.supervisor import Supervisor
    from psrec.launch.supervise.supervisor import SupervisorConfig
    lines = []
    supervisor = Supervisor(None, [], SupervisorConfig(
        limits=RestartLimits(data_service=0)), tmp_path, log=lines.append)
    service = LocalDataService(2, tmp_path, str(tmp_path), lines.append)
    assert not service.keep(supervisor._spend)  # not started: nothing
    service.process = subprocess.Popen(
        [sys.executable, "-c", "import os, signal; "
         "os.kill(os.getpid(), signal.SIGKILL)"])
    service.process.wait()
    with pytest.raises(RetryableError, match=(
            rf"data pid {service.process.pid}\) died \(signal SIGKILL\) "
            r"with its restart budget spent \(--max-data-service-restarts")):
        service.keep(supervisor._spend)
    assert lines == [
        f"psrec supervisor: tf.data service died (data pid "
        f"{service.process.pid}, signal SIGKILL); giving up: the data_service "
        "restart budget is spent (0/0, --max-data-service-restarts)"]


def test_frozen_data_service_is_the_failed_role_of_a_stall(tmp_path):
    """A stopped (SIGSTOP) tf.data service looks alive to ``keep`` while
    every closure waits on it; when the coordinator then stalls (exit 138,
    every PS and worker healthy) the supervisor names the service as the
    failed role, kills it and restarts it from the data_service budget --
    here spent: one line naming the SIGKILL, no coordinator budget used."""
    from psrec.errors import RetryableError
    from psrec.launch.supervise.data_service import LocalDataService
    from psrec.launch.supervise.supervisor import Supervisor
    from psrec.launch.supervise.supervisor import SupervisorConfig
    lines = []
    service = LocalDataService(2, tmp_path, str(tmp_path), lines.append)
    supervisor = Supervisor(None, [], SupervisorConfig(
        limits=RestartLimits(data_service=0)), tmp_path, log=lines.append,
        data_service=service)
    service.process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        assert not service.frozen() and not service.kill_if_frozen()
        assert not supervisor._restart_frozen_data(138)  # not the data's
        _freeze(service.process.pid)
        assert service.frozen()
        assert not service.keep(supervisor._spend)  # frozen looks alive
        with pytest.raises(RetryableError, match=r"died \(signal SIGKILL\)"):
            supervisor._restart_frozen_data(138)
        assert service.process.returncode == -signal.SIGKILL
        assert "failed role: data_service (the tf.data service was frozen)" \
            in lines[-1], lines
        assert supervisor.budget.total["coordinator"] == 0
    finally:
        service.process.kill()
        service.process.wait()


def test_the_coordinator_is_handed_its_job_not_a_command_line(tmp_path,
                                                              monkeypatch):
    """What the supervisor starts: a job process named by its role, given
    the job file the JobConfig codec wrote (the dispatcher's address in it)
    -- no `psrec train` arguments, no hidden flag, and no environment
    variable of psrec's besides what the caller's environment had."""
    from psrec.launch.cli import job_process
    from psrec.launch.job.config import JobConfig
    from psrec.launch.job.run import job_process_command
    from psrec.launch.supervise.restart_policy import SupervisorConfig
    from psrec.launch.supervise.supervisor import Supervisor
    config = JobConfig(workdir=tmp_path, data_service="grpc://127.0.0.1:5050")
    folder = tmp_path / "coordinator"
    command = job_process_command(config, "coordinator", folder, "--json")
    assert command == [sys.executable, "-P", "-m",
                       "psrec.launch.cli.job_process", "coordinator",
                       str(folder / "job.json"), "--json"]
    assert JobConfig.read(folder) == config  # the whole job, as it was
    started = []

    class Started(Exception):
        pass

    def spawn(argv, log=None, env=None):
        started.append((argv, env))
        raise Started

    monkeypatch.setattr("psrec.launch.supervise.supervisor.spawn", spawn)
    supervisor = Supervisor(None, command, SupervisorConfig(), tmp_path)
    supervisor.cluster = type("Cluster", (), {"live_spec": lambda self: (
        ClusterSpec.build(ps=["127.0.0.1:1"], workers=["127.0.0.1:2"]))})()
    with pytest.raises(Started):
        supervisor._loop()
    [(argv, env)] = started
    assert argv == [*command, "--cluster", str(tmp_path / "cluster.json")]
    assert env is None  # the launcher's role environment, nothing added
    # The job process takes exactly that command line; a coordinator
    # without a cluster file is a one-line usage error.
    args = job_process._parser().parse_args(argv[4:])
    assert (args.role, args.job, args.cluster, args.json) == (
        "coordinator", str(folder / "job.json"),
        str(tmp_path / "cluster.json"), True)
    with pytest.raises(SystemExit) as exit_info:
        job_process.main(["coordinator", str(folder / "job.json")])
    assert exit_info.value.code == 2


class _Roles:
    """What the supervisor needs of a local cluster: its spec, its
    processes by task (real ones: ``sleep``), and restarting a task."""

    def __init__(self, cluster: ClusterSpec, tasks: list[TaskInfo]) -> None:
        self.cluster = cluster
        self.processes = {task: self._start() for task in tasks}

    @staticmethod
    def _start() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c",
                                 "import time; time.sleep(120)"])

    def start_task(self, task: TaskInfo) -> subprocess.Popen:
        self.processes[task] = self._start()
        return self.processes[task]

    def wait_ready(self, tasks) -> None:
        pass

    def live_spec(self) -> ClusterSpec:
        return self.cluster


def test_a_frozen_ps_is_killed_and_only_it_is_restarted(tmp_path):
    """After a stall with a SIGSTOPped PS: the PS is the failed role, the
    frozen process is killed (not left stopped), a new one is started on
    the ps budget, and no worker is touched."""
    from psrec.launch.supervise.supervisor import Supervisor
    from psrec.launch.supervise.supervisor import SupervisorConfig
    roles = None
    with _listening_cluster() as (cluster, _, tasks):
        ps, workers = tasks[0], tasks[1:]
        try:
            roles = _Roles(cluster, tasks)
            before = dict(roles.processes)
            lines = []
            supervisor = Supervisor(roles, [], SupervisorConfig(backoff=0.0),
                                    tmp_path, log=lines.append)
            _freeze(before[ps].pid)
            failure = classify(cluster, roles.processes, set())
            assert supervisor._recover(failure, 138)
            assert before[ps].returncode == -signal.SIGKILL  # not left stopped
            assert roles.processes[ps] is not before[ps]
            assert roles.processes[ps].poll() is None
            assert all(roles.processes[w] is before[w] for w in workers)
            assert "failed role: ps (ps-0 is frozen" in lines[0], lines
            assert lines[-1] == (f"psrec supervisor: ps-0 restarted (pid "
                                 f"{roles.processes[ps].pid})"), lines
            assert not [line for line in lines if "worker-" in line
                        and "restarted" in line]
            assert supervisor.budget.used["ps"] == 1
        finally:
            for process in ([] if roles is None else
                            [*roles.processes.values(), *before.values()]):
                process.kill()
                process.wait()


def test_a_worker_lost_as_the_coordinator_finishes_is_still_reported(
        tmp_path):
    """A worker that dies between the supervisor's last look and the
    coordinator's (successful) exit is named in the run's output: the run
    ends 0 and says which worker it lost, with its signal."""
    from psrec.launch.supervise.supervisor import Supervisor
    from psrec.launch.supervise.supervisor import SupervisorConfig
    roles = None
    with _listening_cluster() as (cluster, _, tasks):
        try:
            roles = _Roles(cluster, tasks)
            victim = tasks[-1]
            roles.processes[victim].kill()
            roles.processes[victim].wait()
            lines = []
            supervisor = Supervisor(roles, [], SupervisorConfig(backoff=0.0),
                                    tmp_path, log=lines.append)
            supervisor.coordinator = subprocess.Popen(
                [sys.executable, "-c", "pass"])
            supervisor.coordinator.wait()
            assert supervisor._watch() == (0, None)
            assert lines == [
                f"psrec supervisor: {victim.name} died (exit -9) before the "
                "coordinator exited; the run ends without it"], lines
        finally:
            for process in [] if roles is None else roles.processes.values():
                process.kill()
                process.wait()
