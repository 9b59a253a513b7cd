"""User-history features (``features.spec.history``): built at conversion
from the log with only strictly earlier events, taken from the request at
serving; pooled by DIN target attention or a BST transformer layer, under
one device and the in-process PS cluster, exported whole and split."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

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
from psrec.models.optim.config import OptimizerConfig
from psrec.models.optim.sizing import dense_parameter_count
from psrec.models.ranking.config import ModelConfig
from psrec.models.ranking.config import ModelConfigError
from psrec.models.ranking.config import check_model_spec
from psrec.models.serving.export import export_saved_model
from psrec.models.serving.export import serving_signature
from psrec.models.serving.split_export import publish_split

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


# -- target attention (combiner: din) and BST (combiner: bst) -----------------

def _attended(combiner: str) -> FeatureSpec:
    return FeatureSpec.from_dict(dict(SPEC_DICT, categorical=SPEC_DICT[
        "categorical"][:2] + [dict(SPEC_DICT["categorical"][2],
                                   combiner=combiner)]))


DIN_SPEC, BST_SPEC = _attended("din"), _attended("bst")
SPECS = {"din": DIN_SPEC, "bst": BST_SPEC}
#: The models of the attended specs (small: dim 4, one 8-wide layer).
MODELS = {"din": ModelConfig(interaction="dot", bottom_mlp=(8,),
                             top_mlp=(8,), attention_mlp=(8,)),
          "bst": ModelConfig(interaction="dot", bottom_mlp=(8,),
                             top_mlp=(8,), bst_heads=2, bst_ff_units=8)}


def _din_model(softmax: bool = False):
    return build_model(DIN_SPEC, dataclasses.replace(
        MODELS["din"], attention_softmax=softmax))


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


def _batch(seen, items=(5, 6)) -> dict[str, tf.Tensor]:
    """A model batch of two rows: users, target ``items`` and the history
    ``seen`` (raw item ids, -1 padding kept where it is) of each row."""
    padding = tf.constant(seen, tf.int64) < 0
    return {"user": _ids("user", ["u0", "u1"]), "item": _ids("item", items),
            "seen": tf.where(padding, tf.constant(-1, tf.int64),
                             _ids("item", seen)),
            "psrec__dense": tf.zeros([2, 1])}


def test_bst_reads_the_target_and_the_order_and_ignores_padding():
    model = build_model(BST_SPEC, MODELS["bst"])
    arch = model.sparse_arch
    batch = _batch([[7, 8, 9], [7, 8, 9]])
    model(batch)  # builds every part
    index = [f.name for f in BST_SPEC.categorical].index("seen")

    def pooled(batch):
        return arch(batch)[0][index].numpy()

    first = pooled(batch)
    # Two targets, the same history: two pooled vectors.
    assert np.abs(first[0] - first[1]).max() > 1e-4
    # The same items in another order (the position embeddings).
    assert np.abs(pooled(_batch([[9, 8, 7], [8, 7, 9]])) - first).max() > 1e-4
    # Padding takes no position: [7, pad, 8] pools as [7, 8, pad] (and
    # the third item counts: [7, 8, 9] pools otherwise).
    packed = pooled(_batch([[7, 8, -1], [9, -1, -1]]))
    np.testing.assert_allclose(
        pooled(_batch([[7, -1, 8], [-1, -1, 9]])), packed, atol=1e-6)
    assert np.abs(packed[0] - first[0]).max() > 1e-4
    # Whatever the rows at padded slots hold, the output is the same; a
    # list of padding only pools the target's own output (finite).
    layer = arch.attention["seen"]
    rows = tf.random.stateless_normal([3, LENGTH, 4], [3, 4])
    mask = tf.constant([[1, 1, 0], [1, 0, 0], [0, 0, 0]], tf.float32)
    target = tf.random.stateless_normal([3, 4], [5, 6])
    noise = 100 * tf.random.stateless_normal([3, LENGTH, 4], [7, 8])
    clean = layer(rows, mask, target).numpy()
    np.testing.assert_allclose(
        layer(rows + noise * (1 - mask[:, :, None]), mask, target),
        clean, atol=1e-5)
    assert np.isfinite(clean).all()
    # Every weight of the layer is a dense part and gets gradients (but
    # the key bias: it adds one value to all of a query's scores, which a
    # softmax does not see).
    variables = layer.trainable_variables
    assert {id(v) for v in variables} <= {id(v) for v in
                                          model.dense_variables()}
    with tf.GradientTape() as tape:
        out = arch(batch)[0][index]
        loss = tf.reduce_sum(out * tf.random.stateless_normal(
            tf.shape(out), [1, 2]))
    grads = {v.name: tf.convert_to_tensor(g) for v, g in zip(
        variables, tape.gradient(loss, variables))
        if "key/bias" not in v.name}
    assert len(grads) == len(variables) - 1 and any(
        "positions" in name for name in grads)
    assert all(np.abs(g.numpy()).max() > 0 for g in grads.values()), [
        name for name, g in grads.items() if not np.abs(g.numpy()).any()]


def _split_client_scores(folder, raw: dict[str, tf.Tensor]) -> np.ndarray:
    """A split version served as a key-value store does, with plain TF and
    pyarrow: raw features -> ``keys`` -> rows of the table file (padding,
    key -1: zeros) -> the dense model (the history's rows and its keys)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    model = tf.saved_model.load(str(folder / manifest["model"]))
    keys = model.signatures["keys"](**raw)
    dump = pq.read_table(folder / manifest["tables"]["ids"]["file"])
    store = dict(zip(dump.column("key").to_pylist(),
                     dump.column("vector").to_pylist()))
    inputs = {"price": raw["price"], "seen__keys": keys["seen"]}
    for feature in manifest["features"]:
        ids = keys[feature].numpy()
        inputs[feature] = tf.constant(np.array(
            [store.get(int(k), [0.0] * 4) for k in ids.reshape(-1)],
            np.float32).reshape(ids.shape + (4,)))
    return model.signatures["serving_default"](**inputs)[
        "probability"].numpy()


@pytest.mark.parametrize("combiner", ["din", "bst"])
def test_an_attended_history_exports_and_serves_from_a_history_list(
        converted, combiner):
    """The all-in-one export and the split export serve the trained
    model's scores from raw features and the history list."""
    root, table, _, batch = converted
    spec = SPECS[combiner]
    model = build_model(spec, MODELS[combiner])
    inputs = {k: tf.constant(v) for k, v in batch.items()
              if k not in ("label", ID_COLUMN)}
    expected = tf.sigmoid(model(inputs)).numpy()
    loaded = tf.saved_model.load(str(export_saved_model(
        model, spec, root / f"{combiner}_export")))
    raw = _request(table)
    served = loaded.signatures["serving_default"](**raw)["probability"]
    np.testing.assert_allclose(served.numpy(), expected, atol=1e-6)
    # The order of the list matters to BST (position embeddings).
    reversed_raw = dict(raw, seen=tf.constant(_padded(
        [row[::-1] for row in _expected(table)])))
    other = loaded.signatures["serving_default"](**reversed_raw)[
        "probability"].numpy()
    assert (np.abs(other - served.numpy()).max() > 1e-6) == (
        combiner == "bst")
    bundle = publish_split(model, spec, root / f"{combiner}_split",
                           {"step": 0})
    np.testing.assert_allclose(_split_client_scores(Path(bundle.path), raw),
                               expected, atol=1e-6)


def test_din_needs_a_history_and_a_ranking_model():
    data = dict(SPEC_DICT, categorical=[dict(SPEC_DICT["categorical"][0],
                                             max_length=2, combiner="din")]
                + SPEC_DICT["categorical"][1:])
    with pytest.raises(SpecError, match="only a feature with `history`"):
        FeatureSpec.from_dict(data)
    for spec in (DIN_SPEC, BST_SPEC):
        with pytest.raises(SpecError, match=f"use `combiner: "
                           f"{spec.categorical[2].combiner}`"):
            FeatureSpec.from_dict(dict(spec.to_dict(), towers={
                "query": ["user", "seen", "price"], "candidate": ["item"],
                "candidate_id": "item"}))


def test_the_size_estimate_counts_the_attention_layers():
    config = ModelConfig(interaction="dot", bottom_mlp=(8,), top_mlp=(8,))
    dim, width = 4, config.attention_mlp[0]  # [h, t, h*t, h-t] -> 36 -> 1
    attention = (4 * dim * width + width) + (width + 1)
    assert (dense_parameter_count(DIN_SPEC, config)
            - dense_parameter_count(SPEC, config)) == attention
    # BST: positions (target + LENGTH), query/key/value/output of 3 heads
    # of ceil(4 / 3) = 2 units, two layer norms, the feed-forward part of
    # 4 x dim units (the default).
    heads, key, ff = 3, 2, 4 * dim
    transformer = ((LENGTH + 1) * dim + 3 * (dim * heads * key + heads * key)
                   + (heads * key * dim + dim) + 2 * 2 * dim
                   + (dim * ff + ff) + (ff * dim + dim))
    assert (dense_parameter_count(BST_SPEC, dataclasses.replace(
        config, bst_heads=heads)) - dense_parameter_count(SPEC, config)
            ) == transformer


@pytest.mark.parametrize("spec,option,combiner", [
    (SPEC, {"attention_softmax": True}, "din"),
    (BST_SPEC, {"attention_mlp": (4,)}, "din"),
    (SPEC, {"bst_heads": 4}, "bst"),
    (DIN_SPEC, {"bst_ff_units": 16}, "bst")])
def test_attention_options_without_their_history_are_refused(
        spec, option, combiner):
    check_model_spec(SPECS[combiner], ModelConfig(**option))
    (key, value), = option.items()
    with pytest.raises(ModelConfigError, match=re.escape(
            f"`{key}` = {value!r} applies to a user history with "
            f"`combiner: {combiner}`")):
        check_model_spec(spec, ModelConfig(**option))
    with pytest.raises(ModelConfigError, match="`bst_heads` = 0 must be"):
        ModelConfig(bst_heads=0)


# -- under the in-process PS cluster --------------------------------------------

#: Two histories of the same events, one attended by DIN, one by BST: one
#: run trains both.
BOTH_SPEC = FeatureSpec.from_dict(dict(SPEC_DICT, categorical=SPEC_DICT[
    "categorical"] + [dict(SPEC_DICT["categorical"][2], name=f"seen_{c}",
                           combiner=c) for c in ("din", "bst")]))


@pytest.mark.cluster
def test_attended_histories_train_and_evaluate_on_the_ps_cluster(
        tmp_path, ps_cluster):
    """The DIN and BST layers live on a PS, the workers' steps train them,
    and the evaluation (one closure per shard) counts every eval row
    once."""
    from psrec.ps_cluster.cluster.partition_config import PartitionConfig
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    from psrec.ps_cluster.training.config import LoopConfig
    from psrec.ps_cluster.training.trainer import Trainer
    pq.write_table(_log(400), tmp_path / "log.parquet", row_group_size=64)
    report = convert([tmp_path / "log.parquet"], BOTH_SPEC, tmp_path / "data",
                     ConversionOptions(shards=2, eval_fraction=0.25))
    trainer = Trainer(build_ps_strategy(ps_cluster, PartitionConfig(
        kind="fixed")), BOTH_SPEC, dataclasses.replace(
            MODELS["bst"], attention_mlp=(8,)),
        OptimizerConfig(dense_lr=0.01), InputConfig(batch_size=32))
    layers = trainer.model.sparse_arch.attention
    variables = [v for name in ("seen_din", "seen_bst")
                 for v in layers[name].trainable_variables]
    assert all("/job:ps/" in v.device for v in variables)
    before = [v.numpy() for v in variables]
    result = trainer.train(trainer.dataset_fn(report.manifest), LoopConfig(
        steps=6, steps_per_closure=3, checkpoint_every=0),
        eval_manifest=report.manifest)
    assert np.isfinite(result.final_loss) and result.step == 6
    assert result.eval.count == report.rows_written["eval"] == 100
    assert 0.0 <= result.eval.auc <= 1.0
    moved = {v.name: np.abs(v.numpy() - b).max() > 0 for v, b in zip(
        variables, before) if "key/bias" not in v.name}
    assert len(moved) == len(variables) - 1 and all(moved.values()), moved
