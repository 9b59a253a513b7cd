"""Checkpoint -> serving SavedModel, and checkpoint evaluation, without a
cluster: the model is rebuilt with plain variables from ``job.json`` and
restored (verified by value) from the latest checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from psrec.data.dataset import make_eval_dataset
from psrec.data.manifest import Manifest
from psrec.data.records import corruption_named
from psrec.features.spec import ID_COLUMN
from psrec.launch.job_config import JobConfig
from psrec.models.export import export_saved_model
from psrec.models.ranking import RankingModel
from psrec.models.ranking import build_model
from psrec.ps_cluster.checkpoint import CheckpointKeeper
from psrec.ps_cluster.metrics import EvalResult
from psrec.ps_cluster.metrics import batch_statistics
from psrec.ps_cluster.metrics import merge


def restore_plain_model(checkpoint_dir: str | Path,
                        checkpoint: str | None = None
                        ) -> tuple[RankingModel, JobConfig, str]:
    """The trained model with plain (unsharded) variables.

    Returns:
      ``(model, job record, restored checkpoint path)``.

    Raises:
      FileNotFoundError: no job.json or no checkpoint in the directory.
    """
    record = JobConfig.read(checkpoint_dir)
    model = build_model(record.spec, record.model)
    keeper = CheckpointKeeper(checkpoint_dir, tf.train.Checkpoint(model=model))
    path = keeper.restore(checkpoint, model_only=True)
    if path is None:
        raise FileNotFoundError(f"no checkpoint in {checkpoint_dir}.")
    return model, record, path


def export_checkpoint(checkpoint_dir: str | Path, out_dir: str | Path) -> Path:
    """Exports the latest checkpoint of a training run as a SavedModel."""
    model, record, _ = restore_plain_model(checkpoint_dir)
    return export_saved_model(model, record.spec, out_dir)


def evaluate_checkpoint(checkpoint_dir: str | Path, manifest: Manifest,
                        split: str = "eval", batch_size: int = 4096
                        ) -> EvalResult:
    """AUC/logloss of the latest checkpoint on a split (every example once)."""
    model, record, _ = restore_plain_model(checkpoint_dir)
    manifest.verify(record.spec.fingerprint(), checksums=False)
    files = manifest.files(split)
    dataset = make_eval_dataset(files, record.spec, batch_size,
                                manifest.block_rows)
    label = record.spec.label.name
    step = tf.function(lambda batch: batch_statistics(
        batch[label], model(batch), batch[ID_COLUMN]))
    with corruption_named(files):
        parts = [{k: np.asarray(v) for k, v in step(batch).items()}
                 for batch in dataset]
    return merge(parts)
