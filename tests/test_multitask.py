"""Several labels, one model (issue 21 §1): a spec's ``labels`` list, the
missing label of a row masked for its task, the one loss as the weighted
sum of the tasks' losses, each task's eval metrics exactly once (one device
and the in-process PS cluster), and an export serving every task's score
from raw features (loaded with plain ``tf.saved_model.load``)."""

from __future__ import annotations

import dataclasses
import json
import time
import types

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.format.manifest import Manifest
from psrec.data.ingest.synthetic import synthetic_table
from psrec.data.input.config import InputConfig
from psrec.data.input.dataset import make_eval_dataset
from psrec.features.spec.columns import SpecError
from psrec.features.spec.spec import ID_COLUMN
from psrec.features.spec.spec import FeatureSpec
from psrec.launch.monitor.heartbeat import reporter_fields
from psrec.launch.monitor.metrics_http import HeartbeatCollector
from psrec.models.optim.config import OptimizerConfig
from psrec.models.ranking.config import ModelConfig
from psrec.models.ranking.model import build_ranking_model
from psrec.models.ranking.model import example_batch
from psrec.models.ranking.model import product_logit
from psrec.models.ranking.model import task_labels
from psrec.models.serving.export import ServingModule
from psrec.models.serving.export import export_saved_model
from psrec.ps_cluster.checkpoint.best import BestTracker
from psrec.ps_cluster.checkpoint.best import improves
from psrec.ps_cluster.checkpoint.best import metric_value
from psrec.ps_cluster.checkpoint.best import read_best
from psrec.ps_cluster.evaluation.metrics import EvalResult
from psrec.ps_cluster.training.config import LoopConfig
from psrec.ps_cluster.training.step import TrainStep
from psrec.ps_cluster.training.trainer import Trainer

ROWS = 3000
MISSING = 0.3  # share of rows without the like / rating label
LABELS = [{"name": "click"},
          {"name": "like", "loss": "bce"},
          {"name": "rating", "loss": "mse", "weight": 0.5},
          {"name": "buy", "given": "click"}]  # ESMM: buy after a click


def _spec(labels=LABELS) -> FeatureSpec:
    return FeatureSpec.from_dict({
        "name": "tasks", "labels": labels,
        "tables": [{"name": "ids", "dim": 8}],
        "dense": [{"name": "price", "transform": "log1p"}],
        "categorical": [
            {"name": "user", "table": "ids", "hash_buckets": 100},
            {"name": "item", "table": "ids", "hash_buckets": 100}]})


MODEL = ModelConfig(interaction="concat", top_mlp=(16,))
MMOE = dataclasses.replace(MODEL, task_towers="mmoe", experts=3,
                           expert_units=(16,))
