"""Sharding audit (``psrec audit-shards``): proves each example reaches
exactly one input pipeline.

It runs the real per-pipeline training input functions over one epoch, with
the ids every example carries, and reports per-pipeline counts, overlap
(ids read by more than one pipeline, or twice by one; must be 0) and coverage
(distinct ids read / rows in the manifest; must be 100%).
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import tensorflow as tf

from psrec.data.dataset import InputConfig
from psrec.data.dataset import iterate_checked
from psrec.data.dataset import make_train_dataset_fn
from psrec.data.dataset import shard_files
from psrec.data.manifest import Manifest
from psrec.features.spec import ID_COLUMN
from psrec.features.spec import FeatureSpec


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

    def summary(self) -> str:
        lines = [f"sharding audit of split {self.split!r} over "
                 f"{self.pipelines} input pipelines:"]
        lines += [f"  pipeline {i}: {c} examples"
                  for i, c in enumerate(self.counts)]
        lines.append(f"  overlap: {self.overlap} (must be 0)")
        lines.append(f"  coverage: {self.distinct}/{self.expected_rows} = "
                     f"{self.coverage:.2%} (must be 100%)")
        lines.append("  result: " + ("OK" if self.ok else "FAILED"))
        return "\n".join(lines)


def audit_shards(manifest: Manifest, spec: FeatureSpec, pipelines: int, *,
                 split: str = "train", batch_size: int = 1024) -> AuditReport:
    """Reads one epoch through each pipeline's input function and counts ids."""
    dataset_fn = make_train_dataset_fn(
        manifest, spec, InputConfig(batch_size=batch_size), epochs=1,
        split=split)
    files = manifest.files(split)
    seen: collections.Counter = collections.Counter()
    counts = []
    for pipeline in range(pipelines):
        context = tf.distribute.InputContext(
            num_input_pipelines=pipelines, input_pipeline_id=pipeline,
            num_replicas_in_sync=1)
        ids = [batch[ID_COLUMN].numpy() for batch in iterate_checked(
            dataset_fn(context), shard_files(files, pipelines, pipeline))]
        ids = np.concatenate(ids) if ids else np.zeros([0], np.int64)
        counts.append(len(ids))
        seen.update(ids.tolist())
    overlap = sum(c - 1 for c in seen.values() if c > 1)
    return AuditReport(split=split, pipelines=pipelines, counts=tuple(counts),
                       expected_rows=manifest.rows(split), distinct=len(seen),
                       overlap=overlap)
