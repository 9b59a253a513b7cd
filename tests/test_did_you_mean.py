"""A misspelt name from a closed set is answered with the closest one
(issue 23 §3): one helper, :func:`psrec.errors.did_you_mean`, used by every
error that refuses such a name. One test per kind of name a user types:
flags, sub-commands, checkpoint names, column and feature names in flags,
ingest types, spec values and references at every level, job keys, model
options, checkpoint prefixes and workdirs. (Flag choices, models, presets,
top-level spec keys and label columns: tests/test_first_hour_data.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from psrec.errors import ConfigError
from psrec.errors import did_you_mean
from psrec.launch.cli.main import main


def _error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines()
           if line.startswith("psrec")]
    assert len(err) == 1, err
    return err[0]


def _exit_code(argv: list[str]) -> int:
    """``psrec ARGV``'s exit code, from a parser error or the run."""
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


def test_the_helper_prefers_a_match_but_for_case_then_the_closest():
    assert did_you_mean("c1", ["C1", "C10", "c2"]) == "; did you mean 'C1'?"
    assert did_you_mean("Clicks", ["click", "price"]) == (
        "; did you mean 'click'?")
    assert did_you_mean("zzz", ["click", "price"]) == ""


# -- the command line ---------------------------------------------------------


@pytest.mark.parametrize("argv, command, meant", [
    (["train", "--stpes", "10"], "psrec train", "--steps"),
    (["spec", "infer", "raw", "--labl=click"], "psrec spec", "--label"),
    (["k8s", "render", "--backend", "tfjob", "--name", "ctr", "--image",
      "psrec:1", "--workdir", "runs/ctr", "--outt", "job.yaml"],
     "psrec k8s render", "--out"),
])
def test_a_misspelt_flag_names_its_command_and_the_flag(argv, command, meant,
                                                        capsys):
    assert _exit_code(argv) == 2
    line = _error_line(capsys)
    assert line.startswith(f"{command}: error: unrecognized arguments")
    assert f"did you mean {meant!r}?" in line


def test_a_misspelt_required_flag_is_named_beside_the_missing_one(capsys):
    assert _exit_code(["k8s", "render", "--backend", "tfjob", "--nmae",
                       "ctr", "--image", "psrec:1", "--workdir", "w"]) == 2
    line = _error_line(capsys)
    assert line.startswith("psrec k8s render: error: the following "
                           "arguments are required: --name;"), line
    assert "--nmae is not an option; did you mean '--name'?" in line


@pytest.mark.parametrize("argv, meant", [
    (["trian"], "train"),
    (["ingest", "cvs", "x.csv", "--out", "pq"], "csv"),
    (["embeddings", "stat", "ckpt"], "stats"),
])
def test_a_misspelt_command_or_format_suggests_it(argv, meant, capsys):
    assert _exit_code(argv) == 2
    assert f"did you mean {meant!r}?" in _error_line(capsys)


# -- names in files and folders -------------------------------------------------


def _checkpoints(folder: Path, *steps: int) -> Path:
    """A checkpoint folder as its names show it: ``ckpt-N.index`` files
    (what choosing a checkpoint by name looks at)."""
    folder.mkdir(parents=True)
    for step in steps:
        (folder / f"ckpt-{step}.index").write_bytes(b"")
    return folder


def test_a_misspelt_checkpoint_name_suggests_a_kept_one(tmp_path):
    from psrec.ps_cluster.checkpoint.best import choose_checkpoint
    folder = _checkpoints(tmp_path / "checkpoints", 20, 40)
    with pytest.raises(ConfigError, match="did you mean 'ckpt-40'\\?"):
        choose_checkpoint(folder, "ckpt-41")


@pytest.mark.parametrize("which, meant", [
    ("latets", "latest"), ("bset", "best"), ("ckpt40", "ckpt-40")])
