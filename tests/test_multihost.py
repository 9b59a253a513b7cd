"""Multi-host training on one machine: every role on its own "host".

Each test builds a virtual network (tests/_netns.py: one Linux network
namespace per host on a virtual switch, addresses 10.x.0.i), writes the
TF_CONFIG of every task with ``psrec tf-config --allow-remote``, runs
``psrec server`` for the PS and the workers and ``psrec train`` (the
coordinator, TF_CONFIG naming it chief) each in its own namespace, and
cuts hosts off the switch (a network partition) mid-training.

Skipped, with the reason, only where network namespaces cannot be created
(not root: no CAP_NET_ADMIN / CAP_SYS_ADMIN).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from psrec.errors import EXIT_RETRYABLE
from psrec.runtime import role_environment
from tests._netns import VirtualNetwork
from tests._netns import leftover_namespaces
from tests._proc import REPO
from tests._proc import pid_alive

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PORT = 2222
HOSTS = ("chief", "ps0", "worker0", "worker1")
TASK_FILES = {"ps0": "ps-0", "worker0": "worker-0", "worker1": "worker-1",
              "chief": "chief-0"}
PROGRESS = r"^step (\d+)/\d+ \[.*workers \{(.*)\}"
RERUNS = 3  # coordinator runs after the first, as an orchestrator would
PARTITION_S = 10.0  # how long a host stays cut off (the fault's length)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    from psrec.data.convert.convert import ConversionOptions
    from psrec.data.convert.convert import convert
    from psrec.data.ingest.synthetic import write_synthetic_parquet
    from psrec.features import criteo
    root = tmp_path_factory.mktemp("multihost-data")
    spec = criteo(buckets=500, dim=4)
    files = write_synthetic_parquet(spec, root / "parquet", 4000, files=1)
    convert(files, spec, root / "tfrecord",
            ConversionOptions(shards=2, eval_fraction=0.2, block_rows=64))
    return root / "tfrecord"


def _env(**extra: str) -> dict[str, str]:
    env = role_environment()
    env["PYTHONUNBUFFERED"] = "1"  # lines arrive as they are printed
    env.update(extra)
    return env


def _tf_configs(net: VirtualNetwork, out: Path) -> dict[str, str]:
    """TF_CONFIG of every host, written by the real `psrec tf-config`."""
    address = {h: f"{net.address(h)}:{PORT}" for h in HOSTS}
    done = subprocess.run(
        [sys.executable, "-m", "psrec", "tf-config", "--ps-hosts",
         address["ps0"], "--worker-hosts",
         f"{address['worker0']},{address['worker1']}", "--chief-host",
         address["chief"], "--allow-remote", "--out", str(out)],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return {h: (out / f"{TASK_FILES[h]}.json").read_text() for h in HOSTS}


def _start_servers(net: VirtualNetwork, configs: dict[str, str],
                   logs: Path) -> dict:
    servers = {h: net.run(h, [sys.executable, "-m", "psrec", "server",
                              "--allow-remote"],
                          _env(TF_CONFIG=configs[h]), cwd=REPO,
                          log_file=logs / f"{h}.log")
               for h in ("ps0", "worker0", "worker1")}
    for host, server in servers.items():
        served = server.wait_for(r"psrec server: \S+ serving (\S+)", 120)
        assert served.group(1) == f"{net.address(host)}:{PORT}"
    return servers


def _train(net: VirtualNetwork, config: str, data: Path, workdir: Path,
           *extra: str, log: str = "chief.log"):
    return net.run("chief", [
        sys.executable, "-m", "psrec", "train", "--data", str(data),
        "--workers", "2", "--ps", "1", "--batch-size", "64",
        "--steps-per-closure", "5", "--log-every", "10", "--workdir",
        str(workdir), "--allow-remote", *extra],
        _env(TF_CONFIG=config), cwd=REPO, log_file=workdir.parent / log)


def _closures(line: str) -> dict[int, int]:
    return {int(k): int(v) for k, v in re.findall(r"(\d+): (\d+)", line)}


def _last_progress(output: str) -> re.Match:
    return list(re.finditer(PROGRESS, output, re.M))[-1]


@pytest.fixture
def network(tmp_path):
    net = VirtualNetwork(HOSTS)
    with net:
        yield net
    assert not leftover_namespaces(net)
    assert not [p.pid for p in net.processes if pid_alive(p.pid)]


def test_full_train_over_non_loopback_addresses(tmp_path, network, data_dir):
    configs = _tf_configs(network, tmp_path / "tf_config")
    chief = json.loads(configs["chief"])
    assert chief["task"] == {"type": "chief", "index": 0}
    hosts = [a.rsplit(":", 1)[0] for job in chief["cluster"].values()
             for a in job]
    assert all(h.startswith("10.") for h in hosts), hosts
    servers = _start_servers(network, configs, tmp_path)
    # Separate hosts: the chief reaches the PS over the switch.
    assert network.connects("chief", "ps0", PORT)
    coordinator = _train(network, configs["chief"], data_dir,
                         tmp_path / "run", "--steps", "60")
    assert coordinator.wait(240) == 0, coordinator.output[-3000:]
    out = coordinator.output
    assert "warning: WARNING: --allow-remote" in out  # non-loopback named
    [line] = [x for x in out.splitlines()
              if "coordinating existing cluster" in x]
    for host in ("chief", "ps0", "worker0", "worker1"):
        assert f"'{network.address(host)}:{PORT}'" in line, line
    assert "127.0.0.1" not in line and "local cluster" not in out
    assert "steps 0 -> 60" in out
    # Both workers, on their own hosts, ran closures.
    per_worker = _closures(re.findall(
        r"closures finished per worker: workers \{(.*)\}", out)[-1])
    assert per_worker.get(0, 0) > 0 and per_worker.get(1, 0) > 0, per_worker
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["strategy"], summary["ps"], summary["workers"]) == (
        "ps", 1, 2)
    assert (Path(summary["export"]) / "saved_model.pb").is_file()
    assert all(s.process.poll() is None for s in servers.values())


def test_worker_partition_training_completes(tmp_path, network, data_dir):
    configs = _tf_configs(network, tmp_path / "tf_config")
    _start_servers(network, configs, tmp_path)
    steps = 200
    coordinator = _train(network, configs["chief"], data_dir,
                         tmp_path / "run", "--steps", str(steps),
                         "--checkpoint-every", "50", "--stall-timeout", "300")
    coordinator.wait_for(r"^step (2\d|3\d|4\d)/", 180)
    before = _closures(_last_progress(coordinator.output).group(2))
    network.link_down("worker1")
    cut = time.monotonic()
    seen = len(coordinator.lines)
    assert not network.connects("chief", "worker1", PORT)  # really cut off
    assert network.connects("chief", "worker0", PORT)
    time.sleep(max(0.0, PARTITION_S - (time.monotonic() - cut)))
    network.link_up("worker1")
    healed = time.monotonic()
    assert coordinator.wait(240) == 0, coordinator.output[-3000:]
    out = coordinator.output
    assert f"steps 0 -> {steps}" in out
    after = _closures(re.findall(
        r"closures finished per worker: workers \{(.*)\}", out)[-1])
    progress = [(t, re.match(PROGRESS, line)) for t, line
                in coordinator.lines[seen:] if re.match(PROGRESS, line)]
    healed_at = next(_closures(m.group(2)) for t, m in progress
                     if t >= healed)
    # The cut-off worker came back: it finished closures after the link
    # was up again (not only the one in flight at the cut).
    assert after[1] > healed_at.get(1, 0) >= before.get(1, 0), (
        before, healed_at, after)
    assert after[0] > before.get(0, 0), (before, after)


def test_ps_partition_exits_retryable_and_rerun_resumes(tmp_path, network,
                                                        data_dir):
    configs = _tf_configs(network, tmp_path / "tf_config")
    _start_servers(network, configs, tmp_path)
    steps, stall = 200, 20
    args = ("--steps", str(steps), "--checkpoint-every", "50",
            "--stall-timeout", str(stall), "--no-export")
    first = _train(network, configs["chief"], data_dir, tmp_path / "run",
                   *args)
    first.wait_for(r"step (5\d|6\d|7\d): checkpoint .*ckpt-\d+$", 180)
    network.link_down("ps0")
    assert not network.connects("chief", "ps0", PORT)
    # The PS stays cut off until the coordinator gives up on it.
    code = first.wait(stall + 120)
    gave_up = time.monotonic()
    network.link_up("ps0")
    out = first.output
    assert code == EXIT_RETRYABLE, out[-3000:]
    assert "retryable" in out, out[-3000:]
    last_step = max(int(m.group(1)) for m in re.finditer(PROGRESS, out,
                                                         re.M))
    # The same command again, as an orchestrator reruns a retryable exit
    # (bounded: RERUNS tries).
    attempts = []
    for attempt in range(RERUNS):
        second = _train(network, configs["chief"], data_dir,
                        tmp_path / "run", *args,
                        log=f"chief-rerun{attempt}.log")
        code = second.wait(240)
        attempts.append((code, time.monotonic() - gave_up))
        if code != EXIT_RETRYABLE:
            break
    assert code == 0, (attempts, second.output[-3000:])
    resumed = second.wait_for(r"resumed from (\S+) at step (\d+)", 1)
    assert f"steps {resumed.group(2)} -> {steps}" in second.output
    assert 0 < int(resumed.group(2)) <= last_step
