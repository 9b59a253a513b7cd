"""Model composition, interactions, optimizers and learning-rate policy
(no cluster: plain variables)."""

import numpy as np
import pytest
import tensorflow as tf

from psrec.features import criteo
from psrec.features import movielens
from psrec.models.build import build_model
from psrec.models.optim.config import OptimizerConfig
from psrec.models.optim.optimizers import ScaledWarmup
from psrec.models.ranking.config import MODEL_PRESETS
from psrec.models.ranking.config import ModelConfig
from psrec.models.ranking.config import ModelConfigError
from psrec.models.ranking.config import model_config
from psrec.models.ranking.interaction import DotInteraction
from psrec.models.ranking.interaction import FMInteraction
from psrec.models.ranking.model import RankingModel
from psrec.models.ranking.model import example_batch


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
@pytest.mark.parametrize("spec_fn", [lambda: criteo(buckets=50, dim=4),
                                     lambda: movielens(dim=4)],
                         ids=["criteo", "movielens"])
def test_every_named_model_builds_from_both_presets(name, spec_fn):
    spec = spec_fn()
    model = build_model(spec, model_config(name))
    assert type(model) is RankingModel  # one class, four configurations
    logits = model(example_batch(spec, rows=5))
    assert logits.shape == (5,)
    assert np.all(np.isfinite(logits.numpy()))
    wide = model.config.wide
    assert len(model.embedding_variables()) == len(spec.tables) * (2 if wide
                                                                   else 1)


def test_embedding_and_dense_variables_partition_the_trainables():
    model = build_model(criteo(buckets=50, dim=4), model_config("deepfm"))
    tables = {id(v) for v in model.embedding_variables()}
    dense = {id(v) for v in model.dense_variables()}
    assert tables and dense and not tables & dense
    assert tables | dense == {id(v) for v in model.trainable_variables}


def test_named_configs_differ_only_in_interaction_and_wide_part():
    assert MODEL_PRESETS["dcn"].interaction == "cross"
    assert MODEL_PRESETS["dlrm"].interaction == "dot"
    assert MODEL_PRESETS["deepfm"].interaction == "fm"
    assert MODEL_PRESETS["deepfm"].wide and MODEL_PRESETS["wide_deep"].wide
    assert not MODEL_PRESETS["dcn"].wide


def test_low_rank_cross_uses_the_projection():
    spec = criteo(buckets=50, dim=4)
    model = build_model(spec, model_config("dcn", cross_low_rank=3))
    kernels = [v.shape for v in model.interaction_arch.trainable_variables
               if "kernel" in v.name]
    width = len(spec.dense) + len(spec.categorical) * 4
    assert (width, 3) in kernels and (3, width) in kernels


def test_dot_interaction_matches_hand_computation():
    dense = tf.constant([[1.0, 2.0]])
    embeddings = [tf.constant([[3.0, 4.0]]), tf.constant([[5.0, 6.0]])]
    out, extra = DotInteraction()(dense, embeddings)
    assert extra is None
    # dense, then pairs (d.e1, d.e2, e1.e2) = (11, 17, 39)
    np.testing.assert_allclose(out.numpy(), [[1, 2, 11, 17, 39]])


def test_fm_interaction_second_order_term_matches_hand_computation():
    dense = tf.constant([[1.0, 2.0]])
    embeddings = [tf.constant([[3.0, 4.0]]), tf.constant([[5.0, 6.0]])]
    out, fm = FMInteraction()(dense, embeddings)
    # sum of pairwise dot products: 11 + 17 + 39
    np.testing.assert_allclose(fm.numpy(), [67.0])
    np.testing.assert_allclose(out.numpy(), [[1, 2, 3, 4, 5, 6]])


