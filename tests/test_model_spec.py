"""Every named model on every valid spec (issue 9): no dense features, one
categorical feature, multi-hot features, tables of different widths; the
one refusal (no categorical feature) before anything starts; and the output
bias initialised to the base rate's logit."""

import dataclasses
import json
import math
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from psrec.features import criteo
from psrec.features import movielens
from psrec.features.spec.spec import DENSE_COLUMN
from psrec.features.spec.spec import FeatureSpec
from psrec.models.build import build_model
from psrec.models.ranking.config import MODEL_PRESETS
from psrec.models.ranking.config import ModelConfigError
from psrec.models.ranking.config import check_model_spec
from psrec.models.ranking.config import model_config
from psrec.models.ranking.interaction import DotInteraction
from psrec.models.ranking.interaction import FMInteraction
from psrec.models.ranking.model import RankingModel
from tests._proc import REPO

MODELS = sorted(MODEL_PRESETS)


def _spec(tables, categorical, dense=()) -> FeatureSpec:
    return FeatureSpec.from_dict({"name": "small", "tables": tables,
                                  "categorical": categorical,
                                  "dense": list(dense)})


def _one_categorical(dense=()) -> FeatureSpec:
    return _spec([{"name": "ids", "rows": 50, "dim": 4}],
                 [{"name": "item", "table": "ids", "hash_buckets": 50}],
                 dense)


def _multi_hot_mixed_widths() -> FeatureSpec:
    """No dense; a single-valued and a multi-hot feature on tables of
    widths 4 and 6."""
    return _spec([{"name": "users", "rows": 30, "dim": 4},
                  {"name": "tags", "rows": 40, "dim": 6}],
                 [{"name": "user", "table": "users", "hash_buckets": 30},
                  {"name": "tags", "table": "tags", "hash_buckets": 40,
                   "max_length": 3, "combiner": "sum"}])


def _movielens_mixed_widths() -> FeatureSpec:
    spec = movielens(dim=4)
    tables = tuple(dataclasses.replace(t, dim=8) if t.name == "genre" else t
                   for t in spec.tables)
    return dataclasses.replace(spec, tables=tables)


SPECS = {
    "criteo-no-dense": lambda: dataclasses.replace(criteo(buckets=20, dim=4),
                                                   dense=()),
    "one-categorical": _one_categorical,
    "one-categorical-one-dense": lambda: _one_categorical(
        [{"name": "price", "transform": "log1p"}]),
    "multi-hot-mixed-widths-no-dense": _multi_hot_mixed_widths,
    "movielens-mixed-widths": _movielens_mixed_widths,
}


def random_batch(spec: FeatureSpec, rows: int, seed: int = 0) -> dict:
    """Random raw dense values and valid ids (multi-hot: some padding)."""
    rng = np.random.default_rng(seed)
    batch = {}
    if spec.dense:
        batch[DENSE_COLUMN] = tf.constant(
            rng.exponential(3.0, (rows, len(spec.dense))), tf.float32)
    for feature in spec.categorical:
        shape = (rows, feature.max_length) if feature.multi_hot else (rows,)
        ids = feature.row_offset + rng.integers(0, feature.hash_buckets,
                                                shape)
        if feature.multi_hot:  # pad the tail of every other row
            ids[::2, -1] = -1
        batch[feature.name] = tf.constant(ids, tf.int64)
    return batch


def _loss(model, batch, labels):
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels, model(batch, training=True)))


@pytest.mark.parametrize("spec_name", sorted(SPECS))
@pytest.mark.parametrize("name", MODELS)
def test_every_model_trains_a_step_on_every_spec(name, spec_name):
    spec = SPECS[spec_name]()
    model = build_model(spec, model_config(name))
    batch = random_batch(spec, rows=16)
    labels = tf.constant(np.random.default_rng(1).integers(0, 2, 16),
                         tf.float32)
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        before = _loss(model, batch, labels)
    gradients = tape.gradient(before, variables)
    assert np.isfinite(before.numpy())
    # Every part is wired into the logit: each variable gets a gradient.
    missing = [v.name for v, g in zip(variables, gradients) if g is None]
    assert not missing
    tf_keras.optimizers.legacy.SGD(0.01).apply_gradients(
        zip(gradients, variables))
    after = _loss(model, batch, labels)
    assert after.numpy() < before.numpy()


