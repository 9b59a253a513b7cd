"""A workdir belongs to one job, trained by one ``psrec train`` at a time:
another job's request is refused before anything is written or started,
and so is a second run while a live process holds the workdir's lock."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys

import pytest

from psrec.launch.job.config import JobConfig
from psrec.launch.job.workdir import LOCK_FILE
from psrec.launch.job.workdir import job_differences
from psrec.launch.job.workdir import lock_holder
from psrec.launch.job.workdir import workdir_lock
from tests._forbid import Reached
from tests._forbid import forbid


def _record_job(workdir, monkeypatch, *flags) -> list:
    """A workdir as a ``psrec train`` run leaves it: the job the CLI builds
    from ``flags`` recorded in ``checkpoints/job.json``, beside a
    checkpoint's files. Returns the seams' list (emptied)."""
    from psrec.launch.cli.main import main
    seen = forbid(monkeypatch)
    with pytest.raises(Reached):  # the check passes on an empty workdir
        main(["train", "--workdir", str(workdir), *flags])
    [config] = seen
    config.write(config.checkpoint_dir)
    (config.checkpoint_dir / "ckpt-200.index").write_bytes(b"dcn tables")
    (config.checkpoint_dir / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-200"\n')
    seen.clear()
    return seen


def _hashes(folder) -> dict[str, str]:
    return {str(path.relative_to(folder)): hashlib.sha256(
        path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*")) if path.is_file()}


def test_another_model_in_a_dcn_workdir_is_refused_before_anything(
        tmp_path, capsys, monkeypatch):
    from psrec.launch.cli.main import main
    workdir = tmp_path / "criteo"
    seen = _record_job(workdir, monkeypatch, "--model", "dcn",
                       "--allow-exposed")
    before = _hashes(workdir)
    assert "checkpoints/job.json" in before
    capsys.readouterr()
    code = main(["train", "--workdir", str(workdir), "--model", "deepfm",
                 "--allow-exposed"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"psrec train: error: {workdir} holds another "
                             "job ("), err[0]
    assert "`--model` recorded 'dcn', requested 'deepfm'" in err[0], err[0]
    assert "another `--workdir`" in err[0], err[0]
    assert "resume the recorded one with `--model` = 'dcn'" in err[0]
    assert seen == []  # no data prepared, no server, no supervisor
    assert _hashes(workdir) == before  # nothing written, job.json included


def test_a_resume_may_change_its_steps_and_cadence(tmp_path, monkeypatch):
    from psrec.launch.cli.main import main
    workdir = tmp_path / "run"
    seen = _record_job(workdir, monkeypatch, "--strategy", "one-device")
    with pytest.raises(Reached):
        main(["train", "--workdir", str(workdir), "--strategy", "one-device",
              "--steps", "800", "--eval-every", "100", "--log-every", "5",
              "--dense-lr", "0.01", "--batch-size", "64"])
    [config] = seen
    assert config.loop.steps == 800


@pytest.mark.parametrize("flags, field", [
    (("--cross-low-rank", "4"), "`ModelConfig.cross_low_rank` recorded None"),
    (("--sparse-optimizer", "ftrl"),
     "`--sparse-optimizer` recorded 'adagrad', requested 'ftrl'"),
    (("--synthetic-rows", "1000"),
     "`--synthetic-rows` recorded 250000, requested 1000"),
    (("--spec", "movielens"), "`--spec` recorded 'criteo' (fingerprint "),
])
def test_each_identity_field_is_named(tmp_path, capsys, monkeypatch, flags,
                                      field):
    from psrec.launch.cli.main import main
    workdir = tmp_path / "run"
    seen = _record_job(workdir, monkeypatch, "--strategy", "one-device")
    before = _hashes(workdir)
    capsys.readouterr()
    code = main(["train", "--workdir", str(workdir), "--strategy",
                 "one-device", *flags])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert field.replace("`ModelConfig.cross_low_rank`",
                         "`--cross-low-rank`") in err[0], err[0]
    assert seen == [] and _hashes(workdir) == before


def test_the_data_is_the_folder_a_job_reads(tmp_path):
    data = tmp_path / "data" / "tfrecord"
    recorded = JobConfig(workdir=tmp_path / "run", data=data).to_dict()
    recorded["data"] = str(data)
    same = JobConfig(workdir=tmp_path / "run", data=data / "manifest.json")
    assert job_differences(recorded, same) == []
    other = JobConfig(workdir=tmp_path / "run", data=tmp_path / "other")
    [(name, before, after)] = job_differences(recorded, other)
    assert name == "JobConfig.data"
    assert (before, after) == (repr(str(data)),
                               repr(str(tmp_path / "other")))
    generated = JobConfig(workdir=tmp_path / "run")
    assert job_differences(generated.to_dict(), JobConfig(
        workdir=tmp_path / "run", data=tmp_path / "run/data/tfrecord")) == []


_HOLD = """
import sys
from psrec.launch.job.config import JobConfig
from psrec.launch.job.workdir import workdir_lock
with workdir_lock(JobConfig(workdir=sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def holder(tmp_path):
    """Another OS process holding ``tmp_path / 'run'``'s lock as ``psrec
    train`` takes it; killed at the end."""
    child = subprocess.Popen(
        [sys.executable, "-P", "-c", _HOLD, str(tmp_path / "run")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "held\n"
        yield child
    finally:
        child.kill()
        child.wait()


def test_a_second_train_on_a_held_workdir_is_refused_naming_the_pid(
        tmp_path, capsys, monkeypatch, holder):
    from psrec.launch.cli.main import main
    seen = forbid(monkeypatch)
    workdir = tmp_path / "run"
    before = _hashes(workdir)
    code = main(["train", "--workdir", str(workdir), "--strategy",
                 "one-device"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"psrec train: error: {workdir} is in use by "
                             f"another psrec train (pid {holder.pid}, "), err
    assert seen == [] and _hashes(workdir) == before


def test_the_lock_is_released_when_its_holder_dies(tmp_path, monkeypatch,
                                                   holder):
    from psrec.launch.cli.main import main
    seen = forbid(monkeypatch)
    lock = tmp_path / "run" / LOCK_FILE
    holder.send_signal(signal.SIGKILL)  # no clean-up: its pid stays written
    holder.wait()
    assert lock_holder(lock) == holder.pid
    with pytest.raises(Reached):  # past the lock, on to the data
        main(["train", "--workdir", str(tmp_path / "run"), "--strategy",
              "one-device"])
    assert len(seen) == 1
    with workdir_lock(JobConfig(workdir=tmp_path / "run")):
        assert lock_holder(lock) == os.getpid()
    assert lock_holder(lock) is None  # released cleanly: no stale pid


def test_a_non_chief_worker_named_by_tf_config_takes_no_lock(
        tmp_path, monkeypatch, holder):
    """The workers of one multi-worker-mirrored job share its workdir: only
    the chief holds it."""
    from psrec.launch.cli.main import main
    seen = forbid(monkeypatch)
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1", '
                       '"127.0.0.1:2"]}, "task": {"type": "worker", '
                       '"index": 1}}')
    with pytest.raises(Reached):
        main(["train", "--workdir", str(tmp_path / "run"), "--strategy",
              "multi-worker-mirrored"])
    assert len(seen) == 1
