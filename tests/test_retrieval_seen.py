"""Seen candidates left out of the retrieval evaluation (issue 23): each
eval pair is ranked against the catalogue less the candidates its user
(``towers.query_id``) has in the train split, its own kept, for the model
and the popularity baseline alike; ``seen.parquet`` written at conversion
holds the lists; ``--no-exclude-seen`` ranks against the whole catalogue.

One device and an untrained model: the ranks are checked against a NumPy
brute force over the same embeddings, not against a quality bar."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from psrec.data.convert.catalogue import Catalogue
from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.convert.seen import SEEN_NAME
from psrec.data.convert.seen import SeenItems
from psrec.data.input.config import InputConfig
from psrec.data.input.dataset import make_eval_dataset
from psrec.features.spec.columns import SpecError
from psrec.features.spec.presets import PRESETS
from psrec.features.spec.spec import ID_COLUMN
from psrec.features.spec.spec import FeatureSpec
from psrec.launch.cli.main import build_parser
from psrec.launch.cli.main import main
from psrec.launch.cli.main import parse
from psrec.launch.cli.retrieval_flags import retrieval_config
from psrec.launch.job.config import JobConfig
from psrec.models.optim.config import OptimizerConfig
from psrec.models.retrieval.config import RetrievalConfig
from psrec.ps_cluster.retrieval.eval import SeenTables
from psrec.ps_cluster.retrieval.eval import pair_ranks
from psrec.ps_cluster.retrieval.metrics import popularity_baseline
from psrec.ps_cluster.retrieval.metrics import popularity_ranks
from psrec.ps_cluster.retrieval.trainer import RetrievalTrainer
from tests._retrieval_data import retrieval_spec_dict

CONFIG = RetrievalConfig(tower_mlp=(16,), output_dim=8)
USERS, ITEMS, ROWS = 60, 40, 3_000


def _spec_dict(query_id: str | None = "user_id") -> dict:
    data = retrieval_spec_dict()
    if query_id is not None:
        data["towers"]["query_id"] = query_id
    return data


def _log(path) -> tuple:
    """Ratings where users repeat a few items (so a pair's own candidate
    can be in its user's train list too) and some rows have no user."""
    rng = np.random.default_rng(3)
    users = rng.integers(0, USERS, ROWS)
    items = (users * 7 + rng.integers(0, 12, ROWS)) % ITEMS
    user_ids = pa.array([None if i % 97 == 0 else int(u) + 1000
                         for i, u in enumerate(users)], pa.int64())
    table = pa.table({
        "label": pa.array((rng.random(ROWS) < 0.8).astype(np.int64)),
        "user_id": user_ids, "user_group": pa.array(
            [f"g{u % 5}" for u in users]),
        "item_id": pa.array(items + 5000, pa.int64()),
        "category": pa.array([f"c{i % 4}" for i in items])})
    pq.write_table(table, path)
    return table


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("seen")
    table = _log(root / "log.parquet")
    spec = FeatureSpec.from_dict(_spec_dict())
    report = convert([root / "log.parquet"], spec, root / "data",
                     ConversionOptions(shards=2, eval_fraction=0.25,
                                       split_mode="hash"))
    return spec, report.manifest, table


def _split_ids(manifest, spec, split: str) -> np.ndarray:
    return np.concatenate([
        b[ID_COLUMN].numpy() for b in make_eval_dataset(
            manifest.files(split), spec, 512, manifest.block_rows)])


def test_spec_query_id_is_checked_and_optional():
    with pytest.raises(SpecError) as error:
        FeatureSpec.from_dict(_spec_dict("item_id"))
    assert "`query_id` = 'item_id' must be one of the categorical `query`" \
        in str(error.value)
    plain = FeatureSpec.from_dict(_spec_dict(None))
    assert "query_id" not in plain.to_dict()["towers"]  # fingerprint kept
    spec = FeatureSpec.from_dict(_spec_dict())
    assert FeatureSpec.from_dict(spec.to_dict()) == spec
    assert PRESETS["movielens-retrieval"]().towers.query_id == "user_id"


def test_conversion_writes_each_pairs_users_train_candidates(data):
    """``seen.parquet`` against the log itself: per positive eval row, its
    user's distinct positive train candidates (none without a user)."""
    spec, manifest, table = data
    catalogue = Catalogue.load(manifest.root, spec)
    seen = catalogue.seen
    train_ids = set(_split_ids(manifest, spec, "train").tolist())
    eval_ids = _split_ids(manifest, spec, "eval")
    users = table.column("user_id").to_pylist()
    row_of = {int(r): i for i, r in enumerate(catalogue.raw_ids)}
    items = [row_of[i] for i in table.column("item_id").to_pylist()]
    label = table.column("label").to_pylist()
    expected_seen: dict = {}
    for row in train_ids:
        if label[row] and users[row] is not None:
            expected_seen.setdefault(users[row], set()).add(items[row])
    pairs = sorted(int(r) for r in eval_ids if label[r])
    assert seen.pair_ids.tolist() == pairs
    assert seen.pair_candidates.tolist() == [items[r] for r in pairs]
    for row, user in zip(pairs, seen.pair_users):
        listed = seen.seen[seen.offsets[user]:seen.offsets[user + 1]]
        assert listed.tolist() == sorted(
            expected_seen.get(users[row], set()) if users[row] is not None
            else set()), row
    assert any(items[r] in expected_seen.get(users[r], ())
               for r in pairs if users[r] is not None)  # own item seen too


def _stub() -> types.SimpleNamespace:
    """A model whose embeddings are the batch's ``q`` and ``c``."""
    return types.SimpleNamespace(query_embedding=lambda b: b["q"],
                                 candidate_embedding=lambda b: b["c"])


def test_a_planted_seen_item_is_left_out_and_the_next_takes_its_rank():
    """Catalogue rows 0..3 in two chunks; the pair (row 2) scores below row
    3, which its user has seen, and above rows 0 and 1: rank 1 with the
    whole catalogue, 0 with row 3 left out. Its own row, seen too, stays.
    Popularity: rows by train count 3, 0, 2, 1: the pair's rank 2 drops to
    1 (row 3 out), the other pair's (row 1) from 3 to 2."""
    catalogue = tf.constant([[0.1, 0.0], [0.2, 0.0], [0.5, 0.0],
                             [0.9, 0.0]])
    tables = types.SimpleNamespace(
        bounds=[(0, 2), (2, 4)],
        embeddings=[catalogue[:2], catalogue[2:]])
    seen = SeenTables(SeenItems(
        pair_ids=np.array([10, 11]), pair_users=np.array([0, 1]),
        pair_candidates=np.array([2, 1]), offsets=np.array([0, 2, 3]),
        seen=np.array([2, 3, 3])), train_counts=np.array([5, 1, 4, 9]))
    batch = {"q": tf.constant([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]),
             "c": tf.gather(catalogue, [2, 1, 0]),
             ID_COLUMN: tf.constant([10, 11, 99], tf.int64)}
    model = _stub()
    assert pair_ranks(model, tables, batch).numpy().tolist() == [1, 2, 3]
    candidate, rows, items = seen.lookup(batch[ID_COLUMN])
    assert candidate.numpy().tolist() == [2, 1, -1]  # 99: not a pair
    assert list(zip(rows.numpy(), items.numpy())) == [(0, 3), (1, 3)]
    assert pair_ranks(model, tables, batch, (rows, items)).numpy().tolist(
        ) == [0, 1, 3]
    assert popularity_ranks([5, 1, 4, 9]).tolist() == [1, 3, 2, 0]
    assert seen.popularity_ranks(candidate, rows, items).numpy()[:2].tolist(
        ) == [1, 2]


def _brute_force(trainer, manifest, spec, seen: SeenItems | None):
    """Recall@k and MRR of the model and of popularity, pair by pair in
    NumPy over the trainer's catalogue embeddings."""
    trainer.refresh_catalogue()
    catalogue = np.concatenate([v.numpy() for v in trainer.tables.embeddings])
    popular = popularity_ranks(trainer.catalogue.train_counts)
    model, base = [], []
    for batch in make_eval_dataset(manifest.files("eval"), spec, 512,
                                   manifest.block_rows):
        query = trainer.model.query_embedding(batch).numpy()
        own = np.sum(query * trainer.model.candidate_embedding(
            batch).numpy(), 1)
        bar = own + 1e-5 * np.maximum(1.0, np.abs(own))
        for q, b, row, label in zip(query, bar, batch[ID_COLUMN].numpy(),
                                    batch["label"].numpy().reshape(-1)):
            if label <= 0:
                continue
            at = np.searchsorted(seen.pair_ids, row)
            user, mine = seen.pair_users[at], seen.pair_candidates[at]
            left = seen.seen[seen.offsets[user]:seen.offsets[user + 1]]
            left = left[left != mine]
            above = catalogue @ q > b
            above[left] = False
            model.append(above.sum())
            base.append(popular[mine] - np.sum(popular[left] < popular[mine]))
    return [({k: float(np.mean(np.array(r) < k)) for k in (1, 10, 50)},
             float(np.mean(1.0 / (np.array(r) + 1.0)))) for r in (model, base)]


def test_eval_leaves_seen_out_for_model_and_popularity_and_can_be_off(data):
    spec, manifest, _ = data
    catalogue = Catalogue.load(manifest.root, spec)

    def trainer(config):
        return RetrievalTrainer(
            tf.distribute.OneDeviceStrategy("/cpu:0"), spec, config,
            OptimizerConfig(), InputConfig(batch_size=64),
            catalogue=catalogue)

    excluding = trainer(CONFIG)
    result = excluding.evaluate(manifest)
    assert result.seen_excluded and result.count == catalogue.seen.pairs
    assert "(each user's train candidates left out)" in result.summary()
    (recall, mrr), (base_recall, base_mrr) = _brute_force(
        excluding, manifest, spec, catalogue.seen)
    for k in recall:
        assert result.recall[k] == pytest.approx(recall[k], abs=1e-9)
        assert result.popularity["recall"][k] == pytest.approx(
            base_recall[k], abs=1e-9)
    assert result.mrr == pytest.approx(mrr)
    assert result.popularity["mrr"] == pytest.approx(base_mrr)
    # Off: the whole catalogue, and the baseline from the counts, as before.
    whole = trainer(dataclasses.replace(CONFIG, exclude_seen=False))
    whole.model.set_weights(excluding.model.get_weights())
    before = whole.evaluate(manifest)
    assert not before.seen_excluded
    assert "left out" not in before.summary()
    assert before.popularity == popularity_baseline(
        catalogue.train_counts, catalogue.eval_counts)
    assert before.count == result.count
    assert before.mrr < result.mrr and before.popularity["mrr"] < (
        result.popularity["mrr"])
    # The train split is never filtered (its pairs are the seen lists).
    assert not excluding.evaluate(manifest, split="train").seen_excluded


def test_a_conversion_without_query_id_writes_no_lists(tmp_path, data):
    _log(tmp_path / "log.parquet")
    spec = FeatureSpec.from_dict(_spec_dict(None))
    report = convert([tmp_path / "log.parquet"], spec, tmp_path / "data",
                     ConversionOptions(eval_fraction=0.25, split_mode="hash"))
    assert not (report.manifest.root / SEEN_NAME).exists()
    assert Catalogue.load(report.manifest.root, spec).seen is None


def test_no_exclude_seen_is_a_retrieval_flag_of_train_and_eval(
        data, tmp_path, capsys):
    spec, manifest, _ = data
    parser = build_parser()

    def train(*flags: str):
        return retrieval_config(parse(parser, [
            "train", "--task", "retrieval", "--data", str(manifest.root),
            *flags]), spec)

    assert train().exclude_seen and not train(
        "--no-exclude-seen").exclude_seen
    # A ranking run's eval refuses it before TensorFlow, exit 2.
    JobConfig(workdir=tmp_path, spec=PRESETS["criteo"]()).write(
        tmp_path / "checkpoints")
    assert main(["eval", str(tmp_path / "checkpoints"), "--data",
                 str(manifest.root), "--no-exclude-seen"]) == 2
    assert "--no-exclude-seen: " in capsys.readouterr().err
