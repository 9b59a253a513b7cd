"""GAUC and slices (psrec.ps_cluster.evaluation.groups): the per-group
partial sums of several batches, merged by addition, give the brute-force
per-group rank AUC (ties 1/2) exactly when scores lie on bin centres (ties
included), and within the reported error bound on continuous scores;
one-class groups are left out and counted; weighting; slices."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import tensorflow as tf

from psrec.ps_cluster.evaluation.breakdown import Breakdown
from psrec.ps_cluster.evaluation.groups import GROUP_BIN_WIDTH
from psrec.ps_cluster.evaluation.groups import GROUP_LOGIT_RANGE
from psrec.ps_cluster.evaluation.groups import GROUP_SLOTS
from psrec.ps_cluster.evaluation.groups import breakdown_statistics
from psrec.ps_cluster.evaluation.metrics import batch_statistics
from psrec.ps_cluster.evaluation.metrics import merge


def brute_auc(labels, scores) -> float:
    """P(positive > negative) over every pair, ties 1/2 (O(P*N))."""
    pos = scores[labels > 0.5]
    neg = scores[labels < 0.5]
    wins = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return (wins + 0.5 * ties) / (len(pos) * len(neg))


def brute_gauc(labels, scores, groups, weighting):
    total = weight_sum = 0.0
    skipped = scored = 0
    for g in np.unique(groups):
        mine = groups == g
        y = labels[mine]
        if y.min() == y.max():
            skipped += 1
            continue
        scored += 1
        w = mine.sum() if weighting == "impressions" else 1.0
        total += w * brute_auc(y, scores[mine])
        weight_sum += w
    return total / weight_sum, scored, skipped


def _evaluate(labels, logits, users, items, breakdown, batch=1000):
    """The real eval path: per-batch statistics (batch_statistics plus the
    breakdown's), summed over batches by ``merge``."""
    parts = []
    for i in range(0, len(labels), batch):
        y = tf.constant(labels[i:i + batch], tf.float32)
        x = tf.constant(logits[i:i + batch], tf.float32)
        stats = batch_statistics(y, x, tf.constant(users[i:i + batch]))
        stats.update(breakdown_statistics(
            breakdown, {"user": tf.constant(users[i:i + batch]),
                        "item": tf.constant(items[i:i + batch])}, y, x))
        parts.append({k: np.asarray(v) for k, v in stats.items()})
    return merge(parts, breakdown)


def _data(rng, n, groups, continuous):
    users = rng.integers(100, 100 + groups, n).astype(np.int64)  # offset ids
    bias = rng.normal(0, 1, groups)[users - 100]
    if continuous:
        logits = rng.normal(bias, 2.0)
    else:  # on bin centres of a few bins: many ties within and across
        bins = rng.integers(40, 200, n)
        logits = -GROUP_LOGIT_RANGE + (bins + 0.5) * GROUP_BIN_WIDTH
    p = 1 / (1 + np.exp(-(logits + bias)))
    labels = (rng.random(n) < p).astype(np.float32)
    # Users with one class only: 5 users whose labels are all 0 / all 1.
    labels[users < 103] = 0.0
    labels[(users >= 103) & (users < 105)] = 1.0
    items = rng.integers(0, 30, n).astype(np.int64)
    return labels, logits.astype(np.float32), users, items


@pytest.mark.parametrize("weighting", ["impressions", "uniform"])
def test_gauc_equals_brute_force_on_bin_centres_with_ties(weighting):
    rng = np.random.default_rng(3)
    labels, logits, users, items = _data(rng, 6000, 300, continuous=False)
    assert len(np.unique(logits)) < 200  # ties within groups
    result = _evaluate(labels, logits, users, items,
                       Breakdown(group_by="user", weighting=weighting))
    expected, scored, skipped = brute_gauc(labels, logits, users, weighting)
    assert result.gauc == pytest.approx(expected, abs=1e-9)
    assert result.gauc_error_bound > 0  # ties share bins, yet exact
    assert (result.gauc_groups, result.gauc_skipped_groups) == (
        scored, skipped)
    assert skipped >= 5


def test_gauc_within_reported_bound_on_continuous_scores():
    rng = np.random.default_rng(4)
    labels, logits, users, items = _data(rng, 20000, 500, continuous=True)
    result = _evaluate(labels, logits, users, items,
                       Breakdown(group_by="user"))
    expected, _, _ = brute_gauc(labels, logits, users, "impressions")
    assert abs(result.gauc - expected) <= result.gauc_error_bound
    assert result.gauc_error_bound < 0.05
    # uniform and impression weighting differ on this data: both are used.
    uniform = _evaluate(labels, logits, users, items,
                        Breakdown(group_by="user", weighting="uniform"))
    assert uniform.gauc == pytest.approx(
        brute_gauc(labels, logits, users, "uniform")[0],
        abs=uniform.gauc_error_bound)
    assert uniform.gauc != result.gauc


def test_ids_a_slot_apart_share_a_group():
    """Ids equal modulo GROUP_SLOTS are one group: the documented limit."""
    labels = np.array([1, 0], np.float32)
    logits = np.array([1.0, -1.0], np.float32)
    users = np.array([7, 7 + GROUP_SLOTS], np.int64)
    result = _evaluate(labels, logits, users, users,
                       Breakdown(group_by="user"))
    assert (result.gauc, result.gauc_groups) == (1.0, 1)


def test_slices_top_values_and_other():
    rng = np.random.default_rng(5)
    labels, logits, users, items = _data(rng, 8000, 200, continuous=False)
    result = _evaluate(labels, logits, users, items,
                       Breakdown(slice_by="item", top=3))
    ids, counts = np.unique(items, return_counts=True)
    top = ids[np.argsort(-counts, kind="stable")[:3]]
    assert [s["id"] for s in result.slices] == [str(i) for i in top] + [
        "other"]
    for s in result.slices:
        mine = (np.isin(items, top, invert=True) if s["id"] == "other"
                else items == int(s["id"]))
        y, x = labels[mine], logits[mine].astype(np.float64)
        assert s["count"] == mine.sum()
        assert s["positives"] == y.sum()
        assert s["auc"] == pytest.approx(brute_auc(y, x), abs=1e-9)
        logloss = np.mean(np.maximum(x, 0) - x * y + np.log1p(
            np.exp(-np.abs(x))))
        assert s["logloss"] == pytest.approx(logloss, rel=1e-4)
        assert s["calibration"] == pytest.approx(
            np.sum(1 / (1 + np.exp(-x))) / y.sum(), rel=1e-4)
    assert sum(s["count"] for s in result.slices) == len(labels)
    scalars = result.scalars()
    assert f"slice/item={top[0]}/auc" in scalars
    assert "slice item=other" in result.summary()
    assert math.isnan(result.gauc if result.gauc is not None else math.nan)


# -- in process: psrec train (one device) and psrec eval --------------------


@pytest.fixture(scope="module")
def run_with_breakdown(tmp_path_factory):
    """A short one-device run of the small criteo-like data with
    ``--group-by C1 --slice-by C2 --slice-top 3``."""
    from psrec.launch.cli.main import main
    from tests._ps_helpers import untrained_checkpoint_and_data
    root = tmp_path_factory.mktemp("gauc")
    _, manifest = untrained_checkpoint_and_data(root)
    flags = ["--group-by", "C1", "--slice-by", "C2", "--slice-top", "3"]
    assert main(["train", "--strategy", "one-device", "--data",
                 str(manifest.root), "--model", "dlrm", "--batch-size", "64",
                 "--steps", "20", "--workdir", str(root / "run"),
                 "--json", "--no-export", *flags]) == 0
    return manifest, root / "run", flags


def test_a_run_reports_gauc_and_slices_everywhere(run_with_breakdown,
                                                  capsys):
    import json

    from psrec.launch.cli.main import main
    manifest, run, flags = run_with_breakdown
    capsys.readouterr()
    from psrec.launch.job.summary import JobSummary
    saved = json.loads((run / "summary.json").read_text())
    evaluated = saved["eval"]
    text = JobSummary.from_dict(saved).summary()  # psrec train's summary
    assert "GAUC by C1 (impressions)" in text and "slice C2=other" in text
    assert 0.0 <= evaluated["gauc"] <= 1.0
    assert evaluated["group_by"] == "C1" and evaluated["groups_exact"]
    groups = evaluated["gauc_groups"] + evaluated["gauc_skipped_groups"]
    assert 1 <= evaluated["gauc_groups"] and groups <= 100  # 100 buckets
    slices = evaluated["slices"]
    assert [s["id"] for s in slices][-1] == "other" and len(slices) == 4
    assert sum(s["count"] for s in slices) == evaluated["count"]
    counts = [s["count"] for s in slices[:3]]
    assert counts == sorted(counts, reverse=True)
    # TensorBoard: eval/gauc and the slices' scalars.
    tags = set()
    for path in (run / "tensorboard").rglob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            tags |= {v.tag for v in event.summary.value}
    assert "eval/gauc" in tags
    assert f"eval/slice/C2={slices[0]['id']}/auc" in tags
    # psrec eval of the run's checkpoint: the same figures from the other
    # eval path (one pass here vs. the trainer's per-shard functions).
    assert main(["eval", str(run / "checkpoints"), "--data",
                 str(manifest.root), "--checkpoint", "latest", "--json",
                 *flags]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["gauc"] == pytest.approx(evaluated["gauc"], abs=1e-5)
    assert again["gauc_groups"] == evaluated["gauc_groups"]
    assert [s["id"] for s in again["slices"]] == [s["id"] for s in slices]
    assert main(["eval", str(run / "checkpoints"), "--data",
                 str(manifest.root), "--checkpoint", "latest",
                 *flags]) == 0
    text = capsys.readouterr().out
    assert "GAUC by C1 (impressions)" in text and "slice C2=other" in text


def test_a_column_not_in_the_spec_is_refused_in_one_line(
        run_with_breakdown, capsys):
    from psrec.launch.cli.main import main
    manifest, run, _ = run_with_breakdown
    capsys.readouterr()
    assert main(["eval", str(run / "checkpoints"), "--data",
                 str(manifest.root), "--group-by", "user"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--group-by user" in err[0] and "C1" in err[0]


def test_the_heartbeat_carries_the_gauc():
    from types import SimpleNamespace

    from psrec.launch.monitor.heartbeat import reporter_fields
    from psrec.ps_cluster.evaluation.metrics import EvalResult
    result = EvalResult(count=10, positives=3.0, logloss=0.5, auc=0.7,
                        id_sum=0, gauc=0.65, group_by="user")
    fields = reporter_fields(SimpleNamespace(
        loss=0.4, last_eval=result, last_eval_step=5))
    assert fields["eval"] == {"step": 5, "auc": 0.7, "logloss": 0.5,
                              "gauc": 0.65}
    plain = reporter_fields(SimpleNamespace(loss=0.4, last_eval=dataclasses
                                            .replace(result, gauc=None),
                                            last_eval_step=5))
    assert "gauc" not in plain["eval"]


@pytest.mark.cluster
def test_gauc_under_ps_is_merged_from_the_closures_sums(
        ps_cluster, small_criteo_spec, criteo_data, tmp_path):
    """Under ParameterServerStrategy each eval shard is a closure on a
    worker returning its per-group sums; the coordinator's merge gives the
    GAUC and slices of one pass over the same checkpoint in this process."""
    from psrec.data.input.config import InputConfig
    from psrec.launch.job.config import JobConfig
    from psrec.launch.job.export import evaluate_checkpoint
    from psrec.models.ranking.config import ModelConfig
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    from psrec.ps_cluster.training.config import LoopConfig
    from psrec.ps_cluster.training.trainer import Trainer
    manifest, _ = criteo_data
    model = ModelConfig(interaction="dot", top_mlp=(8,))
    checkpoints = tmp_path / "checkpoints"
    loop = LoopConfig(steps=10, steps_per_closure=5, eval_every=0,
                      checkpoint_every=0, keep_best="none", group_by="C1",
                      gauc_weighting="uniform", slice_by="C2", slice_top=2)
    JobConfig(workdir=tmp_path, spec=small_criteo_spec, model_name="dlrm",
              model=model, loop=loop).write(checkpoints)
    trainer = Trainer(build_ps_strategy(ps_cluster), small_criteo_spec,
                      model, input_config=InputConfig(batch_size=64),
                      checkpoint_dir=checkpoints)
    result = trainer.train(trainer.dataset_fn(manifest), loop,
                           eval_manifest=manifest).eval
    assert len(manifest.files("eval")) == 4  # four closures merged
    single = evaluate_checkpoint(checkpoints, manifest, checkpoint="latest",
                                 breakdown=loop.breakdown())
    assert result.count == single.count == 4000
    assert result.gauc_weighting == "uniform"
    assert result.gauc == pytest.approx(single.gauc, abs=1e-5)
    assert (result.gauc_groups, result.gauc_skipped_groups) == (
        single.gauc_groups, single.gauc_skipped_groups)
    assert [s["id"] for s in result.slices] == [
        s["id"] for s in single.slices]
    assert [s["count"] for s in result.slices] == [
        s["count"] for s in single.slices]
    assert sum(s["count"] for s in result.slices) == 4000