def test_multi_hot_mean_combiner_ignores_padding():
    spec = movielens(dim=4)
    model = build_model(spec, model_config("dcn"))
    batch = example_batch(spec, rows=1)
    offset = spec.categorical[2].row_offset
    padded = dict(batch, genres=tf.constant([[offset + 1, offset + 2, -1, -1,
                                               -1, -1]], tf.int64))
    embeddings, _ = model.sparse_arch(padded)
    table = model.sparse_arch.tables["genre"].numpy()
    np.testing.assert_allclose(embeddings[2].numpy()[0],
                               table[[1, 2]].mean(axis=0), rtol=1e-6)


def test_bad_model_options_name_the_argument_and_value():
    with pytest.raises(ModelConfigError, match=r"`interaction` = 'bilinear'"):
        ModelConfig(interaction="bilinear")
    with pytest.raises(ModelConfigError, match=r"`--model` = 'xgboost'"):
        model_config("xgboost")
    with pytest.raises(ModelConfigError, match=r"unknown model option"):
        model_config("dcn", depth=3)
    with pytest.raises(ModelConfigError, match=r"`top_mlp` = \(0,\)"):
        ModelConfig(top_mlp=(0,))


@pytest.mark.parametrize("name", ["dlrm", "deepfm"])
def test_dot_and_fm_project_tables_of_other_widths_to_the_widest(name):
    import dataclasses
    spec = movielens(dim=4)
    tables = (dataclasses.replace(spec.tables[0], dim=8),) + spec.tables[1:]
    model = build_model(dataclasses.replace(spec, tables=tables),
                        model_config(name))
    # The 8-wide table is used as is; every 4-wide table maps to 8 columns.
    assert sorted(model.projections) == ["genre", "item", "user_attr"]
    assert {tuple(p.kernel.shape) for p in model.projections.values()} == {
        (4, 8)}
    assert model.dense_arch.out.units == 8
    logits = model(example_batch(model.spec, rows=3))
    assert logits.shape == (3,)


def test_learning_rate_scales_with_batch_and_warms_up_linearly():
    schedule = ScaledWarmup(0.1, batch_size=4096, base_batch_size=1024,
                            warmup_steps=10)
    np.testing.assert_allclose(float(schedule(0)), 0.4 * 1 / 10, rtol=1e-6)
    np.testing.assert_allclose(float(schedule(4)), 0.4 * 5 / 10, rtol=1e-6)
    np.testing.assert_allclose(float(schedule(9)), 0.4, rtol=1e-6)
    np.testing.assert_allclose(float(schedule(1000)), 0.4, rtol=1e-6)


def test_optimizer_config_rejects_unknown_optimizers():
    with pytest.raises(ValueError, match=r"`OptimizerConfig.sparse` = 'lamb'"):
        OptimizerConfig(sparse="lamb")


def test_bf16_towers_gather_rows_without_reading_whole_tables():
    """Under ``mixed_bfloat16`` the tables stay float32 variables and only
    the gathered rows are cast: a step reads no table whole (Keras'
    AutoCastVariable would read and cast every table every step), and the
    embeddings reach the towers in bfloat16 with the values of the rows."""
    import tf_keras
    spec = criteo(buckets=50, dim=4)
    tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = build_model(spec, model_config("deepfm"))
        batch = example_batch(spec, rows=5)
        model(batch)
        graph = tf.function(lambda b: model.sparse_arch(b)).get_concrete_function(
            batch).graph
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")
    tables = {tuple(v.shape) for v in model.embedding_variables()}
    reads = [tuple(op.outputs[0].shape) for op in graph.get_operations()
             if op.type == "ReadVariableOp"]
    assert tables and not tables & set(reads), reads
    embeddings, _ = model.sparse_arch(batch)
    assert {e.dtype for e in embeddings} == {tf.bfloat16}
    feature = spec.categorical[0]
    table = model.sparse_arch.tables[feature.table]
    assert table.dtype == tf.float32
    expected = tf.cast(tf.gather(table, batch[feature.name]), tf.bfloat16)
    assert np.array_equal(embeddings[0].numpy(), expected.numpy())
