"""``--checkpoint-writers``: who writes and reads checkpoint files, and the
proof, before training, that every PS task sees the folder it would write.

The positive cases run on the session's in-process cluster (2 PS, whose
servers share this process and its file systems, ``ram://`` included). The
negative case is real: ``psrec train`` coordinating ``psrec server``
processes with a ``ram://`` workdir, which is per process, so the PS cannot
see what the coordinator writes there.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid

import numpy as np
import pytest
import tensorflow as tf

from psrec.data.input.config import InputConfig
from psrec.errors import ConfigError
from psrec.features.spec.presets import criteo
from psrec.launch.job.config import JobConfig
from psrec.models.embedding import table_init
from psrec.models.ranking.config import ModelConfig
from psrec.ps_cluster.checkpoint import writers as checkpoint_writers
from psrec.ps_cluster.checkpoint.keeper import compare_with_checkpoint
from psrec.ps_cluster.checkpoint.save import COORDINATOR_CPU
from psrec.ps_cluster.checkpoint.save import save_options
from psrec.ps_cluster.cluster.partition_config import PartitionConfig
from psrec.ps_cluster.cluster.strategy import build_ps_strategy
from psrec.ps_cluster.training.trainer import Trainer
from psrec.runtime import role_environment
from tests._proc import REPO
from tests._proc import kill_pids
from tests._proc import one_ps_one_worker_configs

SPEC = criteo(buckets=200, dim=4)
TABLE = "model/sparse_arch/categorical/.ATTRIBUTES/VARIABLE_VALUE"


def _trainer(cluster, directory, writers: str) -> Trainer:
    return Trainer(build_ps_strategy(cluster, PartitionConfig(kind="fixed")),
                   SPEC, ModelConfig(interaction="concat", top_mlp=(4,)),
                   input_config=InputConfig(batch_size=16),
                   checkpoint_dir=directory, checkpoint_writers=writers)


def _scramble(trainer: Trainer, seed: int) -> None:
    """Values no fresh model has, in every shard of the table and slot."""
    rng = np.random.default_rng(seed)
    table = trainer.model.sparse_arch.tables["categorical"]
    for shard in table.variables:
        slot = trainer.sparse_optimizer.get_slot(shard, "accumulator")
        for variable in (shard, slot):
            table_init.assign_rows(variable, 0, tf.constant(
                rng.random(variable.shape, np.float32)))


def _probes(folder) -> list[str]:
    return [name for name in tf.io.gfile.listdir(str(folder))
            if name.startswith(checkpoint_writers.PROBE_PREFIX)]


@pytest.mark.cluster
@pytest.mark.parametrize("folder", ["path", "ram"])
def test_tasks_write_their_shards_wherever_the_folder_is(
        ps_cluster, tmp_path, folder):
    directory = (tmp_path / "ckpt" if folder == "path"
                 else f"ram://psrec-{uuid.uuid4().hex[:8]}/ckpt")
    trainer = _trainer(ps_cluster, directory, "tasks")
    keeper = trainer.keeper
    assert keeper.tasks_write  # also on ram://, which auto never trusts
    assert checkpoint_writers.ps_devices(trainer.strategy) == [
        "/job:ps/replica:0/task:0/device:CPU:0",
        "/job:ps/replica:0/task:1/device:CPU:0"]  # each was probed
    assert save_options(True).experimental_io_device is None
    assert not tf.io.gfile.exists(str(directory))  # probed, then removed
    _scramble(trainer, 1)
    path = trainer.save()
    saved = tf.compat.v1.train.NewCheckpointReader(path).get_tensor(TABLE)
    assert _probes(directory) == []
    _scramble(trainer, 2)
    assert compare_with_checkpoint(trainer.checkpoint, path) != []
    assert keeper.restore(path) == path  # read and checked on each PS
    table = trainer.model.sparse_arch.tables["categorical"]
    assert np.array_equal(table.numpy(), saved)


@pytest.mark.cluster
def test_coordinator_writes_even_where_the_tasks_could(ps_cluster, tmp_path):
    trainer = _trainer(ps_cluster, tmp_path / "ckpt", "coordinator")
    assert not trainer.keeper.tasks_write
    assert save_options(False).experimental_io_device == COORDINATOR_CPU
    auto = _trainer(ps_cluster, tmp_path / "auto", "auto")
    assert auto.keeper.tasks_write  # every task on this host, a local path
    assert not _trainer(ps_cluster, "ram://x/auto", "auto").keeper.tasks_write


@pytest.mark.cluster
def test_an_unreachable_ps_is_retryable_not_a_folder_it_does_not_see(
        ps_cluster, tmp_path, monkeypatch):
    def unreachable(device, path):
        raise tf.errors.UnavailableError(None, None, "Socket closed")

    monkeypatch.setattr(checkpoint_writers, "_read_on", unreachable)
    strategy = build_ps_strategy(ps_cluster, PartitionConfig())
    with pytest.raises(tf.errors.UnavailableError):
        checkpoint_writers.check_tasks_see_folder(strategy, tmp_path / "c",
                                                  "tasks")
    assert not (tmp_path / "c").exists()  # probe and folder removed


def test_the_flag_offers_the_writers_the_job_knows():
    # (The job config's codec and refusals: tests/test_job_config.py.)
    from psrec.launch.cli.main import build_parser
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    flag = next(a for a in train._actions
                if "--checkpoint-writers" in a.option_strings)
    assert tuple(flag.choices) == checkpoint_writers.WRITERS
    with pytest.raises(ConfigError,
                       match="JobConfig.checkpoint_writers"):
        JobConfig(checkpoint_writers="everyone")


@pytest.mark.slow
@pytest.mark.cluster
def test_a_ps_that_does_not_see_the_folder_stops_the_job_before_step_1(
        tmp_path):
    configs, _ = one_ps_one_worker_configs()
    servers = []
    try:
        for key in (("ps", 0), ("worker", 0)):
            servers.append(subprocess.Popen(
                [sys.executable, "-m", "psrec", "server"], cwd=REPO,
                env=dict(role_environment(), TF_CONFIG=configs[key]),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        # No wait for the servers: `psrec train` waits for every port.
        workdir = f"ram://psrec-{uuid.uuid4().hex[:8]}/run"
        done = subprocess.run(
            [sys.executable, "-m", "psrec", "train", "--workers", "1",
             "--steps", "5", "--batch-size", "32", "--synthetic-rows",
             "2000", "--spec", "criteo", "--workdir", workdir,
             "--checkpoint-writers", "tasks", "--no-export"],
            cwd=REPO, env=dict(role_environment(),
                               TF_CONFIG=configs[("chief", 0)]),
            capture_output=True, text=True, timeout=300)
    finally:
        kill_pids(p.pid for p in servers)
        for process in servers:
            process.wait()
    out = done.stdout + done.stderr
    assert done.returncode == 2, out[-3000:]
    error = [line for line in done.stderr.splitlines()
             if "does not see the checkpoint folder" in line]
    assert len(error) == 1, out[-3000:]
    assert "PS task 0 (/job:ps/replica:0/task:0)" in error[0]
    assert f"{workdir}/checkpoints" in error[0]
    assert "--checkpoint-writers coordinator" in error[0]
    assert ("cannot read a file the coordinator wrote there (not found"
            in error[0])
    # Before training: no step was scheduled, none reported.
    assert "steps 0 ->" not in out and not re.search(r"\bstep \d", out)


@pytest.mark.parametrize("dtype, shape", [
    (tf.bfloat16, (1001, 16)), (tf.float32, (999, 1)), (tf.float32, (7,))])
def test_tensors_are_stored_in_aligned_slices_that_restore_whole(
        tmp_path, dtype, shape):
    """``AlignedSlices`` cuts a tensor over the slice size into slices of
    whole rows, each at most the slice size and starting at a multiple of
    64 bytes (so each is a view of the variable, never a copy: 32-byte
    bfloat16 rows were copied by ``MaxShardSizePolicy``); the slices cover
    it exactly, hold its values, and a checkpoint written with them
    restores it whole; a small tensor stays whole."""
    import types

    from psrec.ps_cluster.checkpoint.save import AlignedSlices
    values = np.random.default_rng(0).normal(size=shape)
    variable = tf.Variable(tf.cast(values, dtype))
    slices = AlignedSlices(slice_bytes=1024)
    shardable = types.SimpleNamespace(
        checkpoint_key="v", tensor=variable.read_value(), slice_spec="",
        shape=variable.shape, dtype=dtype, device="/cpu:0")
    shards = slices([shardable])
    rows, row_bytes = shape[0], int(np.prod(shape[1:])) * dtype.size
    if rows * row_bytes <= 1024:
        assert shards == [{"v": {"": shardable.tensor}}]
    else:
        covered = 0
        for shard in shards:
            [(spec, part)] = shard["v"].items()
            begin, length = map(int, spec.split(" ")[-1].split(":")[0]
                                .split(","))
            assert begin == covered and length * row_bytes <= 1024, spec
            assert (begin * row_bytes) % 64 == 0, spec
            np.testing.assert_array_equal(
                part.numpy(), variable.numpy()[begin:begin + length])
            covered += length
        assert covered == rows and len(shards) > 1
    path = tf.train.Checkpoint(v=variable).write(
        str(tmp_path / "c"), options=tf.train.CheckpointOptions(
            experimental_sharding_callback=slices))
    restored = tf.Variable(tf.zeros(shape, dtype))
    tf.train.Checkpoint(v=restored).read(path).assert_consumed()
    np.testing.assert_array_equal(restored.numpy(), variable.numpy())