def test_a_misspelt_checkpoint_word_is_refused_before_the_export(
        tmp_path, capsys, which, meant):
    from psrec.launch.job.config import JobConfig
    folder = _checkpoints(tmp_path / "checkpoints", 20, 40)
    JobConfig().write(folder)
    assert _exit_code(["export", str(folder), "--out", str(tmp_path / "m"),
                       "--checkpoint", which]) == 2
    assert f"did you mean {meant!r}?" in _error_line(capsys)
    assert not (tmp_path / "m").exists()


def test_a_misspelt_checkpoint_word_is_refused_without_tensorflow(
        tmp_path):
    from psrec.launch.job.config import JobConfig
    from tests.test_fast_errors import _psrec
    folder = _checkpoints(tmp_path / "checkpoints", 20, 40)
    JobConfig().write(folder)
    code, tensorflow, err, _ = _psrec(
        ["export", str(folder), "--out", str(tmp_path / "m"),
         "--checkpoint", "latets"], tmp_path)
    assert code == 2 and not tensorflow, err
    assert "did you mean 'latest'?" in err[-1]


def test_a_misspelt_checkpoint_prefix_suggests_a_kept_one(tmp_path, capsys):
    folder = _checkpoints(tmp_path / "checkpoints", 20, 40)
    assert _exit_code(["embeddings", "stats", str(folder / "ckpt-4")]) == 2
    assert f"did you mean '{folder / 'ckpt-40'}'?" in _error_line(capsys)


@pytest.mark.parametrize("typed, meant", [
    ("runs/old/checkpoints/ckpt-4", "runs/old/checkpoints/ckpt-40"),
    ("runs/olld", "runs/old")])
def test_a_misspelt_warm_start_source_suggests_one_beside_it(tmp_path, typed,
                                                            meant):
    from psrec.launch.job.warm_start import find_source
    _checkpoints(tmp_path / "runs" / "old" / "checkpoints", 20, 40)
    with pytest.raises(ConfigError,
                       match=f"did you mean '{tmp_path / meant}'\\?"):
        find_source(str(tmp_path / typed))


def test_a_misspelt_workdir_suggests_a_run_beside_it(tmp_path, capsys):
    (tmp_path / "runs" / "criteo" / "checkpoints").mkdir(parents=True)
    (tmp_path / "runs" / "criteo" / "checkpoints" / "job.json").write_text(
        "{}")
    assert _exit_code(["show", str(tmp_path / "runs" / "critoe")]) == 2
    assert f"did you mean '{tmp_path / 'runs' / 'criteo'}'?" in _error_line(
        capsys)


# -- column and feature names given in flags ----------------------------------


@pytest.mark.parametrize("field", ["group_by", "slice_by"])
def test_a_misspelt_group_or_slice_feature_suggests_the_feature(field):
    from psrec.features.spec.presets import criteo
    from psrec.ps_cluster.evaluation.breakdown import Breakdown
    with pytest.raises(ConfigError, match="did you mean 'C1'\\?"):
        Breakdown(**{field: "c1"}).check(criteo())


def _parquet(path: Path) -> str:
    pq.write_table(pa.table({"click": [1, 0, 1, 0], "Price": [1.0, 2.0,
                                                              3.0, 4.0],
                             "user": ["a", "b", "a", "c"]}), path)
    return str(path)


def test_a_misspelt_keep_or_label_column_suggests_the_column(tmp_path):
    from psrec.models.serving.scoring import check_inputs
    schema = pq.read_schema(_parquet(tmp_path / "a.parquet"))
    with pytest.raises(ConfigError, match="did you mean 'user'\\?"):
        check_inputs("a.parquet", schema, {}, ["usr"])


def test_a_misspelt_order_by_column_suggests_the_column(tmp_path, capsys):
    src = _parquet(tmp_path / "a.parquet")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec()))
    assert _exit_code(["convert", src, "--spec", str(spec), "--out",
                       str(tmp_path / "tf"), "--order-by", "clik"]) == 2
    assert "did you mean 'click'?" in _error_line(capsys)


def test_a_misspelt_exclude_column_suggests_the_column(tmp_path, capsys):
    src = _parquet(tmp_path / "a.parquet")
    assert _exit_code(["spec", "infer", src, "--label", "click", "--out",
                       str(tmp_path / "s.yaml"), "--exclude", "price",
                       "--no-progress"]) == 2
    assert "did you mean 'Price'?" in _error_line(capsys)


