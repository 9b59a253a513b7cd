"""A Grafana dashboard of a psrec training job, over the ``psrec_*``
metrics that ``psrec train --metrics-port`` serves
(:mod:`psrec.launch.monitor.metrics_http`).

:func:`grafana_dashboard` returns the dashboard JSON (a dict) of
:func:`panels`. Its ``datasource`` variable picks the Prometheus data
source at import; its ``job`` variable is the Prometheus ``job`` label of
the scrape (default: the job's name; the list offers every scrape job
that serves ``psrec_build_info``, as the label depends on the scrape
configuration). ``psrec k8s render`` writes it beside the
manifests; import it in Grafana (Dashboards -> New -> Import).
"""

from __future__ import annotations

import re
from typing import Any

#: The Prometheus ``job`` label selector every query uses.
SELECTOR = '{job=~"$job"}'
JOB_QUERY = "label_values(psrec_build_info, job)"


def _panel(title: str, exprs: list[tuple[str, str]], unit: str,
           description: str, kind: str = "timeseries") -> dict[str, Any]:
    return {
        "type": kind, "title": title, "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list",
                               "placement": "bottom"}},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr,
                     "legendFormat": legend,
                     "datasource": {"type": "prometheus",
                                    "uid": "${datasource}"}}
                    for i, (expr, legend) in enumerate(exprs)]}


def panels() -> list[dict[str, Any]]:
    """The dashboard's panels, in reading order (without positions)."""
    s = SELECTOR
    return [
        _panel("Throughput (examples/s)", [
            (f"sum(rate(psrec_train_examples_total{s}[$__rate_interval]))",
             "examples/s")], "short",
            "Training examples per second, all workers."),
        _panel("Training loss", [
            (f"psrec_train_loss{s}", "loss")], "none",
            "Mean loss of the last finished closure."),
        _panel("Eval AUC", [
            (f"psrec_eval_auc{s}", "AUC")], "none",
            "AUC of the last evaluation on the eval split."),
        _panel("Checkpoint age", [
            (f"time() - psrec_last_checkpoint_timestamp_seconds{s}",
             "age")], "s",
            "Seconds since the latest checkpoint was written: the work a "
            "lost PS would cost."),
        _panel("Restarts by role", [
            (f"sum by (role) (psrec_restarts_total{s})", "{{role}}")],
            "none", "Roles the supervisor restarted (workers, PS, the "
            "coordinator)."),
        _panel("Heartbeat age", [
            (f"psrec_heartbeat_age_seconds{s}", "age")], "s",
            "Seconds since the coordinator's last heartbeat; /healthz "
            "fails past --stall-timeout."),
        _panel("Phase", [
            (f"max by (phase) (psrec_phase{s})", "{{phase}}")], "none",
            "The coordinator's phase (1 = current).", "state-timeline"),
        _panel("Checkpoint duration", [
            (f"psrec_checkpoint_duration_seconds{s}", "save")], "s",
            "How long the last checkpoint save took (a SIGTERM's grace "
            "period must cover it)."),
    ]


def grafana_dashboard(job_name: str) -> dict[str, Any]:
    """The Grafana dashboard JSON of the job ``job_name``."""
    laid_out = [{**panel, "id": index + 1, "gridPos": {
        "x": 12 * (index % 2), "y": 8 * (index // 2), "w": 12, "h": 8}}
        for index, panel in enumerate(panels())]
    return {
        "title": f"psrec: {job_name}",
        "uid": _uid(job_name), "tags": ["psrec"], "editable": True,
        "schemaVersion": 39, "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus",
             "type": "datasource", "query": "prometheus", "current": {},
             "hide": 0, "refresh": 1},
            {"name": "job", "label": "Prometheus job label",
             "type": "query", "query": JOB_QUERY,
             "definition": JOB_QUERY,
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "current": {"text": job_name, "value": job_name},
             "refresh": 2, "includeAll": False, "multi": False,
             "hide": 0},
        ]},
        "panels": laid_out,
    }


def _uid(job_name: str) -> str:
    """Grafana uids: at most 40 characters of ``[a-zA-Z0-9-_]``."""
    return ("psrec-" + re.sub(r"[^a-zA-Z0-9_-]+", "-", job_name))[:40]


def expr_metrics(expr: str) -> set[str]:
    """The metric names a panel query reads (label matchers, ranges,
    ``by (...)`` clauses and function names left out)."""
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\bby\s*\([^)]*\)", " ", expr)
    return set(re.findall(r"\b[A-Za-z_:][A-Za-z0-9_:]*\b(?!\s*\()", bare))
