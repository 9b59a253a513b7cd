"""The learned candidate bias of the two-tower model (``RetrievalConfig.
candidate_bias``, issue 23): the wide (``[rows, 1]``) twins of the candidate
tables, summed per candidate into one more embedding column (1 in the
query's), so every score -- the loss, the exact evaluation, the exported
top-k -- is ``q . c + bias``. Small eager models here; training under each
strategy, the checkpoint and the export are in ``tests/test_retrieval.py``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from psrec.data.convert.catalogue import Catalogue
from psrec.features.spec.spec import FeatureSpec
from psrec.launch.job.config import JobConfig
from psrec.launch.job.workdir import job_differences
from psrec.models.embedding.sparse_arch import WIDE_SUFFIX
from psrec.models.retrieval.config import RetrievalConfig
from psrec.models.retrieval.loss import CandidateTables
from psrec.models.retrieval.loss import RetrievalLoss
from psrec.models.retrieval.model import build_retrieval_model
from psrec.ps_cluster.planner.plan import table_variables
from tests._retrieval_data import retrieval_spec_dict

CONFIG = RetrievalConfig(tower_mlp=(8,), output_dim=4)


@pytest.fixture(scope="module")
def spec() -> FeatureSpec:
    return FeatureSpec.from_dict(retrieval_spec_dict())


@pytest.fixture(scope="module")
def model(spec):
    return build_retrieval_model(spec, CONFIG)


def _candidates(item_rows, category_rows) -> dict[str, tf.Tensor]:
    return {"item_id": tf.constant(item_rows, tf.int64),
            "category": tf.constant(category_rows, tf.int64)}


def test_the_candidate_tables_get_wide_twins_and_nothing_else(spec, model):
    assert CONFIG.candidate_bias  # the default
    tables = model.sparse_arch.tables
    assert sorted(n for n in tables if n.endswith(WIDE_SUFFIX)) == [
        "groups__wide", "items__wide"]  # item_id's and category's tables
    assert tables["items__wide"].shape == (4000, 1)
    # The planner counts the same variables the model creates.
    planned = [name for name, _, _ in table_variables(spec, CONFIG)]
    assert planned == ["users", "items", "items__wide", "groups",
                       "groups__wide"]
    assert sorted(planned) == sorted(tables)
    plain = build_retrieval_model(
        spec, dataclasses.replace(CONFIG, candidate_bias=False))
    assert not any(n.endswith(WIDE_SUFFIX) for n in plain.sparse_arch.tables)
    assert plain.candidate_embedding(_candidates([3], [101])).shape == (1, 4)


def test_the_bias_is_the_last_column_and_moves_the_score(model):
    """The candidate's bias = its item row's wide weight + its category
    row's; the query's last column is 1, so it adds to the score."""
    tables = model.sparse_arch.tables
    tables["items__wide"].scatter_update(tf.IndexedSlices(
        tf.constant([[0.5], [-0.25]]), tf.constant([7, 9])))
    tables["groups__wide"].scatter_update(tf.IndexedSlices(
        tf.constant([[0.125]]), tf.constant([105])))
    candidates = model.candidate_embedding(_candidates([7, 9, 11],
                                                       [105, 105, 3]))
    assert candidates.shape == (3, CONFIG.embedding_dim) == (3, 5)
    np.testing.assert_allclose(candidates[:, -1], [0.625, -0.125, 0.0])
    # The towers' part is still L2-normalised.
    np.testing.assert_allclose(tf.norm(candidates[:, :-1], axis=1), 1.0,
                               rtol=1e-5)
    query = model.query_embedding({"user_id": tf.constant([1, 2], tf.int64),
                                   "user_group": tf.constant([4, 5],
                                                             tf.int64)})
    np.testing.assert_array_equal(query[:, -1], [1.0, 1.0])
    scores = tf.matmul(query, candidates, transpose_b=True).numpy()
    cosines = tf.matmul(query[:, :-1], candidates[:, :-1],
                        transpose_b=True).numpy()
    np.testing.assert_allclose(scores - cosines,
                               [[0.625, -0.125, 0.0]] * 2, atol=1e-6)


def test_the_bias_receives_the_loss_gradient(spec, model):
    """The sampled softmax trains each batch candidate's bias rows (and
    only those) through the sparse optimizer's variables, in the direction
    that lowers the loss whatever the towers' random weights."""
    catalogue = Catalogue(
        raw_ids=np.arange(4), train_counts=np.array([40, 30, 20, 10]),
        features={"item_id": np.array([1, 2, 3, 4], np.int64),
                  "category": np.array([101, 101, 102, 102], np.int64)})
    tables = CandidateTables(catalogue, spec, CONFIG.embedding_dim)
    # Temperature 1: the softmax cannot saturate to exactly 0 or 1 in
    # float32, so every gradient below is nonzero.
    loss = RetrievalLoss(model, tables,
                         dataclasses.replace(CONFIG, temperature=1.0), spec)
    # Rows 0 and 2 (label 1) both have item 1 as their positive (each
    # other's accidental hit, removed); rows 1 and 3 (label 0) are not
    # trained as queries, so items 2 and 3 are only negatives.
    batch = {"label": tf.constant([[1], [0], [1], [0]], tf.int64),
             "user_id": tf.constant([[1], [2], [3], [4]], tf.int64),
             "user_group": tf.constant([[1], [1], [2], [2]], tf.int64),
             "item_id": tf.constant([[1], [2], [1], [3]], tf.int64),
             "category": tf.constant([[101], [101], [101], [102]],
                                     tf.int64)}
    wide = model.sparse_arch.tables["items__wide"]
    # trained by the sparse optimizer
    assert any(v is wide for v in model.embedding_variables())
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(loss(batch))
    grad = tape.gradient(total, wide)
    dense = tf.math.unsorted_segment_sum(grad.values, grad.indices,
                                         4000).numpy()[:, 0]
    assert np.flatnonzero(dense).tolist() == [1, 2, 3]  # the batch's items
    # d loss / d bias = sum over the logits it enters of (p - target):
    # item 1 is only ever a target (p - 1 < 0), items 2 and 3 only
    # negatives (p > 0). Raising the positive's bias lowers the loss,
    # raising a negative's raises it.
    assert dense[1] < 0
    assert dense[2] > 0 and dense[3] > 0


def test_a_run_recorded_before_the_bias_had_none(spec):
    """A ``job.json`` written before ``candidate_bias`` existed trained
    without it: read back so (its checkpoints restore), and resuming it
    with the new default is refused as another job."""
    old = {"tower_mlp": [8], "output_dim": 4}
    assert not RetrievalConfig.from_dict(old).candidate_bias
    assert RetrievalConfig.from_dict(CONFIG.to_dict()) == CONFIG
    recorded = JobConfig(spec=spec, retrieval=CONFIG).to_dict()
    recorded["retrieval"] = old
    differences = job_differences(recorded, JobConfig(spec=spec,
                                                      retrieval=CONFIG))
    assert ("RetrievalConfig.candidate_bias", "False", "True") in differences
