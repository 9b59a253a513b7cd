"""DeepFM starts at the base rate on a wide spec and learns without
blowing up.

Its FM term, the dot products of all F(F-1)/2 field pairs (27 fields on
Criteo: 351 pairs, plus the dense field), is added to the logit. At the
tables' default scale ``1/sqrt(dim)`` and a Glorot dense projection it
started with a standard deviation of several logits (initial logloss 1.5
where the base rate gives 0.53 on the Criteo sample); ``deepfm`` now starts
its field vectors at ``FM_INIT_SCALE`` (``ModelConfig.init_scale``).
"""

import math

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from psrec.features import criteo
from psrec.features.spec.spec import DENSE_COLUMN
from psrec.features.spec.spec import FeatureSpec
from psrec.models.build import build_model
from psrec.models.ranking.config import FM_INIT_SCALE
from psrec.models.ranking.config import ModelConfigError
from psrec.models.ranking.config import model_config

RATE = 0.25
LOGIT = math.log(RATE / (1 - RATE))


def _criteo_batch(spec: FeatureSpec, rows: int, seed: int = 0) -> dict:
    """Heavy-tailed raw counts (like Criteo's) and valid ids."""
    rng = np.random.default_rng(seed)
    counts = np.floor(rng.lognormal(2.0, 2.0, (rows, len(spec.dense))))
    batch = {DENSE_COLUMN: tf.constant(counts, tf.float32)}
    for feature in spec.categorical:
        batch[feature.name] = tf.constant(
            feature.row_offset + rng.integers(0, feature.hash_buckets, rows),
            tf.int64)
    return batch


def _start_gap(config) -> np.ndarray:
    """|initial logit - base-rate logit| of each row of a Criteo batch."""
    spec = criteo(buckets=100, dim=16)
    tf_keras.utils.set_random_seed(0)
    model = build_model(spec, config, positive_rate=RATE)
    return np.abs(model(_criteo_batch(spec, 512)).numpy() - LOGIT)


def test_untrained_deepfm_predicts_the_base_rate_on_many_fields():
    gap = _start_gap(model_config("deepfm"))
    assert gap.mean() < 0.02 and gap.max() < 0.2, (gap.mean(), gap.max())
    # Control: at the tables' default scale (the former deepfm) the FM term
    # of 13 dense features and 26 embeddings moves the start by logits.
    former = _start_gap(model_config("deepfm", init_scale=None))
    assert former.mean() > 0.5, former.mean()


def test_deepfm_field_vectors_start_at_the_fm_scale_unless_the_spec_says():
    spec = criteo(buckets=50, dim=8)
    model = build_model(spec, model_config("deepfm"))
    table = model.sparse_arch.tables["categorical"].numpy()
    # The spec's default initializer, uniform, at the model's scale.
    assert np.abs(table).max() <= FM_INIT_SCALE
    assert table.std() > FM_INIT_SCALE / 4
    kernel = model.dense_arch.out.kernel.numpy()
    assert 0.5 * FM_INIT_SCALE < kernel.std() < 2 * FM_INIT_SCALE
    # A scale the spec gives wins over the model's default.
    data = spec.to_dict()
    data["tables"][0]["scale"] = 0.5
    explicit = build_model(FeatureSpec.from_dict(data), model_config("deepfm"))
    assert np.abs(explicit.sparse_arch.tables["categorical"].numpy()).max(
    ) > 0.4
    # Other models keep the tables' default 1/sqrt(dim).
    dcn = build_model(spec, model_config("dcn"))
    assert np.abs(dcn.sparse_arch.tables["categorical"].numpy()).max(
    ) > 0.9 * 8 ** -0.5


@pytest.mark.parametrize("scale", [0.0, -1.0, math.inf, True, "0.01"])
def test_a_bad_init_scale_is_refused(scale):
    with pytest.raises(ModelConfigError, match=r"`init_scale` = "):
        model_config("deepfm", init_scale=scale)


def test_deepfm_learns_a_pairwise_signal_without_blowing_up():
    """Two of 26 categorical fields carry the signal through their pair
    (same parity: p = 0.8, else 0.1); the others are noise. Trained from
    the base rate, DeepFM is never much worse than the base rate on fresh
    rows (the former start was: logloss > 1, even infinite, in the first
    hundred steps) and ends near the best possible logloss (0.413)."""
    spec = criteo(buckets=8, dim=8)
    tf_keras.utils.set_random_seed(0)

    def sample(rows, seed):
        batch = _criteo_batch(spec, rows, seed)
        a = batch["C1"].numpy() - spec.categorical[0].row_offset
        b = batch["C2"].numpy() - spec.categorical[1].row_offset
        p = np.where(a % 2 == b % 2, 0.8, 0.1)
        labels = np.random.default_rng(seed + 1).random(rows) < p
        return batch, tf.constant(labels, tf.float32), p

    _, _, p = sample(20_000, 99)
    rate = float(p.mean())
    base = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    model = build_model(spec, model_config("deepfm"), positive_rate=rate)
    sparse = tf_keras.optimizers.legacy.Adagrad(0.05)
    dense = tf_keras.optimizers.legacy.Adam(0.001)
    tables, towers = model.embedding_variables(), model.dense_variables()

    @tf.function
    def step(batch, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                labels, model(batch, training=True)))
        grads = tape.gradient(loss, tables + towers)
        sparse.apply_gradients(zip(grads[:len(tables)], tables))
        dense.apply_gradients(zip(grads[len(tables):], towers))

    held_out, labels, _ = sample(4096, 10_000)
    y = labels.numpy()
    loglosses = []
    for i in range(600):
        step(*sample(512, i)[:2])
        if i % 100 == 99:
            logits = model(held_out).numpy().astype(np.float64)
            assert np.all(np.isfinite(logits))
            loglosses.append(float(np.mean(
                np.logaddexp(0, logits) - y * logits)))
    assert max(loglosses) < base + 0.02, (loglosses, base)
    assert loglosses[-1] < 0.45, loglosses
