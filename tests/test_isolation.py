"""Nothing of a local ``psrec train`` listens where other hosts can reach it.

TensorFlow's gRPC servers listen on all interfaces and run any graph a
client sends, whatever the cluster spec says. A local ``psrec train`` runs
its whole process tree (supervisor, coordinator, PS, workers) in a private
network namespace with only loopback: probed here from the test's own
(host) namespace on every non-loopback address of the machine, through
each listening socket of that tree. Without namespaces it refuses, unless
``--allow-exposed``, whose warning names every port that is then really
reachable. ``psrec server`` (the multi-host role) prints where it really
listens. The probes read /proc and connect; they import no TensorFlow.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from psrec.launch.local.netns import ISOLATED
from psrec.launch.local.netns import NO_NETNS_ENV
from tests._forbid import forbid
from tests._proc import PsrecRun
from tests._proc import assert_no_leftovers

TIMEOUT = 150


def _train_args(workdir: Path, *extra: object) -> list[object]:
    return ["train", "--workdir", workdir, "--synthetic-rows", 4000,
            "--steps", 100_000, "--batch-size", 256, "--log-every", 10,
            "--checkpoint-every", 0, "--no-export", *extra]


# -- the machine's addresses, as `ip` lists them ---------------------------


@pytest.fixture(scope="module")
def external_addresses() -> list[str]:
    """The non-loopback addresses of the test's (host) namespace that a
    client can connect to (link-local ones need a scope: left out); a dummy
    interface with one is created when the machine has none."""
    def listed() -> list[str]:
        out = subprocess.run(["ip", "-j", "addr", "show"], check=True,
                             capture_output=True, text=True).stdout
        return [a["local"] for link in json.loads(out)
                for a in link.get("addr_info", [])
                if a.get("scope") == "global"
                and not a["local"].startswith("127.")]
    found = listed()
    dummy = f"psrec{os.getpid() % 100000}"
    if not found:
        subprocess.run(["ip", "link", "add", dummy, "type", "dummy"],
                       check=True)
        subprocess.run(["ip", "addr", "add", "10.213.7.1/32", "dev", dummy],
                       check=True)
        subprocess.run(["ip", "link", "set", dummy, "up"], check=True)
        found = listed()
    assert found, "no non-loopback address to probe"
    yield found
    subprocess.run(["ip", "link", "del", dummy], capture_output=True)


# -- a process tree's listening sockets, from /proc ------------------------


def _tree(root: int) -> list[int]:
    """``root`` and every live descendant."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, frontier = [root], [root]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        tree += children
        frontier = children
    return tree


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def _listen_table(net: Path) -> dict[str, int]:
    """LISTEN sockets of one namespace's /proc net tables: inode -> port."""
    table = {}
    for name in ("tcp", "tcp6"):
        for line in (net / name).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":
                table[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    return table


def _listeners(pids: list[int]) -> dict[int, dict[str, int]]:
    """Per pid: the TCP sockets it listens on (inode -> port), looked up in
    its own network namespace."""
    found = {}
    for pid in pids:
        table = _listen_table(Path(f"/proc/{pid}/net"))
        found[pid] = {inode: port for inode, port in table.items()
                      if inode in _socket_inodes(pid)}
    return found


def _reachable(addresses: list[str], listeners: dict[int, dict[str, int]]
               ) -> list[str]:
    """``address:port`` pairs through which a client in the test's
    namespace reaches one of ``listeners``' sockets: the connection is
    accepted, and the socket that listens there (in this namespace) is one
    of theirs, not some other program's on the same port number."""
    ours = {inode for sockets in listeners.values() for inode in sockets}
    here = _listen_table(Path("/proc/self/net"))
    reached = []
    for port in sorted({p for s in listeners.values() for p in s.values()}):
        for address in addresses:
            try:
                with socket.create_connection((address, port), timeout=3):
                    pass
            except OSError:
                continue
            if {i for i, p in here.items() if p == port} & ours:
                reached.append(f"{address}:{port}")
    return reached


def _cluster_ports(workdir: Path) -> dict[str, int]:
    jobs = json.loads((workdir / "cluster.json").read_text())
    return {f"{job}-{i}": int(address.rsplit(":", 1)[1])
            for job, addresses in jobs.items()
            for i, address in enumerate(addresses)}


def _serving(run: PsrecRun) -> list[int]:
    """Waits until every server of the run listens: the roles (the
    supervisor announces them once their ports accept connections) and the
    coordinator (TensorFlow starts a server in it when it connects);
    returns the run's process tree."""
    run.wait_for(r"local cluster: .*\(pids ", timeout=TIMEOUT)
    run.wait_for(r"coordinator pid \d+", timeout=TIMEOUT)
    [coordinator] = run.coordinator_pids
    deadline = time.monotonic() + TIMEOUT
    while not _listeners([coordinator])[coordinator]:
        assert time.monotonic() < deadline, "the coordinator never listened"
        assert run.process.poll() is None, run.output[-3000:]
        time.sleep(0.1)
    return _tree(run.process.pid)


def _stop(run: PsrecRun, workdir: Path) -> None:
    run.process.send_signal(signal.SIGINT)
    assert run.wait(timeout=60) == 130, run.output[-3000:]
    assert_no_leftovers(run, workdir)


# -- the tests --------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.slow
def test_local_train_is_unreachable_from_other_hosts(tmp_path,
                                                     external_addresses):
    workdir = tmp_path / "run"
    with PsrecRun(_train_args(workdir)) as run:
        pids = _serving(run)
        assert ISOLATED in run.output
        listeners = _listeners(pids)
        ports = {p for sockets in listeners.values() for p in sockets.values()}
        # The probe sees the servers: every PS and worker port of the
        # cluster, and the coordinator's (TensorFlow starts a server in the
        # coordinator too, on a port it picks).
        assert set(_cluster_ports(workdir).values()) < ports
        assert _reachable(external_addresses, listeners) == []
        own = os.readlink("/proc/self/ns/net")
        assert all(os.readlink(f"/proc/{pid}/ns/net") != own for pid in pids)
        _assert_handed_its_job(run.coordinator_pids[0], workdir)
        # The same run is the SIGINT-while-training case: stopped mid-step,
        # it exits 130 with one line, and none of its roles survives.
        assert len(run.role_pids) == 3  # 1 PS + 2 workers
        run.wait_for(r"^step \d+/100000 ", timeout=TIMEOUT)
        _stop(run, workdir)
        assert "psrec train: interrupted" in run.output


def _assert_handed_its_job(pid: int, workdir: Path) -> None:
    """The supervised coordinator, as the kernel sees it: a job process
    started with its job file and the cluster file, nothing else -- no
    rerun of `psrec train`'s command line with hidden flags, no psrec
    variable in its environment -- and the job file carries the local
    tf.data service's address (the run reads through it: 2 workers)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    job = workdir / "coordinator" / "job.json"
    assert argv[1:] == ["-P", "-m", "psrec.launch.cli.job_process",
                        "coordinator", str(job), "--cluster",
                        str(workdir / "cluster.json")], argv
    environ = dict(item.split("=", 1) for item in Path(
        f"/proc/{pid}/environ").read_bytes().decode().split("\0") if item)
    # PSREC_NETNS: the namespace's state, set for the whole tree by the
    # re-execution into it (launch.local.netns).
    added = {name for name in environ if name.startswith("PSREC_")
             and name not in os.environ and name != "PSREC_NETNS"}
    assert not added and "PSREC_DATA_SERVICE" not in environ, sorted(environ)
    handed = json.loads(job.read_text())
    assert handed["input"]["mode"] == "data-service"
    assert re.fullmatch(r"grpc://127\.0\.0\.1:\d+", handed["data_service"])


def test_without_namespaces_train_refuses_before_any_work(
        tmp_path, monkeypatch, capsys):
    """In-process, as the re-executed ``psrec`` runs it: first
    :func:`enter_and_record` (which, namespaces unavailable, records why),
    then the command, which must refuse before its data and any server
    (reaching either raises :class:`Reached`)."""
    from psrec.launch.cli.main import main
    from psrec.launch.local.netns import STATE_ENV
    from psrec.launch.local.netns import enter_and_record
    monkeypatch.setenv(NO_NETNS_ENV, "1")
    monkeypatch.setenv(STATE_ENV, "")  # restored (unset) after the test
    enter_and_record()
    assert os.environ[STATE_ENV] == f"unavailable: {NO_NETNS_ENV}=1 is set"
    forbid(monkeypatch)
    workdir = tmp_path / "run"
    assert main([str(a) for a in _train_args(workdir)]) == 2
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines()
             if line.startswith("psrec")]
    assert len(lines) == 1, captured
    assert lines[0].startswith("psrec train: error: cannot "
                               "isolate the local cluster")
    assert f"{NO_NETNS_ENV}=1 is set" in lines[0]
    assert "--allow-exposed" in lines[0]
    assert not (workdir / "data").exists()  # refused before the data
    assert not (workdir / "logs").exists()  # and before any server


@pytest.mark.cluster
@pytest.mark.slow
def test_allow_exposed_warns_naming_every_reachable_port(tmp_path,
                                                         monkeypatch,
                                                         external_addresses):
    monkeypatch.setenv(NO_NETNS_ENV, "1")
    workdir = tmp_path / "run"
    with PsrecRun(_train_args(workdir, "--allow-exposed", "--workers", 1)
                  ) as run:
        warning = run.wait_for(r"^psrec: WARNING: --allow-exposed", 120)
        line = warning.string
        warned = {role: int(port) for role, port in
                  re.findall(r"([a-z]+(?:-\d+)?) on port (\d+)", line)}
        assert set(warned) == {"coordinator", "ps-0", "worker-0"}, line
        for address in external_addresses:
            assert address in line
        pids = _serving(run)
        listeners = _listeners(pids)
        ports = {p for sockets in listeners.values() for p in sockets.values()}
        assert ports == set(warned.values())  # every port, no other
        # ... and the warning is true: other hosts reach each of them.
        reached = _reachable(external_addresses, listeners)
        assert {int(r.rsplit(":", 1)[1]) for r in reached} == ports
        _stop(run, workdir)


@pytest.mark.cluster
def test_psrec_server_prints_the_addresses_it_really_listens_on(
        tmp_path, external_addresses):
    from psrec.ps_cluster.cluster.addresses import free_loopback_ports
    ps, worker = free_loopback_ports(2)
    spec = tmp_path / "cluster.json"
    spec.write_text(json.dumps({"ps": [f"127.0.0.1:{ps}"],
                                "worker": [f"127.0.0.1:{worker}"]}))
    with PsrecRun(["server", "--cluster", spec, "--role", "ps",
                   "--index", 0]) as run:
        line = run.wait_for(r"psrec server: listening on ", 120).string
        run.wait_for(r"psrec server: warning: TensorFlow's gRPC server has "
                     r"no authentication and no TLS", 10)
        # Told 127.0.0.1, TensorFlow binds the wildcard: every address.
        assert re.search(rf"(0\.0\.0\.0|\[::\]):{ps} = every interface",
                         line), line
        for address in ["127.0.0.1", *external_addresses]:
            assert address in line, line
        with socket.create_connection((external_addresses[0], ps), 5):
            pass  # as printed: reachable on the external address


def test_a_private_namespace_falls_back_to_a_user_namespace():
    """Without CAP_SYS_ADMIN, unshare(CLONE_NEWNET) is refused; psrec then
    makes a user namespace (uid mapped to itself) with its own network,
    whose only interface, lo, is up."""
    code = ("import ctypes, os, socket; "
            "from psrec.launch.local.netns import enter_private_network, interfaces;"
            " assert ctypes.CDLL(None, use_errno=True).unshare(0x40000000);"
            " uid = os.getuid(); why = enter_private_network(); "
            "s = socket.create_server(('127.0.0.1', 0)); "
            "socket.create_connection(s.getsockname(), 5); "
            "print(why, interfaces(), os.getuid() == uid, "
            "open('/proc/self/uid_map').read().split())")
    done = subprocess.run(
        ["setpriv", "--inh-caps=-sys_admin", "--bounding-set=-sys_admin",
         sys.executable, "-P", "-c", code],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    uid = str(os.getuid())
    assert done.stdout.split("[", 1)[0].strip() == "None"
    assert f"['lo'] True ['{uid}', '{uid}', '1']" in done.stdout
