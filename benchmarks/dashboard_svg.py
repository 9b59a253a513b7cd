"""Draws the Grafana dashboard's panels (``psrec.launch.monitor.dashboard``) as one
SVG, from metrics scraped during a real local ``psrec train`` run.

Not a Grafana screenshot: the script starts ``psrec train --metrics-port``
(synthetic data, 2 workers + 1 PS), scrapes ``/metrics`` every second,
SIGKILLs one worker once a third of the steps are done (the supervisor
restarts it: the restarts panel shows it), and draws each panel's quantity
from the scraped samples the way its query computes it (throughput = rate of
``psrec_train_examples_total`` over the last 5 scrapes, checkpoint age =
scrape time - ``psrec_last_checkpoint_timestamp_seconds``, ...) with
hand-written SVG polylines.

Usage::

    python benchmarks/dashboard_svg.py [--out docs/dashboard.svg]
        [--steps 1200] [--scrapes scrapes.json]

``--scrapes FILE``: also save the scrapes (JSON); with ``--redraw`` draw
from that file instead of running.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from html import escape
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from psrec.launch.monitor.dashboard import panels
from psrec.runtime import role_environment

REPO = Path(__file__).resolve().parents[1]
WIDTH, HEIGHT, PAD = 440, 190, 44
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
          "#e377c2", "#7f7f7f")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                timeout=5) as response:
        text = response.read().decode()
    samples = [[s.name, s.labels, s.value]
               for family in text_string_to_metric_families(text)
               for s in family.samples]
    return {"time": time.time(), "samples": samples}


def run_and_scrape(steps: int, log) -> list[dict]:
    """A real local run, scraped every second until it exits."""
    port = _free_port()
    workdir = tempfile.mkdtemp(prefix="psrec-dashboard-")
    command = [sys.executable, "-m", "psrec", "train", "--workdir", workdir,
               "--synthetic-rows", "100000", "--steps", str(steps),
               "--batch-size", "64", "--steps-per-closure", "5",
               "--eval-every", str(steps // 6), "--checkpoint-every",
               str(steps // 6), "--workers", "2", "--ps", "1",
               "--no-export", "--metrics-port", str(port)]
    process = subprocess.Popen(command, cwd=REPO, env=role_environment(),
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout),
                              daemon=True)
    reader.start()
    scrapes: list[dict] = []
    killed = False
    try:
        while process.poll() is None:
            try:
                scrapes.append(_scrape(port))
            except OSError:
                time.sleep(1.0)
                continue
            step = _value(scrapes[-1], "psrec_train_steps_total")
            roles = re.findall(r"local cluster: .*\(pids ([\d, ]+)\)",
                               "".join(lines))
            if not killed and roles and step and step >= steps / 3:
                worker = int(roles[-1].split(",")[-1])  # the last worker
                os.kill(worker, signal.SIGKILL)
                log(f"step {step:.0f}: killed worker pid {worker}")
                killed = True
            time.sleep(1.0)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        reader.join(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)
    if process.returncode != 0:
        raise SystemExit(f"psrec train exited {process.returncode}:\n"
                         + "".join(lines[-30:]))
    return scrapes


def _value(scrape: dict, name: str, **labels) -> float | None:
    for sample, sample_labels, value in scrape["samples"]:
        if sample == name and all(sample_labels.get(k) == v
                                  for k, v in labels.items()):
            return value
    return None


def _labelled(scrapes: list[dict], name: str, label: str) -> dict:
    """``{label value: [(t, value)]}`` of a labelled metric."""
    series: dict[str, list] = {}
    for scrape in scrapes:
        for sample, labels, value in scrape["samples"]:
            if sample == name:
                series.setdefault(labels[label], []).append(
                    (scrape["time"], value))
    return series


def _gauge(scrapes: list[dict], name: str) -> list:
    return [(s["time"], v) for s in scrapes
            if (v := _value(s, name)) is not None]


def _rate(scrapes: list[dict], name: str, window: int = 5) -> list:
    points = _gauge(scrapes, name)
    return [(t, (v - points[i - window][1]) / (t - points[i - window][0]))
            for i, (t, v) in enumerate(points) if i >= window]


def series_of(title: str, scrapes: list[dict]) -> dict[str, list]:
    """What the panel ``title`` plots, computed from the scrapes as its
    query does."""
    if title.startswith("Throughput"):
        return {"examples/s": _rate(scrapes, "psrec_train_examples_total")}
    if title == "Checkpoint age":
        return {"age": [(s["time"], s["time"] - v) for s in scrapes if (
            v := _value(s, "psrec_last_checkpoint_timestamp_seconds"))]}
    if title == "Restarts by role":
        return _labelled(scrapes, "psrec_restarts_total", "role")
    if title == "Phase":
        return _labelled(scrapes, "psrec_phase", "phase")
    names = {"Training loss": "psrec_train_loss",
             "Eval AUC": "psrec_eval_auc",
             "Heartbeat age": "psrec_heartbeat_age_seconds",
             "Checkpoint duration": "psrec_checkpoint_duration_seconds"}
    return {title.lower(): _gauge(scrapes, names[title])}


def _num(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _timeline(series: dict[str, list], t0: float, t1: float,
              plot_w: float) -> list[str]:
    """A state timeline: one band coloured by the phase at each scrape."""
    current = sorted((t, name) for name, points in series.items()
                     for t, v in points if v == 1.0)
    seen = list(dict.fromkeys(name for _, name in current))
    out = []
    for (t, name), (t_next, _) in zip(current, current[1:] + [(t1, "")]):
        x = PAD + plot_w * (t - t0) / max(1e-9, t1 - t0)
        w = plot_w * (t_next - t) / max(1e-9, t1 - t0)
        out.append(f'<rect x="{x:.1f}" y="60" width="{w + 0.3:.1f}" '
                   f'height="50" fill="{COLORS[seen.index(name)]}"/>')
    for index, name in enumerate(seen):
        out.append(f'<text x="{PAD + 8 + 64 * index}" y="{HEIGHT - 4}" '
                   f'fill="{COLORS[index]}" class="k">{escape(name)}</text>')
    return out


def _panel_svg(title: str, unit: str, kind: str, series: dict[str, list],
               x0: float, t0: float, t1: float, ox: int, oy: int
               ) -> list[str]:
    out = [f'<g transform="translate({ox},{oy})">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#fff" '
           'stroke="#ccc"/>',
           f'<text x="10" y="18" class="t">{escape(title)}</text>']
    values = [v for points in series.values() for _, v in points]
    if not values:
        return out + ['<text x="10" y="40">no data</text></g>']
    plot_w, plot_h = WIDTH - PAD - 10, HEIGHT - 60
    if kind == "state-timeline":
        return out + _timeline(series, t0, t1, plot_w) + ["</g>"]
    # Seconds and counts from 0; loss and AUC zoomed to their range.
    low = min(values) if unit == "none" and "Restarts" not in title else min(
        values + [0.0])
    high = max(values)
    if high - low < 1e-9:
        high = low + 1.0

    def xy(t: float, v: float) -> str:
        x = PAD + plot_w * (t - t0) / max(1e-9, t1 - t0)
        y = 30 + plot_h * (1 - (v - low) / (high - low))
        return f"{x:.1f},{y:.1f}"
    suffix = " s" if unit == "s" else ""
    out += [f'<line x1="{PAD}" y1="30" x2="{PAD}" y2="{30 + plot_h}" '
            'stroke="#999"/>',
            f'<line x1="{PAD}" y1="{30 + plot_h}" x2="{WIDTH - 10}" '
            f'y2="{30 + plot_h}" stroke="#999"/>',
            f'<text x="{PAD - 4}" y="36" class="a">{_num(high)}{suffix}'
            '</text>',
            f'<text x="{PAD - 4}" y="{30 + plot_h}" class="a">'
            f'{_num(low)}{suffix}</text>',
            f'<text x="{WIDTH - 10}" y="{44 + plot_h}" class="a">'
            f'{t1 - x0:.0f} s</text>',
            f'<text x="{PAD}" y="{44 + plot_h}" class="l">'
            f'{t0 - x0:.0f} s</text>']
    for index, (name, points) in enumerate(sorted(series.items())):
        color = COLORS[index % len(COLORS)]
        if points:
            out.append(f'<polyline fill="none" stroke="{color}" '
                       'stroke-width="1.6" points="'
                       + " ".join(xy(t, v) for t, v in points) + '"/>')
        out.append(f'<text x="{PAD + 8 + 64 * index}" y="{HEIGHT - 4}" '
                   f'fill="{color}" class="k">{escape(name)}</text>')
    return out + ["</g>"]


def render(scrapes: list[dict]) -> str:
    """The SVG of every dashboard panel over the scrapes."""
    # From the coordinator's first heartbeat (before it: data preparation
    # and cluster start-up, nothing to draw) to the end of the run.
    scrapes = [s for s in scrapes if _value(
        s, "psrec_phase", phase="connecting") is not None] or scrapes
    t0, t1 = scrapes[0]["time"], scrapes[-1]["time"]
    chosen = panels()
    rows = (len(chosen) + 1) // 2
    width, height = 2 * WIDTH + 30, rows * (HEIGHT + 10) + 50
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" '
           'font-family="sans-serif" font-size="11">',
           "<style>.t{font-weight:bold;font-size:13px}.a{text-anchor:end;"
           "fill:#555}.l{fill:#555}.k{font-size:11px}</style>",
           f'<rect width="{width}" height="{height}" fill="#f4f5f5"/>',
           '<text x="10" y="24" class="t">psrec dashboard panels, drawn '
           'from /metrics scraped every second during a real local run '
           "(a worker SIGKILLed at 1/3 of the steps)</text>"]
    for index, panel in enumerate(chosen):
        unit = panel["fieldConfig"]["defaults"]["unit"]
        out += _panel_svg(panel["title"], unit, panel["type"],
                          series_of(panel["title"], scrapes), t0, t0, t1,
                          10 + (WIDTH + 10) * (index % 2),
                          40 + (HEIGHT + 10) * (index // 2))
    return "\n".join(out + ["</svg>"]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "dashboard.svg"))
    parser.add_argument("--steps", type=int, default=1200,
                        help="about 2 epochs of the 80,000 train rows")
    parser.add_argument("--scrapes", default=None,
                        help="save the scrapes here (JSON)")
    parser.add_argument("--redraw", action="store_true",
                        help="draw from --scrapes instead of running")
    args = parser.parse_args()
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    if args.redraw:
        scrapes = json.loads(Path(args.scrapes).read_text())
    else:
        scrapes = run_and_scrape(args.steps, log)
        if args.scrapes:
            Path(args.scrapes).write_text(json.dumps(scrapes))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(render(scrapes))
    log(f"{len(scrapes)} scrapes drawn to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
