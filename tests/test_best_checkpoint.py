"""Training that is right with default flags: periodic evaluation, the best
checkpoint kept (out of rotation, across resumes) and exported, early
stopping, ``--epochs``, and ``psrec eval``/``export --checkpoint``.

The Trainer tests use the one-device strategy in this process; where a test
must know which evaluation is best, the evaluation's AUC is scripted (the
model, checkpoints and files are real), so the best is not the last by
construction. The CLI tests run ``psrec train --strategy one-device`` in
process and check the best against every evaluation the run printed and
against an offline evaluation of each named checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.ingest.synthetic import write_synthetic_parquet
from psrec.data.input.config import InputConfig
from psrec.features.spec.presets import criteo
from psrec.launch.cli.main import main
from psrec.launch.job.config import JobConfig
from psrec.launch.job.export import evaluate_checkpoint
from psrec.launch.job.export import restore_plain_model
from psrec.models.optim.config import OptimizerConfig
from psrec.models.ranking.config import model_config
from psrec.ps_cluster.checkpoint.best import choose_checkpoint
from psrec.ps_cluster.checkpoint.best import read_best
from psrec.ps_cluster.training.config import LoopConfig

SPEC = criteo(buckets=50, dim=4)
MODEL = model_config("dlrm", bottom_mlp=(8,), top_mlp=(8,))
TABLE = "categorical"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """1,000 rows: 800 train (2 shards), 200 eval. Returns the manifest."""
    root = tmp_path_factory.mktemp("best-data")
    paths = write_synthetic_parquet(SPEC, root / "parquet", 1000, files=1)
    return convert(paths, SPEC, root / "tfr", ConversionOptions(
        shards=2, eval_fraction=0.2)).manifest


@pytest.fixture(scope="module")
def no_eval_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("no-eval-data")
    paths = write_synthetic_parquet(SPEC, root / "parquet", 300, files=1)
    return convert(paths, SPEC, root / "tfr",
                   ConversionOptions(shards=2, eval_fraction=0)).manifest


def _trainer(checkpoints: Path, keep: int = 1):
    from psrec.ps_cluster.cluster.strategy import build_replicated_strategy
    from psrec.ps_cluster.training.trainer import Trainer
    JobConfig(workdir=checkpoints.parent, spec=SPEC, model_name="dlrm",
              model=MODEL).write(checkpoints)
    return Trainer(build_replicated_strategy("one-device"), SPEC, MODEL,
                   OptimizerConfig(sparse_lr=0.5, warmup_steps=0),
                   InputConfig(batch_size=32), checkpoint_dir=checkpoints,
                   keep_checkpoints=keep)


def _scripted(trainer, aucs: dict[int, float]) -> list[int]:
    """The trainer's evaluation, with the AUC at each step replaced by
    ``aucs[step]``; returns the steps evaluated (appended as it runs)."""
    real, evaluated = trainer.evaluate, []

    def evaluate(manifest, batch_size=None):
        step = int(trainer.progress.step.numpy())
        evaluated.append(step)
        return dataclasses.replace(real(manifest, batch_size),
                                   auc=aucs[step])

    trainer.evaluate = evaluate
    return evaluated


def _table(trainer) -> np.ndarray:
    """The full table (its shards concatenated under PS)."""
    table = trainer.model.sparse_arch.tables[TABLE]
    return np.concatenate([s.numpy() for s in getattr(
        table, "variables", [table])])


def _train(trainer, manifest, loop: LoopConfig):
    tables: dict[int, np.ndarray] = {}
    bests = []
    result = trainer.train(
        trainer.dataset_fn(manifest), loop, eval_manifest=manifest,
        on_boundary=lambda step, result, saved: tables.__setitem__(
            step, _table(trainer)),
        on_best=bests.append)
    return result, tables, [b.step for b in bests]


def test_best_checkpoint_survives_rotation_and_is_exported(tmp_path, data):
    checkpoints = tmp_path / "checkpoints"
    trainer = _trainer(checkpoints, keep=1)
    aucs = {8: 0.60, 16: 0.70, 24: 0.65, 32: 0.62, 40: 0.61}
    evaluated = _scripted(trainer, aucs)
    result, tables, bests = _train(trainer, data, LoopConfig(
        steps=40, steps_per_closure=4, eval_every=8, checkpoint_every=0))
    assert evaluated == [8, 16, 24, 32, 40]
    assert bests == [8, 16]
    record = read_best(checkpoints)
    assert (record.step, record.value, record.metric) == (16, 0.70, "auc")
    assert result.best == record and result.stopped_early_at is None
    # --keep-checkpoints 1 rotated ckpt-16 away; the best survived it.
    assert not (checkpoints / "ckpt-16.index").exists()
    assert sorted(p.name for p in checkpoints.glob("ckpt-*.index")) == [
        "ckpt-40.index"]
    assert sorted(p.name for p in (checkpoints / "best").iterdir()) == [
        "best-16.data-00000-of-00001", "best-16.index"]
    # The default choice (export, eval) is the best: step 16's weights.
    chosen = choose_checkpoint(checkpoints)
    assert (chosen.name, chosen.step) == ("best/best-16", 16)
    model, _, _ = restore_plain_model(checkpoints, chosen.path)
    restored = model.sparse_arch.tables[TABLE].numpy()
    np.testing.assert_array_equal(restored, tables[16])
    assert not np.array_equal(restored, tables[40])  # not the last one
    latest = choose_checkpoint(checkpoints, "latest")
    assert (latest.name, latest.best) == ("ckpt-40", None)
    assert choose_checkpoint(checkpoints, "ckpt-16").path == chosen.path


def test_resume_keeps_the_best_so_far(tmp_path, data):
    checkpoints = tmp_path / "checkpoints"
    first = _trainer(checkpoints)
    _scripted(first, {8: 0.70, 16: 0.60})
    _train(first, data, LoopConfig(steps=16, steps_per_closure=4,
                                   eval_every=8, checkpoint_every=0))
    assert read_best(checkpoints).step == 8
    resumed = _trainer(checkpoints)
    assert resumed.restore().endswith("ckpt-16")
    _scripted(resumed, {24: 0.69, 32: 0.71})
    _, _, bests = _train(resumed, data, LoopConfig(
        steps=32, steps_per_closure=4, eval_every=8, checkpoint_every=0))
    # 0.69 at step 24 is better than this run's first eval, but not than
    # the best-so-far of the first run (0.70 at step 8).
    assert bests == [32]
    assert read_best(checkpoints).step == 32


def test_early_stopping_stops_after_patience_evals(tmp_path, data):
    checkpoints = tmp_path / "checkpoints"
    trainer = _trainer(checkpoints)
    evaluated = _scripted(trainer, {8: 0.6, 16: 0.7, 24: 0.69, 32: 0.68,
                                    40: 0.9, 48: 0.9})
    result, _, _ = _train(trainer, data, LoopConfig(
        steps=48, steps_per_closure=4, eval_every=8, checkpoint_every=0,
        early_stop_patience=2))
    assert evaluated == [8, 16, 24, 32]  # never reached step 40
    assert (result.step, result.stopped_early_at) == (32, 32)
    assert int(trainer.progress.step.numpy()) == 32
    assert read_best(checkpoints).evals_without_improvement == 2
    assert trainer.keeper.latest.endswith("ckpt-32")
    # Rerunning the stopped job does not train on.
    again = _trainer(checkpoints)
    again.restore()
    rerun, _, _ = _train(again, data, LoopConfig(
        steps=48, steps_per_closure=4, eval_every=8, checkpoint_every=0,
        early_stop_patience=2))
    assert (rerun.step, rerun.stopped_early_at) == (32, 32)


def test_logloss_best_is_the_lowest(tmp_path, data):
    checkpoints = tmp_path / "checkpoints"
    trainer = _trainer(checkpoints)
    losses = {8: 0.5, 16: 0.4, 24: 0.45}
    real = trainer.evaluate
    trainer.evaluate = lambda manifest, batch_size=None: dataclasses.replace(
        real(manifest), logloss=losses[int(trainer.progress.step.numpy())])
    _train(trainer, data, LoopConfig(steps=24, steps_per_closure=4,
                                     eval_every=8, checkpoint_every=0,
                                     keep_best="logloss"))
    record = read_best(checkpoints)
    assert (record.step, record.metric, record.value) == (16, "logloss", 0.4)


def test_default_eval_interval_is_about_five_per_run():
    assert LoopConfig(steps=400, steps_per_closure=10,
                      eval_every=None).resolved().eval_every == 80
    assert LoopConfig(steps=410, steps_per_closure=10,
                      eval_every=None).resolved().eval_every == 90
    assert LoopConfig(steps=12, steps_per_closure=4,
                      eval_every=None).resolved().eval_every == 4
    assert LoopConfig(steps=400, eval_every=0).resolved().eval_every == 0
    assert JobConfig().loop.eval_every is None  # psrec train's default


# -- psrec train / eval / export ------------------------------------------------------


def _train_cli(tmp_path: Path, data, *extra: str) -> list[str]:
    spec_file = SPEC.save(tmp_path / "spec.yaml")
    return ["train", "--strategy", "one-device", "--spec", str(spec_file),
            "--model", "dlrm", "--data", str(data.root), "--batch-size",
            "32", "--grad-accum-steps", "2", "--steps-per-closure", "2",
            "--sparse-lr", "0.5", "--workdir", str(tmp_path / "run"), *extra]


@pytest.mark.slow
def test_epochs_train_best_and_eval_end_to_end(tmp_path, data, capsys):
    # 800 train rows / (32 x 2 rows per step) = 12.5 -> 13 steps per epoch.
    assert main(_train_cli(tmp_path, data, "--epochs", "2", "--json")) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert (summary["step"], summary["steps_per_epoch"]) == (26, 13)
    assert summary["epochs"] == pytest.approx(2.0)
    checkpoints = tmp_path / "run" / "checkpoints"
    job = json.loads((checkpoints / "job.json").read_text())
    assert job["epochs"] == 2.0 and job["loop"]["steps"] == 26
    assert job["loop"]["eval_every"] == 6  # ceil(26 / 5 / 2) * 2
    # Every evaluation the run printed; the best is the highest AUC.
    evals = {int(m.group(1)): float(m.group(2)) for m in re.finditer(
        r"^step (\d+): eval: \d+ examples, AUC (\d\.\d+)", captured.err,
        re.M)}
    assert sorted(evals) == [6, 12, 18, 24, 26]
    best = summary["best"]
    assert best["value"] == pytest.approx(max(evals.values()), abs=1e-4)
    assert evals[best["step"]] == pytest.approx(best["auc"], abs=1e-4)
    assert summary["exported_checkpoint"] == best["checkpoint"]
    assert summary["exported_auc"] == best["auc"]
    # psrec eval: the best by default; latest is the final evaluation.
    manifest = str(data.root)
    assert main(["eval", str(checkpoints), "--data", manifest,
                 "--json"]) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert (chosen["checkpoint"], chosen["step"]) == (best["checkpoint"],
                                                      best["step"])
    assert chosen["auc"] == pytest.approx(best["auc"], abs=1e-4)
    assert main(["eval", str(checkpoints), "--data", manifest,
                 "--checkpoint", "latest", "--json"]) == 0
    latest = json.loads(capsys.readouterr().out)
    assert latest["step"] == 26
    assert latest["auc"] == pytest.approx(summary["eval"]["auc"], abs=1e-4)
    assert main(["export", str(checkpoints), "--out", str(tmp_path / "x"),
                 "--checkpoint", "best"]) == 0
    assert f"step {best['step']}" in capsys.readouterr().out
    assert main(["eval", str(checkpoints), "--data", manifest,
                 "--checkpoint", "ckpt-999"]) == 2
    line = _one_line(capsys.readouterr().err, "eval")
    assert "'ckpt-999': no such checkpoint" in line
    # The text summary says how many epochs ran and what was exported.
    text = _summary_text(summary)
    assert "2.00 epochs (13 steps each)" in text
    assert f"from checkpoint {best['checkpoint']}, eval AUC" in text


def _summary_text(data: dict) -> str:
    from psrec.launch.job.summary import JobSummary
    return JobSummary.from_dict(data).summary()


def _one_line(err: str, command: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"psrec {command}: error: "), err
    return lines[0]


def test_steps_and_epochs_together_exit_2_naming_both(tmp_path, data,
                                                      capsys):
    assert main(_train_cli(tmp_path, data, "--steps", "10", "--epochs",
                           "1")) == 2
    line = _one_line(capsys.readouterr().err, "train")
    assert "--steps" in line and "--epochs" in line
    assert not (tmp_path / "run").exists()


def test_eval_without_eval_split_is_one_line_exit_2(tmp_path, data,
                                                    no_eval_data, capsys):
    checkpoints = tmp_path / "checkpoints"
    trainer = _trainer(checkpoints)
    trainer.train(trainer.dataset_fn(data), LoopConfig(
        steps=2, steps_per_closure=2, checkpoint_every=0))
    assert main(["eval", str(checkpoints), "--data",
                 str(no_eval_data.root)]) == 2
    captured = capsys.readouterr()
    line = _one_line(captured.err, "eval")
    assert str(no_eval_data.root / "manifest.json") in line
    assert "--eval-fraction" in line
    assert captured.out == ""
    with pytest.raises(Exception, match="no eval split"):
        evaluate_checkpoint(checkpoints, no_eval_data)


@pytest.mark.cluster
def test_best_checkpoint_under_ps_on_the_in_process_cluster(
        ps_cluster, small_criteo_spec, criteo_data, tmp_path):
    """Under ParameterServerStrategy (checkpoint files written through the
    coordinator): a step counts one worker's batch, and the best checkpoint
    survives rotation and restores the weights of its step."""
    from psrec.models.ranking.config import ModelConfig
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    from psrec.ps_cluster.training.trainer import Trainer
    manifest, _ = criteo_data
    model = ModelConfig(interaction="dot", top_mlp=(8,))
    checkpoints = tmp_path / "checkpoints"
    JobConfig(workdir=tmp_path, spec=small_criteo_spec, model_name="dlrm",
              model=model).write(checkpoints)
    trainer = Trainer(build_ps_strategy(ps_cluster), small_criteo_spec,
                      model, OptimizerConfig(warmup_steps=0),
                      InputConfig(batch_size=64), checkpoint_dir=checkpoints,
                      keep_checkpoints=1)
    _scripted(trainer, {10: 0.6, 20: 0.8, 30: 0.7})
    result, tables, bests = _train(trainer, manifest, LoopConfig(
        steps=30, steps_per_closure=5, eval_every=10, checkpoint_every=0))
    assert result.examples == 30 * 64  # one worker's batch per step
    assert bests == [10, 20] and read_best(checkpoints).step == 20
    assert not (checkpoints / "ckpt-20.index").exists()
    restored, _, _ = restore_plain_model(
        checkpoints, choose_checkpoint(checkpoints, "best").path)
    np.testing.assert_array_equal(
        restored.sparse_arch.tables[TABLE].numpy(), tables[20])


def test_summary_says_epochs_best_export_and_early_stop():
    from psrec.launch.job.summary import JobSummary
    from psrec.ps_cluster.checkpoint.best import BestRecord
    from psrec.ps_cluster.evaluation.metrics import EvalResult
    best = BestRecord(checkpoint="best/best-40", source="ckpt-40", step=40,
                      metric="auc", value=0.7, auc=0.7, logloss=0.45,
                      count=100, evals_without_improvement=2)
    summary = JobSummary(
        strategy="one-device", manifest="m/manifest.json",
        checkpoint="c/ckpt-80", export="w/export", tensorboard="w/tb",
        start_step=0, step=80, executed_steps=80, examples_per_sec=1.0,
        final_loss=0.5, eval=EvalResult(count=100, positives=25.0,
                                        logloss=0.5, auc=0.65, id_sum=0),
        seconds=1.0, workers=1, ps=0, replicas=1, batch_size=32,
        micro_batches=1, precision="float32", closures_per_worker={},
        epochs=2.0, steps_per_epoch=40, best=best,
        exported_checkpoint="best/best-40", exported_auc=0.7,
        stopped_early_at=80)
    text = summary.summary()
    # The exported model's figures lead; the last step's come after.
    assert text.splitlines()[1] == (
        "  export:      w/export (from checkpoint best/best-40, eval AUC "
        "0.7000)")
    assert text.splitlines()[2].startswith("  best:        step 40, AUC")
    assert "\n  last eval:   step 80: AUC 0.6500  logloss 0.5000" in text
    assert "still improving" not in text  # the best is not the last
    assert "2.00 epochs (40 steps each)" in text
    assert "stopped early at step 80" in text
    assert "best:        step 40, AUC 0.7000" in text
    assert "(from checkpoint best/best-40, eval AUC 0.7000)" in text
    restored = JobSummary.from_dict(json.loads(json.dumps(
        summary.to_dict())))
    assert restored.best == best and restored.summary() == text


def _summary(**fields):
    from psrec.launch.job.summary import JobSummary
    from psrec.ps_cluster.evaluation.metrics import EvalResult
    values = dict(
        strategy="one-device", manifest="m/manifest.json",
        checkpoint="c/ckpt-80", export=None, tensorboard="w/tb",
        start_step=0, step=80, executed_steps=80, examples_per_sec=1.0,
        final_loss=0.5, eval=EvalResult(count=100, positives=25.0,
                                        logloss=0.5, auc=0.65, id_sum=0),
        seconds=1.0, workers=1, ps=0, replicas=1, batch_size=32,
        micro_batches=1, precision="float32", closures_per_worker={})
    values.update(fields)
    return JobSummary(**values).summary()


def test_summary_without_eval_split_says_there_was_no_evaluation():
    text = _summary(eval=None, export="w/export/1",
                    exported_checkpoint="ckpt-80")
    assert "best: None" not in text and "None" not in text
    [line] = [li for li in text.splitlines() if li.startswith("  best:")]
    assert "no evaluation ran (the data has no eval split)" in line
    assert "--eval-fraction 0.1" in line  # how to get one
    assert "last eval" not in text
    assert "export:      none" in _summary(eval=None)


def test_summary_says_when_the_best_is_the_last_checkpoint():
    from psrec.ps_cluster.checkpoint.best import BestRecord
    best = BestRecord(checkpoint="best/best-80", source="ckpt-80", step=80,
                      metric="auc", value=0.65, auc=0.65, logloss=0.5,
                      count=100)
    text = _summary(best=best, export="w/export/1",
                    exported_checkpoint="best/best-80", exported_auc=0.65)
    assert ("the best checkpoint is the last one (step 80): the model was "
            "still improving; more steps (--steps, --epochs) may help"
            ) in text
    earlier = dataclasses.replace(best, step=40, checkpoint="best/best-40")
    assert "still improving" not in _summary(best=earlier)
    # No best tracked: said plainly, not "None".
    text = _summary(best=None)
    assert "best:        not tracked (--keep-best none)" in text
    assert "None" not in text


def test_early_stopping_needs_a_metric():
    from psrec.errors import ConfigError
    with pytest.raises(ConfigError, match=r"`LoopConfig.early_stop_patience` = 2 "
                       "needs a metric to watch"):
        LoopConfig(keep_best="none", early_stop_patience=2)
    with pytest.raises(ConfigError, match=r"`LoopConfig.keep_best` = 'mse'"):
        LoopConfig(keep_best="mse")


def test_summary_names_one_run_s_files_one_way(tmp_path, monkeypatch):
    """TensorFlow's absolute checkpoint path and the workdir's relative
    ones are printed alike: relative below the working directory, absolute
    outside it, URIs as they are."""
    from psrec.launch.job.summary import JobSummary
    from psrec.ps_cluster.evaluation.metrics import EvalResult
    from psrec.uri_path import shown_path
    monkeypatch.chdir(tmp_path)
    summary = JobSummary(
        strategy="ps", manifest=str(tmp_path / "data" / "manifest.json"),
        checkpoint=str(tmp_path / "runs" / "a" / "checkpoints" / "ckpt-8"),
        export="runs/a/export/1", tensorboard="runs/a/tensorboard",
        start_step=0, step=8, executed_steps=8, examples_per_sec=1.0,
        final_loss=0.5, eval=EvalResult(count=100, positives=25.0,
                                        logloss=0.5, auc=0.65, id_sum=0),
        seconds=1.0, workers=1, ps=1, replicas=1, batch_size=32,
        micro_batches=1, precision="float32", closures_per_worker={},
        epochs=2.0, steps_per_epoch=4)
    text = summary.summary()
    assert "  data:        data/manifest.json" in text
    assert "  checkpoint:  runs/a/checkpoints/ckpt-8" in text
    assert "  export:      runs/a/export/1" in text
    assert str(tmp_path) not in text
    outside = tmp_path.parent / "elsewhere" / "ckpt-3"
    assert shown_path(outside) == str(outside)
    assert shown_path("gs://bucket/run/ckpt-3") == "gs://bucket/run/ckpt-3"
    assert shown_path(None) == "none"


def test_summary_of_a_run_with_nothing_left_says_so():
    """A rerun of a finished run trains nothing: no 'final train loss nan,
    0 examples/s'."""
    from psrec.launch.job.summary import JobSummary
    summary = JobSummary(
        strategy="ps", manifest="m/manifest.json", checkpoint="c/ckpt-8",
        export=None, tensorboard="t", start_step=8, step=8,
        executed_steps=0, examples_per_sec=0.0, final_loss=float("nan"),
        eval=None, seconds=1.0, workers=1, ps=1, replicas=1, batch_size=32,
        micro_batches=1, precision="float32", closures_per_worker={},
        epochs=2.0, steps_per_epoch=4)
    text = summary.summary()
    assert "  steps 8 -> 8: nothing left to train" in text
    assert "nan" not in text and "0 examples/s" not in text
