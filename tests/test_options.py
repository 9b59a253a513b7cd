"""One source per option (``psrec.options``): each configuration field
carries its default, help, choices and strategies; the flags of ``psrec
train``, their refusals and the error lines are derived from the fields.
Also the one optimizer registry (training, planner, size guard)."""

from __future__ import annotations

import dataclasses

import pytest

from psrec.data.convert.config import ConversionOptions
from psrec.data.infer.infer import InferOptions
from psrec.data.input.config import InputConfig
from psrec.errors import ConfigError
from psrec.features.spec.presets import criteo
from psrec.features.spec.presets import movielens_rating
from psrec.features.spec.presets import movielens_retrieval
from psrec.launch.cli.options import field_flags
from psrec.launch.cli.options import translate
from psrec.launch.job.config import BenchConfig
from psrec.launch.job.config import JobConfig
from psrec.launch.job.config import StrategyConfig
from psrec.launch.job.config import SyntheticData
from psrec.launch.k8s.objects import BACKENDS
from psrec.launch.k8s.objects import K8sJob
from psrec.launch.supervise.restart_policy import BUDGET_FLAGS
from psrec.launch.supervise.restart_policy import RestartLimits
from psrec.launch.supervise.restart_policy import SupervisorConfig
from psrec.models.optim.config import DENSE_OPTIMIZERS
from psrec.models.optim.config import OPTIMIZERS
from psrec.models.optim.config import SPARSE_OPTIMIZERS
from psrec.models.optim.config import OptimizerConfig
from psrec.models.optim.config import slot_text
from psrec.models.ranking.config import ModelConfig
from psrec.models.retrieval.config import RetrievalConfig
from psrec.models.serving.config import ExportConfig
from psrec.options import field_default
from psrec.options import has_default
from psrec.options import option_of
from psrec.options import option_values
from psrec.options import options
from psrec.ps_cluster.cluster.partition_config import PartitionConfig
from psrec.ps_cluster.training.config import LoopConfig
from tests._forbid import Reached
from tests._forbid import forbid

CONFIGS = (JobConfig, StrategyConfig, SyntheticData, InputConfig,
           OptimizerConfig, LoopConfig, PartitionConfig, RetrievalConfig,
           ConversionOptions, InferOptions, K8sJob, RestartLimits,
           SupervisorConfig, ModelConfig, ExportConfig)


def _parser(*words):
    """The parser of ``psrec WORDS...`` (``_parser("k8s", "render")``)."""
    from psrec.launch.cli.main import build_parser
    parser = build_parser()
    for word in words:
        sub = next(a for a in parser._actions  # noqa: SLF001
                   if isinstance(a.choices, dict) and word in a.choices)
        parser = sub.choices[word]
    return parser


def _train_parser():
    return _parser("train")


def _flag_defaults(parser) -> dict[str, object]:
    return {flag: action.default for action in parser._actions  # noqa: SLF001
            for flag in action.option_strings}


# -- the fields ---------------------------------------------------------------------


@pytest.mark.parametrize("cls", CONFIGS)
def test_every_field_is_an_option_with_help(cls):
    for field in dataclasses.fields(cls):
        meta = option_of(field)
        assert meta is not None, f"{cls.__name__}.{field.name}"
        assert meta.help.strip(), f"{cls.__name__}.{field.name}"


def test_each_train_flag_takes_its_default_from_its_field():
    """The flag's default is the job's value of the field (no copy): a
    changed field default changes the flag."""
    defaults = _flag_defaults(_train_parser())
    job = JobConfig()
    checked = 0
    for owner, config in ((JobConfig, job), (StrategyConfig, job.strategy),
                          (OptimizerConfig, job.optimizer),
                          (InputConfig, job.input), (LoopConfig, job.loop),
                          (PartitionConfig, job.partition),
                          (SyntheticData, job.synthetic)):
        for field, meta in options(owner):
            if meta.flag in (None, "--spec") or meta.flag not in defaults:
                continue  # --spec: the spec beside --data, else criteo
            value = getattr(config, field.name)
            if isinstance(field_default(field), bool):
                assert defaults[meta.flag] is False, meta.flag  # a switch
            elif meta.flag == "--workdir":
                assert defaults[meta.flag] == str(value)
            else:
                assert defaults[meta.flag] == value, meta.flag
            checked += 1
    assert checked >= 30, checked


