"""Conversion = serving: the same raw rows -- with nulls, empty strings and
-1 in single values and inside multi-hot lists -- give the same embedding ids
and the same predictions whether they go through ``psrec convert`` and the
training input pipeline or through the exported serving SavedModel."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.input.config import InputConfig
from psrec.data.input.dataset import make_train_dataset_fn
from psrec.features.spec.spec import DENSE_COLUMN
from psrec.features.spec.spec import ID_COLUMN
from psrec.models.build import build_model
from psrec.models.ranking.config import ModelConfig
from psrec.models.serving.export import ServingModule
from psrec.models.serving.export import export_saved_model
from tests._client import client_inputs
from tests._client import mixed_spec

SPEC = mixed_spec("parity")
# Hand-made rows first (checked value by value below), then random ones.
CITY = ["a", None, "", "b", "a", "c", None]
USER = [1, None, -1, 7, 1, 2, 3]
TAGS = [["x", None, "", "y"], None, [], ["", None], ["x", "y", "z", "w"],
        ["", "x", "", "y", "z", "w"], [None]]
CODES = [[3, None, -1, 4], None, [], [-1], [1, 2, 3, 4],
         [-1, 5, -1, 6, 7, 8], [None]]
RANDOM_ROWS = 150


def _raw_table() -> pa.Table:
    rng = np.random.default_rng(7)
    city, user, tags, codes = (list(CITY), list(USER), list(TAGS),
                               list(CODES))

    def maybe(value, pad):
        return rng.choice(np.array([value, None, pad], object),
                          p=[0.7, 0.15, 0.15])

    for _ in range(RANDOM_ROWS):
        city.append(maybe(f"c{rng.integers(20)}", ""))
        user.append(maybe(int(rng.integers(100)), -1))
        tags.append(None if rng.random() < 0.1 else [
            maybe(f"t{rng.integers(30)}", "") for _ in range(rng.integers(6))])
        codes.append(None if rng.random() < 0.1 else [
            maybe(int(rng.integers(40)), -1)
            for _ in range(rng.integers(6))])
    rows = len(city)
    price = rng.gamma(2.0, 3.0, rows)
    return pa.table({
        "label": pa.array(rng.integers(0, 2, rows), pa.int64()),
        "price": pa.array([None if i % 5 == 1 else p
                           for i, p in enumerate(price)], pa.float64()),
        "city": pa.array(city, pa.string()),
        "user": pa.array(user, pa.int64()),
        "tags": pa.array(tags, pa.list_(pa.string())),
        "codes": pa.array(codes, pa.list_(pa.int64())),
    })


def _serving_inputs(table: pa.Table) -> dict[str, np.ndarray]:
    return client_inputs(table, SPEC)


def _hash(values, offset: int) -> np.ndarray:
    return tf.strings.to_hash_bucket_fast(
        np.array([str(v) for v in values], object), 50).numpy() + offset


@pytest.fixture(scope="module")
def parity(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    table = _raw_table()
    pq.write_table(table, root / "raw.parquet")
    report = convert([root / "raw.parquet"], SPEC, root / "data",
                     ConversionOptions(shards=2, block_rows=16,
                                       eval_fraction=0))
    assert report.bad_rows == 0
    # (a) the training input pipeline over the converted shards
    dataset = make_train_dataset_fn(report.manifest, SPEC,
                                    InputConfig(batch_size=64),
                                    epochs=1)(None)
    parts: dict[str, list] = {}
    for batch in dataset:
        for name, value in batch.items():
            parts.setdefault(name, []).append(value.numpy())
    rows = {k: np.concatenate(v) for k, v in parts.items() if v[0].ndim}
    order = np.argsort(rows[ID_COLUMN])
    trained = {k: v[order] for k, v in rows.items()}
    assert np.array_equal(trained[ID_COLUMN], np.arange(table.num_rows))

    model = build_model(SPEC, ModelConfig(interaction="dot", bottom_mlp=(8,),
                                          top_mlp=(8,)))
    inputs = {k: tf.constant(trained[k]) for k in
              [DENSE_COLUMN] + [f.name for f in SPEC.categorical]}
    # (b) the exported serving function on the same raw values
    raw = {k: tf.constant(v) for k, v in _serving_inputs(table).items()}
    served_ids = ServingModule(model, SPEC).model_batch(raw)
    loaded = tf.saved_model.load(str(export_saved_model(
        model, SPEC, root / "export")))
    served = loaded.signatures["serving_default"](**raw)
    return model, inputs, trained, served_ids, served


def test_conversion_and_serving_give_identical_ids(parity):
    _, _, trained, served_ids, _ = parity
    for feature in SPEC.categorical:
        np.testing.assert_array_equal(trained[feature.name],
                                      served_ids[feature.name].numpy(),
                                      err_msg=feature.name)
    np.testing.assert_array_equal(trained[DENSE_COLUMN][:, 0][1::5],
                                  np.ones_like(trained[DENSE_COLUMN][1::5, 0]))


def test_nulls_and_pads_mean_what_serving_means(parity):
    """Value by value, independently of psrec's encoder: a missing single
    value is the missing token "", a null/""/-1 list element is padding
    (dropped; the values after it move up), a null list is all padding."""
    _, _, trained, _, _ = parity
    missing_city, missing_user = _hash([""], 0)[0], _hash([""], 50)[0]
    assert trained["city"][:3].tolist() == [_hash(["a"], 0)[0],
                                            missing_city, missing_city]
    assert trained["user"][:4].tolist() == [
        _hash([1], 50)[0], missing_user, missing_user, _hash([7], 50)[0]]
    tags, codes = trained["tags"], trained["codes"]
    assert tags[0].tolist() == [*_hash(["x", "y"], 100), -1]
    assert codes[0].tolist() == [*_hash([3, 4], 150), -1]
    for row in (1, 2, 3, 6):  # null list, empty list, only padding
        assert (tags[row] == -1).all() and (codes[row] == -1).all()
    assert tags[4].tolist() == _hash(["x", "y", "z"], 100).tolist()
    assert tags[5].tolist() == _hash(["x", "y", "z"], 100).tolist()
    assert codes[5].tolist() == _hash([5, 6, 7], 150).tolist()


def test_conversion_and_serving_give_identical_predictions(parity):
    model, inputs, _, _, served = parity
    expected = tf.sigmoid(model(inputs)).numpy()
    np.testing.assert_allclose(served["probability"].numpy(), expected,
                               rtol=0, atol=1e-6)
    assert np.std(expected) > 1e-4  # rows are told apart
    # The comparison is sensitive: hashing the null tag of row 0 as a real
    # value (the old conversion) moves that row's prediction.
    skewed = dict(inputs, tags=tf.tensor_scatter_nd_update(
        inputs["tags"], [[0, 2]], [int(_hash([""], 100)[0])]))
    moved = tf.sigmoid(model(skewed)).numpy()
    assert abs(moved[0] - expected[0]) > 1e-6
    np.testing.assert_allclose(moved[1:], expected[1:], rtol=0, atol=1e-7)
