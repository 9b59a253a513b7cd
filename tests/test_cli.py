"""The ``psrec`` command line as users meet it: one-line errors with exit
codes, ``--help`` with every default and grouped flags, ``--ps``/``--workers``
as counts everywhere, ``--json`` results. Called in-process (``main``)."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.errors import RetryableError
from psrec.launch.cli import argtypes
from psrec.launch.cli import data_run
from psrec.launch.cli.main import COMMANDS
from psrec.launch.cli.main import Command
from psrec.launch.cli.main import build_parser
from psrec.launch.cli.main import exit_code_for
from psrec.launch.cli.main import main
from psrec.launch.cli.main import shows_default


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    [sub] = [a for a in parser._actions
             if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The user-visible arguments (not --help, not hidden ones)."""
    return [a for a in parser._actions
            if not isinstance(a, argparse._HelpAction)
            and a.help != argparse.SUPPRESS]


def _flat(text: str) -> str:
    return " ".join(text.split())


def _one_line_error(err: str, command: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"psrec {command}: error: "), err
    return lines[0]


# -- --help ------------------------------------------------------------------


def test_every_option_of_every_command_has_help_and_shows_its_default():
    commands = _commands()
    assert {"ingest", "convert", "audit-shards", "spec", "synth", "tf-config",
            "train", "advise", "server", "export", "eval", "predict",
            "score", "bench"} <= set(
                commands)
    shown = 0
    for name, parser in commands.items():
        text = parser.format_help()
        assert "(default: None)" not in _flat(text), name
        assert "(default: False)" not in _flat(text), name
        assert "%%" not in text and "%(" not in text, name
        for action in _options(parser):
            flag = "/".join(action.option_strings) or action.dest
            assert action.help and action.help.strip(), f"{name} {flag}"
            if shows_default(action):
                entry = _help_entry(text, action.option_strings[0])
                assert f"(default: {action.default})" in entry, entry
                shown += 1
    assert shown >= 40  # the check above did run over the real defaults


def _every_parser(parser=None, words=()):
    """``(words, parser)`` of every command and command group."""
    parser = parser or build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield (*words, name), child
                yield from _every_parser(child, (*words, name))


def test_every_command_s_help_ends_with_an_example_that_parses(capsys):
    every = list(_every_parser())
    assert len(every) >= 20
    for words, parser in every:
        text = parser.format_help()
        last = text.strip().splitlines()[-1]
        assert last.startswith(f"example: psrec {' '.join(words)}"), (
            words, last)
        example = last[len("example: psrec "):].split()
        try:
            build_parser().parse_args(example)
        except SystemExit as error:  # pragma: no cover - the failure
            pytest.fail(f"{words}: {last}: {capsys.readouterr().err}"
                        f" (exit {error.code})")


