"""Reliability: real OS processes, SIGKILL/SIGSTOP, hard timeouts.

Each scenario runs ``psrec train`` (supervisor + PS + workers + coordinator
as separate processes) on a small converted dataset, injects a fault and
checks what psrec guarantees, then that no process it started remains.
The tests assert bounds, they measure nothing: recovery times belong in
the benchmarks page.
"""

import dataclasses
import hashlib
import json
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from psrec.data.format.manifest import Manifest
from tests._fault_data import STEPS
from tests._fault_data import synthetic_run_data
from tests._fault_data import train_args
from tests._forbid import forbid
from tests._proc import PsrecRun
from tests._proc import assert_no_leftovers
from tests._proc import pid_alive

TABLE_KEY = "model/sparse_arch/categorical"
TABLE = TABLE_KEY + "/.ATTRIBUTES/VARIABLE_VALUE"
DELTA_EVERY = 10

PROGRESS = r"^step (\d+)/\d+ \[.*workers \{(.*)\}"


@pytest.fixture(scope="module")
def manifest_dir(tmp_path_factory) -> Path:
    return synthetic_run_data(tmp_path_factory.mktemp("faultdata"))


def _steps_seen(run: PsrecRun) -> list[int]:
    return [int(m.group(1)) for m in re.finditer(PROGRESS, run.output, re.M)]


def _per_worker(line_match: re.Match) -> dict[int, int]:
    return {int(k): int(v) for k, v in re.findall(r"(\d+): (\d+)",
                                                  line_match.group(2))}


def _executed(run: PsrecRun) -> int:
    return int(re.search(r"optimizer updates executed: (\d+)",
                         run.output).group(1))


def _role_pid(run: PsrecRun, index: int) -> int:
    """pids in the 'local cluster' line are ordered ps..., worker..."""
    return run.role_pids[index]


@pytest.mark.cluster
@pytest.mark.slow
def test_worker_killed_and_not_restarted_run_completes(tmp_path,
                                                       manifest_dir):
    run = PsrecRun(train_args(tmp_path, manifest_dir,
                               "--no-restart-workers"))
    try:
        run.wait_for(r"^step (7\d|8\d|9\d)/", 240)  # about a quarter
        os.kill(_role_pid(run, 2), signal.SIGKILL)  # worker-1 (after ps-0)
        assert run.wait(300) == 0, run.output[-3000:]
        assert "worker-1 died" in run.output and "not restarted" in run.output
        assert max(_steps_seen(run)) == STEPS
        # at-least-once: a closure lost with the worker ran again elsewhere
        assert _executed(run) >= STEPS
    finally:
        run.kill()
        assert_no_leftovers(run, tmp_path)


@dataclasses.dataclass
class _Faults:
    """What one run with a PS kill and three worker kills showed."""

    run: PsrecRun
    workdir: Path
    last_step: int  # the last step seen before the PS kill
    resumed: re.Match  # "resumed from CHECKPOINT at step N"
    table_sha256: str  # of that checkpoint's table, read before rotation
    back: dict[int, int]  # closures per worker when worker-1 was back
    grown: dict[int, int]  # ... once it had finished closures again
    code: int  # the exit code of the SIGTERM that ended the run


@pytest.fixture(scope="module")
def ps_then_worker_killed(tmp_path_factory, manifest_dir) -> _Faults:
    """One run, one start-up, the faults in turn (CI time): ps-0 SIGKILLed
    after ckpt-100 (the PS budget: 1), then worker-1 SIGKILLed three times
    (the worker budget: 3; the shared one is 0), each time restarted; once
    the restarted worker has finished closures again, SIGTERM ends it.
    Delta checkpoints every 10 steps between full ones every 100: the PS
    loss restores ckpt-100 and its deltas."""
    workdir = tmp_path_factory.mktemp("ps-then-worker")
    run = PsrecRun(train_args(
        workdir, manifest_dir, "--steps", "2000", "--max-restarts", "0",
        "--max-worker-restarts", "3", "--max-ps-restarts", "1",
        "--delta-every", str(DELTA_EVERY), "--full-every", "100"))
    try:
        run.wait_for(r"checkpoint .*ckpt-100$", 300)
        run.wait_for(r"^step 1[2-4]\d/", 120)
        last_step = max(_steps_seen(run))
        os.kill(_role_pid(run, 0), signal.SIGKILL)  # ps-0
        run.wait_for(r"failed role: ps \(ps-0 exited", 60)
        resumed = run.wait_for(r"resumed from (\S+) at step (\d+)", 240)
        table = _table_at(resumed.group(1))
        table_sha256 = hashlib.sha256(
            np.ascontiguousarray(table).tobytes()).hexdigest()
        worker = _role_pid(run, 2)  # worker-1: not restarted with the PS
        for _ in range(3):
            mark = len(run.lines)
            os.kill(worker, signal.SIGKILL)
            worker = int(run.wait_for(r"worker-1 restarted \(pid (\d+)\)",
                                      120, after=mark).group(1))
        mark = len(run.lines)
        back = _per_worker(run.wait_for(PROGRESS, 60, after=mark))
        deadline = time.monotonic() + 120
        grown = back
        while grown.get(1, 0) <= back.get(1, 0):
            assert time.monotonic() < deadline, "worker-1 never worked again"
            mark = len(run.lines)
            grown = _per_worker(run.wait_for(PROGRESS, 60, after=mark))
        run.process.send_signal(signal.SIGTERM)
        code = run.wait(120)
    finally:
        run.kill()
        assert_no_leftovers(run, workdir)
    return _Faults(run, workdir, last_step, resumed, table_sha256, back,
                   grown, code)


