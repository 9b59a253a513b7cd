"""The sharding audit runs the input path training takes under
ParameterServerStrategy (shards chosen by
``experimental_get_current_worker_index()``), on a real in-process PS
cluster and in one process, and catches the every-worker-reads-every-file
bug that sharding by a PS worker's ``InputContext`` (1 pipeline, id 0)
causes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from psrec.data.input.audit import audit_shards
from psrec.data.input.audit import per_worker_datasets
from psrec.data.input.config import InputConfig
from psrec.data.input.dataset import PIPELINE_COLUMN
from psrec.data.input.dataset import make_train_dataset_fn
from psrec.features.spec.spec import ID_COLUMN
from tests._ps_helpers import CLUSTER_WORKERS


def _expected_counts(manifest, workers: int, split: str = "train"
                     ) -> tuple[int, ...]:
    """Rows per worker when worker i reads shard files i, i+K, ... ."""
    shards = manifest.shards[split]
    return tuple(sum(s.rows for s in shards[i::workers])
                 for i in range(workers))


def _everything_fn(manifest, spec):
    """The input function without ``ps_workers``: it shards by the
    ``InputContext``, which under PS is 1 pipeline, id 0 (or none at all
    through ``create_per_worker_dataset``), so every worker reads every
    file."""
    return make_train_dataset_fn(manifest, spec, InputConfig(batch_size=1024),
                                 epochs=1)


@pytest.fixture(scope="module")
def coordinator(ps_cluster):
    """A coordinator of its own over the session's in-process cluster."""
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(ps_cluster.to_tf_cluster_dict()),
        rpc_layer="grpc")
    return tf.distribute.coordinator.ClusterCoordinator(
        tf.distribute.ParameterServerStrategy(resolver))


@pytest.mark.cluster
def test_audit_on_a_ps_cluster_reads_each_example_on_exactly_one_worker(
        coordinator, criteo_data, small_criteo_spec):
    manifest, _ = criteo_data
    report = audit_shards(manifest, small_criteo_spec, CLUSTER_WORKERS,
                          coordinator=coordinator)
    assert report.counts == _expected_counts(manifest, CLUSTER_WORKERS)
    assert min(report.counts) > 0
    assert report.overlap == 0
    assert report.distinct == report.expected_rows == 16_000
    assert report.ok
    # The in-process audit (the CLI's) reads the same thing per worker.
    local = audit_shards(manifest, small_criteo_spec, CLUSTER_WORKERS)
    assert local == report


@pytest.mark.cluster
def test_audit_on_a_ps_cluster_catches_every_worker_reading_every_file(
        coordinator, criteo_data, small_criteo_spec):
    manifest, _ = criteo_data
    report = audit_shards(manifest, small_criteo_spec, CLUSTER_WORKERS,
                          coordinator=coordinator,
                          dataset_fn=_everything_fn(manifest,
                                                    small_criteo_spec))
    assert report.counts == (16_000,) * CLUSTER_WORKERS
    assert report.overlap == 16_000 * (CLUSTER_WORKERS - 1)
    assert report.distinct == 16_000  # full coverage does not hide it
    assert not report.ok
    assert "result: FAILED" in report.summary()


def test_in_process_audit_catches_every_worker_reading_every_file(
        criteo_data, small_criteo_spec):
    manifest, _ = criteo_data
    report = audit_shards(manifest, small_criteo_spec, 3,
                          dataset_fn=_everything_fn(manifest,
                                                    small_criteo_spec))
    assert report.counts == (16_000,) * 3
    assert report.overlap == 32_000 and not report.ok


def test_in_process_audit_catches_files_no_worker_reads(criteo_data,
                                                        small_criteo_spec):
    """Training built for 4 workers on a cluster of 2: files 2 and 3 are
    never read (coverage 50%), with no overlap."""
    manifest, _ = criteo_data
    wrong = make_train_dataset_fn(manifest, small_criteo_spec,
                                  InputConfig(batch_size=1024), epochs=1,
                                  ps_workers=4)
    report = audit_shards(manifest, small_criteo_spec, 2, dataset_fn=wrong)
    assert report.overlap == 0
    assert report.counts == _expected_counts(manifest, 4)[:2]
    assert report.distinct == sum(report.counts) < 16_000
    assert report.coverage == pytest.approx(sum(report.counts) / 16_000)
    assert not report.ok


def test_in_process_audit_binds_the_worker_index_as_a_ps_worker_does(
        criteo_data, small_criteo_spec):
    """The per-worker datasets of the CLI audit come from
    ``experimental_get_current_worker_index()`` (which raises outside a
    worker closure), not from an ``InputContext``: a ``dataset_fn`` that
    shards by it alone, and fails when handed a context, audits clean."""
    manifest, _ = criteo_data
    with pytest.raises(RuntimeError, match="worker index"):
        tf.function(lambda: tf.distribute.coordinator
                    .experimental_get_current_worker_index())()
    ids = np.arange(10, dtype=np.int64)

    def by_worker_index(context=None):
        assert context is None, "a PS worker's dataset_fn gets no context"
        index = tf.distribute.coordinator.experimental_get_current_worker_index()
        return tf.data.Dataset.from_tensor_slices(ids).shard(3, index).batch(
            4).map(lambda i: {ID_COLUMN: i})

    read = {i: np.concatenate([b[ID_COLUMN].numpy() for b in d])
            for i, d in per_worker_datasets(by_worker_index, 3)}
    assert {i: v.tolist() for i, v in read.items()} == {
        0: [0, 3, 6, 9], 1: [1, 4, 7], 2: [2, 5, 8]}
    # The training input function under the audit: worker i reads exactly
    # the rows of shard files i, i+3, ... (tagged with pipeline i).
    fn = make_train_dataset_fn(manifest, small_criteo_spec,
                               InputConfig(batch_size=1024), epochs=1,
                               split="eval", ps_workers=2)
    counts = []
    for index, dataset in per_worker_datasets(fn, 2):
        batches = list(dataset)
        assert {int(b[PIPELINE_COLUMN]) for b in batches} == {index}
        counts.append(sum(int(b[ID_COLUMN].shape[0]) for b in batches))
    assert tuple(counts) == _expected_counts(manifest, 2, "eval")
