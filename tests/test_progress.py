"""Progress of the long passes (``psrec.progress``): what ingest, convert,
spec infer, eval and the pre-training data checks report, and the CLI's bar
on stderr (``launch.monitor.progress_bar``) that keeps ``--json`` stdout clean."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.infer.infer import infer_spec
from psrec.data.ingest.criteo import ingest_criteo
from psrec.data.ingest.jsonl import ingest_jsonl
from psrec.data.ingest.libfm import ingest_libfm
from psrec.data.ingest.synthetic import write_synthetic_parquet
from psrec.data.ingest.tabular import ingest_csv
from psrec.data.input.integrity import check_disjoint_splits
from psrec.data.input.integrity import repair_corrupted_shards
from psrec.features import criteo
from psrec.launch.cli.main import main
from psrec.launch.monitor.progress_bar import ProgressBar
from psrec.progress import SILENT
from psrec.progress import Progress
from psrec.progress import Task

SPEC = criteo(buckets=50, dim=4)


class RecordedTask(Task):
    """A pass as reported: label, total, unit, every advance, closes."""

    def __init__(self, label: str, total: int | None, unit: str) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.advances: list[int] = []
        self.closes = 0

    @property
    def done(self) -> int:
        return sum(self.advances)

    @property
    def closed(self) -> bool:
        return self.closes > 0

    def advance(self, n: int = 1) -> None:
        assert not self.closed, f"{self.label}: advanced after close"
        assert n >= 0, f"{self.label}: advanced by {n}"
        self.advances.append(n)

    def close(self) -> None:
        self.closes += 1


class Recorder(Progress):
    """A :class:`Progress` that records every pass."""

    def __init__(self) -> None:
        self.tasks: list[RecordedTask] = []

    def task(self, label: str, total: int | None, unit: str = "rows"
             ) -> RecordedTask:
        self.tasks.append(RecordedTask(label, total, unit))
        return self.tasks[-1]


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def parquet(tmp_path_factory) -> list[Path]:
    """2 synthetic Parquet files, 700 rows in all."""
    root = tmp_path_factory.mktemp("progress-parquet")
    return write_synthetic_parquet(SPEC, root, 700, files=2)


@pytest.fixture(scope="module")
def converted(parquet, tmp_path_factory):
    out = tmp_path_factory.mktemp("progress-tfr")
    return convert(parquet, SPEC, out, ConversionOptions(
        shards=2, eval_fraction=0.2, batch_rows=100)).manifest


# -- the protocol -------------------------------------------------------------


def test_silent_progress_accepts_every_call():
    with SILENT.task("anything", 10, "rows") as task:
        task.advance(3)
        task.advance()
    task.close()  # closing twice is allowed


# -- what the library reports -------------------------------------------------


def test_convert_reports_every_input_row_in_batches(parquet, tmp_path):
    recorder = Recorder()
    report = convert(parquet, SPEC, tmp_path / "out", ConversionOptions(
        shards=2, eval_fraction=0.2, batch_rows=100), progress=recorder)
    (task,) = recorder.tasks
    rows = sum(pq.read_metadata(p).num_rows for p in parquet)
    assert (task.label, task.unit) == ("convert", "rows")
    assert task.total == report.rows_read == rows == 700
    assert task.done == rows and max(task.advances) <= 100
    assert len(task.advances) >= 7  # per batch, not once at the end
    assert task.closes >= 1


def test_ingest_reports_the_bytes_of_every_input_as_stored(tmp_path):
    text = "id,click\n" + "".join(f"u{i},{i % 2}\n" for i in range(50_000))
    (tmp_path / "a.csv").write_text(text)
    with gzip.open(tmp_path / "b.csv.gz", "wt") as f:
        f.write(text)
    sources = [tmp_path / "a.csv", tmp_path / "b.csv.gz"]
    recorder = Recorder()
    report = ingest_csv(sources, tmp_path / "out", block_size_bytes=4096,
                        progress=recorder)
    assert report.rows == 100_000
    (task,) = recorder.tasks
    stored = sum(p.stat().st_size for p in sources)
    assert (task.unit, task.total, task.done) == ("bytes", stored, stored)
    assert len(task.advances) > 2  # as pyarrow reads on (ahead of parsing)
    assert task.closed


def test_criteo_ingest_reports_the_bytes_of_every_input(tmp_path):
    line = "1\t" + "\t".join(["3"] * 13 + ["68fd1e64"] * 26) + "\n"
    (tmp_path / "day.txt").write_text(line * 20_000)
    with gzip.open(tmp_path / "day2.txt.gz", "wt") as f:
        f.write(line * 20_000)
    sources = [tmp_path / "day.txt", tmp_path / "day2.txt.gz"]
    recorder = Recorder()
    report = ingest_criteo(sources, tmp_path / "out", block_size_bytes=1 << 16,
                           progress=recorder)
    assert report.rows == 40_000
    (task,) = recorder.tasks
    stored = sum(p.stat().st_size for p in sources)
    assert (task.unit, task.total, task.done) == ("bytes", stored, stored)
    assert len(task.advances) > 2 and task.closed


def test_libfm_and_jsonl_ingest_report_their_bytes(tmp_path):
    (tmp_path / "a.libfm").write_text("1 0:3:1 1:7:1\n0 0:4:1 1:2:1\n")
    (tmp_path / "a.jsonl").write_text('{"a": 1}\n{"a": 2}\n{"a": 3}\n')
    for ingest, src in ((ingest_libfm, tmp_path / "a.libfm"),
                        (ingest_jsonl, tmp_path / "a.jsonl")):
        recorder = Recorder()
        ingest([src], tmp_path / src.suffix[1:], progress=recorder)
        (task,) = recorder.tasks
        size = src.stat().st_size
        assert (task.unit, task.total, task.done) == ("bytes", size, size)
        assert task.closed


def test_a_failed_ingest_still_closes_its_pass(tmp_path):
    (tmp_path / "bad.csv").write_text("id,click\nu1,1\nu2,x\n")
    recorder = Recorder()
    with pytest.raises(Exception, match="click"):
        ingest_csv([tmp_path / "bad.csv"], tmp_path / "out",
                   column_types={"click": "int64"}, progress=recorder)
    (task,) = recorder.tasks
    assert task.closed and task.done < task.total


def test_spec_infer_reports_the_rows_of_the_parquet_metadata(parquet,
                                                             tmp_path):
    recorder = Recorder()
    report = infer_spec(parquet, "label", tmp_path / "spec.yaml",
                        progress=recorder)
    (task,) = recorder.tasks
    assert task.unit == "rows"
    assert task.total == task.done == report.rows == 700
    assert len(task.advances) == 2  # one batch per (small) file
    assert task.closed


def test_pre_training_checks_report_bytes_hashed_and_ids_read(converted,
                                                              tmp_path):
    recorder = Recorder()
    manifest, repair = repair_corrupted_shards(converted, tmp_path, 0,
                                               progress=recorder)
    assert repair is None
    assert check_disjoint_splits(manifest, progress=recorder) == 140
    hashed, ids = recorder.tasks
    shards = [s for split in ("train", "eval") for s in manifest.shards[split]]
    assert hashed.unit == "bytes" and len(hashed.advances) == len(shards)
    assert hashed.total == hashed.done == sum(s.bytes for s in shards)
    assert ids.unit == "rows"
    assert ids.total == ids.done == manifest.rows("train") + manifest.rows(
        "eval") == 700
    assert hashed.closed and ids.closed


def test_prepare_data_shows_both_checks_and_draws_bars_by_default(
        converted, tmp_path, capsys):
    from psrec.launch.job.config import JobConfig
    from psrec.launch.job.config import StrategyConfig
    from psrec.launch.job.data import prepare_data
    config = JobConfig(workdir=tmp_path / "run", spec=SPEC,
                       data=converted.root,
                       strategy=StrategyConfig(kind="one-device"))
    recorder = Recorder()
    prepare_data(config, log=lambda text: None, progress=recorder)
    assert [t.unit for t in recorder.tasks] == ["bytes", "rows"]
    assert all(t.closed and t.done == t.total for t in recorder.tasks)
    capsys.readouterr()
    prepare_data(config, log=lambda text: None)  # the CLI's default
    err = capsys.readouterr().err
    assert "checking the sha256 of 4 shards (MiB)" in err
    assert "checking that train and eval share no example (rows)" in err
    assert "700/700 [====" in err


def test_eval_reports_the_rows_of_the_split(converted, tmp_path, capsys):
    from psrec.data.input.config import InputConfig
    from psrec.launch.job.config import JobConfig
    from psrec.launch.job.export import evaluate_checkpoint
    from psrec.models.optim.config import OptimizerConfig
    from psrec.models.ranking.config import model_config
    from psrec.ps_cluster.cluster.strategy import build_replicated_strategy
    from psrec.ps_cluster.training.config import LoopConfig
    from psrec.ps_cluster.training.trainer import Trainer
    model = model_config("dlrm", bottom_mlp=(8,), top_mlp=(8,))
    checkpoints = tmp_path / "checkpoints"
    JobConfig(workdir=tmp_path, spec=SPEC, model_name="dlrm",
              model=model).write(checkpoints)
    trainer = Trainer(build_replicated_strategy("one-device"), SPEC, model,
                      OptimizerConfig(warmup_steps=0),
                      InputConfig(batch_size=32), checkpoint_dir=checkpoints)
    trainer.train(trainer.dataset_fn(converted), LoopConfig(
        steps=2, steps_per_closure=2, checkpoint_every=0))
    recorder = Recorder()
    result = evaluate_checkpoint(checkpoints, converted, batch_size=64,
                                 progress=recorder)
    (task,) = recorder.tasks
    assert task.unit == "rows"
    assert task.total == task.done == result.count == converted.rows("eval")
    assert len(task.advances) == 3  # 140 rows in batches of 64
    capsys.readouterr()
    # The CLI: a bar on stderr, one JSON object on stdout.
    assert main(["eval", str(checkpoints), "--data", str(converted.root),
                 "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["count"] == 140
    assert "eval (eval split) (rows)" in captured.err
    assert "140/140 [====" in captured.err


# -- the CLI's bar ------------------------------------------------------------


def test_cli_ingest_draws_on_stderr_and_keeps_json_stdout_clean(tmp_path,
                                                                capsys):
    src = tmp_path / "log.csv"
    src.write_text("id,click\n" + "".join(f"u{i},1\n" for i in range(500)))
    assert main(["ingest", "csv", str(src), "--out", str(tmp_path / "out"),
                 "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["rows"] == 500  # stdout: one object
    assert "ingest 1 file (MiB)" in captured.err
    assert "1/1 [==============================]" in captured.err
    assert "\r" not in captured.err  # not a terminal: lines
    assert main(["ingest", "csv", str(src), "--out", str(tmp_path / "out"),
                 "--json", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["rows"] == 500
    assert captured.err == ""


def test_cli_convert_and_spec_infer_show_rows(parquet, tmp_path, capsys):
    spec_file = SPEC.save(tmp_path / "spec.yaml")
    assert main(["convert", *map(str, parquet), "--spec", str(spec_file),
                 "--out", str(tmp_path / "out"), "--eval-fraction", "0.2",
                 "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["rows_read"] == 700
    assert "convert (rows)" in captured.err
    assert "700/700 [====" in captured.err
    assert main(["spec", "infer", *map(str, parquet), "--label", "label",
                 "--out", str(tmp_path / "inferred.yaml"), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["rows"] == 700
    assert "spec infer: statistics (rows)" in captured.err
    assert "700/700 [====" in captured.err


def test_without_a_terminal_the_bar_prints_lines_at_most_each_interval():
    stream = io.StringIO()
    with ProgressBar(stream, interval=3600).task("convert", 1000,
                                                 "rows") as task:
        for _ in range(10):
            task.advance(100)
    text = stream.getvalue()
    assert "\r" not in text and "\b" not in text
    lines = text.splitlines()
    # The label, the first line, then nothing for an hour but the last.
    assert lines[0] == "convert (rows)"
    assert lines[1].startswith("   0/1000 [")
    assert lines[2].startswith("1000/1000 [==============================]")
    assert len(lines) == 3


def test_on_a_terminal_the_bar_redraws_in_place():
    stream = FakeTerminal()
    with ProgressBar(stream, interval=0).task("ingest", 3 << 20,
                                              "bytes") as task:
        task.advance(1 << 20)
        task.advance(2 << 20)
    text = stream.getvalue()
    assert text.startswith("ingest (MiB)\n")
    assert text.count("\r") == 4  # 0, 1, 3 MiB and the final draw
    assert "3/3 [==============================]" in text
    assert text.endswith("\n")


def test_progbar_never_writes_to_stdout(capsys):
    stream = io.StringIO()
    with ProgressBar(stream, interval=0).task("x", 5, "shards") as task:
        task.advance(5)
    assert capsys.readouterr().out == ""
    assert "5/5" in stream.getvalue()


def test_the_training_bar_ends_its_line_before_what_follows():
    """On a terminal the bar is redrawn with ``\\r``; whatever the run says
    next -- ``psrec train: interrupted (SIGINT) ...`` after Ctrl-C, an error
    -- must start a line of its own, not be glued to the bar."""
    from psrec.launch.monitor.progress import ProgressReporter

    terminal = FakeTerminal()
    reporter = ProgressReporter(total_steps=100, stream=terminal)
    reporter.update(7, 0.5, 64)
    assert not terminal.getvalue().endswith("\n")  # the bar is open
    reporter.close()
    terminal.write("psrec train: interrupted (SIGINT)\n")
    *_, bar, last, _ = terminal.getvalue().split("\n")
    assert bar.lstrip("\r").startswith("step 7/100")
    assert last == "psrec train: interrupted (SIGINT)"
    reporter.close()  # closing twice adds no empty line
    assert terminal.getvalue().endswith("(SIGINT)\n")
