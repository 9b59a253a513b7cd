"""Sharding audit (``psrec audit-shards``): proves each example reaches
exactly one worker's input pipeline.

It runs the training input function over one epoch, per worker, along the
code path training takes under ``ParameterServerStrategy``: the
``dataset_fn`` built with ``ps_workers=K`` shards by
``tf.distribute.coordinator.experimental_get_current_worker_index()`` (the
``InputContext`` a PS worker gets always says 1 pipeline, id 0), and it
reports per-worker counts of the ids every example carries, overlap (ids
read by more than one worker, or twice by one; must be 0) and coverage
(distinct ids read / rows in the manifest; must be 100%).

Two ways to run the per-worker datasets, both through the same path:

* on a real cluster (``coordinator=``): the ``dataset_fn`` goes to
  ``ClusterCoordinator.create_per_worker_dataset`` exactly as in training,
  and a scheduled closure drains each worker's iterator on that worker;
* in this process (the CLI): the ``dataset_fn`` is traced once without
  arguments, as ``create_per_worker_dataset`` does, and the traced function
  is called once per worker with TensorFlow's dispatch context for that
  worker, which is where ``experimental_get_current_worker_index`` reads
  the index when a worker runs the function.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Iterator

import numpy as np
import tensorflow as tf

from psrec.data.format.manifest import Manifest
from psrec.data.format.records import corruption_named
from psrec.data.input.config import InputConfig
from psrec.data.input.dataset import DatasetFn
from psrec.data.input.dataset import make_train_dataset_fn
from psrec.data.input.dataset import shard_files
from psrec.features.spec.spec import ID_COLUMN
from psrec.features.spec.spec import FeatureSpec


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """Result of a sharding audit of one split."""

    split: str
    pipelines: int
    counts: tuple[int, ...]
    expected_rows: int
    distinct: int
    overlap: int

    @property
    def coverage(self) -> float:
        return self.distinct / self.expected_rows if self.expected_rows else 1.0

    @property
    def ok(self) -> bool:
        return self.overlap == 0 and self.distinct == self.expected_rows

    def to_dict(self) -> dict[str, object]:
        """The report as JSON-able data, with ``coverage`` and ``ok``."""
        return {**dataclasses.asdict(self), "counts": list(self.counts),
                "coverage": self.coverage, "ok": self.ok}

    def summary(self) -> str:
        lines = [f"sharding audit of split {self.split!r} over "
                 f"{self.pipelines} input pipelines (one per parameter-server "
                 "worker):"]
        lines += [f"  pipeline {i}: {c} examples"
                  for i, c in enumerate(self.counts)]
        lines.append(f"  overlap: {self.overlap} (must be 0)")
        lines.append(f"  coverage: {self.distinct}/{self.expected_rows} = "
                     f"{self.coverage:.2%} (must be 100%)")
        lines.append("  result: " + ("OK" if self.ok else "FAILED"))
        return "\n".join(lines)


def audit_shards(manifest: Manifest, spec: FeatureSpec, pipelines: int, *,
                 split: str = "train", batch_size: int = 1024,
                 coordinator: tf.distribute.coordinator.ClusterCoordinator
                 | None = None,
                 dataset_fn: DatasetFn | None = None,
                 timeout: float = 600.0) -> AuditReport:
    """Reads one epoch through each PS worker's input and counts ids.

    Args:
      pipelines: the number of PS workers (``ps_workers`` of training).
      coordinator: a ``ClusterCoordinator`` over a cluster of exactly
        ``pipelines`` workers: the per-worker datasets are created and read
        on those workers. None: in this process (see the module docstring).
      dataset_fn: the input function to audit; None (the normal case) is
        the training one, ``make_train_dataset_fn(..., ps_workers=
        pipelines)`` over one epoch.
      timeout: seconds the cluster audit may take to hear from every worker.

    Raises:
      NotEnoughShardsError: fewer shard files than pipelines.
      CorruptRecordError: a shard is corrupted (names the file).
    """
    if dataset_fn is None:
        dataset_fn = make_train_dataset_fn(
            manifest, spec, InputConfig(batch_size=batch_size), epochs=1,
            split=split, ps_workers=pipelines)
    files = manifest.files(split)
    if coordinator is None:
        per_worker = _read_in_process(dataset_fn, files, pipelines)
    else:
        per_worker = _read_on_cluster(coordinator, dataset_fn, files,
                                      pipelines, timeout)
    seen: collections.Counter = collections.Counter()
    counts = []
    for worker in range(pipelines):
        ids = per_worker[worker]
        counts.append(len(ids))
        seen.update(ids.tolist())
    overlap = sum(c - 1 for c in seen.values() if c > 1)
    return AuditReport(split=split, pipelines=pipelines, counts=tuple(counts),
                       expected_rows=manifest.rows(split), distinct=len(seen),
                       overlap=overlap)


# -- in this process ------------------------------------------------------------


class _Worker:
    """What TensorFlow's dispatch context needs of a worker: its index."""

    def __init__(self, index: int) -> None:
        self.worker_index = index


