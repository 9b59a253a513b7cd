"""Running ``psrec`` as a real OS process in tests: output watched line by
line with deadlines, pids parsed from its output, leftovers checked."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_PID_LINES = (re.compile(r"local cluster: .*\(pids ([\d, ]+)\)"),
              re.compile(r"coordinator pid (\d+)"),
              re.compile(r"restarted \(pid (\d+)\)"))


class PsrecRun:
    """``python -m launch ARGS`` with its merged output collected."""

    def __init__(self, args: list[str], cwd: Path | None = None) -> None:
        self.args = args
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "launch", *args], cwd=cwd or REPO,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, text=True, bufsize=1)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def output(self) -> str:
        with self._cond:
            return "\n".join(line for _, line in self.lines)

    def wait_for(self, pattern: str, timeout: float,
                 after: int = 0) -> re.Match:
        """The first line (from index ``after``) matching ``pattern``."""
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
                if left <= 0 or (self.process.poll() is not None
                                 and not self._reader.is_alive()):
                    raise AssertionError(
                        f"no line matching {pattern!r} within {timeout} s; "
                        f"output:\n{self.output[-4000:]}")
                self._cond.wait(min(left, 0.5))

    def time_of(self, pattern: str) -> float:
        regex = re.compile(pattern)
        with self._cond:
            for stamp, line in self.lines:
                if regex.search(line):
                    return stamp
        raise AssertionError(f"no line matching {pattern!r}")

    def wait(self, timeout: float) -> int:
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"psrec {self.args[0]} did not exit within {timeout} s; "
                f"output:\n{self.output[-4000:]}") from None
        self._reader.join(timeout=10)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def pids(self) -> set[int]:
        """Every pid psrec reported starting (roles, coordinators)."""
        found = {self.process.pid}
        for regex in _PID_LINES:
            for match in regex.finditer(self.output):
                found.update(int(p) for p in match.group(1).split(","))
        return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if text.encode() in cmdline and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def assert_no_leftovers(run: PsrecRun, workdir: Path,
                        timeout: float = 15.0) -> None:
    """No process psrec started (or that names the workdir) survives."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in run.pids() if alive(p)]
        left += processes_mentioning(str(workdir))
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for pid in left:  # never leave them behind, even when failing
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, f"processes left behind: {sorted(set(left))}"
