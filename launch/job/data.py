"""The data of a job: generated when none is given, checked once before any
server starts, and the check recorded so restarted coordinators (and the
local multi-worker-mirrored workers) do not read all the data again."""

from __future__ import annotations

import json
from pathlib import Path

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.convert.sampling import logit_shift
from psrec.data.format.files import write_json_atomic
from psrec.data.format.manifest import Manifest
from psrec.data.format.manifest import ManifestError
from psrec.data.ingest.synthetic import write_synthetic_parquet
from psrec.data.input.dataset import NotEnoughShardsError
from psrec.data.input.integrity import check_disjoint_splits
from psrec.data.input.integrity import repair_corrupted_shards
from psrec.launch.job.config import JobConfig
from psrec.launch.monitor.progress_bar import ProgressBar
from psrec.models.optim.sizing import estimate_replicated_bytes
from psrec.models.serving.versions import check_root
from psrec.progress import Progress
from psrec.ps_cluster.checkpoint.keeper import check_output_folder
from psrec.uri import require_tf_filesystem
from psrec.uri_path import UriPath
from psrec.uri_path import as_path


def input_pipelines(config: JobConfig) -> int:
    """Processes that read their own share of the train files."""
    return (config.workers if config.strategy.kind in (
        "ps", "multi-worker-mirrored") else 1)


def prepare_data(config: JobConfig, log=print, *,
                 progress: Progress | None = None) -> Manifest:
    """Returns a manifest that is safe to train on; nothing here needs a
    server, so bad data is refused before any role starts.

    First the checkpoint (and export) folders and ``--data``
    (:func:`check_output_folders`). Generates and converts the default
    synthetic data when no data is given (reused when already converted with
    the same spec, so a rerun resumes instead of regenerating). Then checks:
    the spec hash, every shard (presence, size, sha256; corrupted shards
    repaired within ``max_corrupt_records``), that train and eval splits share
    no example, and that there are enough train shards for the workers.
    ``progress`` shows each pass over the data; None: bars on stderr.
    """
    check_output_folders(config)
    progress = ProgressBar() if progress is None else progress
    if config.data is not None:
        manifest = Manifest.load(config.data)
    else:
        root = as_path(config.workdir) / "data"
        try:
            manifest = Manifest.load(root / "tfrecord")
            manifest.check_spec(config.spec.fingerprint())
        except ManifestError:
            manifest = _generate(config, root, log, progress)
    manifest.check_spec(config.spec.fingerprint())
    manifest.require_rows("train")
    manifest, repair = repair_corrupted_shards(
        manifest, as_path(config.workdir) / "repaired",
        config.max_corrupt_records, checksums=config.verify_checksums,
        progress=progress)
    if repair is not None:
        log(repair.summary())
    if config.verify_checksums:  # both read every byte of the data
        check_disjoint_splits(manifest, progress=progress)
    check_enough_shards(config, manifest)
    return manifest


def check_enough_shards(config: JobConfig, manifest: Manifest,
                        what: str = "") -> None:
    """Every input pipeline (worker) gets its own train shard; ``what``
    names the data in the error (a followed partition)."""
    pipelines = input_pipelines(config)
    if len(manifest.files("train")) < pipelines:
        raise NotEnoughShardsError(
            f"{what}{len(manifest.files('train'))} train shards cannot feed "
            f"{pipelines} workers without overlap; convert with "
            f"`--shards {pipelines}` or more.")


def check_output_folders(config: JobConfig) -> None:
    """Before any server starts: the checkpoint folder (and with
    ``export`` the export folder) is writable with room for one checkpoint
    -- tables, optimizer slots and dense weights (``models.optim.sizing``) -- or
    one export (tables and dense weights)."""
    if config.data is not None:  # TFRecords are read by TensorFlow
        require_tf_filesystem(config.data, "--data")
    size = estimate_replicated_bytes(config.spec, config.model,
                                     config.optimizer)
    check_output_folder(config.checkpoint_dir, size.total_bytes,
                        "checkpoint")
    if config.export:
        export = as_path(config.workdir) / "export"
        check_output_folder(export, size.table_bytes + size.dense_bytes,
                            "export")
        check_root(str(export))  # not at the end