def test_choices_come_from_the_fields():
    by_flag = {flag: action for action in _train_parser()._actions  # noqa: SLF001
               for flag in action.option_strings}
    assert tuple(by_flag["--strategy"].choices) == option_of(
        _field(StrategyConfig, "kind")).choices
    assert tuple(by_flag["--sparse-optimizer"].choices) == SPARSE_OPTIMIZERS
    assert tuple(by_flag["--dense-optimizer"].choices) == DENSE_OPTIMIZERS
    assert tuple(by_flag["--partitioner"].choices) == option_of(
        _field(PartitionConfig, "kind")).choices


def _field(cls, name):
    return {f.name: f for f in dataclasses.fields(cls)}[name]


# The commands whose flags come from these classes' fields, and the flags
# whose command-line default is a "not given" None instead of the field's.
FLAG_SOURCES = [
    (("convert",), ConversionOptions, ()),
    (("spec",), InferOptions, ("--exclude",)),
    (("k8s", "render"), K8sJob, ("--ps-memory",)),
    (("train",), RestartLimits, ()),
    (("train",), SupervisorConfig, ()),
    (("train",), ModelConfig, ()),
    (("bench",), BenchConfig, ()),
]


@pytest.mark.parametrize("words, cls, unset", FLAG_SOURCES,
                         ids=[cls.__name__ for _, cls, _ in FLAG_SOURCES])
def test_every_flag_of_a_field_is_registered_from_it(words, cls, unset):
    """Each option field with a flag is one flag of the command, with the
    field's help, default and choices: a copy written in the parser, or a
    field that lost its flag, fails here."""
    from psrec.launch.cli.options import _OptionAction
    by_flag = {flag: action for action in _parser(*words)._actions  # noqa: SLF001
               for flag in action.option_strings}
    checked = 0
    for field, meta in options(cls):
        if meta.flag is None:
            continue
        action = by_flag[meta.flag]
        assert isinstance(action, _OptionAction), meta.flag
        assert action.help == meta.help, meta.flag
        assert action.choices == meta.choices, meta.flag
        if meta.flag in unset:
            assert action.default is None, meta.flag
        elif not has_default(field):
            assert action.required, meta.flag
        elif isinstance(field_default(field), bool):
            assert (action.nargs, action.default) == (0, False), meta.flag
        else:
            assert action.default == field_default(field), meta.flag
        checked += 1
    assert checked >= 1


def test_the_flags_build_the_default_configuration_back():
    args = _parser("convert").parse_args(["in.parquet", "--spec", "criteo",
                                          "--out", "x"])
    assert option_values(args, ConversionOptions) == ConversionOptions()
    args = _parser("convert").parse_args(
        ["in.parquet", "--spec", "criteo", "--out", "x", "--split", "hash",
         "--eval-fraction", "0.25"])
    assert option_values(args, ConversionOptions) == ConversionOptions(
        split_mode="hash", eval_fraction=0.25)
    from psrec.launch.cli.train import supervisor_config
    args = _train_parser().parse_args(["--max-restarts", "5",
                                       "--max-ps-restarts", "1",
                                       "--no-restart-workers"])
    policy = supervisor_config(args)
    assert policy.limits == RestartLimits(worker=5, ps=1, coordinator=5,
                                          data_service=5)
    assert policy.restart_workers is False
    assert supervisor_config(_train_parser().parse_args([])).limits == (
        RestartLimits())


def test_one_choice_list_and_one_flag_name_per_option():
    by_flag = {flag: action
               for action in _parser("k8s", "render")._actions  # noqa: SLF001
               for flag in action.option_strings}
    assert tuple(by_flag["--backend"].choices) == BACKENDS
    assert by_flag["--backend"].default == BACKENDS[0]
    flags = {field.name: meta.flag for field, meta in options(RestartLimits)}
    assert BUDGET_FLAGS == {role: flags[role] for role in BUDGET_FLAGS}