def test_without_dense_features_there_is_no_bottom_mlp():
    spec = SPECS["criteo-no-dense"]()
    for name in MODELS:
        model = build_model(spec, model_config(name))
        assert model.dense_arch is None and model.wide_dense is None


def test_dot_interaction_without_dense_pairs_the_embeddings_only():
    embeddings = [tf.constant([[1.0, 2.0]]), tf.constant([[3.0, 4.0]]),
                  tf.constant([[5.0, 6.0]])]
    out, extra = DotInteraction()(tf.zeros([1, 0]), embeddings)
    assert extra is None
    # The embeddings take the dense vector's place, then the pairs
    # (e1.e2, e1.e3, e2.e3) = (11, 17, 39).
    np.testing.assert_allclose(out.numpy(), [[1, 2, 3, 4, 5, 6, 11, 17, 39]])
    single, _ = DotInteraction()(tf.zeros([1, 0]), embeddings[:1])
    np.testing.assert_allclose(single.numpy(), [[1, 2]])  # no pair


def test_fm_interaction_without_dense_is_fm_over_the_embeddings():
    embeddings = [tf.constant([[1.0, 2.0]]), tf.constant([[3.0, 4.0]]),
                  tf.constant([[5.0, 6.0]])]
    out, fm = FMInteraction()(tf.zeros([1, 0]), embeddings)
    np.testing.assert_allclose(fm.numpy(), [11.0 + 17.0 + 39.0])
    np.testing.assert_allclose(out.numpy(), [[1, 2, 3, 4, 5, 6]])


def test_dot_projects_the_narrower_table_of_a_mixed_width_spec():
    model = build_model(_multi_hot_mixed_widths(), model_config("dlrm"))
    assert list(model.projections) == ["users"]
    assert tuple(model.projections["users"].kernel.shape) == (4, 6)
    assert model.projections["users"].kernel in model.dense_variables()


# -- refusals -----------------------------------------------------------------

DENSE_ONLY = {"name": "dense-only", "dense": [{"name": "price"}]}


@pytest.mark.parametrize("name", MODELS)
def test_a_spec_without_categorical_features_is_refused_naming_model_and_fix(
        name):
    spec = FeatureSpec.from_dict(DENSE_ONLY)
    with pytest.raises(ModelConfigError) as error:
        check_model_spec(spec, model_config(name), name)
    message = str(error.value)
    assert f"`--model` = {name!r}" in message
    assert "no categorical" in message or "only dense" in message
    assert "add a categorical feature" in message
    with pytest.raises(ModelConfigError, match="categorical feature"):
        build_model(spec, model_config(name))


