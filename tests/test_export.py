"""Export: a checkpoint trained on the cluster becomes a serving SavedModel
that, loaded in a fresh process with no cluster, scores raw rows exactly like
the trained model; the signature follows the spec (criteo and movielens)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from psrec.data.ingest.synthetic import write_synthetic_parquet
from psrec.data.input.config import InputConfig
from psrec.features.spec.presets import movielens
from psrec.features.spec.spec import DENSE_COLUMN
from psrec.features.spec.spec import ID_COLUMN
from psrec.launch.job.config import JobConfig
from psrec.launch.job.export import export_checkpoint
from psrec.models.build import build_model
from psrec.models.optim.config import OptimizerConfig
from psrec.models.ranking.config import ModelConfig
from psrec.models.serving.export import ServingModule
from psrec.models.serving.export import export_saved_model
from psrec.ps_cluster.cluster.strategy import build_ps_strategy
from psrec.ps_cluster.training.config import LoopConfig
from psrec.ps_cluster.training.trainer import Trainer
from tests._ps_helpers import helper_result
from tests._ps_helpers import raw_rows
from tests._ps_helpers import read_split
from tests._ps_helpers import run_helper

pytestmark = pytest.mark.cluster

MODEL = ModelConfig(interaction="cross", top_mlp=(16,), cross_layers=1)
ROWS = 400  # raw rows scored (from the first Parquet file: ids 0..399)
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def exported(ps_cluster, small_criteo_spec, criteo_data, tmp_path_factory):
    """A model trained 40 steps on the shared cluster, its checkpoint
    directory (with job.json, as ``psrec train`` writes it) and its export."""
    manifest, parquet = criteo_data
    root = tmp_path_factory.mktemp("export")
    ckpt_dir = root / "checkpoints"
    JobConfig(workdir=root, spec=small_criteo_spec, model_name="dcn",
              model=MODEL, input=InputConfig(batch_size=128),
              data=manifest.root).write(ckpt_dir)
    trainer = Trainer(build_ps_strategy(ps_cluster), small_criteo_spec, MODEL,
                      OptimizerConfig(sparse_lr=0.2, dense_lr=0.01,
                                      base_batch_size=128, warmup_steps=0),
                      InputConfig(batch_size=128), checkpoint_dir=ckpt_dir)
    result = trainer.train(trainer.dataset_fn(manifest), LoopConfig(
        steps=40, steps_per_closure=10, checkpoint_every=0))
    assert result.checkpoint == trainer.keeper.latest
    out = Path(export_checkpoint(ckpt_dir, root / "export").path)
    assert out == root / "export" / "1"
    return trainer, out, parquet[0], root


@pytest.fixture(scope="module")
def served(exported, small_criteo_spec):
    """Probabilities and signature from a fresh process (no cluster)."""
    _, out, parquet, root = exported
    spec_file = root / "spec.json"
    spec_file.write_text(json.dumps(small_criteo_spec.to_dict()))
    completed = run_helper(["serve", "--model", out, "--spec", spec_file,
                            "--parquet", parquet, "--rows", ROWS,
                            "--out", root / "served"], timeout=150)
    info = helper_result(completed)
    info["probability"] = np.load(root / "served" / "probability.npy")
    info["logit"] = np.load(root / "served" / "logit.npy")
    return info


def test_export_wrote_a_saved_model(exported):
    _, out, _, _ = exported
    assert (out / "saved_model.pb").is_file()
    assert (out / "variables" / "variables.index").is_file()


def test_served_probabilities_equal_the_cluster_model(exported, served,
                                                      small_criteo_spec):
    trainer, _, parquet, _ = exported
    assert not any("/job:" in d for d in served["devices"])  # no cluster
    raw = raw_rows(parquet, small_criteo_spec, ROWS)
    assert np.isnan(raw["I1"]).any()  # nulls reach serving as NaN
    batch = ServingModule(trainer.model, small_criteo_spec).model_batch(
        {k: tf.constant(v) for k, v in raw.items()})
    expected = tf.sigmoid(trainer.model(batch)).numpy()
    probability = served["probability"]
    assert probability.shape == (ROWS,)
    assert np.all((probability > 0) & (probability < 1))
    assert np.max(np.abs(probability - expected)) <= TOLERANCE
    assert np.std(probability) > 1e-3  # rows are told apart, not a constant
    np.testing.assert_allclose(served["logit"],
                               trainer.model(batch).numpy(), atol=1e-4)


def test_serving_encodes_rows_as_the_conversion_did(exported, served,
                                                    criteo_data,
                                                    small_criteo_spec):
    """The same rows read back from the training shards (converted ids and
    dense values) give the same probabilities on the cluster model."""
    trainer, _, _, _ = exported
    manifest, _ = criteo_data
    rows = read_split(manifest, small_criteo_spec, "train", batch_size=2048)
    order = np.argsort(rows[ID_COLUMN])
    assert np.array_equal(rows[ID_COLUMN][order[:ROWS]], np.arange(ROWS))
    converted = {k: tf.constant(v[order[:ROWS]]) for k, v in rows.items()}
    inputs = {k: converted[k] for k in
              [DENSE_COLUMN] + [f.name for f in small_criteo_spec.categorical]}
    expected = tf.sigmoid(trainer.model(inputs)).numpy()
    assert np.max(np.abs(served["probability"] - expected)) <= TOLERANCE


def test_signature_inputs_follow_the_spec(served, small_criteo_spec):
    inputs = served["inputs"]
    expected = {f.name: ["float32", [None]] for f in small_criteo_spec.dense}
    expected.update({f.name: ["string", [None]]
                     for f in small_criteo_spec.categorical})
    assert inputs == expected
    assert served["outputs"] == ["logit", "probability"]


def test_movielens_export_takes_int64_ids_and_multi_hot_strings(tmp_path):
    spec = movielens(dim=4)
    model = build_model(spec, ModelConfig(interaction="dot", bottom_mlp=(8,),
                                          top_mlp=(8,)))
    out = export_saved_model(model, spec, tmp_path / "export")
    parquet = write_synthetic_parquet(spec, tmp_path / "parquet", 64,
                                      files=1, seed=3)[0]
    raw = raw_rows(parquet, spec, 64)
    assert raw["user_id"].dtype == np.int64
    assert raw["genres"].ndim == 2 and (raw["genres"] == "").any()

    loaded = tf.saved_model.load(str(out))
    signature = loaded.signatures["serving_default"]
    _, inputs = signature.structured_input_signature
    assert {k: (s.dtype, s.shape.as_list()) for k, s in inputs.items()} == {
        "age": (tf.float32, [None]),
        "user_id": (tf.int64, [None]), "item_id": (tf.int64, [None]),
        "genres": (tf.string, [None, None]),
        "gender": (tf.string, [None]), "occupation": (tf.string, [None]),
        "zip": (tf.string, [None]),
    }
    tensors = {k: tf.constant(v) for k, v in raw.items()}
    served = signature(**tensors)["probability"].numpy()
    batch = ServingModule(model, spec).model_batch(tensors)
    genres = batch["genres"].numpy()
    assert genres.shape == (64, spec.categorical[2].max_length)
    assert np.array_equal(genres < 0, np.pad(
        raw["genres"] == "", [[0, 0], [0, 6 - raw["genres"].shape[1]]],
        constant_values=True))  # padding -> -1, masked in the mean
    expected = tf.sigmoid(model(batch)).numpy()
    assert np.max(np.abs(served - expected)) <= TOLERANCE
    # Padding a multi-hot list further does not change the score.
    wider = dict(tensors, genres=tf.pad(tensors["genres"], [[0, 0], [0, 2]]))
    np.testing.assert_allclose(signature(**wider)["probability"].numpy(),
                               served, atol=TOLERANCE)


def test_eval_of_a_checkpoint_matches_the_cluster_evaluation(
        exported, criteo_data, capsys):
    from psrec.launch.cli.main import main
    from psrec.launch.job.export import evaluate_checkpoint
    trainer, _, _, root = exported
    manifest, _ = criteo_data
    on_cluster = trainer.evaluate(manifest)
    offline = evaluate_checkpoint(root / "checkpoints", manifest)
    assert offline.count == manifest.rows("eval") == on_cluster.count
    assert offline.id_sum == on_cluster.id_sum  # the same rows, once each
    assert offline.auc == pytest.approx(on_cluster.auc, abs=1e-4)
    assert offline.logloss == pytest.approx(on_cluster.logloss, abs=1e-4)
    assert main(["eval", str(root / "checkpoints"), "--data",
                 str(manifest.root)]) == 0
    assert f"eval: {manifest.rows('eval')} examples" in capsys.readouterr().out
