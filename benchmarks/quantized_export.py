"""Size and scores of ``psrec export --table-dtype float32|float16|int8``.

Exports the chosen checkpoint of a trained run three times (one per table
dtype) into ``--out``, scores the raw Parquet rows with each export (plain
``tf.saved_model.load``, via ``psrec.models.serving.scoring.score_files``)
and reports, per dtype, on the eval rows (the last ``--eval-fraction`` of
the rows by row id: ``psrec convert``'s default ``tail`` split): the bytes
of ``variables/``, of the table variables in it, the largest
``|p - p_float32|`` and the AUC. One JSON line per dtype on stdout.

Usage::

    python benchmarks/quantized_export.py runs/dcn/checkpoints raw \\
        --out /tmp/quantized --eval-fraction 0.2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psrec.runtime import configure_environment  # noqa: E402

configure_environment()

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import tensorflow as tf  # noqa: E402

from psrec.launch.job.config import JobConfig  # noqa: E402
from psrec.launch.job.export import export_checkpoint  # noqa: E402
from psrec.models.serving.config import TABLE_DTYPES  # noqa: E402
from psrec.models.serving.config import ExportConfig  # noqa: E402
from psrec.models.serving.scoring import score_files  # noqa: E402


def _auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Exact ROC AUC, ties counted half (average ranks)."""
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    values, inverse, counts = np.unique(scores, return_inverse=True,
                                        return_counts=True)
    sums = np.bincount(inverse, ranks)
    ranks = (sums / counts)[inverse]
    positive = labels == 1
    n_pos, n_neg = positive.sum(), (~positive).sum()
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2)
                 / (n_pos * n_neg))


def _table_bytes(folder: str, rows: set[int]) -> int:
    """Bytes of the 2-D variables with a table's row count."""
    reader = tf.train.load_checkpoint(f"{folder}/variables/variables")
    dtypes = reader.get_variable_to_dtype_map()
    return sum(dtypes[k].size * int(np.prod(s)) for k, s in
               reader.get_variable_to_shape_map().items()
               if len(s) == 2 and s[0] in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint_dir")
    parser.add_argument("raw", help="the raw Parquet rows the run converted")
    parser.add_argument("--out", required=True)
    parser.add_argument("--eval-fraction", type=float, default=0.2)
    args = parser.parse_args()
    spec = JobConfig.read(args.checkpoint_dir).spec
    rows = {t.rows for t in spec.tables}
    base = None
    for dtype in TABLE_DTYPES:
        out = Path(args.out) / dtype
        report = export_checkpoint(args.checkpoint_dir, out,
                                   config=ExportConfig(table_dtype=dtype))
        scores = Path(args.out) / f"scores-{dtype}.parquet"
        score_files(report.path, [args.raw], scores)
        table = pq.read_table(scores)
        row = table.column("row").to_numpy()
        total = len(row)
        eval_rows = row >= total - int(round(total * args.eval_fraction))
        p = table.column("probability").to_numpy()[eval_rows]
        labels = table.column("label").to_numpy()[eval_rows]
        if base is None:
            base = p
        variables = sum(f.stat().st_size for f in
                        (Path(report.path) / "variables").iterdir())
        print(json.dumps({
            "table_dtype": dtype, "variables_bytes": variables,
            "table_bytes": _table_bytes(report.path, rows),
            "eval_rows": int(eval_rows.sum()),
            "max_abs_dp": float(np.abs(p - base).max()),
            "auc": round(_auc(labels, p), 6)}), flush=True)


if __name__ == "__main__":
    main()