def test_errors_of_the_new_classes_name_fields_the_cli_names_flags():
    for build, field, flag in (
            (lambda: ConversionOptions(shards=0), "ConversionOptions.shards",
             "--shards"),
            (lambda: ConversionOptions(order_by="ts", eval_fraction=0),
             "ConversionOptions.order_by", "--order-by"),
            (lambda: ConversionOptions(split_mode="random"),
             "ConversionOptions.split_mode", "--split"),
            (lambda: ConversionOptions(neg_sample_rate=0),
             "ConversionOptions.neg_sample_rate", "--neg-sample-rate"),
            (lambda: InferOptions(max_buckets=1), "InferOptions.max_buckets",
             "--max-buckets")):
        with pytest.raises(ConfigError) as error:
            build()
        message = str(error.value)
        assert f"`{field}`" in message and "--" not in message, message
        assert f"`{flag}`" in translate(message), translate(message)
        assert "ConversionOptions." not in translate(message)
    assert field_flags()["SupervisorConfig.restart_workers"] == (
        "--no-restart-workers")
    assert field_flags()["RestartLimits.coordinator"] == "--max-restarts"
    assert field_flags()["ModelConfig.cross_low_rank"] == "--cross-low-rank"


# -- scope: what the user gave ------------------------------------------------------


@pytest.mark.parametrize("extra, flag", [
    (("--strategy", "mirrored", "--workers", "2"), "--workers"),
    (("--strategy", "one-device", "--ps", "1"), "--ps"),
    (("--memory-fraction", "0.5"), "--memory-fraction"),
    (("--collective", "auto"), "--collective"),
    (("--strategy", "mirrored", "--checkpoint-writers", "auto"),
     "--checkpoint-writers"),
    (("--strategy", "mirrored", "--partitioner", "min-size"),
     "--partitioner"),
    (("--strategy", "multi-worker-mirrored", "--early-stop-patience", "0"),
     "--early-stop-patience"),
])
def test_a_flag_typed_at_its_default_is_refused_like_any_value(
        tmp_path, capsys, monkeypatch, extra, flag):
    from psrec.launch.cli.main import main
    forbid(monkeypatch)
    code = main(["train", "--workdir", str(tmp_path / "run"), *extra])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"psrec train: error: `{flag}` has no effect "
                             "with --strategy "), err[0]
    assert not (tmp_path / "run").exists()


def test_the_python_api_refuses_a_value_that_differs_from_the_default():
    """A Python caller cannot be told apart from the default: the field
    set to its default is accepted, any other value refused."""
    mirrored = StrategyConfig(kind="mirrored")
    assert JobConfig(strategy=mirrored, workers=2).workers == 2
    with pytest.raises(ConfigError, match=r"^`JobConfig.workers` has no "
                       "effect with `StrategyConfig.kind` mirrored"):
        JobConfig(strategy=mirrored, workers=3)


# -- errors name the field; the CLI names the flag ----------------------------------


def test_library_errors_name_fields_and_no_flag():
    for build, field in (
            (lambda: StrategyConfig(grad_accum_steps=0),
             "StrategyConfig.grad_accum_steps"),
            (lambda: StrategyConfig(kind="tpu"), "StrategyConfig.kind"),
            (lambda: OptimizerConfig(sparse="lamb"), "OptimizerConfig.sparse"),
            (lambda: PartitionConfig(kind="even"), "PartitionConfig.kind"),
            (lambda: InputConfig(mode="stream"), "InputConfig.mode"),
            (lambda: JobConfig(connect_timeout=0), "JobConfig.connect_timeout"),
            (lambda: RetrievalConfig(output_dim=0),
             "RetrievalConfig.output_dim")):
        with pytest.raises(ConfigError) as error:
            build()
        assert f"`{field}`" in str(error.value), str(error.value)
        assert "--" not in str(error.value), str(error.value)


def test_the_cli_translates_fields_to_flags_by_their_metadata():
    flags = field_flags()
    assert flags["StrategyConfig.grad_accum_steps"] == "--grad-accum-steps"
    assert flags["PartitionConfig.shards"] == "--table-shards"
    assert flags["OptimizerConfig.sparse"] == "--sparse-optimizer"
    assert flags["RetrievalConfig.output_dim"] == "--output-dim"
    assert translate("`StrategyConfig.grad_accum_steps` = 0 must be >= 1.") == (
        "`--grad-accum-steps` = 0 must be >= 1.")
    assert translate("`LoopConfig.in_flight_per_worker` = 0") == (
        "`LoopConfig.in_flight_per_worker` = 0")  # no flag: stays a field


