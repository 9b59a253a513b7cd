"""Supervision that cannot be blocked: the heartbeat watchdog, the connect
timeout, per-role restart budgets and a graceful SIGTERM.

Real processes (supervisor + PS + workers + coordinator), real signals.
"""

import json
import os
import re
import signal
import socket
from pathlib import Path

import pytest
import tensorflow as tf

from tests._fault_data import STEPS
from tests._fault_data import synthetic_run_data
from tests._fault_data import train_args
from tests._proc import PsrecRun
from tests._proc import assert_no_leftovers
from tests._proc import pid_alive

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PROGRESS = r"^step (\d+)/\d+ \["


@pytest.fixture(scope="module")
def manifest_dir(tmp_path_factory) -> Path:
    return synthetic_run_data(tmp_path_factory.mktemp("watchdata"))


def _past_first_checkpoint(run: PsrecRun) -> None:
    """Waits until the run has saved ckpt-50 and trained on past it."""
    run.wait_for(r"checkpoint .*ckpt-50$", 300)
    run.wait_for(r"^step (7\d|8\d)/", 120)


def _steps_seen(run: PsrecRun, after: int = 0) -> list[int]:
    return [int(m.group(1)) for _, line in run.lines[after:]
            for m in [re.search(PROGRESS, line)] if m]


def test_frozen_coordinator_is_detected_killed_and_restarted(tmp_path,
                                                            manifest_dir):
    timeout = 15
    run = PsrecRun(train_args(tmp_path, manifest_dir, "--stall-timeout",
                               str(timeout)))
    frozen = None
    try:
        _past_first_checkpoint(run)
        frozen = run.coordinator_pids[-1]
        os.kill(frozen, signal.SIGSTOP)  # its own watchdog cannot run now
        stall = run.wait_for(
            r"psrec supervisor: stall: .*phase (\w+), last step (\d+).*"
            r"frozen processes: coordinator", timeout + 60)
        assert stall.group(1) in ("training", "checkpoint", "eval")
        # at most one heartbeat interval behind the last progress line
        assert int(stall.group(2)) >= 50
        run.wait_for(r"failed role: coordinator \(stalled in phase", 30)
        resumed = run.wait_for(r"resumed from (\S+) at step (\d+)", 240)
        assert run.wait(300) == 0, run.output[-3000:]
        assert int(resumed.group(2)) >= 50
        assert max(_steps_seen(run)) == STEPS
        assert "ps-0 restarted" not in run.output  # only what failed
    finally:
        if frozen and pid_alive(frozen):
            os.kill(frozen, signal.SIGKILL)
        run.kill()
        assert_no_leftovers(run, tmp_path)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_cluster_not_up_fails_naming_the_unreachable_tasks(tmp_path,
                                                           manifest_dir):
    ps, worker = _free_port(), _free_port()
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"ps": [f"127.0.0.1:{ps}"],
                                   "worker": [f"127.0.0.1:{worker}"]}))
    run = PsrecRun(train_args(tmp_path / "w", manifest_dir, "--cluster",
                               str(cluster), "--connect-timeout", "5",
                               "--stall-timeout", "30"))
    try:
        code = run.wait(120)  # not the 300 s silent hang of before
        assert code == 138, run.output[-3000:]
        assert f"ps-0 (127.0.0.1:{ps})" in run.output
        assert f"worker-0 (127.0.0.1:{worker})" in run.output
        assert "--connect-timeout 5" in run.output
    finally:
        run.kill()
        assert_no_leftovers(run, tmp_path)


def test_sigterm_saves_a_checkpoint_and_prints_one_line(tmp_path,
                                                        manifest_dir):
    # No boundary (checkpoint, eval) near the signal: the save is its own.
    run = PsrecRun(train_args(tmp_path, manifest_dir, "--steps", "2000",
                               "--checkpoint-every", "1000"))
    try:
        run.wait_for(r"^step (7\d|8\d)/", 300)
        seen = len(run.lines)
        before = max(_steps_seen(run))
        os.kill(run.process.pid, signal.SIGTERM)
        code = run.wait(120)
        assert code == 143, run.output[-3000:]
        # stdout's progress and boundary lines of the steps still running
        # aside, one line: the coordinator's.
        after = [line for _, line in run.lines[seen:]
                 if not re.match(r"step \d+", line)]
        assert len(after) == 1, after
        saved = re.search(r"terminated \(SIGTERM\): checkpoint (\S+) at step "
                          r"(\d+)", after[0])
        assert saved, after
        step = int(saved.group(2))
        assert step >= before  # the step reached, not an older save
        latest = tf.train.latest_checkpoint(str(tmp_path / "checkpoints"))
        assert latest == saved.group(1)
        assert latest.endswith(f"-{step}")
        reader = tf.train.load_checkpoint(latest)
        keys = [k for k in reader.get_variable_to_shape_map()
                if k.endswith("progress/step/.ATTRIBUTES/VARIABLE_VALUE")]
        assert len(keys) == 1 and reader.get_tensor(keys[0]) == step, keys
    finally:
        run.kill()
        assert_no_leftovers(run, tmp_path)
