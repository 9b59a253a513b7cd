"""The multi-machine recipe on one machine: `psrec server` roles started
from TF_CONFIG, and `psrec train` coordinating them (TF_CONFIG naming the
chief) without starting any server itself."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.ingest.synthetic import write_synthetic_parquet
from psrec.features import criteo
from psrec.runtime import role_environment
from tests._proc import REPO
from tests._proc import one_ps_one_worker_configs

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _wait_listening(port: int, process: subprocess.Popen,
                    timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            try:
                process.wait(timeout=0.05)
                raise AssertionError(f"server exited: {process.returncode}")
            except subprocess.TimeoutExpired:
                pass
    raise AssertionError(f"port {port} never listened")


def test_servers_from_tf_config_and_train_as_chief(tmp_path):
    spec = criteo(buckets=500, dim=4)
    spec_file = spec.save(tmp_path / "spec.yaml")
    files = write_synthetic_parquet(spec, tmp_path / "pq", 4000, files=1)
    convert(files, spec, tmp_path / "tfr",
            ConversionOptions(shards=2, eval_fraction=0.2, block_rows=64))
    configs, ports = one_ps_one_worker_configs()
    ps, worker = ports["ps"], ports["worker"]
    servers = []
    try:
        for key, port in ((("ps", 0), ps), (("worker", 0), worker)):
            env = dict(role_environment(), TF_CONFIG=configs[key])
            process = subprocess.Popen(
                [sys.executable, "-m", "psrec", "server"], cwd=REPO,
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            servers.append(process)
            _wait_listening(port, process)
        env = dict(role_environment(), TF_CONFIG=configs[("chief", 0)])
        done = subprocess.run(
            [sys.executable, "-m", "psrec", "train", "--spec",
             str(spec_file), "--data", str(tmp_path / "tfr"), "--workers",
             "1", "--steps", "30", "--batch-size", "64", "--workdir",
             str(tmp_path / "run"), "--no-export"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        out = done.stdout + done.stderr
        assert "coordinating existing cluster" in out
        assert "local cluster" not in out  # it started no server
        assert "steps 0 -> 30" in out
        assert all(p.poll() is None for p in servers)  # roles still serve
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert (summary["strategy"], summary["ps"], summary["workers"]) == (
            "ps", 1, 1)
        # ... and it coordinated exactly the TF_CONFIG cluster's tasks.
        [line] = [x for x in out.splitlines()
                  if "coordinating existing cluster" in x]
        assert f"'ps': ['127.0.0.1:{ps}']" in line, line
        assert f"'worker': ['127.0.0.1:{worker}']" in line, line
    finally:
        for process in servers:
            process.kill()
            process.wait(timeout=30)
    assert all(not os.path.exists(f"/proc/{p.pid}/cmdline") or
               p.returncode is not None for p in servers)