@pytest.mark.parametrize("types, meant", [
    ("clik=int64", "click"), ("click=int46", "int64")])
def test_a_misspelt_ingest_type_or_column_suggests_it(tmp_path, capsys,
                                                     types, meant):
    src = tmp_path / "log.csv"
    src.write_text("click,x\n1,a\n0,b\n")
    assert _exit_code(["ingest", "csv", str(src), "--out",
                       str(tmp_path / "pq"), "--types", types]) == 2
    assert f"did you mean {meant!r}?" in _error_line(capsys)


# -- the spec: values and references at every level ---------------------------


def _spec(**parts) -> dict:
    spec = {"name": "t", "label": {"name": "click"},
            "tables": [{"name": "ids", "rows": 100, "dim": 8}],
            "dense": [{"name": "Price", "transform": "log1p"}],
            "categorical": [{"name": "user", "table": "ids",
                             "hash_buckets": 50}]}
    spec.update(parts)
    return spec


_USER = {"name": "user", "table": "ids", "hash_buckets": 50}
_ITEM = {"name": "item", "table": "ids", "hash_buckets": 50}


@pytest.mark.parametrize("spec, meant", [
    (_spec(label={"nmae": "click"}), "name"),
    (_spec(categorical=[{**_USER, "hash_bucket": 50}]), "hash_buckets"),
    (_spec(dense=[{"name": "Price", "transform": "log1pp"}]), "log1p"),
    (_spec(tables=[{"name": "ids", "rows": 100, "dim": 8,
                    "mode": "dynamc"}]), "dynamic"),
    (_spec(tables=[{"name": "ids", "dim": 8, "mode": "dynamic",
                    "capacity": 99, "evict": "lfuu"}],
           categorical=[{"name": "user", "table": "ids"}]), "lfu"),
    (_spec(categorical=[{**_USER, "table": "idss"}]), "ids"),
    (_spec(categorical=[_USER, _ITEM, {"name": "x", "table": "ids",
                                        "hash_buckets": 50}],
           derived=[{"name": "x", "kind": "crss",
                     "sources": ["user", "item"]}]), "cross"),
    (_spec(categorical=[_USER, _ITEM, {"name": "x", "table": "ids",
                                        "hash_buckets": 50}],
           derived=[{"name": "x", "kind": "cross",
                     "sources": ["usr", "item"]}]), "user"),
    (_spec(categorical=[_USER, _ITEM],
           towers={"query": ["user", "Price"], "candidate": ["item"],
                   "candidate_idd": "item"}), "candidate_id"),
    (_spec(categorical=[_USER, _ITEM],
           towers={"query": ["user", "price"], "candidate": ["item"],
                   "candidate_id": "item"}), "Price"),
    (_spec(categorical=[_USER, _ITEM],
           towers={"query": ["user", "Price"], "candidate": ["item"],
                   "candidate_id": "itme"}), "item"),
])
def test_a_misspelt_spec_value_or_reference_suggests_it(tmp_path, capsys,
                                                       spec, meant):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert _exit_code(["spec", str(path)]) == 2
    assert f"did you mean {meant!r}?" in _error_line(capsys)


# -- the Python API: job keys and model options --------------------------------


def test_a_misspelt_job_key_or_model_option_suggests_it():
    from psrec.launch.job.config import JobConfig
    from psrec.models.ranking.config import ModelConfigError
    from psrec.models.ranking.config import model_config
    job = json.loads(json.dumps(JobConfig().to_dict()))
    job["model_nam"] = job.pop("model_name")
    with pytest.raises(ConfigError, match="did you mean 'model_name'\\?"):
        JobConfig.from_dict(job)
    with pytest.raises(ModelConfigError, match="did you mean 'dcn'\\?"):
        model_config("dnc")
    with pytest.raises(ModelConfigError,
                       match="did you mean 'cross_low_rank'\\?"):
        model_config("dcn", cross_lowrank=8)
