"""Checkpoint -> serving SavedModel, and checkpoint evaluation, without a
cluster: the model is rebuilt with plain variables from ``job.json`` and
restored (verified by value) from the chosen checkpoint: ``latest``,
``best`` (``best.json``, see :mod:`psrec.ps_cluster.checkpoint.best`) or ``ckpt-N``;
by default the best when the run recorded one, else the latest.

A run trained on negatives kept at rate ``R`` (``psrec convert
--neg-sample-rate``) is evaluated and exported with ``log(R)`` added to its
logits (see :func:`~psrec.launch.job.data.training_neg_sample_rate`); the
export records ``R`` in ``psrec_export.json`` beside ``saved_model.pb``.

Exports are versioned as TF Serving expects: ``OUT/<version>/`` (published
atomically, never overwritten; :mod:`psrec.models.serving.versions`), each with
warmup requests built from the run's eval rows
(:mod:`psrec.models.serving.warmup`; a retrieval export's hold their query
features)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

from psrec.data.convert.catalogue import Catalogue
from psrec.data.convert.sampling import logit_shift
from psrec.data.format.files import write_json_atomic
from psrec.data.format.manifest import Manifest
from psrec.data.format.records import corruption_named
from psrec.data.input.dataset import make_eval_dataset
from psrec.errors import ConfigError
from psrec.launch.job.config import JobConfig
from psrec.launch.job.config import check_curves
from psrec.launch.job.data import training_neg_sample_rate
from psrec.models.build import build_model
from psrec.models.embedding.quantize import table_storage
from psrec.models.ranking.model import RankingModel
from psrec.models.ranking.model import shifted_outputs
from psrec.models.retrieval.config import RECALL_KS
from psrec.models.serving.config import ExportConfig
from psrec.models.serving.export import export_outputs
from psrec.models.serving.export import export_saved_model
from psrec.models.serving.retrieval_export import QUERY_TOWER_DIR
from psrec.models.serving.retrieval_export import export_retrieval
from psrec.models.serving.retrieval_export import query_spec
from psrec.models.serving.split_export import publish_split
from psrec.models.serving.versions import ExportVersion
from psrec.models.serving.versions import publish
from psrec.models.serving.warmup import warmup_rows
from psrec.models.serving.warmup import write_warmup
from psrec.progress import SILENT
from psrec.progress import Progress
from psrec.ps_cluster.checkpoint.best import choose_checkpoint
from psrec.ps_cluster.checkpoint.keeper import CheckpointKeeper
from psrec.ps_cluster.evaluation.breakdown import Breakdown
from psrec.ps_cluster.evaluation.curves import Curves
from psrec.ps_cluster.evaluation.curves import bucket_statistics
from psrec.ps_cluster.evaluation.metrics import EvalResult
from psrec.ps_cluster.evaluation.metrics import add_statistics
from psrec.ps_cluster.evaluation.metrics import eval_statistics
from psrec.ps_cluster.evaluation.metrics import merge
from psrec.ps_cluster.retrieval.metrics import RetrievalEvalResult
from psrec.ps_cluster.retrieval.trainer import RetrievalTrainer
from psrec.uri_path import as_path


def restore_plain_model(checkpoint_dir: str | Path,
                        checkpoint: str | None = None
                        ) -> tuple[RankingModel, JobConfig, str]:
    """The trained model with plain (unsharded) variables, its job record
    and the restored checkpoint's path; FileNotFoundError without a
    job.json or a checkpoint."""
    record = JobConfig.read(checkpoint_dir)
    model = build_model(record.spec, record.retrieval or record.model)
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


@dataclasses.dataclass(frozen=True)
class ExportReport:
    """One published export version.

    Attributes:
      path: the version folder (``root/<version>``), a SavedModel.
      root: the versioned export folder.
      neg_sample_rate: the training data's negative sampling rate (the
        serving logits are corrected by its log).
      warmup: where the warmup requests' rows came from.
      bundle: a split export's kind, base and rows per table
        (:meth:`~psrec.models.serving.bundle.Bundle.summary`); None for a
        SavedModel.
    """

    path: str
    version: int
    root: str
    checkpoint: str
    neg_sample_rate: float
    warmup: str
    bundle: dict | None = None

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def run_manifest(checkpoint_dir: str | Path) -> Manifest | None:
    """The manifest a run trained on (its ``job.json``'s data, else the
    data it generated in its workdir); None when it cannot be loaded."""
    record = JobConfig.read(checkpoint_dir)
    data = record.data or as_path(record.workdir) / "data" / "tfrecord"
    try:
        return Manifest.load(data)
    except ConfigError:  # ManifestError: moved, deleted or never written
        return None


def export_checkpoint(checkpoint_dir: str | Path, out_dir: str | Path,
                      checkpoint: str | None = None, *,
                      version: int | None = None,
                      manifest: Manifest | None = None,
                      config: ExportConfig = ExportConfig()) -> ExportReport:
    """Exports a checkpoint of a training run as version ``version`` (None:
    the next) of the export folder ``out_dir`` (a path or URI).

    Args:
      checkpoint: ``latest``, ``best`` or ``ckpt-N``; None: the best when
        the run recorded one, else the latest.
      manifest: the run's data, for the warmup rows; None: the one its
        ``job.json`` names (:func:`run_manifest`).
      config: how the SavedModel stores its tables (a ranking run's only).

    Raises:
      ConfigError: ``version`` exists already (see
        :func:`psrec.models.serving.versions.publish`); a table dtype other
        than float32 for a retrieval run.
    """
    run = JobConfig.read(checkpoint_dir)
    config.check_task(run.retrieval is not None, str(checkpoint_dir),
                      labels=run.spec.label_names)
    model, record, path = restore_plain_model(
        checkpoint_dir, _chosen(checkpoint_dir, checkpoint))
    if record.retrieval is not None:  # top-K model, query tower, embeddings
        published, source = publish_retrieval(
            model, record, path, manifest or run_manifest(checkpoint_dir),
            str(out_dir), version, EXPORT_INFO)
        return ExportReport(path=published.path, version=published.version,
                            root=str(out_dir), checkpoint=path,
                            neg_sample_rate=1.0, warmup=source)
    rate = training_neg_sample_rate(checkpoint_dir)
    if config.split:  # dense SavedModel + tables as Parquet, no warmup
        bundle = publish_split(model, record.spec, out_dir, {
            "step": choose_checkpoint(checkpoint_dir, checkpoint).step,
            "checkpoint": path, "spec_hash": record.spec.fingerprint(),
            "label": record.spec.label.name, "neg_sample_rate": rate,
            "logit_shift": logit_shift(rate)}, version, config.delta_since)
        return ExportReport(path=bundle.path, version=bundle.version,
                            root=str(out_dir), checkpoint=path,
                            neg_sample_rate=rate, warmup=SPLIT_WARMUP,
                            bundle=bundle.summary())
    if manifest is None:
        manifest = run_manifest(checkpoint_dir)
    rows = warmup_rows(record.spec, manifest)
    root = str(out_dir)
    name = _model_name(root)

    storage = table_storage(model.sparse_arch, config.table_dtype)

    def write(folder: str) -> None:
        export_saved_model(model, record.spec, folder,
                           logit_shift=logit_shift(rate),
                           table_dtype=config.table_dtype)
        write_json_atomic(os.path.join(folder, EXPORT_INFO), {
            "checkpoint": path, "spec_hash": record.spec.fingerprint(),
            "label": record.spec.label.name, "neg_sample_rate": rate,
            "logit_shift": logit_shift(rate), "warmup": rows.source,
            "table_dtype": config.table_dtype, "tables": storage,
            **({"tasks": export_outputs(record.spec)}
               if record.spec.multi_task else {})})
        write_warmup(folder, rows.inputs, name)

    published = publish(root, write, version)
    return ExportReport(path=published.path, version=published.version,
                        root=root, checkpoint=path, neg_sample_rate=rate,
                        warmup=rows.source)


EXPORT_INFO = "psrec_export.json"
#: What a split export says of warmup requests (its dense model's inputs are
#: rows of the key-value store, which TF Serving warmup cannot know).
SPLIT_WARMUP = "none (split export)"


def _model_name(root: str) -> str:
    """The model name warmup requests carry: the export folder's name (TF
    Serving answers them whatever name they carry)."""
    return os.path.basename(root.rstrip("/")) or "model"


def sampling_note(rate: float) -> str:
    """What the CLI says about the logit correction ("" without one)."""
    if rate >= 1.0:
        return ""
    return (f"; logits corrected by log({rate:g}) = {logit_shift(rate):.4f} "
            "(train negatives kept at --neg-sample-rate "
            f"{rate:g})")


def evaluate_checkpoint(checkpoint_dir: str | Path, manifest: Manifest,
                        split: str = "eval", batch_size: int = 4096,
                        checkpoint: str | None = None,
                        neg_sample_rate: float | None = None, *,
                        progress: Progress = SILENT,
                        curves: bool = False,
                        breakdown: Breakdown = Breakdown(),
                        exclude_seen: bool = True
                        ) -> EvalResult | tuple[EvalResult, Curves]:
    """AUC/logloss/calibration of a checkpoint on a split (every example
    once), on logits corrected by ``log(neg_sample_rate)``.

    Args:
      checkpoint: as in :func:`export_checkpoint`.
      neg_sample_rate: the share of negatives the model's training data
        kept; None: the run's (:func:`training_neg_sample_rate`; not the
        rate of ``manifest``, whose eval split is never sampled).
      progress: told the rows evaluated (total: the split's rows).
      curves: also count the probability buckets of
        :func:`~psrec.ps_cluster.evaluation.curves.bucket_statistics` in
        the same pass and return ``(result, Curves)`` (a binary-label
        ranking run only).
      breakdown: GAUC and slices to add (``--group-by``, ``--slice-by``;
        checked by the caller: ``check_breakdown``).
      exclude_seen: a retrieval run's eval pairs are ranked without their
        users' train candidates (when the data has the seen lists).

    Raises:
      ConfigError: the manifest has no rows in ``split`` (exit 2); with
        ``curves``, a retrieval or regression run (exit 2).
    """
    files = manifest.files(split) if manifest.shards.get(split) else []
    if not files or manifest.rows(split) == 0:
        hint = ("convert with --eval-fraction (e.g. 0.1) to hold out eval "
                "rows" if split == "eval" else "convert training data")
        raise ConfigError(f"{manifest.root / 'manifest.json'} has no "
                          f"{split} split: {hint}.")
    if curves:
        check_curves(JobConfig.read(checkpoint_dir))
    if JobConfig.read(checkpoint_dir).retrieval is not None:  # recall@k
        return evaluate_retrieval(checkpoint_dir, _chosen(
            checkpoint_dir, checkpoint), manifest, split, batch_size,
            exclude_seen)
    model, record, _ = restore_plain_model(
        checkpoint_dir, _chosen(checkpoint_dir, checkpoint))
    manifest.verify(record.spec.fingerprint(), checksums=False)
    dataset = make_eval_dataset(files, record.spec, batch_size,
                                manifest.block_rows)
    spec, label = record.spec, record.spec.label.name
    shift = logit_shift(training_neg_sample_rate(checkpoint_dir)
                        if neg_sample_rate is None else neg_sample_rate)

    def statistics(batch):
        outputs = shifted_outputs(model, spec, shift, batch)
        stats = eval_statistics(spec, outputs, batch, breakdown)
        if curves:  # a single binary label (check_curves)
            stats.update(bucket_statistics(batch[label], outputs))
        return stats

    step = tf.function(statistics)
    total = None
    with corruption_named(files), progress.task(
            f"eval ({split} split)", manifest.rows(split), "rows") as task:
        for batch in dataset:
            part = {k: np.asarray(v) for k, v in step(batch).items()}
            total = part if total is None else add_statistics([total, part])
            task.advance(int(tf.shape(batch[label])[0]))
    result = merge([total], breakdown, record.spec)
    return (result, Curves.from_totals(total)) if curves else result


# ``psrec export`` and ``psrec eval`` of a retrieval run.

#: Candidates the top-K SavedModel returns per query.
EXPORT_K = max(RECALL_KS)


def publish_retrieval(model, record, checkpoint: str,
                      manifest: Manifest | None, out_dir: str,
                      version: int | None, info_name: str,
                      k: int = EXPORT_K) -> tuple[ExportVersion, str]:
    """Publishes version ``version`` (None: the next) of ``out_dir`` from
    the restored ``model`` of job ``record`` (checkpoint ``checkpoint``),
    with ``info_name`` (``psrec_export.json``) describing it and warmup
    requests of the query features of the first eval rows in both the
    top-K model and its query tower; returns the version and where the
    warmup rows came from.

    Raises:
      ConfigError: the run's data (and so its catalogue) is unknown.
    """
    if manifest is None:
        raise ConfigError(
            f"the data of the run of {checkpoint} (job.json `data`) cannot "
            "be loaded: a retrieval export needs its candidate catalogue "
            "(candidates.parquet beside the manifest).")
    catalogue = Catalogue.load(manifest.root, record.spec)
    rows = warmup_rows(record.spec, manifest,
                       serving_spec=query_spec(record.spec))
    name = _model_name(str(out_dir))

    def write(folder: str) -> None:
        written = export_retrieval(model, record.spec, catalogue, folder, k)
        write_json_atomic(os.path.join(folder, info_name), {
            "checkpoint": checkpoint,
            "spec_hash": record.spec.fingerprint(), **written,
            "warmup": rows.source})
        for saved_model in (folder, tf.io.gfile.join(folder,
                                                     QUERY_TOWER_DIR)):
            write_warmup(saved_model, rows.inputs, name)

    return publish(str(out_dir), write, version), rows.source


def evaluate_retrieval(checkpoint_dir: str, checkpoint: str,
                       manifest: Manifest, split: str = "eval",
                       batch_size: int = 4096, exclude_seen: bool = True
                       ) -> RetrievalEvalResult:
    """Exact recall@k and MRR of checkpoint ``checkpoint`` (a path) of the
    retrieval run in ``checkpoint_dir`` on ``split`` of ``manifest``,
    against the catalogue of ``manifest`` (less each pair's user's train
    candidates with ``exclude_seen``, whatever the run recorded)."""
    record = JobConfig.read(checkpoint_dir)
    manifest.verify(record.spec.fingerprint(), checksums=False)
    trainer = RetrievalTrainer(
        tf.distribute.OneDeviceStrategy("/cpu:0"), record.spec,
        dataclasses.replace(record.retrieval, exclude_seen=exclude_seen),
        record.optimizer, record.input,
        catalogue=Catalogue.load(manifest.root, record.spec))
    CheckpointKeeper(checkpoint_dir, tf.train.Checkpoint(
        model=trainer.model)).restore(checkpoint, model_only=True)
    return trainer.evaluate(manifest, batch_size, split)
