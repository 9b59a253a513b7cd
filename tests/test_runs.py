"""``psrec runs`` and ``psrec show``: what runs left on disk, read without
TensorFlow and without a cluster.

The workdir is made of the files a run writes, by the code that writes
them: a real checkpoint (``CheckpointKeeper``), ``job.json``
(``JobConfig.write``), ``best.json`` (``BestTracker``), ``summary.json``
(``JobSummary.to_dict``, written as ``run_job`` writes it) and a real
export (``psrec export`` into ``export/``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from psrec.launch.cli.main import main
from tests._proc import REPO

STEP = 30
BEST_STEP = 20


@pytest.fixture(scope="module")
def runs_folder(tmp_path_factory):
    """A folder with two runs: ``done`` (checkpoints at steps 20 and 30,
    the best at 20, its summary and export version 1) and ``started``
    (job.json and one checkpoint only: a run still going, or killed), and
    one folder that is no run."""
    import tensorflow as tf

    from psrec.data.format.files import write_json_atomic
    from psrec.features import criteo
    from psrec.launch.job.config import JobConfig
    from psrec.launch.job.summary import JobSummary
    from psrec.models.build import build_model
    from psrec.models.ranking.config import model_config
    from psrec.ps_cluster.checkpoint.best import BestTracker
    from psrec.ps_cluster.checkpoint.keeper import CheckpointKeeper
    from psrec.ps_cluster.evaluation.metrics import EvalResult
    root = tmp_path_factory.mktemp("runs")
    spec = criteo(buckets=50, dim=4)
    config = model_config("dlrm", bottom_mlp=(8,), top_mlp=(8,))
    for name, steps in (("done", (BEST_STEP, STEP)), ("started", (10,))):
        workdir = root / name
        checkpoints = workdir / "checkpoints"
        JobConfig(workdir=workdir, spec=spec, model_name="dlrm",
                  model=config).write(checkpoints)
        keeper = CheckpointKeeper(checkpoints, tf.train.Checkpoint(
            model=build_model(spec, config)))
        for step in steps:
            saved = keeper.save(step)
            if name == "done":
                auc = 0.7 if step == BEST_STEP else 0.6
                BestTracker(checkpoints, "auc").update(step, EvalResult(
                    count=100, positives=25.0, logloss=0.5, auc=auc,
                    id_sum=0), saved)
    workdir = root / "done"
    assert main(["export", str(workdir / "checkpoints"), "--out",
                 str(workdir / "export")]) == 0
    summary = JobSummary(
        strategy="one-device", manifest="m/manifest.json",
        checkpoint=str(workdir / "checkpoints" / f"ckpt-{STEP}"),
        export=str(workdir / "export" / "1"), tensorboard="tb",
        start_step=0, step=STEP, executed_steps=STEP, examples_per_sec=1.0,
        final_loss=0.5, eval=EvalResult(count=100, positives=25.0,
                                        logloss=0.55, auc=0.6, id_sum=0),
        seconds=12.5, workers=1, ps=0, replicas=1, batch_size=32,
        micro_batches=1, precision="float32", closures_per_worker={})
    write_json_atomic(workdir / "summary.json", summary.to_dict())
    (root / "notes").mkdir()
    return root


def _psrec(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_runs_lists_each_run_on_one_line(runs_folder, capsys):
    code, out, _ = _psrec(capsys, "runs", str(runs_folder))
    assert code == 0
    header, *rows = out.strip().splitlines()
    assert header.split() == ["name", "model", "data", "steps", "best",
                              "exports", "changed"]
    assert [row.split()[0] for row in rows] == ["done", "started"]
    done, started = rows
    assert "dlrm" in done and "generated" in done
    assert f" {STEP} " in done  # steps done
    assert f"auc 0.7000 (step {BEST_STEP})" in done  # best.json
    assert "  1  " in done  # export version 1
    assert " 10 " in started and "  -  " in started  # no best, no export
    code, out, _ = _psrec(capsys, "runs", str(runs_folder), "--json")
    data = json.loads(out)
    by_name = {run["name"]: run for run in data["runs"]}
    assert by_name["done"]["steps"] == STEP
    assert by_name["done"]["best"]["step"] == BEST_STEP
    assert by_name["done"]["exports"] == [str(runs_folder / "done" / "export"
                                              / "1")]
    assert by_name["started"]["steps"] == 10
    assert by_name["started"]["best"] is None


def test_show_summarises_one_run(runs_folder, capsys):
    code, out, _ = _psrec(capsys, "show", str(runs_folder / "done"))
    assert code == 0
    assert "spec:        criteo" in out
    assert "model:       dlrm" in out
    assert f"steps done:  {STEP}" in out
    assert (f"best:        step {BEST_STEP}, AUC 0.7000, logloss 0.5000 "
            f"(best/best-{BEST_STEP}, by auc)") in out
    assert f"final eval:  step {STEP}: auc 0.6000, logloss 0.5500" in out
    assert f"exports:     {runs_folder / 'done' / 'export' / '1'}" in out
    assert "wall time:   12.5 s" in out
    code, out, _ = _psrec(capsys, "show", str(runs_folder / "started"))
    assert code == 0
    assert "best:        none recorded" in out
    assert "exports:     none" in out
    assert "wall time:   unknown (no summary.json" in out


def test_a_folder_that_is_no_workdir_is_one_line_exit_2(runs_folder, capsys):
    for argv, names in ((["show", str(runs_folder / "notes")],
                         "is not a psrec workdir"),
                        (["show", str(runs_folder)], "is not a psrec workdir"),
                        (["runs", str(runs_folder / "notes")], "holds no runs"),
                        (["runs", str(runs_folder / "nowhere")],
                         "is not a folder")):
        code, out, err = _psrec(capsys, *argv)
        assert code == 2 and out == "", argv
        [line] = err.strip().splitlines()
        assert line.startswith(f"psrec {argv[0]}: error: ") and names in line


def test_runs_and_show_import_no_tensorflow(runs_folder):
    for argv in (["runs", str(runs_folder)],
                 ["show", str(runs_folder / "done")]):
        code = ("import sys\n"
                "from psrec.launch.cli.main import main\n"
                f"code = main({argv!r})\n"
                "assert 'tensorflow' not in sys.modules, 'imported tensorflow'\n"
                "sys.exit(code)\n")
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "done" in done.stdout

