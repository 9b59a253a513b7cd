"""``psrec eval --plots``: probability-bucket counts summed in the
evaluation's pass, ROC/PR curves from the AUC histograms (their area is the
evaluation's AUC), SVG files that parse with their polylines, and a
``pr_curves`` summary TensorBoard reads."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from psrec.launch.cli.main import main
from psrec.launch.job.plots import PR_CURVE_TAG
from psrec.launch.job.plots import write_plots
from psrec.ps_cluster.evaluation.curves import CURVE_BUCKETS
from psrec.ps_cluster.evaluation.curves import Curves
from psrec.ps_cluster.evaluation.curves import bucket_statistics
from psrec.ps_cluster.evaluation.metrics import add_statistics
from psrec.ps_cluster.evaluation.metrics import batch_statistics
from psrec.ps_cluster.evaluation.metrics import merge
from tests.test_fast_errors import _psrec
from tests.test_metrics import exact_auc

SVG = "{http://www.w3.org/2000/svg}"


def _scores(n=30_000, seed=3):
    """Labels and logits with many exact ties (logits rounded to 0.1),
    positives more likely at higher logits."""
    rng = np.random.default_rng(seed)
    logits = np.round(rng.normal(-1.0, 1.5, n), 1).astype(np.float32)
    labels = (rng.random(n) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    return labels, logits


def _totals(labels, logits, batches=3):
    """Statistics summed over ``batches`` batches, as an evaluation does."""
    parts = []
    for lab, log in zip(np.array_split(labels, batches),
                        np.array_split(logits, batches)):
        stats = {**batch_statistics(tf.constant(lab), tf.constant(log),
                                    tf.zeros(len(lab), tf.int64)),
                 **bucket_statistics(tf.constant(lab), tf.constant(log))}
        parts.append({k: np.asarray(v) for k, v in stats.items()})
    return add_statistics(parts)


def _trapezoid(x, y):
    return float(np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2))


def test_bucket_counts_equal_a_brute_force_count():
    labels, logits = _scores()
    total = _totals(labels, logits)
    p = 1 / (1 + np.exp(-logits.astype(np.float64)))
    bucket = np.minimum((p * CURVE_BUCKETS).astype(int), CURVE_BUCKETS - 1)
    expected_pos = np.bincount(bucket, weights=labels,
                               minlength=CURVE_BUCKETS)
    expected_neg = np.bincount(bucket, weights=1 - labels,
                               minlength=CURVE_BUCKETS)
    np.testing.assert_array_equal(total["bucket_pos"], expected_pos)
    np.testing.assert_array_equal(total["bucket_neg"], expected_neg)
    np.testing.assert_allclose(
        total["bucket_prediction_sum"],
        np.bincount(bucket, weights=p, minlength=CURVE_BUCKETS), rtol=1e-4)
    assert len(np.unique(logits)) < len(logits) / 10  # ties, many


def test_roc_area_is_the_evaluation_auc_and_buckets_match_brute_force():
    labels, logits = _scores()
    total = _totals(labels, logits)
    curves = Curves.from_totals(total)
    fpr, tpr = curves.roc(thin=False)
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0, 0, 1, 1)
    assert _trapezoid(fpr, tpr) == pytest.approx(merge([total]).auc,
                                                 abs=1e-12)
    # The thresholds of the probability buckets: their ROC area is the
    # exact rank AUC of the scores quantized to the buckets.
    counts = curves.threshold_counts()
    roc_x = (counts["fp"] / counts["fp"][0])[::-1]
    roc_y = (counts["tp"] / counts["tp"][0])[::-1]
    p = 1 / (1 + np.exp(-logits.astype(np.float64)))
    quantized = np.minimum((p * CURVE_BUCKETS).astype(int),
                           CURVE_BUCKETS - 1)
    assert _trapezoid(roc_x, roc_y) == pytest.approx(
        exact_auc(labels, quantized), abs=1e-12)
    # Precision at the last threshold (all predicted positive): the rate.
    recall, precision = curves.precision_recall(thin=False)
    assert recall[-1] == 1.0
    assert precision[-1] == pytest.approx(labels.mean())
    assert 0.0 < curves.average_precision() <= 1.0


def test_the_svg_files_parse_with_their_polylines(tmp_path):
    labels, logits = _scores()
    curves = Curves.from_totals(_totals(labels, logits))
    written = write_plots(curves, tmp_path / "checkpoints", "ckpt-7",
                          "eval", 7)
    folder = Path(written.folder)
    assert folder == tmp_path / "eval" / "ckpt-7-eval"
    for name in ("roc.svg", "pr.svg", "calibration.svg"):
        root = ET.parse(folder / name).getroot()
        assert root.tag == f"{SVG}svg"
        lines = {p.get("class"): p for p in root.iter(f"{SVG}polyline")}
        assert set(lines) == {"curve", "reference"}, name
        points = lines["curve"].get("points").split()
        assert len(points) > 10, name
        title = next(root.iter(f"{SVG}text")).text
        assert "ckpt-7 (eval split)" in title
    roc = ET.parse(folder / "roc.svg").getroot()
    assert f"AUC {curves.auc:.4f}" in next(roc.iter(f"{SVG}text")).text
    calibration = ET.parse(folder / "calibration.svg").getroot()
    rows = curves.calibration()
    counts = [int(c.find(f"{SVG}title").text.split()[0])
              for c in calibration.iter(f"{SVG}rect")
              if c.get("class") == "count"]
    assert sum(counts) == len(labels)  # every example in a drawn bucket
    assert len(counts) == len(rows) == len(json.loads(
        (folder / "curves.json").read_text())["calibration"])


def _pr_summaries(logdir: Path) -> list:
    found = []
    for event_file in logdir.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(event_file)):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "pr_curves":
                    found.append((event.step, value))
    return found


def test_the_event_file_holds_a_pr_curve_summary(tmp_path):
    labels, logits = _scores()
    curves = Curves.from_totals(_totals(labels, logits))
    written = write_plots(curves, tmp_path / "checkpoints", "best/best-5",
                          "eval", 5)
    board = Path(written.tensorboard)
    assert board == tmp_path / "tensorboard" / "eval-best-best-5-eval"
    (step, value), = _pr_summaries(board)
    assert step == 5 and value.tag == PR_CURVE_TAG
    data = tf.make_ndarray(value.tensor)
    assert data.shape == (6, CURVE_BUCKETS + 1)
    # Rows: TP, FP, TN, FN, precision, recall; threshold 0 takes all.
    assert data[0, 0] == labels.sum() and data[1, 0] == len(labels) - labels.sum()
    np.testing.assert_array_equal(data[0], curves.threshold_counts()["tp"])


# -- psrec eval --plots, in process -----------------------------------------


@pytest.fixture(scope="module")
def checkpoint_and_data(tmp_path_factory):
    """A checkpoint of an untrained small model (with its job.json) and a
    converted data set of the same spec."""
    from tests._ps_helpers import untrained_checkpoint_and_data
    return untrained_checkpoint_and_data(tmp_path_factory.mktemp("plots"))


def test_psrec_eval_plots_writes_the_curves_of_its_evaluation(
        capsys, checkpoint_and_data):
    checkpoints, manifest = checkpoint_and_data
    argv = ["eval", str(checkpoints), "--data", str(manifest.root)]
    assert main(argv + ["--plots", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    plots = data["plots"]
    folder = checkpoints.parent / "eval" / "ckpt-1-eval"
    assert plots["folder"] == str(folder)
    for name in ("roc", "pr", "calibration"):
        assert plots[name] == str(folder / f"{name}.svg")
        ET.parse(plots[name])
    saved = json.loads((folder / "curves.json").read_text())
    assert saved["auc"] == data["auc"]  # the same counts, the same AUC
    assert sum(r["count"] for r in saved["calibration"]) == data["count"]
    (step, _), = _pr_summaries(Path(plots["tensorboard"]))
    assert step == data["step"] == 1
    # The text output names the folder in one line.
    assert main(argv + ["--plots"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"plots: {folder}/") and "tensorboard" in line


def test_plots_of_a_regression_run_are_refused_in_one_line(
        capsys, tmp_path, checkpoint_and_data):
    from psrec.features.spec.presets import movielens_rating
    from psrec.launch.job.config import JobConfig
    from psrec.ps_cluster.checkpoint.keeper import CheckpointKeeper
    _, manifest = checkpoint_and_data
    checkpoints = tmp_path / "checkpoints"
    CheckpointKeeper(checkpoints, tf.train.Checkpoint(
        v=tf.Variable(1.0))).save(1)
    JobConfig(spec=movielens_rating(), model_name="dlrm").write(checkpoints)
    assert main(["eval", str(checkpoints), "--data", str(manifest.root),
                 "--plots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--plots" in err[0] and "mse" in err[0], err
    assert not (tmp_path / "eval").exists()
    # Refused before TensorFlow is imported (a fresh process).
    code, imported, lines, _ = _psrec(
        ["eval", str(checkpoints), "--data", str(manifest.root), "--plots"],
        tmp_path)
    assert (code, imported, lines) == (2, False, err)


@pytest.mark.slow  # a short one-device run: ~32 s on a loaded machine
def test_train_plots_draws_the_checkpoint_it_exports(tmp_path,
                                                     checkpoint_and_data):
    """``psrec train --plots``: after the run, one more evaluation of the
    checkpoint the export takes (the best) writes the curves where ``psrec
    eval --plots`` of that checkpoint would, and the summary names them."""
    from psrec.data.input.config import InputConfig
    from psrec.launch.job.config import JobConfig
    from psrec.launch.job.config import StrategyConfig
    from psrec.launch.job.plots import plot_folders
    from psrec.launch.job.run import run_job
    from psrec.models.optim.config import OptimizerConfig
    from psrec.models.ranking.config import model_config
    from psrec.ps_cluster.checkpoint.best import choose_checkpoint
    from psrec.ps_cluster.training.config import LoopConfig
    _, manifest = checkpoint_and_data
    config = JobConfig(
        workdir=tmp_path / "run", spec=manifest.load_spec(), data=manifest.root,
        model_name="dlrm",
        model=model_config("dlrm", bottom_mlp=(8,), top_mlp=(8,)),
        optimizer=OptimizerConfig(warmup_steps=0),
        input=InputConfig(batch_size=64),
        loop=LoopConfig(steps=2, steps_per_closure=2, eval_every=2),
        strategy=StrategyConfig(kind="one-device"), export=False,
        plots=True)
    lines = []
    summary = run_job(config, log=lines.append)
    best = choose_checkpoint(config.checkpoint_dir)
    assert best.best is not None and best.name.startswith("best/")
    folder, board = plot_folders(config.checkpoint_dir, best.name, "eval")
    assert summary.plots == str(folder)
    assert f"  plots:       {folder}" in summary.summary()
    assert any(line.startswith(f"plots: {folder}/") for line in lines)
    for name in ("roc", "pr", "calibration"):
        ET.parse(folder / f"{name}.svg")
    saved = json.loads((folder / "curves.json").read_text())
    # The curves are the best checkpoint's: its evaluation's AUC again.
    assert saved["checkpoint"] == best.name
    assert saved["auc"] == pytest.approx(best.best.auc, abs=1e-3)
    (step, _), = _pr_summaries(board)
    assert step == best.step


def test_train_plots_without_a_binary_label_is_refused_before_it_starts():
    from psrec.errors import ConfigError
    from psrec.features.spec.presets import movielens_rating
    from psrec.launch.job.config import JobConfig
    with pytest.raises(ConfigError, match="--plots: .*regression"):
        JobConfig(spec=movielens_rating(), plots=True)