def test_the_command_list_is_grouped_each_command_once(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for group in ("data:", "train:", "serve:", "inspect:"):
        assert f"\n  {group}\n" in text, group
    listed = [line.split()[0] for line in text.splitlines()
              if line.startswith("    ") and not line.startswith("     ")]
    assert sorted(listed) == sorted(_commands()), listed
    assert "{" not in text  # no flat {ingest,convert,...} list


def test_no_option_shows_its_default_twice():
    for words, parser in _every_parser():
        for action in _options(parser):
            if shows_default(action):  # the formatter appends the default
                assert not re.search(r"\(default\b", action.help or ""), (
                    words, action.option_strings, action.help)


@pytest.mark.parametrize("command, flag, default", [
    ("train", "--sparse-lr", "0.2"), ("train", "--stall-timeout", "900.0"),
    ("train", "--seed", "0"), ("train", "--keep-best", "auc"),
    ("train", "--model", "deepfm"), ("bench", "--steps", "300"),
    ("advise", "--repeats", "5"), ("convert", "--eval-fraction",
     "0.1 unless --eval-files picks the eval rows"),
    ("convert", "--split", "tail"), ("eval", "--split", "eval")])
def test_help_output_shows_defaults(capsys, command, flag, default):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert f"(default: {default})" in _help_entry(capsys.readouterr().out,
                                                   flag)


def _help_entry(help_text: str, flag: str) -> str:
    """The help of one option in ``--help`` output (continuation lines
    joined)."""
    lines = help_text.splitlines()
    [start] = [i for i, line in enumerate(lines)
               if line.startswith(f"  {flag} ") or line == f"  {flag}"]
    end = start + 1
    while end < len(lines) and lines[end].startswith(" " * 5):
        end += 1
    return _flat(" ".join(lines[start:end]))


def _groups(parser: argparse.ArgumentParser) -> dict[str, set[str]]:
    return {group.title: {o for a in group._group_actions
                          for o in a.option_strings}
            for group in parser._action_groups}


def test_train_flags_are_grouped(capsys):
    groups = _groups(_commands()["train"])
    expected = {
        "data": {"--spec", "--data", "--batch-size", "--synthetic-rows"},
        "model": {"--model", "--cross-low-rank"},
        "optimizer": {"--sparse-lr", "--dense-lr", "--warmup-steps",
                      "--base-batch-size"},
        "cluster": {"--strategy", "--workers", "--ps", "--cluster",
                    "--allow-remote", "--memory-fraction"},
        "reliability": {"--max-restarts", "--stall-timeout",
                        "--checkpoint-every", "--keep-checkpoints"},
        "output": {"--workdir", "--log-every", "--no-export"},
    }
    for title, flags in expected.items():
        assert flags <= groups[title], (title, groups[title])
    # Every train flag is in one of the groups (none left under "options").
    assert groups["options"] <= {"-h", "--help"}
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for title in expected:
        assert f"\n{title}:" in out, title


@pytest.mark.parametrize("command, titles", [
    ("bench", {"model", "cluster", "schedule", "output"}),
    ("advise", {"model", "measurement", "output"})])
def test_bench_and_advise_flags_are_grouped(command, titles):
    groups = _groups(_commands()[command])
    assert titles <= set(groups)
    assert groups["options"] <= {"-h", "--help"}


# -- bad values: one line, exit 2, flag + value + what is allowed ------------


BAD_VALUES = [
    (["train", "--sparse-lr", "0"], "--sparse-lr", "'0'", "> 0"),
    (["train", "--sparse-lr", "nan"], "--sparse-lr", "'nan'", "finite"),
    (["train", "--sparse-lr", "inf"], "--sparse-lr", "'inf'", "finite"),
    (["train", "--dense-lr", "-1"], "--dense-lr", "'-1'", "> 0"),
    (["train", "--stall-timeout", "-5"], "--stall-timeout", "'-5'", ">= 0"),
    (["train", "--stall-timeout", "nan"], "--stall-timeout", "'nan'",
     "finite"),
    (["train", "--batch-size", "0"], "--batch-size", "'0'", ">= 1"),
    (["train", "--batch-size", "lots"], "--batch-size", "'lots'",
     "an integer"),
    (["train", "--memory-fraction", "0"], "--memory-fraction", "'0'",
     "(0, 1]"),
    (["train", "--model", "gpt"], "--model", "'gpt'", "'dcn'"),
    (["train", "--workers", "0"], "--workers", "'0'", ">= 1"),
    (["train", "--ps", "localhost:2222"], "--ps", "'localhost:2222'",
     "an integer"),
    (["train", "--seed", "1.5"], "--seed", "'1.5'", "an integer"),
    (["bench", "--workers", "host:1"], "--workers", "'host:1'",
     "an integer"),
    (["advise", "--memory-fraction", "1.5"], "--memory-fraction", "'1.5'",
     "(0, 1]"),
    (["convert", "in.parquet", "--spec", "criteo", "--out", "o",
      "--eval-fraction", "1.5"], "--eval-fraction", "'1.5'", "[0, 1)"),
    (["convert", "in.parquet", "--spec", "criteo", "--out", "o",
      "--eval-fraction", "1"], "--eval-fraction", "'1'", "[0, 1)"),
    (["convert", "in.parquet", "--spec", "criteo", "--out", "o",
      "--max-bad-fraction", "-0.1"], "--max-bad-fraction", "'-0.1'",
     "[0, 1]"),
    (["server", "--index", "-1"], "--index", "'-1'", ">= 0"),
]


@pytest.mark.parametrize("argv, flag, value, allowed", BAD_VALUES,
                         ids=[" ".join(case[0][:1] + case[0][-2:])
                              for case in BAD_VALUES])
def test_bad_value_exits_2_with_one_line_naming_flag_value_and_rule(
        capsys, argv, flag, value, allowed):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    line = _one_line_error(captured.err, argv[0])
    assert f"argument {flag}:" in line
    assert value in line and allowed in line


def test_missing_required_flag_and_unknown_command_are_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", "in.parquet", "--spec", "criteo"])
    assert exit_info.value.code == 2
    assert "--out" in _one_line_error(capsys.readouterr().err, "convert")
    with pytest.raises(SystemExit) as exit_info:
        main(["frobnicate"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("psrec: error:") and "'frobnicate'" in err


def test_good_values_parse_to_typed_values():
    args = build_parser().parse_args([
        "train", "--sparse-lr", "0.1", "--dense-lr", "1e-4",
        "--stall-timeout", "0", "--memory-fraction", "1", "--workers", "3",
        "--ps", "2", "--seed", "-7"])
    assert (args.sparse_lr, args.dense_lr) == (0.1, 1e-4)
    assert args.stall_timeout == 0.0 and args.memory_fraction == 1.0
    assert (args.workers, args.ps, args.seed) == (3, 2, -7)
    args = build_parser().parse_args(["bench", "--workers", "4", "--ps", "2"])
    assert (args.workers, args.ps) == (4, 2)


@pytest.mark.parametrize("parse, good, bad", [
    (argtypes.positive, {"1": 1, "12": 12}, ["0", "-1", "1.0", "x", ""]),
    (argtypes.non_negative, {"0": 0, "5": 5}, ["-1", "nan"]),
    (argtypes.integer, {"-3": -3, "0": 0}, ["1e3", "one"]),
    (argtypes.positive_float, {"0.5": 0.5, "1e-3": 1e-3},
     ["0", "-0.0", "-1", "nan", "inf", "-inf", "1e999", "x"]),
    (argtypes.non_negative_float, {"0": 0.0, "2.5": 2.5},
     ["-5", "nan", "inf"]),
    (argtypes.fraction, {"0": 0.0, "1": 1.0}, ["1.5", "-0.1", "nan"]),
    (argtypes.positive_fraction, {"1": 1.0, "0.25": 0.25},
     ["0", "1.01", "nan"]),
    (argtypes.proper_fraction, {"0": 0.0, "0.99": 0.99},
     ["1", "1.5", "nan"]),
])
def test_argtypes(parse, good, bad):
    for text, value in good.items():
        assert parse(text) == value
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError,
                           match=f"invalid value {text!r}: must be"):
            parse(text)


def test_a_real_process_prints_one_line_and_exits_2():
    """The console entry point, not just ``main``: exit status 2, one
    line on stderr, nothing on stdout, before TensorFlow is imported."""
    done = subprocess.run(
        [sys.executable, "-m", "psrec", "train", "--sparse-lr", "nan"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout == ""
    line = _one_line_error(done.stderr, "train")
    assert "--sparse-lr" in line and "'nan'" in line


# -- the command registry: parsers without TensorFlow, run modules late ------


def _command_words(parser: argparse.ArgumentParser, words=()):
    """``words`` and those of every command below ``parser``."""
    yield words
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _command_words(child, (*words, name))


def test_every_help_is_printed_without_importing_tensorflow():
    """``psrec --help`` and ``psrec COMMAND --help`` for every command the
    registry builds, in a fresh process: TensorFlow is never imported (nor
    by the module ``k8s simulate`` runs from, which re-executes itself into
    its network namespace first)."""
    every = [list(words) for words in _command_words(build_parser())]
    registered = [c.words.split() for c in COMMANDS if isinstance(c, Command)]
    assert [] in every and all(w in every for w in registered), every
    assert {"train", "advise", "server", "data-server"} <= {
        w[0] for w in every if w}  # the commands cli/train.py adds
    code = f"""
import contextlib, io, json, sys
from psrec.launch.cli.main import main
helps = {{}}
for words in {every!r}:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main([*words, "--help"])
        except SystemExit as done:
            helps[" ".join(words)] = (done.code, out.getvalue())
import psrec.launch.cli.simulate_run
print(json.dumps({{"helps": helps, "tf": sorted(
    m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras",
                                                 "tf_keras"))}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["tf"] == []
    assert sorted(result["helps"]) == sorted(" ".join(w) for w in every)
    for words, (status, text) in result["helps"].items():
        assert status == 0 and text.startswith(
            f"usage: {' '.join(['psrec', *words.split()])} "), words


def test_every_registered_command_runs_a_function_of_its_module():
    import importlib
    for command in COMMANDS:
        if isinstance(command, Command):
            module, function = command.runs.split(":")
            assert callable(getattr(importlib.import_module(module),
                                    function)), command.words


def test_the_run_function_is_looked_up_when_the_command_runs(monkeypatch,
                                                             capsys):
    seen = []
    monkeypatch.setattr(data_run, "run_synth", lambda args: seen.append(
        (args.command, args.rows)) or 0)
    assert main(["synth", "--out", "unused", "--rows", "7"]) == 0
    assert seen == [("synth", 7)]


# -- library errors: one line and their exit code ----------------------------


def test_exit_codes_of_library_errors():
    assert exit_code_for(ConfigError("x")) == 2
    assert exit_code_for(DataError("x")) == 1
    assert exit_code_for(RetryableError("x")) == 138
    assert exit_code_for(ImportError("no module named tensorflow")) == 2
    assert exit_code_for(ModuleNotFoundError("x")) == 2
    assert exit_code_for(FileNotFoundError("x")) == 2
    assert exit_code_for(ValueError("a bug")) is None
    # A retryable error whose cause is an import or configuration failure
    # is permanent: a restart cannot fix it.
    for cause in (ImportError("broken install"), ConfigError("bad spec")):
        try:
            try:
                raise cause
            except Exception as error:
                raise RetryableError("role did not start") from error
        except RetryableError as wrapped:
            assert exit_code_for(wrapped) == 2


@pytest.mark.parametrize("error, code", [
    (ImportError("cannot import name 'x' from 'tensorflow'\n  detail"), 2),
    (ConfigError("first line\nsecond line"), 2),
    (DataError("shard /d/train-0.tfrecord is corrupted"), 1)])
def test_library_error_is_one_line_with_its_exit_code(monkeypatch, capsys,
                                                      error, code):
    def failing(args):
        raise error
    # The registry looks `run_spec` up in its module when `spec` runs.
    monkeypatch.setattr(data_run, "run_spec", failing)
    assert main(["spec", "criteo"]) == code
    captured = capsys.readouterr()
    line = _one_line_error(captured.err, "spec")
    assert str(error).splitlines()[0] in line
    assert captured.out == ""


def test_unknown_spec_is_a_one_line_usage_error(capsys):
    assert main(["spec", "no-such-preset"]) == 2
    line = _one_line_error(capsys.readouterr().err, "spec")
    assert "'no-such-preset'" in line and "criteo" in line


# -- tf-config: addresses are --*-hosts, --ps/--workers are counts -----------


HOSTS = ["--ps-hosts", "localhost:2222,localhost:2223",
         "--worker-hosts", "localhost:2224", "--chief-host", "localhost:2221"]


def test_tf_config_takes_host_lists(capsys):
    assert main(["tf-config", *HOSTS]) == 0
    lines = capsys.readouterr().out.splitlines()
    configs = [json.loads(line) for line in lines]
    assert [c["task"] for c in configs] == [
        {"type": "chief", "index": 0}, {"type": "ps", "index": 0},
        {"type": "ps", "index": 1}, {"type": "worker", "index": 0}]
    assert configs[0]["cluster"] == {
        "chief": ["localhost:2221"], "ps": ["localhost:2222", "localhost:2223"],
        "worker": ["localhost:2224"]}


def test_tf_config_json_is_one_object(capsys, tmp_path):
    assert main(["tf-config", *HOSTS, "--json"]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1
    data = json.loads(out)
    assert sorted(data) == ["chief-0", "ps-0", "ps-1", "worker-0"]
    assert data["ps-1"]["task"] == {"type": "ps", "index": 1}
    assert main(["tf-config", *HOSTS, "--out", str(tmp_path), "--json"]) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    assert [Path(f).name for f in files] == [
        "chief-0.json", "ps-0.json", "ps-1.json", "worker-0.json"]
    assert all(Path(f).is_file() for f in files)


@pytest.mark.parametrize("old, new", [("--ps", "--ps-hosts"),
                                      ("--workers", "--worker-hosts"),
                                      ("--chief", "--chief-host")])
def test_tf_config_old_address_flags_name_the_new_ones(capsys, old, new):
    argv = ["tf-config", "--ps-hosts", "localhost:2222", "--worker-hosts",
            "localhost:2223", old, "localhost:2299"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    line = _one_line_error(capsys.readouterr().err, "tf-config")
    assert f"argument {old}:" in line and "localhost:2299" in line
    assert f"use {new} localhost:2299" in line


def test_tf_config_bad_address_is_one_line(capsys):
    assert main(["tf-config", "--ps-hosts", "localhost", "--worker-hosts",
                 "localhost:2223"]) == 2
    line = _one_line_error(capsys.readouterr().err, "tf-config")
    assert "'localhost'" in line and "port" in line


def test_ps_and_workers_are_counts_in_train_and_bench():
    for command in ("train", "bench"):
        parser = _commands()[command]
        for flag in ("--ps", "--workers"):
            [action] = [a for a in parser._actions if flag in a.option_strings]
            assert action.type is argtypes.positive, (command, flag)
            assert "number of" in action.help
    tf_config = {o for a in _commands()["tf-config"]._actions
                 if a.help != argparse.SUPPRESS for o in a.option_strings}
    assert {"--ps-hosts", "--worker-hosts", "--chief-host"} <= tf_config
    assert not {"--ps", "--workers", "--chief"} & tf_config


# -- eval --json -------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint_and_data(tmp_path_factory):
    """A checkpoint of an untrained small model (with its job.json) and a
    converted data set of the same spec."""
    from tests._ps_helpers import untrained_checkpoint_and_data
    return untrained_checkpoint_and_data(tmp_path_factory.mktemp("eval"))


def test_eval_json_is_one_object_matching_the_text(capsys,
                                                   checkpoint_and_data):
    checkpoints, manifest = checkpoint_and_data
    argv = ["eval", str(checkpoints), "--data", str(manifest.root)]
    assert main(argv + ["--json"]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1
    data = json.loads(out)
    assert data["split"] == "eval"
    assert data["count"] == manifest.rows("eval") == 150
    assert {"auc", "logloss", "positives", "positive_rate",
            "id_sum"} <= set(data)
    assert 0.0 <= data["auc"] <= 1.0 and data["logloss"] > 0
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"eval: {data['count']} examples, AUC {data['auc']:.4f}" in text
    assert main(argv + ["--split", "train", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["split"] == "train" and data["count"] == 450


def test_eval_of_a_folder_without_checkpoint_is_one_line(
        capsys, tmp_path, checkpoint_and_data):
    _, manifest = checkpoint_and_data
    assert main(["eval", str(tmp_path), "--data", str(manifest.root),
                 "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "job.json" in _one_line_error(captured.err, "eval")


def test_export_json_names_the_saved_model(capsys, tmp_path,
                                           checkpoint_and_data):
    checkpoints, _ = checkpoint_and_data
    out = tmp_path / "export"
    assert main(["export", str(checkpoints), "--out", str(out),
                 "--json"]) == 0
    stdout = capsys.readouterr().out
    assert len(stdout.strip().splitlines()) == 1
    saved = Path(json.loads(stdout)["saved_model"])
    assert saved == out / "1"  # the first version of the export folder
    assert (saved / "saved_model.pb").is_file()
