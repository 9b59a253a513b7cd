"""The job configuration of ``psrec train`` (``launch/job/config.py``): the
one codec (``job.json``) and the refusal of options that mean nothing under
the chosen strategy -- in the library and on the command line, before any
server starts."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from psrec.data.input.config import InputConfig
from psrec.errors import ConfigError
from psrec.features.spec.presets import criteo
from psrec.features.spec.presets import movielens
from psrec.launch.job.config import JobConfig
from psrec.launch.job.config import StrategyConfig
from psrec.launch.job.config import SyntheticData
from psrec.models.optim.config import OptimizerConfig
from psrec.models.ranking.config import model_config
from psrec.models.retrieval.config import RetrievalConfig
from psrec.ps_cluster.cluster.partition_config import PartitionConfig
from psrec.ps_cluster.training.config import LoopConfig
from tests._forbid import Reached
from tests._forbid import forbid

# -- the codec ----------------------------------------------------------------------


def _mirrored_job(tmp_path: Path) -> JobConfig:
    """A job where every field differs from its default."""
    return JobConfig(
        workdir=tmp_path / "run", spec=movielens(dim=4), model_name="wide_deep",
        model=model_config("wide_deep", top_mlp=(16, 8), batch_norm="sync",
                           cross_low_rank=3),
        optimizer=OptimizerConfig(sparse="ftrl", dense="sgd", sparse_lr=0.3,
                                  dense_lr=0.02, base_batch_size=512,
                                  warmup_steps=7),
        input=InputConfig(batch_size=96, shuffle_records=8, cycle_length=2,
                          seed=11),
        loop=LoopConfig(steps=77, steps_per_closure=7, in_flight_per_worker=2,
                        log_every=5, eval_every=11, checkpoint_every=22,
                        keep_best="logloss", early_stop_patience=3),
        epochs=2.5,
        strategy=StrategyConfig(kind="mirrored", collective="nccl",
                                mixed_precision=True, grad_accum_steps=3,
                                memory_fraction=0.25, cpu_replicas=2,
                                allow_remote=True),
        data=tmp_path / "data" / "manifest.json",
        synthetic=SyntheticData(rows=999, eval_fraction=0.3, files=3,
                                shards=5, seed=4),
        export=False, plots=True, verify_checksums=False,
        max_corrupt_records=5,
        keep_checkpoints=7, stall_timeout=12.5, connect_timeout=9.0,
        grace_period=4.5)


def _ps_job(tmp_path: Path) -> JobConfig:
    return JobConfig(
        workdir=tmp_path / "ps-run", spec=criteo(buckets=77, dim=4),
        model_name="dlrm", model=model_config("dlrm", bottom_mlp=(8,)),
        strategy=StrategyConfig(kind="ps", mixed_precision=True,
                                grad_accum_steps=2, ps_memory=8 << 30),
        partition=PartitionConfig(kind="max-size", max_shard_bytes=1 << 20,
                                  shards=3),
        workers=3, ps=2, stall_timeout=None, checkpoint_writers="tasks",
        data_service="grpc://127.0.0.1:5050", table_dtype="bfloat16",
        warm_start=str(tmp_path / "yesterday/checkpoints/ckpt-100"),
        reset_optimizer=True,
        retrieval=RetrievalConfig(  # every field differs from its default
            tower_mlp=(8,), output_dim=8, temperature=0.1, normalize=False,
            logq=False, uniform_negatives=4, remove_accidental_hits=False,
            candidate_bias=False, exclude_seen=False))


@pytest.mark.parametrize("build", [_mirrored_job, _ps_job],
                         ids=["mirrored", "ps"])
def test_job_config_round_trips_through_dict_and_job_json(tmp_path, build):
    config = build(tmp_path)
    default = JobConfig()
    differs = [f.name for f in dataclasses.fields(JobConfig)
               if getattr(config, f.name) != getattr(default, f.name)]
    assert len(differs) >= 5, differs
    data = config.to_dict()
    assert JobConfig.from_dict(data) == config
    # Through JSON text too: tuples become lists, paths strings.
    assert JobConfig.from_dict(json.loads(json.dumps(data))) == config
    path = config.write(tmp_path / "ckpt")
    assert path == tmp_path / "ckpt" / "job.json"
    assert JobConfig.read(tmp_path / "ckpt") == config
    assert json.loads(path.read_text())["strategy"]["kind"] == (
        config.strategy.kind)


def test_every_field_of_the_mirrored_job_differs_from_its_default(tmp_path):
    """The codec test above would miss a field the codec drops if that field
    kept its default: the mirrored job sets every field but partition, ps,
    workers, checkpoint_writers, warm_start, reset_optimizer and
    table_dtype (refused under mirrored), data_service (a PS job's dispatcher) and retrieval (a
    ranking job), which the PS job sets, and follow (it excludes --data:
    the next test's job)."""
    config, default = _mirrored_job(tmp_path), JobConfig()
    same = {f.name for f in dataclasses.fields(JobConfig)
            if getattr(config, f.name) == getattr(default, f.name)}
    assert same == {"partition", "ps", "workers", "checkpoint_writers",
                    "data_service", "retrieval", "warm_start",
                    "reset_optimizer", "follow", "table_dtype"}
    ps = _ps_job(tmp_path)
    assert all(getattr(ps, name) != getattr(default, name)
               for name in same - {"follow"})
    strategy = config.strategy
    assert all(getattr(strategy, f.name) != getattr(StrategyConfig(), f.name)
               for f in dataclasses.fields(StrategyConfig)
               if f.name != "ps_memory")  # ps only: set in _ps_job
    assert ps.strategy.ps_memory != StrategyConfig().ps_memory


def test_unknown_job_keys_are_refused_by_name(tmp_path):
    data = JobConfig().to_dict()
    data["learning_rate"] = 0.1
    with pytest.raises(ConfigError, match=r"unknown job keys \['learning_rate'"
                       r"\]"):
        JobConfig.from_dict(data)
    (tmp_path / "job.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="learning_rate"):
        JobConfig.read(tmp_path)
    with pytest.raises(ConfigError, match="not a psrec checkpoint directory"):
        JobConfig.read(tmp_path / "nowhere")
    # Nested keys too: a ConfigError naming the key (exit 2, one line),
    # not a TypeError from the dataclass.
    nested = JobConfig().to_dict()
    nested["strategy"]["kind_of"] = "ps"
    with pytest.raises(ConfigError, match=r"unknown job keys "
                       r"\['strategy.kind_of'\]; known in 'strategy': kind, "):
        JobConfig.from_dict(nested)


# -- options refused under the wrong strategy ---------------------------------------


@pytest.mark.parametrize("kind, options", [
    ("ps", {"collective": "nccl"}),
    ("ps", {"collective": "ring"}),
    ("one-device", {"collective": "ring"}),
    ("ps", {"cpu_replicas": 2}),
    ("one-device", {"cpu_replicas": 2}),
    ("multi-worker-mirrored", {"cpu_replicas": 2}),
    ("ps", {"memory_fraction": 0.3}),
    ("mirrored", {"ps_memory": 1 << 30}),
])
def test_strategy_config_refuses_options_of_other_strategies(kind, options):
    # The library names the field, not a flag (the CLI translates).
    with pytest.raises(ConfigError) as error:
        StrategyConfig(kind=kind, **options)
    message = str(error.value)
    (field,) = options
    assert message.startswith(
        f"`StrategyConfig.{field}` has no effect with `StrategyConfig.kind` "
        f"{kind};"), message
    assert "--" not in message


@pytest.mark.parametrize("kind, fields, field", [
    ("mirrored", {"partition": PartitionConfig(kind="fixed")},
     "JobConfig.partition"),
    ("mirrored", {"partition": PartitionConfig(shards=4)},
     "JobConfig.partition"),
    ("multi-worker-mirrored", {"partition": PartitionConfig(kind="fixed")},
     "JobConfig.partition"),
    ("mirrored", {"ps": 2}, "JobConfig.ps"),
    ("one-device", {"workers": 3}, "JobConfig.workers"),
    ("mirrored", {"checkpoint_writers": "tasks"},
     "JobConfig.checkpoint_writers"),
    ("one-device", {"checkpoint_writers": "coordinator"},
     "JobConfig.checkpoint_writers"),
    ("multi-worker-mirrored", {"loop": LoopConfig(early_stop_patience=2)},
     "LoopConfig.early_stop_patience"),
])
def test_job_config_refuses_options_of_other_strategies(kind, fields, field):
    with pytest.raises(ConfigError) as error:
        JobConfig(strategy=StrategyConfig(kind=kind), **fields)
    assert str(error.value).startswith(
        f"`{field}` has no effect with `StrategyConfig.kind` {kind};"), str(
            error.value)


def test_options_that_apply_everywhere_are_accepted_under_ps():
    config = JobConfig(strategy=StrategyConfig(
        kind="ps", mixed_precision=True, grad_accum_steps=2))
    assert config.strategy.mixed_precision
    assert config.strategy.grad_accum_steps == 2
    for kind in ("mirrored", "multi-worker-mirrored"):
        assert StrategyConfig(kind=kind, collective="ring").collective == (
            "ring")
    assert StrategyConfig(kind="mirrored", cpu_replicas=2).cpu_replicas == 2
    assert StrategyConfig(kind="one-device",
                          memory_fraction=0.3).memory_fraction == 0.3


def _train_args(tmp_path: Path, *extra: str) -> list[str]:
    return ["train", "--workdir", str(tmp_path / "run"), *extra]


@pytest.mark.parametrize("extra, flag", [
    (("--collective", "nccl"), "--collective"),
    (("--collective", "ring"), "--collective"),
    (("--cpu-replicas", "2"), "--cpu-replicas"),
    (("--strategy", "one-device", "--cpu-replicas", "2"), "--cpu-replicas"),
    (("--strategy", "mirrored", "--partitioner", "fixed"), "--partitioner"),
    (("--strategy", "mirrored", "--table-shards", "2"), "--table-shards"),
    (("--memory-fraction", "0.3"), "--memory-fraction"),
    (("--strategy", "mirrored", "--checkpoint-writers", "tasks"),
     "--checkpoint-writers"),
])
def test_cli_refuses_in_one_line_before_any_server_starts(
        tmp_path, capsys, monkeypatch, extra, flag):
    from psrec.launch.cli.main import main
    forbid(monkeypatch)
    began = time.monotonic()
    code = main(_train_args(tmp_path, *extra))
    seconds = time.monotonic() - began
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"psrec train: error: `{flag}` has no effect "
                               "with --strategy "), lines[0]
    assert "Traceback" not in captured.err + captured.out
    assert captured.out == ""
    # Refused while building the configuration: no data, no servers, no
    # processes -- nothing was written, and it took no time.
    assert not (tmp_path / "run").exists()
    assert seconds < 5, seconds


def test_cli_accepts_mixed_precision_and_accumulation_under_ps(
        tmp_path, monkeypatch):
    """Both apply under every strategy now: the CLI builds the job and goes
    on to prepare its data (stopped there)."""
    from psrec.launch.cli.main import main
    from psrec.launch.job import data as job_data
    seen = []

    def prepare(config, *args, **kwargs):
        seen.append(config)
        raise Reached("data preparation")

    monkeypatch.setattr(job_data, "prepare_data", prepare)
    with pytest.raises(Reached):
        main(_train_args(tmp_path, "--mixed-precision", "--grad-accum-steps",
                         "2", "--sync-batch-norm", "--checkpoint-writers",
                         "coordinator"))
    [config] = seen
    assert config.checkpoint_writers == "coordinator"
    assert config.strategy == StrategyConfig(
        kind="ps", mixed_precision=True, grad_accum_steps=2)
    assert config.model.batch_norm == "sync"


# -- a run sized from the data ------------------------------------------------------


class _Rows:
    """A manifest's row counts (all ``resolve_loop`` reads of it)."""

    def __init__(self, train: int, eval_rows: int):
        self.counts = {"train": train, "eval": eval_rows}

    def rows(self, split: str = "train") -> int:
        return self.counts[split]


def _sized(train: int, eval_rows: int, **job) -> LoopConfig:
    from psrec.launch.job.run import resolve_loop
    return resolve_loop(JobConfig(**job), _Rows(train, eval_rows))


def test_a_small_set_trains_whole_epochs_evaluated_each_and_stops_early():
    # 8,312 rows of 1,024 a step: 9 steps an epoch; 300 steps would be 34
    # epochs, the cap is 20
    loop = _sized(8_312, 2_078)  # a closure of 10 steps per worker between
    assert (loop.steps, loop.eval_every, loop.early_stop_patience) == (
        180, 20, 3)  # evaluations (each joins the workers)
    loop = _sized(8_312, 2_078, workers=1)
    assert (loop.steps, loop.eval_every) == (180, 10)


def test_a_large_set_trains_the_epochs_that_reach_the_minimum():
    loop = _sized(200_000, 50_000)  # 196 steps an epoch
    assert (loop.steps, loop.eval_every, loop.early_stop_patience) == (
        392, 80, 3)
    assert _sized(10_000_000, 1_000).steps == 9_766  # one epoch


def test_without_an_eval_split_or_a_metric_nothing_stops_early():
    assert _sized(8_312, 0).early_stop_patience == 0
    loop = _sized(8_312, 2_078, loop=dataclasses.replace(
        JobConfig().loop, keep_best="none"))
    assert (loop.steps, loop.early_stop_patience) == (180, 0)
    assert _sized(8_312, 0, spec=movielens(), retrieval=RetrievalConfig()
                  ).early_stop_patience == 0  # retrieval: no eval split


def test_a_retrieval_run_trains_every_epoch_to_the_cap_keeping_the_best():
    # MovieLens' hash split: 157 steps of 512 an epoch; 300 steps would be
    # 2 epochs, but its MRR plateaus, then peaks after about 12: every
    # epoch up to the cap, each evaluated, the best by MRR kept, no
    # automatic patience (a given one stops it).
    job = dict(spec=movielens(), retrieval=RetrievalConfig(),
               input=InputConfig(batch_size=512))
    loop = _sized(80_000, 20_000, **job)
    assert (loop.steps, loop.eval_every, loop.early_stop_patience,
            loop.keep_best) == (20 * 157, 160, 0, "mrr")
    assert _sized(80_000, 20_000, **job, loop=dataclasses.replace(
        JobConfig().loop, early_stop_patience=4)).early_stop_patience == 4
    # Nothing to watch: the 300-step rule, as for ranking.
    loop = _sized(80_000, 20_000, loop=dataclasses.replace(
        JobConfig().loop, keep_best="none"), **job)
    assert (loop.steps, loop.early_stop_patience) == (2 * 157, 0)
    assert _sized(80_000, 20_000, **job, loop=dataclasses.replace(
        JobConfig().loop, keep_best="recall@100")).keep_best == "recall@100"


def test_given_steps_or_epochs_are_trained_as_given():
    given = dataclasses.replace(JobConfig().loop, steps=50)
    loop = _sized(8_312, 2_078, loop=given)
    assert (loop.steps, loop.eval_every, loop.early_stop_patience) == (
        50, 10, 0)  # about 5 a run, as before
    loop = _sized(8_312, 2_078, epochs=2.0)
    assert (loop.steps, loop.early_stop_patience) == (18, 0)


def test_a_loop_left_to_the_data_is_refused_where_there_is_none():
    assert JobConfig().loop.steps is None  # psrec train's default
    with pytest.raises(ConfigError, match="LoopConfig.steps"):
        LoopConfig(steps=None).resolved()


def test_a_follow_job_round_trips(tmp_path):
    """Every field of ``FollowConfig`` set, through ``job.json``."""
    from psrec.launch.job.config import FollowConfig
    follow = FollowConfig(dir=str(tmp_path / "logs"), until="dt=2026-12-31",
                          poll_seconds=5.0)
    config = JobConfig(workdir=tmp_path / "w", follow=follow, epochs=2.0)
    assert all(getattr(follow, f.name) != getattr(FollowConfig(), f.name)
               for f in dataclasses.fields(FollowConfig) if f.name != "once")
    config.write(tmp_path / "ckpt")
    assert JobConfig.read(tmp_path / "ckpt") == config
    once = JobConfig(follow=FollowConfig(dir="logs", once=True))
    assert JobConfig.from_dict(json.loads(json.dumps(once.to_dict()))) == once
