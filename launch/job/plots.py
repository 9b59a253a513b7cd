"""``psrec eval --plots`` and ``psrec train --plots``: the ROC, precision-recall and calibration curves
of an evaluation as SVG files (hand-written, no plotting library) and its
PR curve for TensorBoard's PR-curve plugin.

Where: ``WORKDIR/eval/<checkpoint>-<split>/{roc,pr,calibration}.svg`` and
``curves.json`` (the calibration table with counts), and the TensorBoard
event file in ``WORKDIR/tensorboard/eval-<checkpoint>-<split>/`` (a run of
its own beside the training run's), where WORKDIR is the folder holding
the checkpoint folder.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np
import tensorflow as tf

from psrec.data.format.files import atomic_output
from psrec.ps_cluster.evaluation.curves import CURVE_BUCKETS
from psrec.ps_cluster.evaluation.curves import Curves
from psrec.uri_path import UriPath
from psrec.uri_path import as_path

PLOT_FILES = ("roc.svg", "pr.svg", "calibration.svg")
PR_CURVE_TAG = "eval/pr_curves"  # the plugin's tag for the name "eval"

# The drawing: a square plot area with margins for ticks and labels.
_SIZE, _LEFT, _TOP, _PLOT = 480, 64, 40, 380
#: Axis limits the calibration plot zooms to: the smallest that holds
#: 99.5% of the examples (a CTR model's predictions crowd near 0).
_ZOOMS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


@dataclasses.dataclass(frozen=True)
class PlotFiles:
    """Where :func:`write_plots` wrote."""

    folder: str
    tensorboard: str

    def to_dict(self) -> dict[str, str]:
        return {"folder": self.folder, "tensorboard": self.tensorboard,
                **{f.split(".")[0]: f"{self.folder}/{f}" for f in PLOT_FILES}}

    def summary(self) -> str:
        return (f"plots: {self.folder}/{{{','.join(PLOT_FILES)}}}; PR curve "
                f"for TensorBoard in {self.tensorboard}")


def plot_folders(checkpoint_dir: str | Path, checkpoint: str, split: str
                 ) -> tuple[Path | UriPath, Path | UriPath]:
    """The SVG folder and the TensorBoard folder of the plots of
    ``checkpoint`` (``best/best-80``, ``ckpt-400``) on ``split``."""
    workdir = as_path(checkpoint_dir).parent
    name = f"{checkpoint.replace('/', '-')}-{split}"
    return workdir / "eval" / name, workdir / "tensorboard" / f"eval-{name}"


def write_plots(curves: Curves, checkpoint_dir: str | Path, checkpoint: str,
                split: str, step: int) -> PlotFiles:
    """Writes the three SVG files, ``curves.json`` and the PR-curve
    summary (at ``step``, the checkpoint's) of ``curves``."""
    folder, board = plot_folders(checkpoint_dir, checkpoint, split)
    folder.mkdir(parents=True, exist_ok=True)
    title = f"{checkpoint} ({split} split)"
    _write(folder / "roc.svg", roc_svg(curves, title))
    _write(folder / "pr.svg", pr_svg(curves, title))
    _write(folder / "calibration.svg", calibration_svg(curves, title))
    _write(folder / "curves.json", json.dumps(
        {"checkpoint": checkpoint, "split": split, "auc": curves.auc,
         "average_precision": curves.average_precision(),
         "buckets": CURVE_BUCKETS, "calibration": curves.calibration()},
        indent=2) + "\n")
    write_pr_curve(curves, str(board), step)
    return PlotFiles(str(folder), str(board))


def write_pr_curve(curves: Curves, logdir: str, step: int) -> None:
    """The PR curve at ``CURVE_BUCKETS + 1`` probability thresholds as a
    ``pr_curves`` summary (TensorBoard's PR-curve plugin) in ``logdir``."""
    from tensorboard.plugins.pr_curve import summary as pr_summary
    counts = curves.threshold_counts()
    proto = pr_summary.raw_data_pb(
        PR_CURVE_TAG.split("/")[0], true_positive_counts=counts["tp"],
        false_positive_counts=counts["fp"],
        true_negative_counts=counts["tn"],
        false_negative_counts=counts["fn"], precision=counts["precision"],
        recall=counts["recall"], num_thresholds=CURVE_BUCKETS + 1,
        description=f"AUC {curves.auc:.4f}; thresholds i/{CURVE_BUCKETS}")
    writer = tf.summary.create_file_writer(logdir)
    with writer.as_default():
        tf.summary.experimental.write_raw_pb(proto.SerializeToString(), step)
    writer.close()


def _write(path, text: str) -> None:
    with atomic_output(path) as tmp:
        tmp.write_text(text)


# -- SVG ------------------------------------------------------------------------


def _ticks(limit: float) -> list[float]:
    return [limit * i / 5 for i in range(6)]


def _chart(title: str, xlabel: str, ylabel: str, limit: float,
           body: list[str]) -> str:
    """An SVG document: axes from 0 to ``limit`` (both), ticks, labels,
    ``title``, and ``body`` (elements in plot coordinates drawn by
    :func:`_points`)."""
    bottom = _TOP + _PLOT
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_SIZE}" '
        f'height="{_SIZE}" viewBox="0 0 {_SIZE} {_SIZE}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect width="{_SIZE}" height="{_SIZE}" fill="white"/>',
        f'<text x="{_SIZE / 2}" y="22" text-anchor="middle" '
        f'font-size="13">{escape(title)}</text>',
        f'<rect class="frame" x="{_LEFT}" y="{_TOP}" width="{_PLOT}" '
        f'height="{_PLOT}" fill="none" stroke="black"/>']
    for value in _ticks(limit):
        offset = value / limit * _PLOT
        x, y = _LEFT + offset, bottom - offset
        label = f"{value:.3g}"
        parts += [
            f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" '
            f'y2="{bottom + 4}" stroke="black"/>',
            f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">'
            f'{label}</text>',
            f'<line x1="{_LEFT - 4}" y1="{y:.1f}" x2="{_LEFT}" y2="{y:.1f}" '
            'stroke="black"/>',
            f'<text x="{_LEFT - 7}" y="{y + 4:.1f}" text-anchor="end">'
            f'{label}</text>']
    parts += [
        f'<text x="{_LEFT + _PLOT / 2}" y="{bottom + 34}" '
        f'text-anchor="middle">{escape(xlabel)}</text>',
        f'<text x="16" y="{_TOP + _PLOT / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {_TOP + _PLOT / 2})">{escape(ylabel)}'
        '</text>', *body, '</svg>']
    return "\n".join(parts) + "\n"