VERIFIED_FILE = "verified-data.json"


def record_verified(config: JobConfig, manifest: Manifest
                    ) -> Path | UriPath:
    """Notes in the workdir that ``manifest`` passed :func:`prepare_data`
    (with the repaired shards it uses); see the module docstring."""
    original = Manifest.load(manifest.root)
    replaced = {
        before.file: after.file
        for split in original.shards
        for before, after in zip(original.shards[split],
                                 manifest.shards[split])
        if before.file != after.file}
    return write_json_atomic(as_path(config.workdir) / VERIFIED_FILE, {
        "manifest": str(manifest.root.resolve()),
        "spec_hash": config.spec.fingerprint(), "replaced": replaced})


def load_verified(config: JobConfig) -> Manifest:
    """The manifest :func:`record_verified` noted for this job; a
    ManifestError without a record, or with one of other data or spec."""
    check_output_folders(config)  # again: a restart may find a full disk
    path = as_path(config.workdir) / VERIFIED_FILE
    if not path.is_file():
        raise ManifestError(f"{path} is missing: the data was not checked by "
                            "its launcher; rerun `psrec train`, which "
                            "checks it first.")
    record = json.loads(path.read_text())
    root = as_path(record["manifest"])
    wanted = (as_path(config.data) if config.data is not None
              else as_path(config.workdir) / "data" / "tfrecord")
    if wanted.is_file():
        wanted = wanted.parent
    if (record["spec_hash"] != config.spec.fingerprint()
            or wanted.resolve() != root):
        raise ManifestError(f"{path} records other data or another spec than "
                            "this job; rerun `psrec train`, which checks it "
                            "first.")
    return Manifest.load(root).with_files(record["replaced"])


def _generate(config: JobConfig, root: Path | UriPath, log, progress: Progress
              ) -> Manifest:
    synthetic = config.synthetic
    log(f"generating {synthetic.rows:,} synthetic rows for spec "
        f"{config.spec.name!r} (embedded default data) ...")
    files = write_synthetic_parquet(config.spec, root / "parquet",
                                    synthetic.rows, files=synthetic.files,
                                    seed=synthetic.seed)
    report = convert(files, config.spec, root / "tfrecord", ConversionOptions(
        shards=max(synthetic.shards, input_pipelines(config)),
        eval_fraction=synthetic.eval_fraction, overwrite=True),
        progress=progress)  # the workdir's own data, remade for its spec
    log(report.summary())
    return report.manifest


SAMPLING_FILE = "sampling.json"


def record_sampling(checkpoint_dir: str | Path, manifest: Manifest,
                    log=print) -> Path | UriPath:
    """Notes beside the checkpoints the negative sampling of the training
    data (``sampling.json``), which evaluation and the export correct for
    with ``log(neg_sample_rate)`` even when the data is gone."""
    rate = manifest.neg_sample_rate
    if rate < 1.0:
        log(f"train negatives were kept at rate {rate:g} (--neg-sample-rate):"
            f" evaluation and the export add log({rate:g}) = "
            f"{logit_shift(rate):.4f} to the logits")
    return write_json_atomic(as_path(checkpoint_dir) / SAMPLING_FILE, {
        "neg_sample_rate": rate, "logit_shift": logit_shift(rate),
        "manifest": str(manifest.root.resolve())})


def training_neg_sample_rate(checkpoint_dir: str | Path) -> float:
    """The ``neg_sample_rate`` of a run's training data: from
    ``sampling.json``; for a run without one (trained before psrec sampled,
    or by the library directly), from the manifest its ``job.json`` names
    when that is readable; else 1.0 (generated data is never sampled)."""
    path = as_path(checkpoint_dir) / SAMPLING_FILE
    if path.is_file():
        return float(json.loads(path.read_text())["neg_sample_rate"])
    data = JobConfig.read(checkpoint_dir).data
    if data is None:
        return 1.0
    try:
        return Manifest.load(data).neg_sample_rate
    except ManifestError:
        return 1.0
