"""Rating regression, the ranking variant ``label: {name: rating, loss:
mse}``: the label keeps its raw value through conversion, the step trains
on the squared error and evaluation reports RMSE (and not the ranking
metrics); a spec without ``loss`` keeps its fingerprint."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.input.config import InputConfig
from psrec.features.spec.columns import SpecError
from psrec.features.spec.presets import PRESETS
from psrec.features.spec.spec import FeatureSpec
from psrec.models.optim.config import OptimizerConfig
from psrec.models.ranking.config import model_config
from psrec.ps_cluster.training.config import LoopConfig
from psrec.ps_cluster.training.trainer import Trainer

ROWS = 6000


def _spec() -> FeatureSpec:
    return FeatureSpec.from_dict({
        "name": "ratings", "label": {"name": "rating", "loss": "mse"},
        "tables": [{"name": "ids", "rows": 600, "dim": 8}], "dense": [],
        "categorical": [
            {"name": "user", "table": "ids", "hash_buckets": 300},
            {"name": "item", "table": "ids", "hash_buckets": 300}]})


def test_mse_label_is_validated_and_keeps_old_fingerprints():
    with pytest.raises(SpecError, match="`loss` = 'mae' is not allowed"):
        FeatureSpec.from_dict({**_spec().to_dict(),
                               "label": {"name": "rating", "loss": "mae"}})
    with pytest.raises(SpecError, match="`threshold` makes a 0/1 label"):
        FeatureSpec.from_dict({**_spec().to_dict(), "label": {
            "name": "rating", "loss": "mse", "threshold": 4}})
    assert _spec().to_dict()["label"] == {"name": "rating", "threshold": None,
                                          "loss": "mse"}
    assert "loss" not in PRESETS["movielens"]().to_dict()["label"]
    assert PRESETS["movielens-rating"]().label.loss == "mse"


def test_rating_regression_trains_and_reports_rmse(tmp_path):
    rng = np.random.default_rng(0)
    users, items = rng.integers(0, 50, ROWS), rng.integers(0, 50, ROWS)
    # A rating each (user, item) pair gets from the two ids, plus noise.
    rating = 1.0 + (users % 5) * 0.5 + (items % 3) * 0.5 + rng.normal(
        0, 0.1, ROWS)
    path = tmp_path / "ratings.parquet"
    pq.write_table(pa.table({"rating": rating,
                             "user": [f"u{u}" for u in users],
                             "item": [f"i{i}" for i in items]}), path)
    spec = _spec()
    manifest = convert([path], spec, tmp_path / "tf", ConversionOptions(
        shards=1, eval_fraction=0.2, split_mode="hash")).manifest
    trainer = Trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), spec,
                      model_config("dcn", top_mlp=(32,)),
                      OptimizerConfig(dense_lr=0.01),
                      InputConfig(batch_size=128))
    result = trainer.train(trainer.dataset_fn(manifest), LoopConfig(
        steps=200, steps_per_closure=25, checkpoint_every=0),
        eval_manifest=manifest)
    # Predicting the mean scores the spread, learning the item part only
    # 0.87 * spread, the user part only 0.5 * spread.
    spread = float(np.std(rating))
    assert result.eval.count == manifest.rows("eval")
    assert result.eval.rmse is not None
    assert result.eval.rmse < 0.6 * spread, (result.eval.rmse, spread)
    assert result.eval.summary().startswith("eval: ")
    assert "AUC" not in result.eval.summary()


@pytest.mark.parametrize("flags", [["--keep-best", "logloss"],
                                   ["--early-stop-patience", "2"]])
def test_ranking_metric_flags_on_a_regression_label_are_refused(
        tmp_path, capsys, flags):
    """AUC/logloss do not apply to an mse label: asking to keep the best
    by them, or to stop early on them, is one line and exit 2 (not a
    silent switch to the latest checkpoint)."""
    from psrec.launch.cli.main import main
    code = main(["train", "--spec", "movielens-rating", "--strategy",
                 "one-device", "--workdir", str(tmp_path / "run"), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "loss: mse" in err[0] and "'rating'" in err[0]
    assert not (tmp_path / "run").exists()  # refused before anything ran