def _table_at(link: str) -> np.ndarray:
    """The ``categorical`` table a restore of ``link`` holds: a full
    checkpoint's, or for a delta its full checkpoint's with the rows of
    each delta of the chain up to it written in, read from the files."""
    path = Path(link)
    if path.parent.name != "deltas":
        return tf.train.load_checkpoint(link).get_tensor(TABLE)
    last = json.loads((path / "manifest.json").read_text())
    chain = sorted((m["step"], folder, m) for folder, m in (
        (p, json.loads((p / "manifest.json").read_text()))
        for p in path.parent.iterdir() if (p / "manifest.json").exists())
        if m["full"] == last["full"] and m["step"] <= last["step"])
    table = tf.train.load_checkpoint(
        str(path.parent.parent / last["full"])).get_tensor(TABLE)
    for _, folder, manifest in chain:
        first = 0
        for k in range(len(manifest["parts"])):
            part = manifest["parts"].get(f"{TABLE_KEY}/part_{k}")
            if part is None:
                break
            reader = tf.train.load_checkpoint(str(folder / part["file"]))
            rows = reader.get_tensor(f"{TABLE_KEY}/part_{k}/rows")
            table[rows + first] = reader.get_tensor(f"{TABLE}/part_{k}")
            first += part["shard_rows"]
    return table


@pytest.mark.cluster
@pytest.mark.slow
def test_worker_killed_and_restarted_works_again(ps_then_worker_killed):
    faults = ps_then_worker_killed
    # the restarted worker finished closures after it came back, in the
    # same coordinator session (no coordinator restart for a worker)
    assert faults.grown[1] > faults.back.get(1, 0), (faults.back,
                                                     faults.grown)
    assert len(faults.run.coordinator_pids) == 2  # the first + the PS's
    assert faults.code == 143, faults.run.output[-3000:]


@pytest.mark.cluster
@pytest.mark.slow
def test_ps_killed_supervisor_restores_and_finishes(ps_then_worker_killed):
    faults = ps_then_worker_killed
    resumed_step = int(faults.resumed.group(2))
    # The latest delta, not the latest full checkpoint (ckpt-100): at most
    # one delta interval lost.
    assert "/deltas/delta-" in faults.resumed.group(1)
    assert 100 < resumed_step and 0 <= faults.last_step - resumed_step <= (
        DELTA_EVERY), (faults.last_step, resumed_step)
    assert max(_steps_seen(faults.run)) > faults.last_step  # went on
    # The restored table equals the files' contents (full + deltas).
    report = json.loads((faults.workdir / "restore.json").read_text())
    assert report["table_sha256"]["categorical"] == faults.table_sha256


@pytest.mark.cluster
@pytest.mark.slow
def test_worker_failures_spend_the_worker_budget_only(ps_then_worker_killed):
    out = ps_then_worker_killed.run.output
    assert "ps restart 1/1" in out
    for kill in range(1, 4):
        assert f"worker restart {kill}/3" in out
    assert "giving up" not in out
    assert "ps-0 restarted" in out and out.count("worker-1 restarted") == 3


