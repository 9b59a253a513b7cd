"""Negative down-sampling (``psrec convert --neg-sample-rate R``) with the
logit correction: conversion keeps every positive and about R of the train
negatives (the same rows on every run, the eval split untouched); a model
trained on the sampled data is evaluated and exported on ``logit + log R``,
so its probabilities are calibrated on the unsampled eval split."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.format.manifest import Manifest
from psrec.data.format.manifest import ManifestError
from psrec.errors import ConfigError
from psrec.features.spec.columns import CategoricalFeature
from psrec.features.spec.columns import DenseFeature
from psrec.features.spec.columns import LabelConfig
from psrec.features.spec.columns import TableConfig
from psrec.features.spec.spec import FeatureSpec
from psrec.launch.cli.main import main
from psrec.launch.job.export import evaluate_checkpoint
from psrec.launch.job.export import restore_plain_model
from psrec.launch.job.run import _base_rate
from psrec.models.serving.export import ServingModule
from psrec.ps_cluster.checkpoint.best import choose_checkpoint

SPEC = FeatureSpec(
    name="sampled",
    label=LabelConfig("label"),
    dense=(DenseFeature("price", transform="log1p", default=1.0),),
    categorical=(CategoricalFeature("item", table="items",
                                    hash_buckets=400),),
    tables=(TableConfig("items", rows=400, dim=4),),
)
ROWS = 100_000
RATE = 0.1


def _table(rows: int = ROWS, seed: int = 3) -> pa.Table:
    """Rows with a ~3% base rate and a learnable signal: each of 60
    items has its own click logit; the price adds to it."""
    rng = np.random.default_rng(seed)
    item_logit = rng.normal(0.0, 1.0, 60)
    item = rng.integers(0, 60, rows)
    price = rng.gamma(2.0, 3.0, rows)
    logit = -4.0 + item_logit[item] + 0.3 * (np.log1p(price) - 1.8)
    label = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    return pa.table({
        "label": pa.array(label),
        "price": pa.array(price, pa.float64()),
        "item": pa.array([f"i{v}" for v in item], pa.string()),
    })


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("neg-raw") / "raw.parquet"
    pq.write_table(_table(), path)
    return path


def _convert(raw: Path, out: Path, rate: float):
    return convert([raw], SPEC, out, ConversionOptions(
        shards=2, eval_fraction=0.5, split_mode="hash",
        neg_sample_rate=rate))


def _shas(manifest: Manifest, split: str) -> list[str]:
    return [s.sha256 for s in manifest.shards[split]]


def test_conversion_keeps_positives_and_about_r_of_train_negatives(
        raw, tmp_path):
    full = _convert(raw, tmp_path / "full", 1.0)
    first = _convert(raw, tmp_path / "a", RATE)
    again = _convert(raw, tmp_path / "b", RATE)
    whole, sampled = full.manifest, first.manifest
    assert whole.negatives_dropped == 0 and whole.neg_sample_rate == 1.0
    # Every positive kept; about RATE of the train negatives.
    assert sampled.positives == whole.positives
    negatives = whole.rows("train") - whole.positives["train"]
    kept = sampled.rows("train") - sampled.positives["train"]
    sigma = math.sqrt(negatives * RATE * (1 - RATE))
    assert abs(kept - RATE * negatives) < 4 * sigma
    assert sampled.negatives_dropped == negatives - kept
    # The eval split is not sampled: the same bytes as without sampling.
    assert sampled.rows("eval") == whole.rows("eval") > 0
    assert _shas(sampled, "eval") == _shas(whole, "eval")
    # Dropped negatives are not bad rows.
    assert first.bad_rows == 0 and sampled.quarantine is None
    # A re-run keeps the same rows (byte-identical shards).
    assert _shas(again.manifest, "train") == _shas(sampled, "train")
    assert _shas(sampled, "train") != _shas(whole, "train")
    # The manifest records the rate and the count; the summary says it.
    data = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert data["neg_sample_rate"] == RATE
    assert data["negatives_dropped"] == negatives - kept
    assert Manifest.load(tmp_path / "a").neg_sample_rate == RATE
    assert f"dropped {negatives - kept}" in first.summary()
    assert "negative sampling" not in full.summary()
    # The base rate the job starts the model at is the written split's.
    assert _base_rate(sampled) == pytest.approx(
        sampled.positives["train"] / sampled.rows("train"))
    assert _base_rate(sampled) > 2 * _base_rate(whole)


def test_an_older_manifest_reads_as_not_sampled(raw, tmp_path):
    manifest = _convert(raw, tmp_path / "d", 1.0).manifest
    path = manifest.root / "manifest.json"
    data = json.loads(path.read_text())
    del data["neg_sample_rate"], data["negatives_dropped"]
    path.write_text(json.dumps(data))
    loaded = Manifest.load(path)
    assert (loaded.neg_sample_rate, loaded.negatives_dropped) == (1.0, 0)
    path.write_text(json.dumps({**data, "neg_sample_rate": 0}))
    with pytest.raises(ManifestError, match="malformed.*neg_sample_rate"):
        Manifest.load(path)


def test_nonsense_rates_are_refused_and_all_positive_data_is_fine(
        raw, tmp_path, capsys):
    for rate in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ConfigError,
                           match="`ConversionOptions.neg_sample_rate` = "):
            ConversionOptions(neg_sample_rate=rate)
    spec_file = str(SPEC.save(tmp_path / "spec.yaml"))
    for text in ("0", "1.5", "abc"):
        with pytest.raises(SystemExit) as exited:
            main(["convert", str(raw), "--spec", spec_file, "--out",
                  str(tmp_path / "x"), "--neg-sample-rate", text])
        assert exited.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1
        assert "--neg-sample-rate" in err[0] and "(0, 1]" in err[0]
    assert not (tmp_path / "x").exists()
    # No negative in the train split: nothing to drop, nothing refused.
    positives = _table(200).set_column(0, "label", pa.array([1] * 200))
    pq.write_table(positives, tmp_path / "pos.parquet")
    report = _convert(tmp_path / "pos.parquet", tmp_path / "pos", 0.3)
    assert report.manifest.negatives_dropped == 0
    assert report.rows_written["train"] + report.rows_written["eval"] == 200


@pytest.fixture(scope="module")
def trained(raw, tmp_path_factory):
    """A dlrm trained on the RATE-sampled data (one device, in process)."""
    root = tmp_path_factory.mktemp("neg-run")
    manifest = _convert(raw, root / "data", RATE).manifest
    assert main(["train", "--strategy", "one-device", "--data",
                 str(manifest.root), "--model", "dlrm", "--batch-size",
                 "256", "--steps", "300", "--eval-every", "150",
                 "--sparse-lr", "0.25",
                 "--workdir", str(root / "run"),
                 "--json", "--no-export"]) == 0
    return manifest, root / "run"


def test_evaluation_is_calibrated_only_with_the_correction(trained, capsys):
    manifest, run = trained
    summary = json.loads((run / "summary.json").read_text())
    checkpoints = run / "checkpoints"
    # The run's periodic evaluation is on corrected logits.
    assert 0.8 <= summary["eval"]["calibration"] <= 1.25
    corrected = evaluate_checkpoint(checkpoints, manifest,
                                    checkpoint="latest")
    assert corrected.calibration == pytest.approx(
        summary["eval"]["calibration"], rel=1e-4)
    # The same checkpoint without the correction predicts ~1/RATE odds.
    raw_eval = evaluate_checkpoint(checkpoints, manifest,
                                   checkpoint="latest", neg_sample_rate=1.0)
    assert raw_eval.calibration > 2
    assert raw_eval.logloss > corrected.logloss
    assert corrected.auc == pytest.approx(raw_eval.auc, abs=1e-3)
    assert corrected.auc > 0.6  # the model learned the signal
    # The rate travels with the checkpoints and `psrec eval` reports it.
    sampling = json.loads((checkpoints / "sampling.json").read_text())
    assert sampling["neg_sample_rate"] == RATE
    capsys.readouterr()
    assert main(["eval", str(checkpoints), "--data", str(manifest.root),
                 "--checkpoint", "latest", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["neg_sample_rate"] == RATE
    assert result["calibration"] == pytest.approx(corrected.calibration,
                                                  rel=1e-4)


def test_the_export_serves_corrected_probabilities(trained, tmp_path, capsys):
    _, run = trained
    checkpoints = run / "checkpoints"
    capsys.readouterr()
    assert main(["export", str(checkpoints), "--out", str(tmp_path / "m"),
                 "--checkpoint", "latest"]) == 0
    assert f"log({RATE:g})" in capsys.readouterr().out
    info = json.loads((tmp_path / "m" / "1" / "psrec_export.json")
                      .read_text())
    assert info["neg_sample_rate"] == RATE
    assert info["logit_shift"] == pytest.approx(math.log(RATE))
    table = _table(64, seed=11)
    raw_rows = {"price": tf.constant(table.column("price").to_numpy(),
                                     tf.float32),
                "item": tf.constant(table.column("item").to_pylist())}
    loaded = tf.saved_model.load(str(tmp_path / "m" / "1"))
    served = loaded.signatures["serving_default"](**raw_rows)
    assert loaded.logit_shift.numpy() == pytest.approx(math.log(RATE))
    # The uncorrected logit of the same checkpoint, outside the export.
    model, record, _ = restore_plain_model(
        checkpoints, choose_checkpoint(checkpoints, "latest").path)
    batch = ServingModule(model, record.spec).model_batch(raw_rows)
    plain = model(batch, training=False).numpy().reshape(-1)
    expected = plain + math.log(RATE)
    np.testing.assert_allclose(served["logit"].numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(served["probability"].numpy(),
                               1 / (1 + np.exp(-expected)), rtol=1e-5)
    assert not np.allclose(served["probability"].numpy(),
                           1 / (1 + np.exp(-plain)), rtol=1e-2)