def test_check_model_spec_is_pure_python():
    code = ("import sys\n"
            "from psrec.features.spec.spec import FeatureSpec\n"
            "from psrec.models.ranking.config import check_model_spec, model_config\n"
            f"spec = FeatureSpec.from_dict({DENSE_ONLY!r})\n"
            "try:\n"
            "    check_model_spec(spec, model_config('dlrm'), 'dlrm')\n"
            "except ValueError:\n"
            "    pass\n"
            "else:\n"
            "    raise SystemExit('not refused')\n"
            "assert 'tensorflow' not in sys.modules, 'imported tensorflow'\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_job_config_refuses_the_spec_before_anything_runs():
    from psrec.launch.job.config import JobConfig
    with pytest.raises(ModelConfigError, match=r"`--model` = 'deepfm'"):
        JobConfig(spec=FeatureSpec.from_dict(DENSE_ONLY),
                  model_name="deepfm", model=model_config("deepfm"))


def test_psrec_train_refuses_with_exit_2_and_one_line_before_any_server(
        tmp_path, capsys):
    from psrec.launch.cli.main import main
    spec_file = tmp_path / "dense_only.json"
    spec_file.write_text(json.dumps(DENSE_ONLY))
    workdir = tmp_path / "run"
    code = main(["train", "--spec", str(spec_file), "--model", "dlrm",
                 "--workdir", str(workdir), "--steps", "2"])
    assert code == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("psrec train: error: `--model` = 'dlrm'")
    assert "categorical" in lines[0]
    # Refused before data generation or any server: the workdir (which
    # would hold data/ and the servers' logs/) was never created.
    assert not workdir.exists()


# -- output bias: the base rate's logit ---------------------------------------

RATE = 0.05
LOGIT = math.log(RATE / (1 - RATE))


# DeepFM on movielens: the FM term of the random embeddings adds to the
# initial logit (next test); with a single field it has no pair, so is 0.
BASE_RATE_CASES = [(name, spec) for name in MODELS
                   for spec in ("movielens-mixed-widths", "one-categorical")
                   if (name, spec) != ("deepfm", "movielens-mixed-widths")]


@pytest.mark.parametrize("name, spec_name", BASE_RATE_CASES)
def test_untrained_model_predicts_the_positive_rate(name, spec_name):
    spec = SPECS[spec_name]()
    model = build_model(spec, model_config(name), positive_rate=RATE)
    np.testing.assert_allclose(model.over_arch.out.bias.numpy(), [LOGIT],
                               rtol=1e-6)
    probabilities = tf.sigmoid(model(random_batch(spec, 512))).numpy()
    # Every logit part but the bias starts at zero (the output kernels and
    # the wide tables), so the prediction is p up to float32 rounding
    # (~1e-7 relative), on every row and so in the mean.
    np.testing.assert_allclose(probabilities, RATE, rtol=1e-4)
    assert abs(probabilities.mean() - RATE) < 1e-5


def test_deepfm_initial_logit_is_the_bias_plus_the_fm_term():
    spec = _movielens_mixed_widths()
    model = build_model(spec, model_config("deepfm"), positive_rate=RATE)
    batch = random_batch(spec, 64)
    seen = {}
    original = model.interaction_arch.call

    def record(dense, embeddings):
        features, fm = original(dense, embeddings)
        seen["fm"] = fm
        return features, fm

    model.interaction_arch.call = record
    logits = model(batch).numpy()
    np.testing.assert_allclose(logits - seen["fm"].numpy(), LOGIT,
                               rtol=1e-5)


def test_without_positive_rate_the_default_initialisation_is_kept():
    spec = _one_categorical([{"name": "price"}])
    model = build_model(spec, model_config("wide_deep"))
    assert model.positive_rate is None
    np.testing.assert_array_equal(model.over_arch.out.bias.numpy(), [0.0])
    assert np.any(model.over_arch.out.kernel.numpy() != 0)
    assert np.any(model.wide_dense.kernel.numpy() != 0)


def test_positive_rate_round_trips_get_config():
    spec = _movielens_mixed_widths()
    model = build_model(spec, model_config("dcn"), positive_rate=0.2)
    config = model.get_config()
    assert config["positive_rate"] == 0.2
    rebuilt = RankingModel.from_config(json.loads(json.dumps(config)))
    assert rebuilt.get_config() == config
    rebuilt(random_batch(spec, 2))
    np.testing.assert_allclose(rebuilt.over_arch.out.bias.numpy(),
                               [math.log(0.2 / 0.8)], rtol=1e-6)


@pytest.mark.parametrize("rate", [0.0, 1.0, 1.5, -0.1, True, "0.1"])
def test_a_positive_rate_outside_0_1_is_refused(rate):
    with pytest.raises(ModelConfigError, match=r"`positive_rate` = "):
        build_model(_one_categorical(), model_config("dcn"),
                    positive_rate=rate)


@pytest.mark.cluster
def test_output_bias_is_a_dense_ps_variable_with_the_base_rate_logit(
        ps_cluster):
    from psrec.ps_cluster.cluster.partition_config import PartitionConfig
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    strategy = build_ps_strategy(ps_cluster, PartitionConfig(kind="fixed"))
    with strategy.scope():
        model = build_model(criteo(buckets=20, dim=4), model_config("dlrm"),
                            positive_rate=0.1)
    bias = model.over_arch.out.bias
    assert "/job:ps/" in bias.device
    assert any(bias is v for v in model.dense_variables())
    np.testing.assert_allclose(bias.numpy(), [math.log(0.1 / 0.9)],
                               rtol=1e-6)