def _kill_whole_job_then_rerun(tmp_path, manifest_dir, trigger) -> None:
    first = PsrecRun(train_args(tmp_path, manifest_dir))
    try:
        trigger(first)
        first.process.kill()  # the supervisor: its children follow it
        first.wait(30)
        assert_no_leftovers(first, tmp_path)
        latest = tf.train.latest_checkpoint(str(tmp_path / "checkpoints"))
        assert latest is not None
        saved_step = int(latest.rsplit("-", 1)[1])
    finally:
        first.kill()
    again = PsrecRun(train_args(tmp_path, manifest_dir))
    try:
        resumed = again.wait_for(r"resumed from (\S+) at step (\d+)", 240)
        assert resumed.group(1) == latest
        assert int(resumed.group(2)) == saved_step
        assert again.wait(300) == 0, again.output[-3000:]
        steps = _steps_seen(again)
        assert min(steps) > saved_step and max(steps) == STEPS
    finally:
        again.kill()
        assert_no_leftovers(again, tmp_path)


@pytest.mark.cluster
@pytest.mark.slow
def test_coordinator_killed_during_checkpoint_save_rerun_resumes(
        tmp_path, manifest_dir):
    checkpoints = tmp_path / "checkpoints"

    def during_save(run: PsrecRun) -> None:
        run.wait_for(r"checkpoint .*ckpt-50$", 300)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the next save's temp files
            if any(p.name.endswith("_temp") for p in checkpoints.iterdir()):
                return
        raise AssertionError("never saw a checkpoint being written")

    _kill_whole_job_then_rerun(tmp_path, manifest_dir, during_save)


@pytest.mark.cluster
@pytest.mark.slow
def test_stalled_worker_trips_watchdog_and_stays_down_without_restarts(
        tmp_path, manifest_dir):
    """A frozen worker: the coordinator's watchdog exits 138 with stacks;
    under --no-restart-workers the worker is not restarted (it is killed)
    and the coordinator restarts on the other one; with no worker left the
    job stops with one line (exit 138)."""
    timeout = 12
    run = PsrecRun(train_args(tmp_path, manifest_dir, "--stall-timeout",
                               str(timeout), "--no-restart-workers",
                               "--steps", "2000"))
    stopped = None
    try:
        run.wait_for(r"^step (4\d|5\d|6\d)/", 240)
        stopped = _role_pid(run, 2)
        os.kill(stopped, signal.SIGSTOP)
        began = time.monotonic()
        run.wait_for(r"failed role: worker \(worker-1 is frozen.*worker-1 "
                     r"not restarted \(--no-restart-workers\); restarting "
                     r"the coordinator on the 1 remaining", timeout + 120)
        fired = run.time_of("psrec watchdog: no training progress")
        assert fired - began <= timeout + 60
        assert "Python stacks of the coordinator" in run.output
        assert "closure(s) scheduled and not collected" in run.output
        assert not pid_alive(stopped)  # killed, not left frozen
        mark = len(run.lines)
        progress = run.wait_for(PROGRESS, 240, after=mark)  # on worker-0
        assert set(_per_worker(progress)) == {0}, progress.group(0)
        assert len(run.coordinator_pids) == 2
        os.kill(_role_pid(run, 1), signal.SIGKILL)  # the last worker
        assert run.wait(120) == 138, run.output[-3000:]
        assert "no worker left" in run.output
        assert "worker-1 restarted" not in run.output
    finally:
        if stopped and pid_alive(stopped):
            os.kill(stopped, signal.SIGCONT)
        run.kill()
        assert_no_leftovers(run, tmp_path)


def _copy_manifest_dir(src: Path, dst: Path) -> Path:
    import shutil
    shutil.copytree(src, dst)
    return dst


