"""Running ``psrec`` as a real OS process in tests: output watched line by
line with deadlines, pids parsed from its output, leftovers checked and
killed by pid.

The one process harness of the suite (test_local_cluster.py,
test_faults.py, test_watchdog.py, test_isolation.py). It imports no
TensorFlow.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterable
from typing import Sequence

from psrec.runtime import role_environment

REPO = Path(__file__).resolve().parents[1]
_ROLE_PIDS = re.compile(r"local cluster: .*\(pids ([\d, ]+)\)")
_COORDINATOR_PID = re.compile(r"coordinator pid (\d+)")
_RESTARTED_PID = re.compile(r"restarted \(pid (\d+)\)")

# -- pids ---------------------------------------------------------------------


def one_ps_one_worker_configs() -> tuple[dict, dict]:
    """A chief, one PS and one worker on free loopback ports: the
    ``TF_CONFIG`` JSON of each task by ``(type, index)``, and each task's
    port by type."""
    from psrec.ps_cluster.cluster.addresses import free_loopback_ports
    from psrec.ps_cluster.cluster.tf_config import ClusterSpec
    from psrec.ps_cluster.cluster.tf_config import tf_configs_for_all_tasks
    ps, worker, chief = free_loopback_ports(3)
    cluster = ClusterSpec.build(ps=[f"127.0.0.1:{ps}"],
                                workers=[f"127.0.0.1:{worker}"],
                                chief=f"127.0.0.1:{chief}")
    configs = {(c.task.type, c.task.index): c.to_json()
               for c in tf_configs_for_all_tasks(cluster)}
    return configs, {"ps": ps, "worker": worker, "chief": chief}


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Waits until none of ``pids`` is alive; returns those still alive."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) ``pid`` has used so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # fields[0] is the state (field 3 of stat); utime, stime are 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for_cpu(pid: int, seconds: float, timeout: float) -> float:
    """Polls until ``pid`` has used ``seconds`` more CPU time than when
    called (it is busy computing); returns the CPU time it used. Fails when
    that does not happen within ``timeout`` or ``pid`` exits."""
    start = cpu_seconds(pid)
    deadline = time.monotonic() + timeout
    while True:
        if not pid_alive(pid):
            raise AssertionError(f"pid {pid} exited while awaited busy")
        used = cpu_seconds(pid) - start
        if used >= seconds:
            return used
        if time.monotonic() > deadline:
            raise AssertionError(
                f"pid {pid} used {used:.2f} s CPU in {timeout} s, not "
                f"{seconds} s")
        time.sleep(0.02)


def kill_pids(pids: Iterable[int]) -> None:
    """SIGKILLs each pid that is still alive (test cleanup, by pid)."""
    for pid in pids:
        if pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def processes_matching(needles: Iterable[str]) -> dict[int, str]:
    """Live processes (not this one) whose command line contains any needle,
    as ``{pid: command line}``."""
    needles = [n for n in needles if n]
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(
                b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(n in cmdline for n in needles) and pid_alive(int(entry.name)):
            found[int(entry.name)] = cmdline
    return found


# -- psrec runs -----------------------------------------------------------------


class WatchedProcess:
    """A started process whose merged stdout/stderr a reader thread
    collects line by line with arrival times (``lines``), optionally also
    appended to ``log``; :meth:`wait_for` and :meth:`time_of` search it.
    ``label`` prefixes failure messages."""

    def __init__(self, process: subprocess.Popen, label: str = "",
                 log=None) -> None:
        self.process = process
        self.label = label
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self._log = log
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                if self._log:
                    self._log.write(line)
                    self._log.flush()
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def output(self) -> str:
        with self._cond:
            return "\n".join(line for _, line in self.lines)

    def wait_for(self, pattern: str, timeout: float,
                 after: int = 0) -> re.Match:
        """The first line (from index ``after``) matching ``pattern``;
        fails when none comes within ``timeout`` s or the output ends
        without one."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = after
        with self._cond:
            while True:
                for _, line in self.lines[seen:]:
                    match = regex.search(line)
                    if match:
                        return match
                seen = len(self.lines)
                left = deadline - time.monotonic()
                ended = (self.process.poll() is not None
                         and not self._reader.is_alive())
                if left <= 0 or ended:
                    why = (f"output ended (exit {self.process.returncode})"
                           if ended else f"none within {timeout} s")
                    raise AssertionError(
                        f"{self.label}no line matching {pattern!r}: {why}; "
                        f"output:\n{self.output[-4000:]}")
                self._cond.wait(min(left, 0.5))

    def time_of(self, pattern: str) -> float:
        """When the first line matching ``pattern`` arrived (monotonic)."""
        regex = re.compile(pattern)
        with self._cond:
            for stamp, line in self.lines:
                if regex.search(line):
                    return stamp
        raise AssertionError(f"{self.label}no line matching {pattern!r}")


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default action. A test
    run started from a script's background job inherits SIGINT ignored
    (bash does that without job control; Python then keeps it ignored), and
    the tests that stop psrec with SIGINT would wait in vain."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class PsrecRun(WatchedProcess):
    """``python -m psrec ARGS`` in its own session (process group), its
    merged stdout/stderr collected line by line, with arrival times, by a
    reader thread.

    Use either directly (call :meth:`kill` in a ``finally``) or as a context
    manager: on exit the process group is SIGKILLed if psrec still runs, and
    every role, coordinator or restarted pid it announced is killed by pid.
    """

    def __init__(self, args: Sequence[object], cwd: Path | None = None
                 ) -> None:
        self.args = [str(a) for a in args]
        self.started = time.monotonic()
        env = role_environment()
        env["PYTHONUNBUFFERED"] = "1"  # lines arrive as they are printed
        super().__init__(subprocess.Popen(
            [sys.executable, "-m", "psrec", *self.args], cwd=cwd or REPO,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, text=True, bufsize=1,
            start_new_session=True, preexec_fn=_default_sigint))

    def __enter__(self) -> "PsrecRun":
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(timeout=30)
        self._reader.join(timeout=10)
        kill_pids(self.pids() - {self.process.pid})

    # -- pids -----------------------------------------------------------------

    @property
    def role_pids(self) -> list[int]:
        """The pids of the last 'local cluster' line (ps..., worker...)."""
        found = _ROLE_PIDS.findall(self.output)
        return [int(p) for p in found[-1].split(",")] if found else []

    @property
    def coordinator_pids(self) -> list[int]:
        """The supervisor's coordinator children (one per restart)."""
        return [int(p) for p in _COORDINATOR_PID.findall(self.output)]

    def pids(self) -> set[int]:
        """Every pid psrec reported starting (roles, coordinators, restarted
        roles), and psrec's own."""
        found = {self.process.pid}
        for regex in (_ROLE_PIDS, _COORDINATOR_PID, _RESTARTED_PID):
            for match in regex.finditer(self.output):
                found.update(int(p) for p in match.group(1).split(","))
        return found

    # -- exit -----------------------------------------------------------------

    def wait(self, timeout: float) -> int:
        """Waits for the exit and the rest of the output; returns the code.
        Past ``timeout`` psrec is killed and the test fails."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"psrec {self.args} did not exit within {timeout} s; "
                f"output:\n{self.output[-4000:]}") from None
        self._reader.join(timeout=10)
        return code

    def kill(self) -> None:
        """SIGKILLs psrec itself (its children must follow it on their
        own: that is what :func:`assert_no_leftovers` checks)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def run_psrec(args: Sequence[object], timeout: float
              ) -> tuple[int, PsrecRun]:
    """Runs ``psrec ARGS`` to completion (killed after ``timeout`` s)."""
    with PsrecRun(args) as run:
        code = run.wait(timeout)
    return code, run


def assert_no_leftovers(run: PsrecRun, workdir: Path,
                        timeout: float = 15.0) -> None:
    """No process psrec started (or that names the workdir) survives."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in run.pids() if pid_alive(p)]
        left += list(processes_matching([str(workdir)]))
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    kill_pids(left)  # never leave them behind, even when failing
    assert not left, f"processes left behind: {sorted(set(left))}"
