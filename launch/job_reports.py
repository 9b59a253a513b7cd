"""Reports of a training job beside its summary: ``restore.json`` after a
resume, and the per-epoch coverage of the train split."""

from __future__ import annotations

from pathlib import Path

from psrec.data.files import write_json_atomic
from psrec.ps_cluster.coverage import coverage_warning
from psrec.uri_path import as_path


def write_restore_report(workdir: str | Path, trainer, path: str) -> None:
    """``restore.json``: sha256 of every restored table, so a restore can be
    audited against the checkpoint file independently."""
    import hashlib

    import numpy as np
    tables = {}
    for name, variable in trainer.model.sparse_arch.tables.items():
        shards = getattr(variable, "variables", [variable])
        values = np.concatenate([s.numpy() for s in shards], axis=0)
        tables[name] = hashlib.sha256(values.tobytes()).hexdigest()
    report = {"checkpoint": path, "step": int(trainer.progress.step.numpy()),
              "table_sha256": tables}
    write_json_atomic(as_path(workdir) / "restore.json", report)


def input_options(config, trainer, manifest) -> dict:
    """``make_train_dataset_fn`` options of the job's ``--input-mode``
    (the tf.data service address, its job name, the first epoch)."""
    from psrec.ps_cluster.data_service import dispatcher_address
    from psrec.ps_cluster.data_service import service_options
    return service_options(
        config.input.mode, dispatcher_address(),
        int(trainer.progress.resumes.numpy()),
        int(trainer.progress.step.numpy()),
        config.input.batch_size * trainer.micro_batches,
        manifest.rows("train"))


def coverage_fields(result, mode: str, log=print) -> dict:
    """``coverage`` and ``coverage_warning`` of the job summary (the
    warning is also logged)."""
    warning = coverage_warning(list(result.coverage), mode)
    if warning:
        log(f"psrec: warning: {warning}")
    return {"coverage": [c.to_dict() for c in result.coverage],
            "coverage_warning": warning, "input_mode": mode}


def coverage_lines(summary) -> list[str]:
    """The summary's coverage lines: one per epoch, then the warning."""
    if not summary.coverage:
        return []
    lines = [f"  input:       --input-mode {summary.input_mode}; rows "
             "trained on per epoch (this coordinator session):"]
    for c in summary.coverage:
        text = (f"    epoch {c['epoch']}: {c['seen']} of {c['rows']} train "
                f"rows seen ({100 * c['fraction']:.2f}%)")
        if c["repeats"]:
            text += f", {c['repeats']} seen twice or more"
        if not c["finished"]:
            text += " (not judged: mixed with the next epoch at the end)"
        lines.append(text)
    if summary.coverage_warning:
        lines.append(f"  WARNING: {summary.coverage_warning}")
    return lines
