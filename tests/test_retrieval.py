"""Two-tower retrieval (``psrec train --task retrieval``): the spec's towers,
the catalogue counted at conversion, training with the sampled softmax and
the exact recall@k evaluation under PS (the in-process cluster), one device
and mirrored (2 CPU replicas, through the CLI), the export round trip and
the inline top-k under PS that replaces TFRS' ``FactorizedTopK``.

The data is the synthetic catalogue of ``tests/_retrieval_data.py``: users
interact only with the 5 items of their group, so an ideal model ranks a
held-out item in the top 5 of the 200 items.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from psrec.data.convert.catalogue import CATALOGUE_NAME
from psrec.data.convert.catalogue import Catalogue
from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.input.config import InputConfig
from psrec.data.input.dataset import make_eval_dataset
from psrec.features.spec.columns import SpecError
from psrec.features.spec.presets import PRESETS
from psrec.features.spec.spec import FeatureSpec
from psrec.launch.cli.main import main
from psrec.launch.job.config import JobConfig
from psrec.launch.job.export import evaluate_checkpoint
from psrec.launch.job.export import export_checkpoint
from psrec.models.optim.config import OptimizerConfig
from psrec.models.retrieval.config import RetrievalConfig
from psrec.models.retrieval.topk import streaming_top_k
from psrec.models.serving.retrieval_export import query_spec
from psrec.models.serving.warmup import warmup_rows
from psrec.ps_cluster.checkpoint.best import choose_checkpoint
from psrec.ps_cluster.checkpoint.best import read_best
from psrec.ps_cluster.cluster.partition_config import PartitionConfig
from psrec.ps_cluster.cluster.strategy import build_ps_strategy
from psrec.ps_cluster.retrieval.metrics import popularity_baseline
from psrec.ps_cluster.retrieval.trainer import RetrievalTrainer
from psrec.ps_cluster.training.config import LoopConfig
from psrec.runtime import role_environment
from tests._proc import REPO
from tests._ps_helpers import read_split
from tests._retrieval_data import ITEMS_PER_GROUP
from tests._retrieval_data import catalogue_size
from tests._retrieval_data import retrieval_spec_dict
from tests._retrieval_data import write_retrieval_parquet
from tests._warmup import official_requests
from tests._warmup import serve

BATCH = 256
STEPS = 150
CONFIG = RetrievalConfig(tower_mlp=(32,), output_dim=16)


@pytest.fixture(scope="module")
def spec() -> FeatureSpec:
    return FeatureSpec.from_dict(retrieval_spec_dict())


@pytest.fixture(scope="module")
def data(tmp_path_factory, spec):
    root = tmp_path_factory.mktemp("retrieval-data")
    parquet = write_retrieval_parquet(root / "parquet" / "rows.parquet")
    report = convert([parquet], spec, root / "tfrecord", ConversionOptions(
        shards=2, eval_fraction=0.2, split_mode="hash"))
    return report.manifest, parquet


def _train(trainer, manifest, steps=STEPS):
    return trainer.train(trainer.dataset_fn(manifest), LoopConfig(
        steps=steps, steps_per_closure=10, checkpoint_every=0),
        eval_manifest=manifest)


@pytest.fixture(scope="module")
def ps_run(ps_cluster, spec, data, tmp_path_factory):
    manifest, _ = data
    ckpt = tmp_path_factory.mktemp("retrieval-run") / "checkpoints"
    strategy = build_ps_strategy(ps_cluster, PartitionConfig(kind="fixed"))
    trainer = RetrievalTrainer(
        strategy, spec, CONFIG, OptimizerConfig(),
        InputConfig(batch_size=BATCH), checkpoint_dir=ckpt,
        catalogue=Catalogue.load(manifest.root, spec))
    evals = {}  # step -> eval result: the best checkpoint is kept by MRR
    result = trainer.train(trainer.dataset_fn(manifest), LoopConfig(
        steps=STEPS, steps_per_closure=10, checkpoint_every=0, eval_every=50,
        keep_best="mrr"), eval_manifest=manifest,
        on_boundary=lambda step, ev, path: evals.update({step: ev}) if ev
        else None)
    JobConfig(workdir=ckpt.parent, spec=spec, data=manifest.root,
              retrieval=CONFIG).write(ckpt)
    return trainer, result, ckpt, evals


# -- spec and catalogue ---------------------------------------------------------


def test_towers_are_validated_naming_the_field(spec):
    data = retrieval_spec_dict()
    data["towers"] = {"query": ["user_id", "nope"],
                      "candidate": ["item_id"], "candidate_id": "category"}
    with pytest.raises(SpecError) as error:
        FeatureSpec.from_dict(data)
    text = str(error.value)
    assert "`query` names 'nope'" in text
    assert "features ['category', 'user_group'] are in neither tower" in text
    assert "`candidate_id` = 'category' must be one of" in text
    assert FeatureSpec.from_dict(spec.to_dict()) == spec  # round trip
    movielens = PRESETS["movielens-retrieval"]()
    assert movielens.towers.candidate_id == "item_id"
    assert "towers" not in PRESETS["movielens"]().to_dict()


def test_catalogue_holds_every_candidate_with_train_counts(data, spec):
    manifest, parquet = data
    table = pq.read_table(manifest.root / CATALOGUE_NAME)
    raw = pq.read_table(parquet).column("item_id").to_numpy()
    assert sorted(table.column("raw_id").to_pylist()) == sorted(set(raw))
    assert table.num_rows == catalogue_size()
    assert sum(table.column("train_count").to_pylist()) == manifest.rows(
        "train")
    catalogue = Catalogue.load(manifest.root, spec)
    assert set(catalogue.features) == {"item_id", "category"}


def test_catalogue_counts_the_eval_pairs_of_each_candidate(data, spec,
                                                           tmp_path):
    """``eval_count``: each candidate's positive eval rows, checked against
    the eval shards themselves (summed per encoded id row, so a hash
    collision cannot hide a miscount)."""
    manifest, _ = data
    catalogue = Catalogue.load(manifest.root, spec)
    assert int(catalogue.eval_counts.sum()) == manifest.rows("eval") > 0
    rows = catalogue.features["item_id"]
    expected = np.zeros(rows.max() + 1, np.int64)
    np.add.at(expected, rows, catalogue.eval_counts)
    counted = np.zeros_like(expected)
    for batch in make_eval_dataset(manifest.files("eval"), spec, 512,
                                   manifest.block_rows):
        positive = tf.reshape(batch["label"], [-1]).numpy() > 0
        np.add.at(counted,
                  tf.reshape(batch["item_id"], [-1]).numpy()[positive], 1)
    np.testing.assert_array_equal(counted, expected)
    assert catalogue.positives("train") is catalogue.train_counts
    # A catalogue written before psrec counted eval pairs: no baseline.
    old = tmp_path / CATALOGUE_NAME
    pq.write_table(pq.read_table(manifest.root / CATALOGUE_NAME).drop(
        ["eval_count"]), old)
    assert Catalogue.load(tmp_path, spec).positives("eval") is None


# -- training and exact evaluation ------------------------------------------------


def _check_quality(result, manifest) -> None:
    # Every held-out pair once, against the whole catalogue.
    assert result.eval.count == manifest.rows("eval")
    assert result.eval.catalogue == catalogue_size()
    assert result.eval.recall[10] >= 0.9, result.eval.summary()
    assert result.eval.recall[1] <= result.eval.recall[5] <= (
        result.eval.recall[10])
    assert 0 < result.eval.mrr <= 1


def test_ps_training_reaches_recall_at_10(ps_run, data):
    trainer, result, _, _ = ps_run
    _check_quality(result, data[0])
    # The popularity baseline of the same pairs, beside the model's.
    catalogue = trainer.catalogue
    assert result.eval.popularity == popularity_baseline(
        catalogue.train_counts, catalogue.eval_counts)
    assert result.eval.count == int(catalogue.eval_counts.sum())
    assert 0 < result.eval.popularity["recall"][10] < 0.5  # 200 candidates
    assert (f"recall@10 {result.eval.recall[10]:.4f} (popularity "
            f"{result.eval.popularity['recall'][10]:.4f})"
            in result.eval.summary())
    assert result.eval.popularity_note() is None  # the model beats it
    # The towers trained on workers, the tables on the PS tasks.
    table = trainer.model.sparse_arch.tables["items"]
    assert {v.device.split("/task")[0] for v in table.variables} == {
        "/job:ps/replica:0"}


def test_one_device_training_reaches_recall_at_10(spec, data):
    manifest, _ = data
    trainer = RetrievalTrainer(
        tf.distribute.OneDeviceStrategy("/cpu:0"), spec, CONFIG,
        OptimizerConfig(), InputConfig(batch_size=BATCH),
        catalogue=Catalogue.load(manifest.root, spec))
    _check_quality(_train(trainer, manifest), manifest)


@pytest.mark.slow
def test_mirrored_training_on_two_cpu_replicas(data):
    """MirroredStrategy over 2 logical CPUs (a fresh process: the CPU is
    split before TensorFlow sets up its devices), with uniform negatives
    (more table rows per replica: the padded all-gather bound grows)."""
    manifest, _ = data
    result = subprocess.run(
        [sys.executable, "-m", "tests.test_retrieval", str(manifest.root)],
        cwd=REPO, env=role_environment(), capture_output=True, text=True,
        timeout=150, stdin=subprocess.DEVNULL, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    replicas, recall = json.loads(result.stdout.strip().splitlines()[-1])
    assert replicas == 2
    assert recall["10"] >= 0.9, recall


def _mirrored_main(root: str) -> None:
    """``python -m tests.test_retrieval MANIFEST_DIR``: trains on 2 CPU
    replicas, prints ``[replicas, recall]`` as JSON."""
    from psrec.data.format.manifest import Manifest
    from psrec.ps_cluster.cluster.strategy import build_replicated_strategy
    from psrec.ps_cluster.cluster.strategy import split_cpu
    split_cpu(2)
    strategy = build_replicated_strategy("mirrored")
    manifest = Manifest.load(root)
    spec = FeatureSpec.from_dict(retrieval_spec_dict())
    trainer = RetrievalTrainer(
        strategy, spec, dataclasses.replace(CONFIG, uniform_negatives=16),
        OptimizerConfig(), InputConfig(batch_size=2 * BATCH),
        catalogue=Catalogue.load(manifest.root, spec))
    result = _train(trainer, manifest)
    print(json.dumps([trainer.replicas, result.eval.recall]))


def test_inline_top_k_runs_inside_a_ps_closure(ps_run):
    """The FactorizedTopK trap: scoring against a candidates dataset fails
    under PS; matmul + top_k against the chunk variables on the PS tasks,
    inside a scheduled closure, works and is exact."""
    trainer, _, _, _ = ps_run
    tables = trainer.tables
    assert all(v.device.startswith("/job:ps") for v in tables.embeddings)
    queries = tf.random.stateless_normal([8, CONFIG.embedding_dim],
                                        seed=(1, 2))

    @tf.function
    def top(query):
        return streaming_top_k(query, tables.embeddings, 10)

    value = trainer.coordinator.schedule(top, args=(queries,))
    trainer.coordinator.join()
    scores, index = value.fetch()
    catalogue = np.concatenate([v.numpy() for v in tables.embeddings])
    expected = queries.numpy() @ catalogue.T
    np.testing.assert_allclose(
        scores, -np.sort(-expected, axis=1)[:, :10], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        np.take_along_axis(expected, index, axis=1), scores, rtol=1e-5,
        atol=1e-6)


# -- export ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def retrieval_export(ps_run, data, tmp_path_factory):
    _, _, ckpt, _ = ps_run
    manifest, _ = data
    return export_checkpoint(ckpt, tmp_path_factory.mktemp("r-export")
                             / "export", "latest", manifest=manifest)


def test_the_best_checkpoint_is_kept_by_mrr_and_chosen(ps_run, capsys):
    _, result, ckpt, evals = ps_run
    assert sorted(evals) == [50, 100, 150]
    mrrs = {step: ev.mrr for step, ev in evals.items()}
    best = read_best(ckpt)
    assert best == result.best and best.metric == "mrr"
    assert best.step == max(mrrs, key=mrrs.get), mrrs
    assert best.value == mrrs[best.step]
    assert best.metrics == evals[best.step].named()
    assert best.auc is None and best.logloss is None
    assert best.summary().startswith(
        f"step {best.step}, recall@1 {evals[best.step].recall[1]:.4f}, ")
    # The export (and psrec eval) of a run that kept one is the best.
    chosen = choose_checkpoint(ckpt)
    assert (chosen.step, chosen.best) == (best.step, best)
    assert "the best: eval recall@1 " in chosen.describe()
    assert main(["show", str(ckpt.parent)]) == 0  # reads best.json
    assert (f"  best:        {best.summary()[:-1]}, by mrr)\n"
            in capsys.readouterr().out)


def test_export_round_trip(ps_run, data, retrieval_export, capsys):
    trainer, result, ckpt, _ = ps_run
    manifest, parquet = data
    folder = retrieval_export.path
    top = tf.saved_model.load(folder).signatures["serving_default"]
    tower = tf.saved_model.load(
        f"{folder}/query_tower").signatures["serving_default"]
    rows = pq.read_table(parquet).slice(0, 64).to_pydict()
    query = {"user_id": tf.constant(rows["user_id"], tf.int64),
             "user_group": tf.constant(rows["user_group"])}
    served = top(**query)
    ids, scores = served["candidate_ids"].numpy(), served["scores"].numpy()
    assert ids.shape == (64, 100) and ids.dtype == np.int64
    # The top-K model = brute force over the exported embeddings.
    embeddings = pq.read_table(f"{folder}/candidates.parquet").to_pydict()
    matrix = np.asarray(embeddings["embedding"], np.float32)
    brute = tower(**query)["embedding"].numpy() @ matrix.T
    order = np.argsort(-brute, axis=1, kind="stable")[:, :100]
    np.testing.assert_allclose(scores, np.take_along_axis(brute, order, 1),
                               rtol=1e-4, atol=1e-5)
    # The trained candidate bias (CONFIG's default) is in the top-k: the
    # embeddings' last column (the query's is 1), the sum of each item's
    # and its category's wide weights, as checkpointed.
    assert CONFIG.candidate_bias
    np.testing.assert_array_equal(tower(**query)["embedding"][:, -1], 1.0)
    reader = tf.train.load_checkpoint(str(ckpt))
    wide = {table: reader.get_tensor(
        f"model/sparse_arch/{table}__wide/.ATTRIBUTES/VARIABLE_VALUE")
        for table in ("items", "groups")}
    catalogue = Catalogue.load(manifest.root, trainer.spec)
    bias = (wide["items"][catalogue.features["item_id"], 0]
            + wide["groups"][catalogue.features["category"], 0])
    np.testing.assert_allclose(matrix[:, -1], bias, rtol=1e-5, atol=1e-6)
    assert np.ptp(bias) > 0.1  # trained: dropping it changes the top-k
    without = tower(**query)["embedding"].numpy()[:, :-1] @ matrix[:, :-1].T
    assert not np.array_equal(
        np.argsort(-without, axis=1, kind="stable")[:, :100], order)
    # The ground truth: a user's own group's items are in the top 10 (item
    # raw id 5000 + 5 * group + j, see tests/_retrieval_data.py).
    groups = [int(g[1:]) for g in rows["user_group"]]
    own = [np.sum((row[:10] - 5000) // ITEMS_PER_GROUP == g)
           for row, g in zip(ids, groups)]
    assert np.mean(own) >= 0.9 * ITEMS_PER_GROUP, own
    # psrec eval of the checkpoint, on one CPU: the cluster's figures.
    again = evaluate_checkpoint(ckpt, manifest, checkpoint="latest")
    assert again.count == result.eval.count
    assert again.popularity == result.eval.popularity
    from psrec.launch.cli.main import main
    assert main(["eval", str(ckpt), "--data", str(manifest.root),
                 "--json"]) == 0  # the result dict carries it
    printed = json.loads(capsys.readouterr().out)
    assert printed["popularity"]["recall"]["100"] == pytest.approx(
        result.eval.popularity["recall"][100])
    for k, value in result.eval.recall.items():
        assert abs(again.recall[k] - value) <= 2 / again.count, k
    info = json.loads(open(f"{folder}/psrec_export.json").read())
    assert info["task"] == "retrieval"
    assert info["catalogue"] == catalogue_size() == result.eval.catalogue


def test_predict_scores_a_retrieval_export_top_k(retrieval_export, data,
                                                 tmp_path, capsys):
    from psrec.launch.cli.main import main
    _, parquet = data
    folder = retrieval_export.path
    out = tmp_path / "top.parquet"
    assert main(["predict", "--model", folder, "--data", str(parquet),
                 "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    table = pq.read_table(out)
    rows = pq.read_table(parquet)
    assert report["rows"] == table.num_rows == rows.num_rows
    assert table.column_names[0] == "row"
    assert table.column_names[-2:] == ["candidate_ids", "scores"]
    # Each row: the export's own top-K for that query row.
    first = rows.slice(0, 8).to_pydict()
    served = tf.saved_model.load(folder).signatures["serving_default"](
        user_id=tf.constant(first["user_id"], tf.int64),
        user_group=tf.constant(first["user_group"]))
    got = table.slice(0, 8).to_pydict()
    np.testing.assert_array_equal(np.asarray(got["candidate_ids"]),
                                  served["candidate_ids"].numpy())
    np.testing.assert_allclose(np.asarray(got["scores"]),
                               served["scores"].numpy(), rtol=1e-5,
                               atol=1e-6)  # batch-size rounding near 0
    # CSV cannot hold the lists: one line, exit 2, naming the export.
    assert main(["predict", "--model", folder, "--data", str(parquet),
                 "--out", str(tmp_path / "top.csv")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("psrec predict: error: ")
    assert "is a retrieval export" in line and "top.parquet" in line


def test_retrieval_warmup_requests_are_query_rows_and_serve(
        retrieval_export, data, spec):
    """The top-K model and its query tower each carry TF Serving warmup
    requests (read with TF Serving's protos): the query features of the
    first 8 eval rows, as one row and as 8, which both signatures take."""
    manifest, parquet = data
    folder = retrieval_export.path
    ids = np.sort(read_split(manifest, spec, "eval")["psrec__id"][:8])
    raw = pq.read_table(parquet).take(ids).to_pydict()
    info = json.loads(open(f"{folder}/psrec_export.json").read())
    assert retrieval_export.warmup == info["warmup"]
    assert info["warmup"].startswith(
        f"eval rows {', '.join(map(str, ids))} of {manifest.root}")
    for saved_model in (folder, f"{folder}/query_tower"):
        requests = official_requests(saved_model, "export")
        assert [len(r["user_id"]) for r in requests] == [1, 8]
        assert sorted(requests[0]) == ["user_group", "user_id"]
        np.testing.assert_array_equal(requests[1]["user_id"], raw["user_id"])
        assert [v.decode() for v in requests[1]["user_group"]] == raw[
            "user_group"]
        for request in requests:
            np.testing.assert_array_equal(request["user_id"],
                                          requests[1]["user_id"][
                                              :len(request["user_id"])])
    for request in official_requests(folder, "export"):
        outputs = serve(folder, request)
        assert outputs["candidate_ids"].shape == (len(request["user_id"]),
                                                  100)
        assert np.all(np.isfinite(outputs["scores"]))
    for request in official_requests(f"{folder}/query_tower", "export"):
        outputs = serve(f"{folder}/query_tower", request)
        assert outputs["embedding"].shape == (len(request["user_id"]),
                                              CONFIG.embedding_dim)


def test_retrieval_warmup_rows_without_data_are_synthetic_query_features(
        spec):
    rows = warmup_rows(spec, None, serving_spec=query_spec(spec))
    assert rows.source == "synthetic rows (no manifest)" and rows.ids == ()
    assert {k: (v.dtype.kind, v.shape) for k, v in rows.inputs.items()} == {
        "user_id": ("i", (8,)), "user_group": ("O", (8,))}


if __name__ == "__main__":
    _mirrored_main(sys.argv[1])
