"""The live view of a run: Prometheus ``/metrics`` and ``/healthz`` scraped
from a real ``psrec train`` (served by the supervisor from outside the
run's private network namespace), the Grafana dashboard's queries checked
against what is really exposed, ``/healthz`` over a heartbeat that stopped,
a coordinator of an existing cluster serving its own metrics, and the
TensorBoard events of the run (instantaneous and per-worker examples/s,
eval at every eval, hyper-parameters)."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import re
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from psrec import __version__
from psrec.launch.cli.main import main
from psrec.launch.cli.metrics_flags import reserve_metrics_socket
from psrec.launch.cli.metrics_flags import take_metrics_socket
from psrec.launch.monitor.dashboard import expr_metrics
from psrec.launch.monitor.dashboard import grafana_dashboard
from psrec.launch.monitor.heartbeat import HeartbeatWriter
from psrec.launch.monitor.heartbeat import heartbeat_path
from psrec.launch.monitor.metrics_http import serving
from psrec.ps_cluster.cluster.addresses import free_loopback_ports
from tests._proc import PsrecRun

TIMEOUT = 180
STEPS, EVAL_EVERY = 120, 40


def _get(port: int, path: str) -> tuple[int, str]:
    """(HTTP status, body) of ``GET path``; OSError when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}",
                                    timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _samples(text: str) -> dict[tuple, float]:
    """``{(sample name, sorted labels): value}`` of an exposition."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples}


def _value(samples: dict, name: str, **labels) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@dataclasses.dataclass
class Scrape:
    metrics: dict[tuple, float]
    types: dict[str, str]
    health: tuple[int, str]

    def phase(self) -> str | None:
        return next((dict(k[1])["phase"] for k, v in self.metrics.items()
                     if k[0] == "psrec_phase" and v == 1.0), None)


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    """A local run (2 workers, 1 PS, an eval every 40 steps) scraped every
    0.2 s from start to exit. Returns (workdir, scrapes, output)."""
    workdir = tmp_path_factory.mktemp("metrics-run") / "run"
    port = free_loopback_ports(1)[0]
    scrapes: list[Scrape] = []
    with PsrecRun(["train", "--workdir", workdir, "--synthetic-rows", 2000,
                   "--steps", STEPS, "--eval-every", EVAL_EVERY,
                   "--steps-per-closure", 5, "--batch-size", 64,
                   "--workers", 2, "--ps", 1, "--no-export",
                   "--metrics-port", port]) as run:
        deadline = time.monotonic() + TIMEOUT
        while run.process.poll() is None and time.monotonic() < deadline:
            try:
                text = _get(port, "/metrics")[1]
                health = _get(port, "/healthz")
            except OSError:  # not serving yet, or already gone
                time.sleep(0.2)
                continue
            scrapes.append(Scrape(_samples(text), {
                f.name: f.type for f in text_string_to_metric_families(text)},
                health))
            time.sleep(0.2)  # the scrape interval
        assert run.wait(TIMEOUT) == 0, run.output[-3000:]
    return workdir, scrapes, run.output


@pytest.mark.cluster
@pytest.mark.slow
def test_scraped_during_training_from_outside_the_namespace(live_run):
    _, scrapes, output = live_run
    # The cluster ran in its private namespace, the metrics port outside it.
    assert "private network namespace" in output
    assert re.search(r"metrics on http://127\.0\.0\.1:\d+/metrics", output)
    training = [s for s in scrapes if s.phase() == "training"]
    assert len(training) >= 2, [s.phase() for s in scrapes]
    steps = [_value(s.metrics, "psrec_train_steps_total") for s in training]
    assert any(b > a for a, b in zip(steps, steps[1:])), steps
    assert all(s.health[0] == 200 and s.health[1].startswith("ok")
               for s in training), [s.health for s in training]
    last = scrapes[-1]
    assert _value(last.metrics, "psrec_train_examples_total") >= 64 * max(
        steps)
    assert last.types["psrec_train_steps"] == "counter"
    assert last.types["psrec_train_loss"] == "gauge"


@pytest.mark.cluster
@pytest.mark.slow
def test_metric_names_and_values(live_run):
    _, scrapes, _ = live_run
    names = {key[0] for s in scrapes for key in s.metrics}
    assert all(n.startswith("psrec_") for n in names), names
    assert {"psrec_train_steps_total", "psrec_train_examples_total",
            "psrec_train_loss", "psrec_eval_auc", "psrec_eval_logloss",
            "psrec_last_checkpoint_timestamp_seconds",
            "psrec_checkpoint_duration_seconds", "psrec_restarts_total",
            "psrec_build_info", "psrec_heartbeat_age_seconds",
            "psrec_phase", "psrec_worker_closures_total"} <= names
    last = scrapes[-1].metrics
    assert 0.0 < _value(last, "psrec_eval_auc") < 1.0
    assert {dict(k[1])["role"]: v for k, v in last.items()
            if k[0] == "psrec_restarts_total"} == {
                "worker": 0.0, "ps": 0.0, "coordinator": 0.0,
                "data_service": 0.0}
    info = [dict(k[1]) for k in last if k[0] == "psrec_build_info"]
    assert info and info[0]["version"] == __version__
    # A checkpoint was written during the run, before the scrape.
    stamp = _value(last, "psrec_last_checkpoint_timestamp_seconds")
    assert time.time() - 600 < stamp <= time.time()
    assert {dict(k[1])["worker"] for k in last
            if k[0] == "psrec_worker_closures_total"} == {"0", "1"}


@pytest.mark.cluster
@pytest.mark.slow
def test_dashboard_queries_only_exposed_metrics(live_run):
    _, scrapes, _ = live_run
    exposed = {key[0] for s in scrapes for key in s.metrics}
    dashboard = json.loads(json.dumps(grafana_dashboard("ctr-daily")))
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Throughput (examples/s)", "Training loss", "Eval AUC",
            "Checkpoint age", "Restarts by role"} <= titles
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["job"]["current"]["value"] == "ctr-daily"
    assert variables["job"]["query"] == (
        "label_values(psrec_build_info, job)")
    used = set()
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            names = expr_metrics(target["expr"])
            assert names, target["expr"]
            used |= names
    assert used <= exposed, used - exposed
    assert "psrec_train_examples_total" in used


@pytest.mark.cluster
@pytest.mark.slow
def test_tensorboard_events_of_the_run(live_run):
    import tensorflow as tf
    workdir, _, output = live_run
    tags: dict[str, list[tuple[int, float]]] = {}
    hparams = b""
    for path in sorted((Path(workdir) / "tensorboard").glob("events.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                plugin = value.metadata.plugin_data.plugin_name
                if plugin == "hparams":
                    hparams += value.metadata.plugin_data.content
                elif value.HasField("tensor"):
                    tags.setdefault(value.tag, []).append(
                        (event.step, float(tf.make_ndarray(value.tensor))))
    assert tags["train/examples_per_sec"]
    for worker in (0, 1):
        rates = tags[f"train/worker_examples_per_sec/worker_{worker}"]
        assert max(rate for _, rate in rates) > 0
    evals = [int(m) for m in re.findall(r"step (\d+): eval:", output)]
    assert evals == list(range(EVAL_EVERY, STEPS + 1, EVAL_EVERY))
    assert [step for step, _ in tags["eval/auc"]] == evals
    assert [step for step, _ in tags["eval/logloss"]] == evals
    assert b"batch_size" in hparams and b"sparse_lr" in hparams


def test_examples_per_sec_is_the_recent_rate(tmp_path):
    """1000 examples/s for 20 s, then 100/s: the scalar follows the drop
    within the 5 s window instead of averaging since the start."""
    import tensorflow as tf

    from psrec.launch.monitor.progress import ProgressReporter
    now = [0.0]
    per_worker = {0: 0, 1: 0}
    reporter = ProgressReporter(
        10_000, log_dir=tmp_path, stream=io.StringIO(),
        per_worker=lambda: per_worker, hparams={"batch_size": 100},
        rate_window=5.0, clock=lambda: now[0])
    step = 0
    for second in range(1, 31):
        count = 1000 if second <= 20 else 100
        now[0] = float(second)
        per_worker[0] += count  # worker 1 stays idle
        step += 1
        reporter.update(step, 0.5, count)
    assert reporter.examples_per_sec() == pytest.approx(100.0)
    reporter.close()
    scalars: dict[str, list[float]] = {}
    for path in tmp_path.glob("events.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.HasField("tensor") and value.tag.startswith("train/"):
                    scalars.setdefault(value.tag, []).append(
                        float(tf.make_ndarray(value.tensor)))
    speeds = scalars["train/examples_per_sec"]
    assert speeds[19] == pytest.approx(1000.0)
    assert speeds[-1] == pytest.approx(100.0)  # the average would be 700
    assert scalars["train/worker_examples_per_sec/worker_0"][-1] == (
        pytest.approx(100.0))
    assert scalars["train/worker_examples_per_sec/worker_1"][-1] == 0.0


def _bound_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def test_healthz_fails_when_the_heartbeat_stops(tmp_path):
    stale = HeartbeatWriter(heartbeat_path(tmp_path))
    stale.publish("training", step=3)  # a previous run's file
    with serving(_bound_socket(), tmp_path, stall_timeout=1.0) as server:
        port = server.address[1]
        code, why = _get(port, "/healthz")
        assert code == 503 and why.startswith("no heartbeat"), why
        writer = HeartbeatWriter(heartbeat_path(tmp_path))
        writer.publish("training", step=7)
        written = time.monotonic()
        code, why = _get(port, "/healthz")
        assert code == 200 and "step 7" in why, why
        # The coordinator stops beating: within the stall timeout (+ slack)
        # the check fails, and not before it.
        deadline = written + 30
        while _get(port, "/healthz")[0] == 200:
            assert time.monotonic() < deadline, "never became unhealthy"
            time.sleep(0.05)
        assert time.monotonic() - written >= 1.0
        code, why = _get(port, "/healthz")
        assert code == 503 and why.startswith("stalled: phase training")
        assert len(why.strip().splitlines()) == 1
        age = _value(_samples(_get(port, "/metrics")[1]),
                     "psrec_heartbeat_age_seconds")
        assert age >= 1.0
        writer.publish("done")  # a finished run stays healthy
        assert _get(port, "/healthz")[0] == 200
        assert _get(port, "/nothing")[0] == 404


def test_healthz_judges_the_heartbeat_as_the_supervisor_does(tmp_path,
                                                              monkeypatch):
    """/healthz and the supervisor share one judge (HeartbeatMonitor): the
    time since the heartbeat last changed, on the watcher's monotonic
    clock -- not the file's wall-clock ``time``, which a writer whose clock
    runs an hour ahead would keep "fresh" forever."""
    from psrec.launch.monitor.metrics_http import HeartbeatCollector
    from psrec.launch.monitor.metrics_http import health
    now = [1000.0]
    monkeypatch.setattr(
        "psrec.launch.monitor.heartbeat.time.monotonic", lambda: now[0])
    path = heartbeat_path(tmp_path)
    ahead = time.time() + 3600.0

    def beat(seq: int) -> None:
        path.write_text(json.dumps({"seq": seq, "phase": "training",
                                    "step": seq, "time": ahead, "pid": 7}))

    beat(1)
    collector = HeartbeatCollector(path, since=time.time())
    assert health(collector, stall_timeout=5.0)[0]
    now[0] += 4.0
    assert health(collector, stall_timeout=5.0)[0]  # 4 s: within the limit
    now[0] += 1.0
    ok, why = health(collector, stall_timeout=5.0)
    assert not ok and why.startswith("stalled: phase training, step 1"), why
    beat(2)  # a new beat is fresh again, whatever its wall-clock time
    assert health(collector, stall_timeout=5.0) == (
        True, "ok: phase training, step 2, last heartbeat 0.0 s ago")


def test_metrics_flags_refused_with_one_line(tmp_path, capsys):
    assert main(["train", "--strategy", "one-device", "--metrics-port",
                 "9100", "--workdir", str(tmp_path)]) == 2
    assert "--metrics-port applies to --strategy ps" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["train", "--metrics-port", str(port), "--workdir",
                     str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--metrics-port {port}" in err[0], err
    # A reserved socket is named for the re-executed process, then claimed.
    args = argparse.Namespace(metrics_port=free_loopback_ports(1)[0],
                              metrics_host="127.0.0.1")
    sock = take_metrics_socket(reserve_metrics_socket(args))
    assert sock.getsockname()[1] == args.metrics_port
    assert not sock.get_inheritable()
    sock.close()


@pytest.mark.cluster
@pytest.mark.slow
def test_coordinator_of_an_existing_cluster_serves_its_own(tmp_path,
                                                          live_run):
    """TF_CONFIG / --cluster (the Kubernetes chief): no supervisor, the
    coordinator serves /healthz and /metrics itself, from its first
    heartbeat on (here while it waits for tasks that never come)."""
    manifest = re.search(r"manifest: (\S+)", live_run[2]).group(1)
    ps, worker, port = free_loopback_ports(3)
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"ps": [f"127.0.0.1:{ps}"],
                                   "worker": [f"127.0.0.1:{worker}"]}))
    with PsrecRun(["train", "--cluster", cluster, "--workdir",
                   tmp_path / "run", "--data", manifest,
                   "--no-verify-checksums",
                   "--connect-timeout", 120, "--metrics-port", port]) as run:
        run.wait_for(r"metrics on http://127\.0\.0\.1:\d+/metrics", 120)
        deadline = time.monotonic() + 120
        while True:
            code, why = _get(port, "/healthz")
            if code == 200:
                break
            assert time.monotonic() < deadline, why
            time.sleep(0.1)
        assert "phase connecting" in why
        metrics = _samples(_get(port, "/metrics")[1])
        assert _value(metrics, "psrec_phase", phase="connecting") == 1.0
        # Nobody here restarts roles: the orchestrator counts restarts.
        assert not [k for k in metrics if k[0] == "psrec_restarts_total"]