def _xy(x: float, y: float, limit: float) -> tuple[float, float]:
    return (_LEFT + x / limit * _PLOT, _TOP + _PLOT - y / limit * _PLOT)


def _polyline(x, y, css: str, limit: float = 1.0, dash: bool = False
              ) -> str:
    points = " ".join("{:.2f},{:.2f}".format(*_xy(a, b, limit))
                      for a, b in zip(x, y))
    style = ' stroke-dasharray="5,4"' if dash else ""
    colour = "#888" if dash else "#1f77b4"
    return (f'<polyline class="{css}" fill="none" stroke="{colour}" '
            f'stroke-width="{1 if dash else 2}"{style} points="{points}"/>')


def roc_svg(curves: Curves, title: str) -> str:
    """The ROC curve (false vs true positive rate) with the chance
    diagonal; the AUC in the title."""
    fpr, tpr = curves.roc()
    return _chart(f"ROC {title}: AUC {curves.auc:.4f}",
                  "false positive rate", "true positive rate", 1.0,
                  [_polyline([0, 1], [0, 1], "reference", dash=True),
                   _polyline(fpr, tpr, "curve")])


def pr_svg(curves: Curves, title: str) -> str:
    """The precision-recall curve with the positive rate (a random
    ranking's precision) as the reference; AUC and average precision in
    the title."""
    recall, precision = curves.precision_recall()
    total = curves.pos_hist.sum() + curves.neg_hist.sum()
    rate = curves.pos_hist.sum() / total if total else 0.0
    return _chart(f"PR {title}: AUC {curves.auc:.4f}, AP "
                  f"{curves.average_precision():.4f}", "recall",
                  "precision", 1.0,
                  [_polyline([0, 1], [rate, rate], "reference", dash=True),
                   _polyline(recall, precision, "curve")])


def _zoom(rows: list[dict[str, float]]) -> float:
    if not rows:
        return 1.0
    counts = np.array([r["count"] for r in rows])
    held = np.cumsum(counts) / counts.sum()
    edge = rows[int(np.searchsorted(held, 0.995))]["high"]
    top = max(edge, max(r["positive_rate"] for r in rows
                        if r["high"] <= edge))
    return next((z for z in _ZOOMS if z >= top - 1e-12), 1.0)


def calibration_svg(curves: Curves, title: str) -> str:
    """Observed positive rate against mean predicted probability per
    probability bucket (1/CURVE_BUCKETS wide), the ideal diagonal, and
    each bucket's example count (bars along the bottom, scaled to the
    largest, and in each point's tooltip)."""
    rows = curves.calibration()
    limit = _zoom(rows)
    shown = [r for r in rows if r["high"] <= limit + 1e-12]
    hidden = int(sum(r["count"] for r in rows) - sum(r["count"]
                                                     for r in shown))
    body = [_polyline([0, limit], [0, limit], "reference", limit, dash=True)]
    largest = max((r["count"] for r in shown), default=1.0)
    for r in shown:  # the count bars: up to a fifth of the plot's height
        x0, _ = _xy(r["low"], 0, limit)
        x1, _ = _xy(r["high"], 0, limit)
        height = math.sqrt(r["count"] / largest) * _PLOT / 5
        body.append(f'<rect class="count" x="{x0:.2f}" '
                    f'y="{_TOP + _PLOT - height:.2f}" width="{x1 - x0:.2f}" '
                    f'height="{height:.2f}" fill="#ccc"><title>'
                    f'{int(r["count"])} examples</title></rect>')
    body.append(_polyline([r["mean_prediction"] for r in shown],
                          [min(r["positive_rate"], limit) for r in shown],
                          "curve", limit))
    for r in shown:
        x, y = _xy(r["mean_prediction"], min(r["positive_rate"], limit),
                   limit)
        body.append(
            f'<circle cx="{x:.2f}" cy="{y:.2f}" r="2.5" fill="#1f77b4">'
            f'<title>[{r["low"]:.3f}, {r["high"]:.3f}): {int(r["count"])} '
            f'examples, mean prediction {r["mean_prediction"]:.4f}, '
            f'observed {r["positive_rate"]:.4f}</title></circle>')
    note = (f"; {hidden} examples above {limit:g} not shown" if hidden
            else "")
    return _chart(f"Calibration {title}{note}", "mean predicted probability",
                  "observed positive rate (bars: examples, sqrt scale)",
                  limit, body)