def _flip_byte_in_record(path: Path, record: int) -> None:
    """Flips one data byte of the ``record``-th record (framing intact)."""
    data = bytearray(path.read_bytes())
    offset = 0
    for _ in range(record):
        length = int.from_bytes(data[offset:offset + 8], "little")
        offset += 12 + length + 4
    length = int.from_bytes(data[offset:offset + 8], "little")
    data[offset + 12 + length // 2] ^= 0x40
    path.write_bytes(bytes(data))


def _corrupt_three_records(data: Path) -> None:
    """One record of shard 0 and two of shard 3."""
    _flip_byte_in_record(data / "train-00000-of-00004.tfrecord", 1)
    _flip_byte_in_record(data / "train-00003-of-00004.tfrecord", 4)
    _flip_byte_in_record(data / "train-00003-of-00004.tfrecord", 7)


def test_wrong_sha256_in_manifest_is_refused_before_servers(
        tmp_path, manifest_dir, capsys, monkeypatch):
    """In-process: the check is data preparation's, before any server
    (starting one raises :class:`Reached`)."""
    from psrec.launch.cli.main import main
    data = _copy_manifest_dir(manifest_dir, tmp_path / "data")
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["shards"]["train"][1]["sha256"] = "0" * 64
    (data / "manifest.json").write_text(json.dumps(manifest))
    forbid(monkeypatch, data=False)
    assert main(train_args(tmp_path / "work", data)) == 2
    captured = capsys.readouterr()
    [line] = [x for x in captured.err.splitlines()
              if x.startswith("psrec")]
    assert "train-00001-of-00004.tfrecord" in line, line
    assert "sha256" in line, line
    assert "Traceback" not in captured.err


@pytest.mark.cluster
@pytest.mark.slow
def test_corrupted_record_during_training_names_the_file(tmp_path,
                                                         manifest_dir):
    data = _copy_manifest_dir(manifest_dir, tmp_path / "data")
    bad = data / "train-00002-of-00004.tfrecord"
    _flip_byte_in_record(bad, 3)
    run = PsrecRun(train_args(tmp_path / "work", data,
                               "--no-verify-checksums"))
    try:
        assert run.wait(300) == 1, run.output[-3000:]
        assert f"corrupted TFRecord file {bad}" in run.output
    finally:
        run.kill()
        assert_no_leftovers(run, tmp_path)


@pytest.mark.cluster
@pytest.mark.slow
def test_bounded_skip_counts_exactly_the_corrupted_records(tmp_path,
                                                           manifest_dir):
    data = _copy_manifest_dir(manifest_dir, tmp_path / "data")
    _corrupt_three_records(data)
    run = PsrecRun(train_args(tmp_path / "w2", data, "--max-corrupt-records",
                               "3", "--steps", "60"))
    try:
        assert run.wait(300) == 0, run.output[-3000:]
        assert "skipped 3 corrupted record(s)" in run.output
        assert re.search(r"train-00003-of-00004.tfrecord: 2 corrupted",
                         run.output)
        rows = Manifest.load(manifest_dir).block_rows
        repaired = tmp_path / "w2" / "repaired" / "train-00003-of-00004.tfrecord"
        original = sum(1 for _ in tf.data.TFRecordDataset(
            str(manifest_dir / "train-00003-of-00004.tfrecord")))
        assert sum(1 for _ in tf.data.TFRecordDataset(str(repaired))) == \
            original - 2
        assert rows > 0
    finally:
        run.kill()
        assert_no_leftovers(run, tmp_path)


def test_more_corrupted_records_than_allowed_are_refused_before_servers(
        tmp_path, manifest_dir, capsys, monkeypatch):
    """The refused half of the bounded skip, in-process: three corrupted
    records against --max-corrupt-records 2 stop data preparation before
    any server (starting one raises :class:`Reached`)."""
    from psrec.launch.cli.main import main
    data = _copy_manifest_dir(manifest_dir, tmp_path / "data")
    _corrupt_three_records(data)
    forbid(monkeypatch, data=False)
    assert main(train_args(tmp_path / "w1", data,
                           "--max-corrupt-records", "2")) == 2
    captured = capsys.readouterr()
    assert ("3 corrupted record(s) found, above --max-corrupt-records 2"
            in captured.err), captured.err[-3000:]
    assert "Traceback" not in captured.err


def test_non_loopback_cluster_refused_without_allow_remote(
        tmp_path, manifest_dir, capsys, monkeypatch):
    """In-process: the cluster check comes before the data and any job
    (reaching either raises :class:`Reached`)."""
    from psrec.launch.cli.main import main
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"ps": ["10.0.0.5:2222"],
                                   "worker": ["10.0.0.6:2222"]}))
    forbid(monkeypatch)
    assert main(train_args(tmp_path / "w", manifest_dir, "--cluster",
                           str(cluster))) == 2
    captured = capsys.readouterr()
    assert "needs `--allow-remote`" in captured.err, captured.err[-3000:]
    assert "coordinating existing cluster" not in captured.out + captured.err
    assert main(["tf-config", "--ps-hosts", "10.0.0.5:2222",
                 "--worker-hosts", "10.0.0.6:2222", "--allow-remote"]) == 0
    captured = capsys.readouterr()
    assert "unauthenticated" in captured.out + captured.err
    assert '"ps":["10.0.0.5:2222"]' in captured.out + captured.err