def per_worker_datasets(dataset_fn: DatasetFn, workers: int
                        ) -> Iterator[tuple[int, tf.data.Dataset]]:
    """``(worker index, dataset)`` for each worker, built in this process as
    ``ClusterCoordinator.create_per_worker_dataset`` builds them on the
    workers: ``dataset_fn`` traced once with no argument, the traced function
    called once per worker inside the dispatch context ``ClusterCoordinator``
    enters to run a closure on that worker."""
    # TensorFlow's own module for that context (what Closure.execute_on
    # enters); it has no public alias.
    from tensorflow.python.distribute.coordinator import coordinator_context
    traced = tf.function(dataset_fn).get_concrete_function()
    for index in range(workers):
        with coordinator_context.with_dispatch_context(_Worker(index)):
            dataset = traced()
        yield index, dataset


def _read_in_process(dataset_fn: DatasetFn, files: list[str],
                     workers: int) -> dict[int, np.ndarray]:
    read = {}
    for index, dataset in per_worker_datasets(dataset_fn, workers):
        with corruption_named(shard_files(files, workers, index)):
            ids = [batch[ID_COLUMN].numpy() for batch in dataset]
        read[index] = (np.concatenate(ids) if ids
                       else np.zeros([0], np.int64))
    return read


# -- on a cluster ------------------------------------------------------------------


def _drain_closure():
    @tf.function
    def drain(iterator):
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        ids = tf.TensorArray(tf.int64, size=0, dynamic_size=True,
                             infer_shape=False,
                             element_shape=tf.TensorShape([None]))
        for batch in iterator:
            ids = ids.write(ids.size(), tf.cast(batch[ID_COLUMN], tf.int64))
        return worker, ids.concat()

    return drain


def _read_on_cluster(coordinator, dataset_fn: DatasetFn, files: list[str],
                     workers: int, timeout: float) -> dict[int, np.ndarray]:
    """Creates the per-worker datasets on the cluster (as training does) and
    drains each worker's iterator in a closure run on that worker.

    The coordinator picks the worker of a closure, so closures are scheduled
    in rounds of one per worker until every worker has run one; a worker's
    first closure reads its whole epoch, a later one finds it exhausted.
    """
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    drain = _drain_closure()
    read: dict[int, list[np.ndarray]] = collections.defaultdict(list)
    deadline = time.monotonic() + timeout
    while any(index not in read for index in range(workers)):
        if time.monotonic() > deadline:
            missing = [i for i in range(workers) if i not in read]
            raise TimeoutError(
                f"sharding audit: no closure ran on worker(s) {missing} "
                f"within {timeout:.0f} s")
        values = [coordinator.schedule(drain, args=(iterator,))
                  for _ in range(workers)]
        with corruption_named(files):
            coordinator.join()
            results = [value.fetch() for value in values]
        for index, ids in results:
            index = int(index)
            if not 0 <= index < workers:
                raise ValueError(
                    f"sharding audit of {workers} pipelines ran on worker "
                    f"{index}: the cluster has more workers than that")
            read[index].append(np.asarray(ids))
    return {index: np.concatenate(parts) for index, parts in read.items()}
