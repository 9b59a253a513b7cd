"""``psrec train --follow``: test, then train each partition of a
partitioned log, exactly once across crashes.

The state protocol (plain Python) is tested on its own; the loop runs for
real: one run with real OS processes (supervisor, PS, worker, coordinator)
whose coordinator is SIGKILLed in the middle of a partition, and one
one-device run (in the test's process) that exports each partition and
is rerun with --once as a batch scheduler would.
"""

import dataclasses
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client import generate_latest

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.ingest.synthetic import write_synthetic_parquet
from psrec.features import criteo
from psrec.launch.job.follow_state import FollowState
from psrec.launch.job.follow_state import FollowStateError
from psrec.launch.job.follow_state import PartitionRecord
from psrec.launch.job.follow_state import pending
from psrec.launch.monitor.heartbeat import heartbeat_path
from psrec.launch.monitor.metrics_http import HeartbeatCollector
from psrec.ps_cluster.training.loop import steps_per_epoch
from tests._proc import PsrecRun
from tests._proc import assert_no_leftovers
from tests._proc import run_psrec

BATCH = 64
ROWS = 2500  # per partition; 20% eval
DAYS = ("dt=2026-12-01", "dt=2026-12-02", "dt=2026-12-03")


def _partition(log: Path, name: str, seed: int, shards: int = 2) -> Path:
    spec = criteo()
    raw = log.parent / "raw" / name
    files = write_synthetic_parquet(spec, raw, ROWS, files=1, seed=seed)
    convert(files, spec, log / name,
            ConversionOptions(shards=shards, eval_fraction=0.2))
    return log / name


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> Path:
    """Three converted partitions and an unfinished fourth (Parquet, no
    manifest: not ready)."""
    root = tmp_path_factory.mktemp("follow") / "log"
    for seed, name in enumerate(DAYS):
        _partition(root, name, seed)
    write_synthetic_parquet(criteo(), root / "dt=2026-12-04", 10, files=1)
    return root


def _train_steps() -> int:
    train_rows = ROWS - int(ROWS * 0.2)
    return steps_per_epoch(train_rows, BATCH)


def _record(name: str, phase: str, start: int, end: int) -> PartitionRecord:
    return PartitionRecord(partition=name, phase=phase, rows=10,
                           test={"auc": 0.6}, eval_step=start,
                           start_step=start, end_step=end, began=0.0)


def test_state_and_checkpoint_must_agree(tmp_path):
    state = FollowState(dir="log")
    state.check_step(0, "f")  # a new run
    with pytest.raises(FollowStateError, match="step 5"):
        state.check_step(5, "f")  # a checkpoint the state never saw
    training = state.with_current(_record("a", "train", 0, 20))
    for step in (0, 7, 20):  # a crash anywhere within the partition
        training.check_step(step, "f")
    with pytest.raises(FollowStateError, match=r"\[0, 20\]"):
        training.check_step(21, "f")
    exporting = state.with_current(_record("a", "export", 0, 20))
    exporting.check_step(20, "f")
    with pytest.raises(FollowStateError, match="rolled back"):
        exporting.check_step(10, "f")  # the checkpoint folder went back
    done = state.with_done(_record("a", "done", 0, 20))
    done.check_step(20, "f")
    with pytest.raises(FollowStateError):
        done.check_step(15, "f")
    # the file round trip keeps every field
    done.with_current(_record("b", "train", 20, 40)).save(tmp_path)
    again = FollowState.load(tmp_path, "log")
    assert again.done == done.done and again.current.partition == "b"
    assert json.loads((tmp_path / "follow.json").read_text())["done"][0][
        "steps"] == 20


def test_what_follow_excludes_is_refused_naming_the_field():
    from psrec.errors import ConfigError
    from psrec.launch.job.config import FollowConfig
    from psrec.launch.job.config import JobConfig
    from psrec.launch.job.config import StrategyConfig
    from psrec.ps_cluster.training.config import LoopConfig
    with pytest.raises(ConfigError, match="FollowConfig.once"):
        FollowConfig(once=True)  # without a folder
    with pytest.raises(ConfigError, match="FollowConfig.until"):
        FollowConfig(dir="logs", until="../dt=1")
    follow = FollowConfig(dir="logs", once=True)
    with pytest.raises(ConfigError, match="JobConfig.data"):
        JobConfig(follow=follow, data=Path("data"))
    with pytest.raises(ConfigError, match="LoopConfig.steps"):
        JobConfig(follow=follow, loop=LoopConfig(steps=100))
    with pytest.raises(ConfigError, match="JobConfig.plots"):
        JobConfig(follow=follow, plots=True)
    with pytest.raises(ConfigError, match="ps / mirrored / one-device"):
        JobConfig(follow=follow,
                  strategy=StrategyConfig(kind="multi-worker-mirrored"))
    assert JobConfig(follow=follow).follow.active  # the job's defaults fit


