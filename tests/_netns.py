"""Several "hosts" on one machine: Linux network namespaces on a virtual
switch, for tests that need separate, non-loopback addresses.

:class:`VirtualNetwork` creates one namespace holding a bridge (the switch)
and one namespace per host, each joined to the bridge by a veth pair whose
host end is ``eth0`` with the address ``10.<subnet>.0.<i>/24`` (and ``lo``
up). Traffic never leaves the machine: the root namespace has no interface
on the bridge. Names carry this process's pid, so parallel runs never meet.

Commands run inside a host with ``ip netns exec`` (which execs them: the
pid returned is the command's own) in their own session; :meth:`link_down`
and :meth:`link_up` pull and replug a host's cable (its port on the switch),
a network partition between it and every other host. On exit every process
started here is SIGKILLed by pid (with anything else still inside the
namespaces, which only this network's processes can be in) and every
namespace -- and with it every link -- is deleted, also when the test
failed. Creating namespaces needs root (CAP_NET_ADMIN, and CAP_SYS_ADMIN
for the mount ``ip netns`` makes); without them the test is skipped, with
the reason.

The harness imports no TensorFlow.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Mapping
from typing import Sequence

import pytest

from tests._proc import WatchedProcess
from tests._proc import kill_pids
from tests._proc import wait_gone

_IP_TIMEOUT = 30


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True,
                          timeout=_IP_TIMEOUT)
    if check and done.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed "
                           f"({done.returncode}): {done.stderr.strip()}")
    return done


class HostProcess(WatchedProcess):
    """A command running inside a host's namespace, in its own session;
    merged stdout/stderr collected line by line (with arrival times) by a
    reader thread, and also appended to ``log_file`` when given."""

    def __init__(self, host: str, namespace: str, argv: Sequence[str],
                 env: Mapping[str, str], cwd: Path | None,
                 log_file: Path | None = None) -> None:
        self.host = host
        self.argv = [str(a) for a in argv]
        log = open(log_file, "a") if log_file else None  # noqa: SIM115
        super().__init__(subprocess.Popen(
            ["ip", "netns", "exec", namespace, *self.argv], cwd=cwd,
            env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, text=True, bufsize=1,
            start_new_session=True), label=f"{host}: ", log=log)
        self.pid = self.process.pid

    def wait(self, timeout: float) -> int:
        """The exit code, once the process and its output have ended; past
        ``timeout`` it is killed and the test fails."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.host}: {self.argv[:4]} did not exit within {timeout} "
                f"s; output:\n{self.output[-4000:]}") from None
        self._reader.join(timeout=10)
        return code

    def kill(self) -> None:
        """SIGKILLs the process's session (by its pid) and reaps it."""
        if self.process.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(timeout=30)
        self._reader.join(timeout=10)
        if self._log:
            self._log.close()
            self._log = None


