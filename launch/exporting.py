"""Checkpoint -> serving SavedModel, and checkpoint evaluation, without a
cluster: the model is rebuilt with plain variables from ``job.json`` and
restored (verified by value) from the chosen checkpoint: ``latest``,
``best`` (``best.json``, see :mod:`psrec.ps_cluster.best`) or ``ckpt-N``;
by default the best when the run recorded one, else the latest."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from psrec.data.dataset import make_eval_dataset
from psrec.data.manifest import Manifest
from psrec.data.records import corruption_named
from psrec.errors import ConfigError
from psrec.features.spec import ID_COLUMN
from psrec.launch.job_config import JobConfig
from psrec.models.export import export_saved_model
from psrec.models.ranking import RankingModel
from psrec.models.ranking import build_model
from psrec.ps_cluster.best import choose_checkpoint
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


def _chosen(checkpoint_dir: str | Path, checkpoint: str | None) -> str:
    """The path of the chosen checkpoint (after checking that the folder
    is a run's: its job.json first)."""
    JobConfig.read(checkpoint_dir)
    return choose_checkpoint(checkpoint_dir, checkpoint).path


def export_checkpoint(checkpoint_dir: str | Path, out_dir: str | Path,
                      checkpoint: str | None = None) -> Path:
    """Exports a checkpoint of a training run as a SavedModel.

    Args:
      checkpoint: ``latest``, ``best`` or ``ckpt-N``; None: the best when
        the run recorded one, else the latest.
    """
    model, record, _ = restore_plain_model(
        checkpoint_dir, _chosen(checkpoint_dir, checkpoint))
    return export_saved_model(model, record.spec, out_dir)


def evaluate_checkpoint(checkpoint_dir: str | Path, manifest: Manifest,
                        split: str = "eval", batch_size: int = 4096,
                        checkpoint: str | None = None) -> EvalResult:
    """AUC/logloss of a checkpoint on a split (every example once).

    Args:
      checkpoint: as in :func:`export_checkpoint`.

    Raises:
      ConfigError: the manifest has no rows in ``split`` (exit 2).
    """
    files = manifest.files(split) if manifest.shards.get(split) else []
    if not files or manifest.rows(split) == 0:
        hint = ("convert with --eval-fraction (e.g. 0.1) to hold out eval "
                "rows" if split == "eval" else "convert training data")
        raise ConfigError(f"{manifest.root / 'manifest.json'} has no "
                          f"{split} split: {hint}.")
    model, record, _ = restore_plain_model(
        checkpoint_dir, _chosen(checkpoint_dir, checkpoint))
    manifest.verify(record.spec.fingerprint(), checksums=False)
    dataset = make_eval_dataset(files, record.spec, batch_size,
                                manifest.block_rows)
    label = record.spec.label.name
    step = tf.function(lambda batch: batch_statistics(
        batch[label], model(batch), batch[ID_COLUMN]))
    with corruption_named(files):
        parts = [{k: np.asarray(v) for k, v in step(batch).items()}
                 for batch in dataset]
    return merge(parts)
