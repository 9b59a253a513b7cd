"""``psrec train`` end to end on a local cluster of OS processes: a run and a
resumed run leave a checkpoint, an export, TensorBoard events and no role
process behind; SIGINT stops the job and its roles; ``LocalCluster`` stops
its processes when its ``with`` block raises."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from pathlib import Path

import pytest
import tensorflow as tf

from psrec.launch.local import LocalCluster
from tests._proc import PsrecRun
from tests._proc import kill_pids
from tests._proc import pid_alive
from tests._proc import processes_matching
from tests._proc import run_psrec
from tests._proc import wait_gone

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TIMEOUT = 300


def _train_args(workdir: Path, steps: int, rows: int = 20_000) -> list[str]:
    return ["train", "--workdir", workdir, "--synthetic-rows", rows,
            "--steps", steps, "--checkpoint-every", 30, "--batch-size", 256]


def _ports(workdir: Path) -> list[str]:
    """Ports the role servers of a run listened on (from their logs)."""
    ports = []
    for log in (workdir / "logs").glob("*.log"):
        ports += re.findall(r"serving [\d.]+:(\d+)", log.read_text())
    return ports


def _assert_nothing_left(run: PsrecRun, workdir: Path) -> None:
    assert len(run.role_pids) == 3, run.output[-2000:]  # 2 workers + 1 PS
    pids = run.role_pids + run.coordinator_pids
    assert wait_gone(pids, timeout=2) == []
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert processes_matching([str(workdir)]) == {}
    ports = _ports(workdir)
    assert ports  # every role logged its address
    servers = processes_matching(["launch server"])
    leftovers = {pid: cmd for pid, cmd in servers.items()
                 if any(f":{port}" in cmd for port in ports)}
    assert leftovers == {}


def _summary_value(output: str, pattern: str) -> re.Match:
    match = re.search(pattern, output)
    assert match, f"{pattern!r} not in output:\n{output[-3000:]}"
    return match


def _event_tags(directory: Path) -> set[str]:
    tags = set()
    for path in directory.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            tags.update(value.tag for value in event.summary.value)
    return tags


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("psrec-train") / "run"


@pytest.fixture(scope="module")
def first_run(workdir):
    code, run = run_psrec(_train_args(workdir, 60), TIMEOUT)
    return code, run


def test_train_end_to_end(first_run, workdir):
    code, run = first_run
    assert code == 0, run.output[-4000:]
    output = run.output
    assert "psrec train summary:" in output
    auc = float(_summary_value(output, r"\n  AUC (\d\.\d+)  logloss").group(1))
    assert 0.0 < auc <= 1.0
    _summary_value(output, r"steps 0 -> 60 \(optimizer updates executed: "
                           r"(\d+)\)")
    checkpoints = workdir / "checkpoints"
    for step in (30, 60):
        assert (checkpoints / f"ckpt-{step}.index").is_file()
    assert tf.train.latest_checkpoint(str(checkpoints)).endswith("ckpt-60")
    assert (checkpoints / "job.json").is_file()
    assert (workdir / "export" / "saved_model.pb").is_file()
    assert {"train/loss", "eval/auc"} <= _event_tags(workdir / "tensorboard")
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["step"] == 60 and summary["eval"]["count"] == 4_000
    assert summary["eval"]["auc"] == pytest.approx(auc, abs=1e-4)


def test_train_leaves_no_process_behind(first_run, workdir):
    _, run = first_run
    _assert_nothing_left(run, workdir)


def test_rerun_resumes_from_the_checkpoint(first_run, workdir):
    assert first_run[0] == 0
    code, run = run_psrec(_train_args(workdir, 90), TIMEOUT)
    assert code == 0, run.output[-4000:]
    resumed = _summary_value(run.output, r"resumed from (\S+) at step (\d+)")
    assert resumed.group(1).endswith("ckpt-60") and resumed.group(2) == "60"
    _summary_value(run.output, r"steps 60 -> 90 ")
    assert "generating" not in run.output  # the converted data is reused
    assert tf.train.latest_checkpoint(
        str(workdir / "checkpoints")).endswith("ckpt-90")
    _assert_nothing_left(run, workdir)


@pytest.mark.parametrize("when", ["cluster-started", "training"])
def test_sigint_stops_the_job_and_its_roles(tmp_path, when):
    workdir = tmp_path / "run"
    args = _train_args(workdir, 100_000, rows=8_000) + ["--log-every", "10"]
    with PsrecRun(args) as run:
        run.wait_for(r"local cluster: .*\(pids ", timeout=120)
        assert len(run.role_pids) == 3
        assert all(pid_alive(p) for p in run.role_pids)
        if when == "training":
            run.wait_for(r"^step \d+/100000 ", timeout=120)
        run.process.send_signal(signal.SIGINT)
        code = run.wait(timeout=30)
        assert code == 130, run.output[-4000:]
        assert "psrec: interrupted" in run.output
        _assert_nothing_left(run, workdir)


def test_local_cluster_stops_its_processes_on_error(tmp_path):
    pids: list[int] = []
    cluster = LocalCluster(1, 1, log_dir=tmp_path / "logs")
    try:
        with pytest.raises(RuntimeError, match="inside the block"):
            with cluster as started:
                pids = started.pids()
                assert len(pids) == 2
                assert all(pid_alive(p) for p in pids)
                for address in started.cluster.to_tf_cluster_dict().values():
                    host, port = address[0].rsplit(":", 1)
                    with socket.create_connection((host, int(port)),
                                                  timeout=5):
                        pass
                raise RuntimeError("failure inside the block")
        assert wait_gone(pids, timeout=2) == []
        assert all(p.poll() is not None for p in cluster.processes.values())
        assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [
            "ps-0.log", "worker-0.log"]
    finally:
        kill_pids(pids)


def test_workers_get_equal_gpu_shares_and_ps_none():
    from psrec.launch.local import worker_gpus
    gpus = ["0", "1", "2", "3"]
    assert [worker_gpus(i, 2, gpus) for i in range(2)] == ["0,1", "2,3"]
    assert [worker_gpus(i, 3, gpus) for i in range(3)] == ["0", "1", "2"]
    assert [worker_gpus(i, 2, ["0"]) for i in range(2)] == ["0", "0"]
    assert worker_gpus(0, 2, []) is None