def test_a_library_refusal_reaches_the_cli_user_as_flags(tmp_path, capsys,
                                                         monkeypatch):
    from psrec.launch.cli.main import main
    forbid(monkeypatch)
    code = main(["train", "--workdir", str(tmp_path / "run"), "--keep-best",
                 "none", "--early-stop-patience", "2"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0] == (
        "psrec train: error: `--early-stop-patience` = 2 needs a metric to "
        "watch: set `--keep-best` to a metric of the task (auc, logloss; "
        "retrieval: mrr, recall@K).")


# -- the best checkpoint: one rule for the CLI and the Python API ------------------


def _retrieval_job(**fields) -> JobConfig:
    return JobConfig(spec=movielens_retrieval(), model_name="dcn",
                     retrieval=RetrievalConfig(), **fields)


def test_the_default_metric_means_the_tasks():
    assert JobConfig(spec=movielens_rating()).loop.keep_best == "none"
    assert _retrieval_job().loop.keep_best == "mrr"
    assert _retrieval_job(loop=LoopConfig(
        keep_best="recall@100", early_stop_patience=2)).loop.keep_best == (
            "recall@100")


@pytest.mark.parametrize("build", [
    lambda: JobConfig(spec=movielens_rating(),
                      loop=LoopConfig(keep_best="logloss")),
    lambda: JobConfig(spec=movielens_rating(),
                      loop=LoopConfig(early_stop_patience=2))])
def test_the_python_api_refuses_a_metric_the_task_lacks(build):
    with pytest.raises(ConfigError, match=r"`LoopConfig.keep_best` = .* "
                       "watch AUC/logloss, which do not exist"):
        build()


def test_the_python_api_refuses_a_ranking_metric_for_retrieval():
    with pytest.raises(ConfigError, match=(
            r"^`LoopConfig.keep_best` = 'logloss': the retrieval task reports "
            r"mrr, recall@1, recall@5, recall@10, recall@50, recall@100 "
            r"\(or none\)\.$")):
        _retrieval_job(loop=LoopConfig(keep_best="logloss"))
    with pytest.raises(ConfigError, match=(
            r"the ranking task reports auc, logloss \(or none\)\.$")):
        JobConfig(loop=LoopConfig(keep_best="mrr"))


def test_a_job_with_ranking_metrics_keeps_its_metric():
    assert JobConfig(spec=criteo(buckets=10)).loop.keep_best == "auc"
    assert JobConfig(loop=LoopConfig(keep_best="logloss")).loop.keep_best == (
        "logloss")


@pytest.mark.parametrize("extra", [
    ("--spec", "movielens-rating", "--keep-best", "auc"),
    ("--spec", "movielens-rating", "--keep-best", "logloss")])
def test_the_cli_refuses_a_metric_the_task_lacks_even_the_default(
        tmp_path, capsys, monkeypatch, extra):
    from psrec.launch.cli.main import main
    forbid(monkeypatch)
    code = main(["train", "--strategy", "one-device", "--workdir",
                 str(tmp_path / "run"), *extra])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("psrec train: error: `--keep-best` = "), err[0]
    assert "`--early-stop-patience`" in err[0]
    assert "watch AUC/logloss, which do not exist" in err[0]


@pytest.mark.parametrize("extra, metric", [
    (("--spec", "movielens-rating"), "none"),
    (("--spec", "movielens-rating", "--keep-best", "none"), "none"),
    (("--task", "retrieval", "--spec", "movielens-retrieval"), "mrr"),
    (("--task", "retrieval", "--spec", "movielens-retrieval", "--keep-best",
      "recall@100", "--early-stop-patience", "2"), "recall@100")])
def test_the_cli_derives_the_tasks_metric_as_the_python_api_does(
        tmp_path, monkeypatch, extra, metric):
    from psrec.launch.cli.main import main
    seen = forbid(monkeypatch)
    with pytest.raises(Reached):
        main(["train", "--strategy", "one-device", "--workdir",
              str(tmp_path / "run"), *extra])
    [config] = seen
    assert config.loop.keep_best == metric


def test_the_cli_refuses_a_metric_the_retrieval_run_does_not_report(
        tmp_path, capsys, monkeypatch):
    from psrec.launch.cli.main import main
    forbid(monkeypatch)
    code = main(["train", "--strategy", "one-device", "--workdir",
                 str(tmp_path / "run"), "--task", "retrieval", "--spec",
                 "movielens-retrieval", "--keep-best", "auc"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0] == (
        "psrec train: error: `--keep-best` = 'auc': the retrieval task "
        "reports mrr, recall@1, recall@5, recall@10, recall@50, recall@100 "
        "(or none).")
    # A K the run does not report.
    code = main(["train", "--strategy", "one-device", "--workdir",
                 str(tmp_path / "run"), "--task", "retrieval", "--spec",
                 "movielens-retrieval", "--keep-best", "recall@20"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert "`--keep-best` = 'recall@20' is not one of" in err[0]
    assert "did you mean 'recall@50'?" in err[0]


# -- the optimizer registry ---------------------------------------------------------


def test_psrec_train_passes_the_chosen_optimizers_to_the_job(tmp_path,
                                                             monkeypatch):
    from psrec.launch.cli.main import main
    seen = forbid(monkeypatch)
    with pytest.raises(Reached):
        main(["train", "--strategy", "one-device", "--workdir",
              str(tmp_path / "run"), "--sparse-optimizer", "ftrl",
              "--dense-optimizer", "sgd"])
    [config] = seen
    assert config.optimizer == OptimizerConfig(sparse="ftrl", dense="sgd")
    assert JobConfig.from_dict(config.to_dict()).optimizer == config.optimizer


def test_the_default_optimizers_are_unchanged(tmp_path, monkeypatch):
    from psrec.launch.cli.main import main
    seen = forbid(monkeypatch)
    with pytest.raises(Reached):
        main(["train", "--strategy", "one-device", "--workdir",
              str(tmp_path / "run")])
    [config] = seen
    assert (config.optimizer.sparse, config.optimizer.dense) == (
        "adagrad", "adam")


def test_plan_offers_the_registry_s_sparse_optimizers(capsys):
    from psrec.launch.cli.main import main
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "{" + ",".join(SPARSE_OPTIMIZERS) + "}" in text
    for name in SPARSE_OPTIMIZERS:
        assert slot_text(name) in text


@pytest.mark.parametrize("sparse", SPARSE_OPTIMIZERS)
def test_a_train_step_makes_the_slots_the_planner_counts(sparse):
    """One step with each sparse optimizer: its class is the registry's, it
    keeps the registry's slot count per table variable, and the bytes of
    those slots are the planner's (and the size guard's)."""
    import tensorflow as tf

    from psrec.launch.job.bench import synthetic_dataset_fn
    from psrec.models.optim.sizing import estimate_replicated_bytes
    from psrec.models.ranking.config import ModelConfig
    from psrec.ps_cluster.planner.plan import plan_partition
    from psrec.ps_cluster.training.trainer import Trainer
    spec = criteo(buckets=10, dim=4)
    model = ModelConfig(interaction="concat", top_mlp=(4,))
    optimizer = OptimizerConfig(sparse=sparse)
    trainer = Trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), spec, model,
                      optimizer, InputConfig(batch_size=8))
    trainer.train(synthetic_dataset_fn(spec, 8, False),
                  LoopConfig(steps=1, steps_per_closure=1,
                             checkpoint_every=0))
    opt = trainer.sparse_optimizer
    assert int(opt.iterations) == 1
    assert type(opt).__name__ == OPTIMIZERS[sparse].keras_class
    tables = trainer.model.sparse_arch.table_variables()
    slot_bytes = 0
    for variable in tables:
        slots = [opt.get_slot(variable, name) for name in opt.get_slot_names()]
        kind = OPTIMIZERS[sparse]
        assert len(slots) == kind.slots + kind.row_slots, variable.name
        assert sorted(s.shape[1] for s in slots) == sorted(
            [1] * kind.row_slots + [variable.shape[1]] * kind.slots)
        slot_bytes += sum(4 * s.shape.num_elements() for s in slots)
    planned = plan_partition(spec, model, 1, optimizer, PartitionConfig())
    assert sum(t.slot_bytes for t in planned.tables) == slot_bytes
    assert estimate_replicated_bytes(
        spec, model, optimizer).table_slot_bytes == slot_bytes