def test_the_followed_folder_is_part_of_the_workdirs_job(tmp_path):
    """A workdir that trained on --data, or followed another folder, holds
    another job than a --follow run (named by its flag's field)."""
    from psrec.launch.job.config import FollowConfig
    from psrec.launch.job.config import JobConfig
    from psrec.launch.job.workdir import job_differences
    follow = JobConfig(workdir=tmp_path, follow=FollowConfig(dir="logs"))
    data_job = JobConfig(workdir=tmp_path, data=Path("data")).to_dict()
    assert "FollowConfig.dir" in [d[0] for d in job_differences(data_job,
                                                                follow)]
    other = JobConfig(workdir=tmp_path, follow=FollowConfig(dir="other"))
    assert [d[0] for d in job_differences(other.to_dict(), follow)] == [
        "FollowConfig.dir"]
    again = JobConfig(workdir=tmp_path, follow=FollowConfig(
        dir="logs", once=True, poll_seconds=5.0))  # how, not what
    assert job_differences(again.to_dict(), follow) == []


def test_an_export_left_by_a_crash_is_found_not_repeated(tmp_path):
    """A crash between a partition's export and its state write: the
    rerun takes the version whose psrec_export.json names the
    partition's checkpoint."""
    from psrec.launch.job.follow import published_from
    for version, step in ((1, 20), (2, 40)):
        folder = tmp_path / "export" / str(version)
        folder.mkdir(parents=True)
        (folder / "psrec_export.json").write_text(json.dumps(
            {"checkpoint": f"/w/checkpoints/ckpt-{step}"}))
    assert published_from(tmp_path / "export", "ckpt-40") == 2
    assert published_from(tmp_path / "export", "ckpt-4") is None
    assert published_from(tmp_path / "nothing", "ckpt-40") is None


def test_partitions_in_name_order_up_to_the_first_not_ready(log):
    ready, waiting = pending(log, set())
    assert [p.name for p in ready] == list(DAYS)
    assert waiting.name == "dt=2026-12-04"
    assert "Parquet" in waiting.describe_waiting()
    ready, waiting = pending(log, {DAYS[0], DAYS[1]})
    assert [p.name for p in ready] == [DAYS[2]]


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    import tensorflow as tf
    tags: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "scalars":
                    tags.setdefault(value.tag, []).append(
                        (event.step, float(tf.make_ndarray(value.tensor))))
    return {k: sorted(v) for k, v in tags.items()}


def _state(workdir: Path) -> dict:
    return json.loads((workdir / "checkpoints" / "follow.json").read_text())


