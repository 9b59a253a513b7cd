"""User-history features (``features.spec.history``): built at conversion
from the log with only strictly earlier events, taken from the request at
serving."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.convert.history import HistoryOrderError
from psrec.data.input.config import InputConfig
from psrec.data.input.dataset import make_train_dataset_fn
from psrec.features.spec.columns import SpecError
from psrec.features.spec.spec import ID_COLUMN
from psrec.features.spec.spec import FeatureSpec
from psrec.features.transforms.ops import CategoricalEncoder
from psrec.models.build import build_model
from psrec.models.optim.sizing import dense_parameter_count
from psrec.models.ranking.config import ModelConfig
from psrec.models.ranking.config import ModelConfigError
from psrec.models.ranking.config import check_model_spec
from psrec.models.serving.export import export_saved_model
from psrec.models.serving.export import serving_signature

LENGTH = 3
FUTURE_ITEM = 999  # planted: one user's last event, at the log's last time
SPEC_DICT = {
    "name": "history",
    "label": {"name": "label"},
    "tables": [{"name": "ids", "dim": 4}],
    "dense": [{"name": "price"}],
    "categorical": [
        {"name": "user", "table": "ids", "hash_buckets": 40},
        {"name": "item", "table": "ids", "dtype": "int64",
         "hash_buckets": 200},
        {"name": "seen", "dtype": "int64", "max_length": LENGTH,
         "history": {"of": "item", "by": "user", "order": "ts"}},
    ],
}
SPEC = FeatureSpec.from_dict(SPEC_DICT)


def _log(rows: int = 90) -> pa.Table:
    """A time-ordered log with ties (several rows per second, some of one
    user), a null user, a null item and a planted last event."""
    rng = np.random.default_rng(7)
    ts = np.sort(rng.integers(1000, 1030, rows))
    users = [f"u{u}" for u in rng.integers(0, 5, rows)]
    users[10] = None
    items = rng.integers(0, 50, rows).tolist()
    items[11] = None
    ts[-1] = ts[-2] = ts[-3] + 1
    users[-1] = users[-2] = "u1"  # the same user twice at the last time
    items[-1] = FUTURE_ITEM
    return pa.table({"label": pa.array(rng.integers(0, 2, rows)),
                     "price": pa.array(rng.random(rows)),
                     "user": pa.array(users, pa.string()),
                     "item": pa.array(items, pa.int64()),
                     "ts": pa.array(ts, pa.int64())})


def _expected(table: pa.Table) -> list[list[int]]:
    """Each row's history by brute force: the same user's items strictly
    earlier in time, most recent first, at most ``LENGTH``."""
    users = table.column("user").to_pylist()
    items = table.column("item").to_pylist()
    ts = table.column("ts").to_pylist()
    lists = []
    for i in range(len(ts)):
        earlier = [items[j] for j in range(len(ts))
                   if users[i] is not None and users[j] == users[i]
                   and ts[j] < ts[i] and items[j] is not None]
        lists.append(earlier[::-1][:LENGTH])
    return lists


def _padded(lists: list[list[int]]) -> np.ndarray:
    return np.array([row + [-1] * (LENGTH - len(row)) for row in lists],
                    np.int64)


def _request(table: pa.Table) -> dict[str, tf.Tensor]:
    """The serving inputs of the log's rows: raw features and each row's
    history list (what a client sends)."""
    return {"price": tf.constant(table.column("price").to_numpy(),
                                 tf.float32),
            "user": tf.constant([u or "" for u in
                                 table.column("user").to_pylist()]),
            "item": tf.constant([-1 if v is None else v for v in
                                 table.column("item").to_pylist()],
                                tf.int64),
            "seen": tf.constant(_padded(_expected(table)))}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("history")
    table = _log()
    pq.write_table(table, root / "log.parquet", row_group_size=16)
    report = convert([root / "log.parquet"], SPEC, root / "data",
                     ConversionOptions(shards=1, block_rows=16,
                                       batch_rows=16, eval_fraction=0))
    dataset = make_train_dataset_fn(report.manifest, SPEC,
                                    InputConfig(batch_size=200), epochs=1)
    batch = next(iter(dataset(None)))
    order = np.argsort(batch[ID_COLUMN].numpy())
    return root, table, report, {k: v.numpy()[order]
                                 for k, v in batch.items() if v.shape.rank}


def test_history_holds_only_strictly_earlier_events(converted):
    _, table, report, batch = converted
    assert report.bad_rows == 0
    expected = _expected(table)
    want = CategoricalEncoder(SPEC).encode_lists(
        "seen", tf.constant(_padded(expected))).numpy()
    np.testing.assert_array_equal(batch["seen"], want)
    # The planted last event is in no history (no later row), and the
    # same user's row at the same time does not see it.
    future = CategoricalEncoder(SPEC).encode("item", [FUTURE_ITEM]).numpy()
    assert not (batch["seen"] == future[0]).any()
    assert expected[-2] == expected[-1]
    # Lists are cut to the most recent LENGTH events, and long lists occur.
    assert max(len(row) for row in expected) == LENGTH
    # The history shares the item's rows (one table range, one lookup).
    seen = next(f for f in SPEC.categorical if f.name == "seen")
    item = next(f for f in SPEC.categorical if f.name == "item")
    assert (seen.table, seen.row_offset) == (item.table, item.row_offset)


def test_exported_model_scores_from_raw_features_and_a_history_list(
        converted):
    root, table, _, batch = converted
    signature = serving_signature(SPEC)
    assert sorted(signature) == ["item", "price", "seen", "user"]
    assert signature["seen"].shape.as_list() == [None, None]
    assert "ts" not in signature  # the time orders the log only
    model = build_model(SPEC, ModelConfig(interaction="dot",
                                          bottom_mlp=(8,), top_mlp=(8,)))
    loaded = tf.saved_model.load(str(export_saved_model(
        model, SPEC, root / "export")))
    raw = _request(table)
    served = loaded.signatures["serving_default"](**raw)["probability"]
    expected = tf.sigmoid(model({k: tf.constant(v) for k, v in batch.items()
                                 if k not in ("label", ID_COLUMN)}))
    np.testing.assert_allclose(served.numpy(), expected.numpy(), atol=1e-6)
    # The score reads the history: other lists give other scores.
    raw["seen"] = tf.constant(_padded([[1, 2, 3]] * table.num_rows))
    other = loaded.signatures["serving_default"](**raw)["probability"]
    assert np.abs(other.numpy() - served.numpy()).max() > 1e-6


def test_a_log_out_of_time_order_is_refused_with_the_row(tmp_path):
    table = _log(20)
    ts = table.column("ts").to_numpy().copy()
    ts[13] = 5  # goes back in time
    table = table.set_column(4, "ts", pa.array(ts))
    pq.write_table(table, tmp_path / "log.parquet")
    with pytest.raises(HistoryOrderError, match=r"log.parquet row 13: 'ts' "
                       r"= 5 comes after \d+ .*sort the input by 'ts'"):
        convert([tmp_path / "log.parquet"], SPEC, tmp_path / "data",
                ConversionOptions(shards=1, batch_rows=8))
    # A later file that starts before the end of the first one too.
    first, second = _log(20), _log(20)
    pq.write_table(first, tmp_path / "a.parquet")
    pq.write_table(second, tmp_path / "b.parquet")
    with pytest.raises(HistoryOrderError, match=r"b.parquet row 0: .*"
                       r"a.parquet row 19"):
        convert([tmp_path / "a.parquet", tmp_path / "b.parquet"], SPEC,
                tmp_path / "data2", ConversionOptions(shards=1))
    # A row without a time is a bad row (quarantined with the reason).
    ts = pa.array([None if i == 4 else v for i, v in enumerate(
        first.column("ts").to_pylist())], pa.int64())
    pq.write_table(first.set_column(4, "ts", ts), tmp_path / "c.parquet")
    report = convert([tmp_path / "c.parquet"], SPEC, tmp_path / "data3",
                     ConversionOptions(shards=1, max_bad_fraction=0.1))
    assert report.bad_rows == 1
    assert report.bad_reasons == {
        "null in 'ts', the time of history 'seen'": 1}


@pytest.mark.parametrize("change,message", [
    ({"history": {"of": "nope", "by": "user", "order": "ts"}},
     "`history.of` = 'nope' must be a single-valued categorical"),
    ({"history": {"of": "item", "by": "user", "order": "ts",
                  "max_length": 50}},
     "takes no `max_length`; give `max_length` on the feature"),
    ({"dtype": "string"}, "give `dtype: int64`"),
    ({"max_length": 1}, "a history is a list"),
    ({"share": "user"}, "`share` = 'user' but a history shares"),
    ({"history": {"of": "item", "by": "user", "order": "user"}},
     "`history.order` = 'user' must be an integer or timestamp column"),
])
def test_bad_history_features_are_named(change, message):
    data = dict(SPEC_DICT, categorical=SPEC_DICT["categorical"][:2]
                + [dict(SPEC_DICT["categorical"][2], **change)])
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        FeatureSpec.from_dict(data)


def test_a_history_spec_round_trips_and_reads_its_order_column(tmp_path):
    saved = FeatureSpec.load(SPEC.save(tmp_path / "spec.yaml"))
    assert saved == SPEC and saved.fingerprint() == SPEC.fingerprint()
    assert SPEC.columns == ("label", "price", "user", "item", "ts")
    plain = FeatureSpec.from_dict(dict(SPEC_DICT, categorical=SPEC_DICT[
        "categorical"][:2]))
    assert all("history" not in f for f in plain.to_dict()["categorical"])
    assert SPEC.to_dict()["categorical"][2]["history"] == {
        "of": "item", "by": "user", "order": "ts"}


# -- target attention (combiner: din) -----------------------------------------

DIN_SPEC = FeatureSpec.from_dict(dict(SPEC_DICT, categorical=SPEC_DICT[
    "categorical"][:2] + [dict(SPEC_DICT["categorical"][2], combiner="din")]))


def _din_model(softmax: bool = False):
    return build_model(DIN_SPEC, ModelConfig(
        interaction="dot", bottom_mlp=(8,), top_mlp=(8,),
        attention_mlp=(8,), attention_softmax=softmax))


def _ids(feature: str, values) -> tf.Tensor:
    return CategoricalEncoder(DIN_SPEC).encode(feature, tf.constant(
        values, tf.int64 if feature != "user" else tf.string))


@pytest.mark.parametrize("softmax", [False, True])
def test_din_pools_by_the_target_and_masks_padding(softmax):
    model = _din_model(softmax)
    arch = model.sparse_arch
    items = _ids("item", [5, 6])
    history = _ids("item", [[7, 8, 9], [7, 8, 9]])
    batch = {"user": _ids("user", ["u0", "u0"]), "item": items,
             "seen": history, "psrec__dense": tf.zeros([2, 1])}
    model(batch)  # builds every part
    index = [f.name for f in DIN_SPEC.categorical].index("seen")
    pooled = arch(batch)[0][index].numpy()
    # Two targets, the same history: two pooled vectors.
    assert np.abs(pooled[0] - pooled[1]).max() > 1e-4
    # Padding counts for nothing: [7, pad, pad] pools as the list [7].
    one = dict(batch, seen=tf.constant(
        [[history.numpy()[0, 0], -1, -1]] * 2, tf.int64))
    got = arch(one)[0][index].numpy()
    table = arch.tables["ids"]
    row = tf.gather(table, history[:1, :1])  # [1, 1, d]
    target = tf.gather(table, items[:1])
    want = arch.attention["seen"](row, tf.ones([1, 1]), target).numpy()
    np.testing.assert_allclose(got[:1], want, rtol=1e-5, atol=1e-6)
    if softmax:  # a single item gets weight 1
        np.testing.assert_allclose(got[0], row.numpy()[0, 0], rtol=1e-5)
    # A list of padding only pools to zeros.
    empty = dict(batch, seen=tf.fill([2, LENGTH], tf.constant(-1, tf.int64)))
    assert not arch(empty)[0][index].numpy().any()
    # The attention MLP is trained (a dense part) and gets gradients.
    variables = arch.attention["seen"].trainable_variables
    assert {id(v) for v in variables} <= {id(v) for v in
                                          model.dense_variables()}
    with tf.GradientTape() as tape:
        pooled = arch(batch)[0][index]
        loss = tf.reduce_sum(pooled * tf.random.stateless_normal(
            tf.shape(pooled), [1, 2]))
    grads = dict(zip([v.name for v in variables],
                     tape.gradient(loss, variables)))
    if softmax:  # a softmax does not see a shift of all scores
        grads = {k: g for k, g in grads.items()
                 if not ("score" in k and "bias" in k)}
    assert grads and all(g is not None and np.abs(g.numpy()).max() > 0
                         for g in grads.values())


def test_a_din_model_exports_and_serves_from_a_history_list(converted):
    root, table, _, batch = converted
    model = _din_model()
    inputs = {k: tf.constant(v) for k, v in batch.items()
              if k not in ("label", ID_COLUMN)}
    expected = tf.sigmoid(model(inputs)).numpy()
    loaded = tf.saved_model.load(str(export_saved_model(
        model, DIN_SPEC, root / "din_export")))
    raw = _request(table)
    served = loaded.signatures["serving_default"](**raw)["probability"]
    np.testing.assert_allclose(served.numpy(), expected, atol=1e-6)


def test_din_needs_a_history_and_a_ranking_model():
    data = dict(SPEC_DICT, categorical=[dict(SPEC_DICT["categorical"][0],
                                             max_length=2, combiner="din")]
                + SPEC_DICT["categorical"][1:])
    with pytest.raises(SpecError, match="only a feature with `history`"):
        FeatureSpec.from_dict(data)
    with pytest.raises(SpecError, match="use `combiner: din`"):
        FeatureSpec.from_dict(dict(DIN_SPEC.to_dict(), towers={
            "query": ["user", "seen", "price"], "candidate": ["item"],
            "candidate_id": "item"}))


def test_the_size_estimate_counts_the_attention_mlp():
    config = ModelConfig(interaction="dot", bottom_mlp=(8,), top_mlp=(8,))
    dim, width = 4, config.attention_mlp[0]  # [h, t, h*t, h-t] -> 36 -> 1
    attention = (4 * dim * width + width) + (width + 1)
    assert (dense_parameter_count(DIN_SPEC, config)
            - dense_parameter_count(SPEC, config)) == attention


def test_attention_options_without_a_din_history_are_refused():
    check_model_spec(DIN_SPEC, ModelConfig(attention_softmax=True))
    with pytest.raises(ModelConfigError, match="`attention_softmax` = True "
                       "applies to a user history with `combiner: din`"):
        check_model_spec(SPEC, ModelConfig(attention_softmax=True))
