"""``psrec export`` and ``psrec eval`` of a retrieval run.

Export: the checkpoint's two-tower model (restored with plain variables by
``launch.exporting``) and the catalogue of the run's data -> one export
version holding the top-K SavedModel, the query tower and the candidate
embeddings (:mod:`psrec.models.retrieval_export`). Eval: the exact
recall@k/MRR of the trainer, on one device, no cluster."""

from __future__ import annotations

import os

import tensorflow as tf

from psrec.data.catalogue import Catalogue
from psrec.data.files import write_json_atomic
from psrec.data.manifest import Manifest
from psrec.errors import ConfigError
from psrec.launch.job_config import JobConfig
from psrec.models.retrieval_config import RECALL_KS
from psrec.models.retrieval_export import export_retrieval
from psrec.models.versions import ExportVersion
from psrec.models.versions import publish
from psrec.ps_cluster.checkpoint import CheckpointKeeper
from psrec.ps_cluster.retrieval_metrics import RetrievalEvalResult
from psrec.ps_cluster.retrieval_trainer import RetrievalTrainer

#: Candidates the top-K SavedModel returns per query.
EXPORT_K = max(RECALL_KS)


def publish_retrieval(model, record, checkpoint: str,
                      manifest: Manifest | None, out_dir: str,
                      version: int | None, info_name: str,
                      k: int = EXPORT_K) -> ExportVersion:
    """Publishes version ``version`` (None: the next) of ``out_dir`` from
    the restored ``model`` of job ``record`` (checkpoint ``checkpoint``),
    with ``info_name`` (``psrec_export.json``) describing it.

    Raises:
      ConfigError: the run's data (and so its catalogue) is unknown.
    """
    if manifest is None:
        raise ConfigError(
            f"the data of the run of {checkpoint} (job.json `data`) cannot "
            "be loaded: a retrieval export needs its candidate catalogue "
            "(candidates.parquet beside the manifest).")
    catalogue = Catalogue.load(manifest.root, record.spec)

    def write(folder: str) -> None:
        written = export_retrieval(model, record.spec, catalogue, folder, k)
        write_json_atomic(os.path.join(folder, info_name), {
            "checkpoint": checkpoint,
            "spec_hash": record.spec.fingerprint(), **written})

    return publish(str(out_dir), write, version)


def evaluate_retrieval(checkpoint_dir: str, checkpoint: str,
                       manifest: Manifest, split: str = "eval",
                       batch_size: int = 4096) -> RetrievalEvalResult:
    """Exact recall@k and MRR of checkpoint ``checkpoint`` (a path) of the
    retrieval run in ``checkpoint_dir`` on ``split`` of ``manifest``,
    against the catalogue of ``manifest``."""
    record = JobConfig.read(checkpoint_dir)
    manifest.verify(record.spec.fingerprint(), checksums=False)
    trainer = RetrievalTrainer(
        tf.distribute.OneDeviceStrategy("/cpu:0"), record.spec,
        record.retrieval, record.optimizer, record.input,
        catalogue=Catalogue.load(manifest.root, record.spec))
    CheckpointKeeper(checkpoint_dir, tf.train.Checkpoint(
        model=trainer.model)).restore(checkpoint, model_only=True)
    return trainer.evaluate(manifest, batch_size, split)