@pytest.mark.cluster
@pytest.mark.slow
def test_follow_killed_mid_partition_resumes_it_exactly_once(tmp_path, log):
    """The coordinator is SIGKILLed after a checkpoint in the middle of the
    second partition; the supervisor restarts it, it resumes that partition
    from the checkpoint without testing it again, and every partition is
    trained exactly once: its recorded steps are one pass, the steps add
    up, each was tested once at the step the previous one ended."""
    per_partition = _train_steps()
    mid = ((per_partition + 5) // 5 + 1) * 5  # a save within the second
    workdir = tmp_path / "w"
    run = PsrecRun([
        "train", "--follow", log, "--follow-until", DAYS[2],
        "--workdir", workdir, "--workers", "1", "--batch-size", BATCH,
        "--steps-per-closure", "1", "--checkpoint-every", "5",
        "--log-every", "5", "--no-export", "--keep-checkpoints", "20",
        "--max-restarts", "1"])
    try:
        run.wait_for(rf"checkpoint .*ckpt-{mid}$", 300)
        os.kill(run.coordinator_pids[-1], signal.SIGKILL)
        killed = _state(workdir)["current"]
        assert killed["partition"] == DAYS[1] and killed["phase"] == "train"
        resumed = run.wait_for(r"resumed from \S+ at step (\d+)", 240)
        assert killed["start_step"] < int(resumed.group(1)) < (
            killed["end_step"])
        run.wait_for(rf"follow: resuming partition {DAYS[1]} \(phase "
                     r"train\)", 60)
        assert run.wait(300) == 0, run.output[-3000:]
    finally:
        run.kill()
        assert_no_leftovers(run, workdir)
    state = _state(workdir)
    assert state["current"] is None
    assert [r["partition"] for r in state["done"]] == list(DAYS)
    end = 0
    for record in state["done"]:
        assert record["steps"] == per_partition, record
        assert record["start_step"] == record["eval_step"] == end
        assert record["test"]["count"] == ROWS  # every row, before training
        end = record["end_step"]
    for day in DAYS:  # tested once each, the killed one included
        assert len(re.findall(rf"follow: partition {day}: test before",
                              run.output)) == 1
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["step"] == end == 3 * per_partition
    assert [r["partition"] for r in summary["partitions"]] == list(DAYS)
    # /metrics: what the heartbeat says of the last partition
    registry = CollectorRegistry()
    registry.register(HeartbeatCollector(heartbeat_path(workdir)))
    text = generate_latest(registry).decode()
    assert "psrec_follow_partitions_total 3.0" in text
    auc = float(re.search(r"^psrec_follow_test_auc (\S+)$", text,
                          re.M).group(1))
    assert auc == pytest.approx(state["done"][-1]["test"]["auc"])


@pytest.mark.slow
def test_once_exports_each_partition_and_a_rerun_trains_only_new_ones(
        tmp_path, log):
    """One device, in this process (the job of `--once`): the ready
    partition is processed, then the job ends, one export version per
    partition; a rerun after a new partition arrived tests and trains that
    one only; `psrec train` following another folder from this workdir is
    refused before anything starts."""
    from psrec.data.input.config import InputConfig
    from psrec.launch.job.config import FollowConfig
    from psrec.launch.job.config import JobConfig
    from psrec.launch.job.config import StrategyConfig
    from psrec.launch.job.run import run_job
    own = tmp_path / "log"
    own.mkdir()
    os.symlink(log / DAYS[0], own / DAYS[0])
    workdir = tmp_path / "w"
    config = JobConfig(  # in this process: one device, as --once would
        workdir=workdir, spec=criteo(),
        strategy=StrategyConfig(kind="one-device"),
        input=InputConfig(batch_size=BATCH),
        loop=dataclasses.replace(JobConfig().loop, group_by="C1"),
        follow=FollowConfig(dir=str(own), once=True))
    run_job(config, log=lambda line: None)
    os.symlink(log / DAYS[1], own / DAYS[1])
    second: list[str] = []
    run_job(config, log=second.append)
    assert re.findall(r"partition (\S+): test before train",
                      "\n".join(second)) == [DAYS[1]]
    summary = json.loads((workdir / "summary.json").read_text())
    assert [r["partition"] for r in summary["partitions"]] == list(DAYS[:2])
    assert [r["export_version"] for r in summary["partitions"]] == [1, 2]
    assert summary["partitions"][1]["start_step"] == _train_steps()
    assert all(0 < r["test"]["gauc"] < 1 for r in summary["partitions"])
    info = json.loads((workdir / "export" / "2" / "psrec_export.json")
                      .read_text())
    assert info["checkpoint"].endswith(f"ckpt-{2 * _train_steps()}")
    tags = _scalars(workdir / "tensorboard" / "follow")
    assert tags["follow/test_auc"] == [
        (i + 1, pytest.approx(r["test"]["auc"]))
        for i, r in enumerate(summary["partitions"])]
    assert [v for _, v in tags["follow/export_version"]] == [1, 2]
    began = time.monotonic()
    code, other = run_psrec([
        "train", "--strategy", "one-device", "--follow", log, "--once",
        "--workdir", workdir], 120)
    assert code == 2 and "another job" in other.output
    assert "--follow" in other.output and "FollowConfig" not in other.output
    assert time.monotonic() - began < 60  # refused before any server