class VirtualNetwork:
    """Hosts ``names`` on one virtual switch (use as a context manager).

    Args:
      names: the hosts, each given ``10.<subnet>.0.<i + 1>``.
      subnet: the second octet (default derived from the pid; the
        addresses exist only inside these namespaces either way).
    """

    def __init__(self, names: Sequence[str], subnet: int | None = None
                 ) -> None:
        if len(set(names)) != len(names) or not 0 < len(names) < 250:
            raise ValueError(f"host names must be unique (1..249): {names}")
        self.names = list(names)
        self.subnet = subnet if subnet is not None else 100 + os.getpid() % 150
        tag = f"psrec-test-{os.getpid()}-{id(self) % 10_000}"
        self.switch = f"{tag}-sw"
        self.namespaces = {name: f"{tag}-h{i}" for i, name in enumerate(names)}
        self.processes: list[HostProcess] = []
        self._created: list[str] = []

    # -- life ------------------------------------------------------------------

    def __enter__(self) -> "VirtualNetwork":
        if shutil.which("ip") is None:
            pytest.skip("network namespaces unavailable: no `ip` command "
                        "(iproute2) on this machine")
        done = _ip("netns", "add", self.switch, check=False)
        if done.returncode != 0:
            pytest.skip("network namespaces unavailable (`ip netns add` "
                        f"failed: {done.stderr.strip()}); they need root "
                        "(CAP_NET_ADMIN and CAP_SYS_ADMIN)")
        self._created.append(self.switch)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        sw = self.switch
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        _ip("-n", sw, "link", "set", "lo", "up")
        for name in self.names:
            ns = self.namespaces[name]
            _ip("netns", "add", ns)
            self._created.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            # Created in the switch's namespace, the host end moved straight
            # into the host's: the root namespace never sees either end.
            _ip("-n", sw, "link", "add", self._port(name), "type", "veth",
                "peer", "name", "eth0", "netns", ns)
            _ip("-n", sw, "link", "set", self._port(name), "master", "br0")
            _ip("-n", sw, "link", "set", self._port(name), "up")
            _ip("-n", ns, "addr", "add", f"{self.address(name)}/24", "dev",
                "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Kills every process started here and everything left inside the
        namespaces (by pid), then deletes the namespaces (their links go
        with them). Safe to call twice."""
        for process in self.processes:
            process.kill()
        inside = []
        for ns in self._created:
            done = _ip("netns", "pids", ns, check=False)
            inside += [int(p) for p in done.stdout.split() if p.isdigit()]
        kill_pids(inside)
        left = wait_gone(inside, timeout=15)
        errors = []
        for ns in reversed(self._created):
            done = _ip("netns", "del", ns, check=False)
            if done.returncode != 0:
                errors.append(f"{ns}: {done.stderr.strip()}")
        self._created.clear()
        if left or errors:
            raise AssertionError(f"teardown left processes {left} / "
                                 f"namespaces {errors}")

    # -- hosts -------------------------------------------------------------------

    def address(self, name: str) -> str:
        """The host's IPv4 address (no prefix length)."""
        return f"10.{self.subnet}.0.{self.names.index(name) + 1}"

    def _port(self, name: str) -> str:
        return f"p{self.names.index(name)}"  # the switch-side veth end

    def run(self, name: str, argv: Sequence[str], env: Mapping[str, str],
            cwd: Path | None = None, log_file: Path | None = None
            ) -> HostProcess:
        """Starts ``argv`` on host ``name`` (tracked; killed on close)."""
        process = HostProcess(name, self.namespaces[name], argv, env, cwd,
                              log_file)
        self.processes.append(process)
        return process

    def exec(self, name: str, argv: Sequence[str], timeout: float = 30
             ) -> subprocess.CompletedProcess:
        """Runs a short command on host ``name`` to completion."""
        return subprocess.run(["ip", "netns", "exec", self.namespaces[name],
                               *argv], capture_output=True, text=True,
                              timeout=timeout)

    def link_down(self, name: str) -> None:
        """Unplugs the host: its switch port goes down (its own ``eth0``
        loses carrier), so no packet reaches or leaves it."""
        _ip("-n", self.switch, "link", "set", self._port(name), "down")

    def link_up(self, name: str) -> None:
        """Plugs the host back in."""
        _ip("-n", self.switch, "link", "set", self._port(name), "up")

    def connects(self, source: str, target: str, port: int,
                 timeout: float = 2.0) -> bool:
        """True when a TCP connection from host ``source`` to ``target``'s
        ``port`` opens within ``timeout`` s."""
        code = (f"import socket; socket.create_connection("
                f"({self.address(target)!r}, {int(port)}), {timeout!r})")
        done = self.exec(source, [sys.executable, "-c", code],
                         timeout=timeout + 30)
        return done.returncode == 0


def leftover_namespaces(network: VirtualNetwork) -> list[str]:
    """Namespaces of ``network`` that still exist."""
    listed = _ip("netns", "list", check=False).stdout.split()
    mine = set(network.namespaces.values()) | {network.switch}
    return sorted(name for name in listed if name in mine)