PLE = dataclasses.replace(MODEL, task_towers="ple", experts=2,
                          task_experts=2, expert_units=(8,), ple_levels=2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Synthetic rows (psrec's generator) with the like and rating labels
    missing (null) in ``MISSING`` of the rows each, converted."""
    root = tmp_path_factory.mktemp("multitask")
    spec = _spec()
    table = synthetic_table(spec, ROWS, seed=3)
    rng = np.random.default_rng(0)
    clicked = table.column("click").to_numpy() == 1
    for name in ("like", "rating", "buy"):
        values = table.column(name).to_numpy().astype(np.float64)
        missing = rng.random(ROWS) < MISSING
        if name == "buy":  # no purchase without a click, often unlogged
            values = np.where(clicked, values, 0.0)
            missing = missing | (~clicked & (rng.random(ROWS) < 0.5))
        table = table.set_column(
            table.schema.get_field_index(name), name,
            pa.array(values, mask=missing))
    pq.write_table(table, root / "rows.parquet")
    report = convert([root / "rows.parquet"], spec, root / "tf",
                     ConversionOptions(shards=2, eval_fraction=0.25))
    assert report.bad_rows == 0  # a missing label is masked, not bad
    return spec, report.manifest, table


def _eval_truth(spec, manifest) -> dict:
    """Rows, id sum and the rows holding each task's label, read here."""
    ids, labels = [], {name: [] for name in spec.label_names}
    for batch in make_eval_dataset(manifest.files("eval"), spec, 512,
                                   manifest.block_rows):
        ids.append(batch[ID_COLUMN].numpy())
        for name in labels:
            labels[name].append(batch[name].numpy())
    labels = {k: np.concatenate(v) for k, v in labels.items()}
    present = {k: np.isfinite(v) for k, v in labels.items()}
    click = np.nan_to_num(labels["click"])
    # buy (given click): click x buy, known where click is and buy is or
    # click is 0
    present["buy"] = present["click"] & (present["buy"] | (click == 0))
    labels["buy"] = click * np.nan_to_num(labels["buy"])
    return {"rows": sum(map(len, ids)),
            "id_sum": int(np.concatenate(ids).sum()),
            "present": {k: int(v.sum()) for k, v in present.items()},
            "positives": {k: float(np.nansum(v[present[k]]))
                          for k, v in labels.items()}}


def test_labels_spec_form_round_trips_and_refuses_mistakes():
    spec = _spec()
    assert spec.label_names == ("click", "like", "rating", "buy")
    assert [label.loss for label in spec.labels] == ["logloss", "logloss",
                                                     "mse", "logloss"]
    assert spec.multi_task and spec.labels[2].weight == 0.5
    assert spec.labels[3].given == "click"
    data = spec.to_dict()
    assert "label" not in data and data["labels"][0] == {
        "name": "click", "threshold": None}
    assert FeatureSpec.from_dict(data) == spec
    single = _spec(labels=[{"name": "click"}])
    assert not single.multi_task and "label" in single.to_dict()
    base = {k: v for k, v in data.items() if k != "labels"}
    with pytest.raises(SpecError, match="not both"):
        FeatureSpec.from_dict({**data, "label": {"name": "click"}})
    with pytest.raises(SpecError, match="'like' is used twice"):
        FeatureSpec.from_dict({**base, "labels": [{"name": "like"},
                                                  {"name": "like"}]})
    with pytest.raises(SpecError, match="`weight` = -1 must be >= 0"):
        FeatureSpec.from_dict({**base, "labels": [
            {"name": "click"}, {"name": "like", "weight": -1}]})
    with pytest.raises(SpecError, match="non-empty list"):
        FeatureSpec.from_dict({**base, "labels": []})
    with pytest.raises(SpecError, match="`given` = 'clik' must name another "
                       "label of the spec; did you mean 'click'"):
        FeatureSpec.from_dict({**base, "labels": [
            {"name": "click"}, {"name": "buy", "given": "clik"}]})
    with pytest.raises(SpecError, match="itself given 'click'"):
        FeatureSpec.from_dict({**base, "labels": [
            {"name": "click"}, {"name": "buy", "given": "click"},
            {"name": "repeat", "given": "buy"}]})


def test_conversion_writes_every_label_and_a_missing_one_as_its_mask(data):
    spec, manifest, table = data
    truth = _eval_truth(spec, manifest)
    assert truth["rows"] == manifest.rows("eval")
    assert truth["present"]["click"] == truth["rows"]  # nothing missing
    for name in ("like", "rating"):  # about MISSING of the rows lack it
        share = 1 - truth["present"][name] / truth["rows"]
        assert 0.2 < share < 0.4, (name, share)


def test_an_mse_task_starts_at_its_train_mean(data):
    """Conversion records each ``mse`` label's mean over the train rows
    that hold it; the untrained model outputs it for that task (and the
    base-rate logit for the first task, not for the others)."""
    spec, manifest, _ = data
    ratings = np.concatenate([
        batch["rating"].numpy() for batch in make_eval_dataset(
            manifest.files("train"), spec, 512, manifest.block_rows)])
    assert manifest.label_means == {"rating": pytest.approx(
        float(np.nanmean(ratings)), rel=1e-6)}
    assert np.isnan(ratings).any()  # the missing ones are left out
    assert Manifest.load(manifest.root).label_means == manifest.label_means
    model = build_ranking_model(spec, MODEL, positive_rate=0.2,
                                label_means={"rating": 3.5})
    outputs = model(example_batch(spec, 6))
    np.testing.assert_allclose(outputs["rating"], 3.5, rtol=1e-6)
    np.testing.assert_allclose(outputs["click"], np.log(0.2 / 0.8),
                               rtol=1e-5)
    out = model.task_over_archs["like"].out  # default initialisation
    assert not out.bias.numpy().any() and out.kernel.numpy().any()
    # One mse label: its mean, whatever the (meaningless) positive rate.
    alone = FeatureSpec.from_dict(dict(spec.to_dict(), labels=[
        {"name": "rating", "loss": "mse"}]))
    model = build_ranking_model(alone, MODEL, positive_rate=0.9,
                                label_means={"rating": 3.5})
    np.testing.assert_allclose(model(example_batch(alone, 6)), 3.5,
                               rtol=1e-6)


def test_a_masked_task_contributes_nothing_to_the_loss_or_gradients():
    """Task ``like`` with its label missing in some rows gives the loss and
    gradients of the batch without those rows (the other tasks weigh 0
    here, so only ``like`` trains)."""
    spec = _spec([{"name": "click", "weight": 0}, {"name": "like"},
                  {"name": "rating", "loss": "mse", "weight": 0}])
    model = build_ranking_model(spec, MODEL)
    step = TrainStep(model, None, None, spec.labels)
    rows = 32
    rng = np.random.default_rng(1)
    batch = dict(example_batch(spec, rows))
    batch["user"] = tf.constant(rng.integers(0, 100, rows), tf.int64)
    batch["item"] = tf.constant(100 + rng.integers(0, 100, rows), tf.int64)
    batch["psrec__dense"] = tf.constant(rng.random((rows, 1)), tf.float32)
    for name in spec.label_names:
        batch[name] = tf.constant(rng.integers(0, 2, rows), tf.float32)
    missing = rng.random(rows) < 0.4
    masked = dict(batch, like=tf.where(missing, np.nan, batch["like"]))
    kept = {k: tf.boolean_mask(v, ~missing) for k, v in batch.items()}

    def loss_and_grads(b):
        variables = model.trainable_variables
        with tf.GradientTape() as tape:
            loss = step.batch_loss(b)
        return loss, tape.gradient(loss, variables)

    loss_masked, grads_masked = loss_and_grads(masked)
    loss_kept, grads_kept = loss_and_grads(kept)
    loss_all, grads_all = loss_and_grads(batch)
    assert np.isfinite(loss_masked.numpy())
    np.testing.assert_allclose(loss_masked, loss_kept, rtol=1e-6)
    assert abs(float(loss_all) - float(loss_kept)) > 1e-4  # rows matter
    for masked_grad, kept_grad in zip(grads_masked, grads_kept):
        if masked_grad is None:
            assert kept_grad is None
            continue
        masked_grad = tf.convert_to_tensor(masked_grad).numpy()
        assert np.isfinite(masked_grad).all()
        np.testing.assert_allclose(
            masked_grad, tf.convert_to_tensor(kept_grad).numpy(),
            rtol=1e-5, atol=1e-7)
    over = model.task_over_archs["like"].trainable_variables
    assert all(np.abs(tf.convert_to_tensor(g).numpy()).sum() > 0
               for g, v in zip(grads_masked, model.trainable_variables)
               if any(v is o for o in over))


def test_a_given_task_trains_on_the_product_over_every_row():
    """ESMM's targets: ``buy`` given ``click`` is click x buy over every
    row; a row without a click needs no buy label, a clicked row without
    one (or a row without a click label) is masked."""
    spec = _spec()
    nan = np.nan
    click = [1.0, 1.0, 0.0, 0.0, 1.0, nan]
    buy = [1.0, 0.0, nan, 0.0, nan, 1.0]
    targets = task_labels(spec, {
        "click": tf.constant(click), "buy": tf.constant(buy),
        "like": tf.zeros([6]), "rating": tf.zeros([6])})
    target, present = targets["buy"]
    assert target.numpy().tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert present.numpy().tolist() == [True, True, True, True, False,
                                        False]
    first, second = tf.constant([-3.0, 0.0, 40.0]), tf.constant(
        [2.0, -1.0, 40.0])
    np.testing.assert_allclose(
        tf.sigmoid(product_logit(first, second)),
        tf.sigmoid(first) * tf.sigmoid(second), rtol=1e-5)


@pytest.mark.parametrize("config", [MMOE, PLE], ids=["mmoe", "ple"])
def test_expert_gates_receive_gradients(config):
    """Every expert and gate variable of MMoE and of a 2-level PLE gets a
    non-zero gradient from the multi-task loss, and the tasks' outputs
    differ (their gates mix the experts differently)."""
    spec = _spec()
    model = build_ranking_model(spec, config)
    rows = 64
    rng = np.random.default_rng(2)
    batch = dict(example_batch(spec, rows))
    batch["user"] = tf.constant(rng.integers(0, 100, rows), tf.int64)
    batch["item"] = tf.constant(100 + rng.integers(0, 100, rows), tf.int64)
    batch["psrec__dense"] = tf.constant(rng.random((rows, 1)) * 5,
                                        tf.float32)
    for name in ("click", "like", "buy"):
        batch[name] = tf.constant(rng.integers(0, 2, rows), tf.float32)
    batch["rating"] = tf.constant(rng.normal(0, 1, rows), tf.float32)
    step = TrainStep(model, None, None, spec.labels)
    variables = model.task_arch.trainable_variables
    with tf.GradientTape() as tape:
        loss = step.batch_loss(batch)
    grads = tape.gradient(loss, variables)
    names = [v.name for v in variables]
    gates = [n for n in names if "gate" in n]
    experts = [n for n in names if "expert_" in n]
    tasks = len(spec.labels)  # a Dense (kernel, bias) per gate, expert
    assert len(gates) == 2 * (tasks if config is MMOE else tasks * 2 + 1)
    assert len(experts) == 2 * (3 if config is MMOE
                                else 2 * (2 + tasks * 2))
    assert len(gates) + len(experts) == len(names)
    for name, grad in zip(names, grads):
        assert grad is not None, name
        assert np.abs(tf.convert_to_tensor(grad).numpy()).sum() > 0, name
    outputs = model(batch)
    assert not np.allclose(outputs["click"], outputs["like"])


def test_task_tower_options_are_checked_and_refused_out_of_place(
        tmp_path, capsys):
    from psrec.launch.cli.main import main
    from psrec.models.ranking.config import ModelConfigError
    with pytest.raises(ModelConfigError, match="task_towers"):
        ModelConfig(task_towers="moe")
    with pytest.raises(ModelConfigError, match="ple_levels"):
        ModelConfig(task_towers="ple", ple_levels=0)
    code = main(["train", "--strategy", "one-device", "--workdir",
                 str(tmp_path / "run"), "--ple-levels", "2",
                 "--task-towers", "mmoe"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "--ple-levels applies to --task-towers ple" in err[0]
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """A one-device run of 40 steps of MMoE on the multi-task data,
    evaluated."""
    spec, manifest, _ = data
    trainer = Trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), spec,
                      MMOE, OptimizerConfig(dense_lr=0.01),
                      InputConfig(batch_size=128))
    result = trainer.train(trainer.dataset_fn(manifest), LoopConfig(
        steps=40, steps_per_closure=20, checkpoint_every=0),
        eval_manifest=manifest)
    return trainer, result


def _check_tasks(result, truth) -> None:
    assert [t["name"] for t in result.tasks] == ["click", "like", "rating",
                                                 "buy"]
    assert result.id_sum == truth["id_sum"]
    for task in result.tasks:  # each task's rows counted exactly once
        assert task["count"] == truth["present"][task["name"]], task
    for task in result.tasks[:2] + result.tasks[3:]:
        assert task["positives"] == truth["positives"][task["name"]]
        assert 0.0 <= task["auc"] <= 1.0 and task["logloss"] > 0
    assert result.tasks[2]["rmse"] > 0 and "auc" not in result.tasks[2]
    assert result.auc == result.tasks[0]["auc"]  # top level: first task


@pytest.mark.slow  # the trained fixture: ~12 s
def test_one_device_eval_reports_each_task_once(data, trained, tmp_path):
    spec, manifest, _ = data
    _, result = trained
    _check_tasks(result.eval, _eval_truth(spec, manifest))
    lines = result.eval.summary().splitlines()
    assert lines[0] == "eval: 4 tasks"
    assert [line.split(":")[0].strip() for line in lines[1:]] == [
        "task click", "task like", "task rating", "task buy"]
    scalars = result.eval.scalars()
    assert {"task/like/auc", "task/like/calibration",
            "task/rating/rmse"} <= set(scalars)
    assert "task/rating/auc" not in scalars
    # The heartbeat carries each task's metrics to the metrics port.
    beat = reporter_fields(types.SimpleNamespace(
        loss=0.5, last_eval=result.eval, last_eval_step=40))
    path = tmp_path / "heartbeat.json"
    path.write_text(json.dumps({**beat, "seq": 1, "phase": "training",
                                "step": 40, "time": time.time()}))
    samples = {tuple(sorted(s.labels.items())): s.value
               for family in HeartbeatCollector(path).collect()
               if family.name == "psrec_eval_task"
               for s in family.samples}
    assert samples[(("metric", "auc"), ("task", "like"))] == pytest.approx(
        result.eval.task("like")["auc"])
    assert samples[(("metric", "rmse"), ("task", "rating"))] == (
        pytest.approx(result.eval.task("rating")["rmse"]))
    assert (("metric", "auc"), ("task", "rating")) not in samples


def test_export_serves_every_task_score_from_raw_features(data, trained,
                                                          tmp_path):
    spec, _, table = data
    trainer, _ = trained
    out = export_saved_model(trainer.model, spec, tmp_path / "export")
    serve = tf.saved_model.load(out).signatures["serving_default"]
    rows = table.slice(0, 64)
    raw = {"price": tf.constant(rows.column("price").to_numpy(
        zero_copy_only=False).astype(np.float32)),
        "user": tf.constant(rows.column("user").to_pylist()),
        "item": tf.constant(rows.column("item").to_pylist())}
    served = serve(**raw)
    assert set(served) == {"probability", "logit", "click_score",
                           "like_score", "rating_score", "buy_score",
                           "buy_given_click_score"}
    # ESMM: pCTCVR = pCTR x pCVR, all three served.
    np.testing.assert_allclose(
        served["buy_score"],
        served["click_score"] * served["buy_given_click_score"], rtol=1e-5)
    assert not np.allclose(served["buy_score"],
                           served["buy_given_click_score"])
    outputs = trainer.model(ServingModule(trainer.model, spec).model_batch(
        raw))
    np.testing.assert_allclose(served["click_score"],
                               served["probability"], rtol=1e-6)
    np.testing.assert_allclose(served["like_score"],
                               tf.sigmoid(outputs["like"]), rtol=1e-5)
    np.testing.assert_allclose(served["rating_score"], outputs["rating"],
                               rtol=1e-5, atol=1e-6)
    assert not np.allclose(served["like_score"], served["click_score"])


def test_a_split_export_of_a_multi_task_run_is_refused_in_one_line():
    from psrec.errors import ConfigError
    from psrec.models.serving.config import ExportConfig
    labels = _spec().label_names
    with pytest.raises(ConfigError, match="multi-task run .*click, like"):
        ExportConfig(split=True).check_task(False, "runs/x", labels=labels)
    ExportConfig().check_task(False, "runs/x", labels=labels)  # whole: fine
    ExportConfig(split=True).check_task(False, "runs/x", labels=labels[:1])


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.parametrize("config", [MODEL, MMOE, PLE],
                         ids=["shared-bottom", "mmoe", "ple"])
def test_ps_cluster_eval_reports_each_task_once(data, ps_cluster, config):
    """Each task arch (PLE with 2 levels) trains under the in-process PS
    cluster, ESMM's given task among the others, and its evaluation (one
    closure per shard) counts every task's rows once."""
    from psrec.ps_cluster.cluster.partition_config import PartitionConfig
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    spec, manifest, _ = data
    trainer = Trainer(build_ps_strategy(ps_cluster, PartitionConfig(
        kind="fixed")), spec, config, OptimizerConfig(dense_lr=0.01),
        InputConfig(batch_size=128))
    result = trainer.train(trainer.dataset_fn(manifest), LoopConfig(
        steps=10, steps_per_closure=10, checkpoint_every=0),
        eval_manifest=manifest)
    _check_tasks(result.eval, _eval_truth(spec, manifest))
    assert dataclasses.asdict(result.eval)["tasks"] == result.eval.tasks


def _result(first_auc: float, like_auc: float) -> EvalResult:
    tasks = [{"name": "click", "loss": "logloss", "count": 10,
              "auc": first_auc, "logloss": 0.5, "calibration": 1.0},
             {"name": "like", "loss": "logloss", "count": 8,
              "auc": like_auc, "logloss": 0.6, "calibration": 1.1},
             {"name": "rating", "loss": "mse", "count": 9, "rmse": 1.0}]
    return EvalResult(count=10, positives=3.0, logloss=0.5, auc=first_auc,
                      id_sum=45, tasks=tasks)


def test_keep_best_task_metric_watches_that_task(tmp_path):
    """``--keep-best like:auc`` keeps the checkpoint where like's AUC was
    best, whatever the first task's did; rating:rmse improves downwards."""
    for step in (10, 20, 30):
        for suffix in (".index", ".data-00000-of-00001"):
            (tmp_path / f"ckpt-{step}{suffix}").write_text("x")
    tracker = BestTracker(tmp_path, "like:auc")
    assert tracker.update(10, _result(0.70, 0.60), str(tmp_path / "ckpt-10"))
    assert not tracker.update(20, _result(0.80, 0.55),
                              str(tmp_path / "ckpt-20"))  # click better only
    assert tracker.update(30, _result(0.60, 0.65), str(tmp_path / "ckpt-30"))
    record = read_best(tmp_path)
    assert (record.step, record.metric, record.value) == (30, "like:auc",
                                                          0.65)
    assert record.summary() == "step 30, like:auc 0.6500 (best/best-30)"
    assert metric_value(_result(0.7, 0.6), "rating:rmse") == 1.0
    assert improves("rating:rmse", 0.9, 1.0)
    assert not improves("rating:rmse", 1.1, 1.0)


@pytest.mark.parametrize("keep_best, words", [
    ("lik:auc", "'lik' is not a label of spec 'tasks' (labels: click, "
     "like, rating, buy); did you mean 'like'?"),
    ("rating:auc", "'auc' is not a metric of the mse label 'rating'; use "
     "rating:rmse."),
    ("like:aux", "did you mean 'auc'?")], ids=["task", "metric", "format"])
def test_keep_best_refuses_a_wrong_task_or_metric_in_one_line(
        tmp_path, capsys, keep_best, words):
    from psrec.launch.cli.main import main
    path = tmp_path / "spec.yaml"
    _spec().save(path)
    code = main(["train", "--spec", str(path), "--strategy", "one-device",
                 "--workdir", str(tmp_path / "run"), "--keep-best",
                 keep_best])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "--keep-best" in err[0] and words in err[0], err[0]
    assert not (tmp_path / "run").exists()


def test_summary_and_show_list_every_task(tmp_path, capsys):
    """The run's summary lines and ``psrec show`` (from summary.json) give
    each task's figures."""
    from psrec.data.format.files import write_json_atomic
    from psrec.launch.cli.main import main
    from psrec.launch.job.config import JobConfig
    from psrec.launch.job.summary import JobSummary
    workdir = tmp_path / "run"
    JobConfig(workdir=workdir, spec=_spec(), model_name="deepfm",
              model=MMOE).write(workdir / "checkpoints")
    summary = JobSummary(
        strategy="one-device", manifest="m/manifest.json",
        checkpoint=str(workdir / "checkpoints" / "ckpt-40"), export=None,
        tensorboard="tb", start_step=0, step=40, executed_steps=40,
        examples_per_sec=1.0, final_loss=0.5, eval=_result(0.7, 0.65),
        seconds=3.0, workers=1, ps=0, replicas=1, batch_size=32,
        micro_batches=1, precision="float32", closures_per_worker={})
    text = summary.summary()
    assert "last eval:   step 40, per task:" in text
    assert ("like: 8 examples, AUC 0.6500, logloss 0.6000, calibration "
            "1.1000") in text
    assert "rating: 9 examples, RMSE 1.0000" in text
    write_json_atomic(workdir / "summary.json", summary.to_dict())
    assert JobSummary.from_dict(summary.to_dict()).eval == summary.eval
    assert main(["show", str(workdir)]) == 0
    out = capsys.readouterr().out
    assert ("final eval:  step 40: click:auc 0.7000, click:logloss 0.5000, "
            "like:auc 0.6500, like:logloss 0.6000, rating:rmse 1.0000") in out
