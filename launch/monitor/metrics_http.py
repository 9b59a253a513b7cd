"""Prometheus ``/metrics`` and ``/healthz`` of a training run, served from
the coordinator's heartbeat file (which process serves them, and what
they answer: ``docs/monitoring.md``).

:class:`HeartbeatCollector` reads ``heartbeat.json``
(:mod:`psrec.launch.monitor.heartbeat`) at each scrape: a custom collector
on a private registry, no global registry, no background state, so the
same server works in whichever process can see the file. Heartbeats older
than the server (a previous run's file) count as missing; fresh or stale
is judged as the supervisor judges it (:class:`~psrec.launch.monitor.
heartbeat.HeartbeatMonitor`: the time since this server saw the heartbeat
change, on its own monotonic clock).
"""

from __future__ import annotations

import contextlib
import http.server
import importlib.metadata
import socket
import threading
import time
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Iterator
from typing import Mapping

from prometheus_client import CollectorRegistry
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from psrec._version import __version__
from psrec.launch.monitor.heartbeat import PHASES
from psrec.launch.monitor.heartbeat import ROLES
from psrec.launch.monitor.heartbeat import HeartbeatMonitor
from psrec.launch.monitor.heartbeat import read_heartbeat

#: Phases after which no more heartbeats come, and that is fine.
FINISHED = ("done", "terminating", "terminated")


def _tensorflow_version() -> str:
    try:
        return importlib.metadata.version("tensorflow")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class HeartbeatCollector:
    """The ``psrec_*`` metrics of one run, read from its heartbeat file at
    each scrape.

    Args:
      restarts: returns restarts per role so far (the supervisor's
        counts), or None where nobody here restarts roles (the metric is
        then listed without samples: the orchestrator counts restarts).
      since: heartbeats written before this wall-clock time are ignored
        (a previous run's file in the same workdir).
    """

    def __init__(self, path: str | Path,
                 restarts: Callable[[], Mapping[str, int]] | None = None,
                 since: float = 0.0) -> None:
        self.path = Path(path)
        self.restarts = restarts
        self.since = since
        self.monitor = HeartbeatMonitor(self.path, timeout=0.0)
        self._tf_version = _tensorflow_version()

    def read(self) -> tuple[dict[str, Any] | None, float | None]:
        """This run's last heartbeat and its age in seconds (the
        monitor's), or (None, None)."""
        beat = read_heartbeat(self.path)
        if beat is None or not isinstance(beat.get("time"), (int, float)) or (
                beat["time"] < self.since):
            return None, None
        return beat, self.monitor.observe(beat)

    def collect(self) -> Iterator[Any]:
        beat, age = self.read()
        beat = beat or {}
        info = GaugeMetricFamily(
            "psrec_build_info", "psrec build: version and TensorFlow "
            "version (always 1)", labels=["version", "tensorflow"])
        info.add_metric([__version__, self._tf_version], 1.0)
        yield info
        restarts = CounterMetricFamily(
            "psrec_restarts", "roles restarted by the supervisor",
            labels=["role"])
        if self.restarts is not None:
            counts = self.restarts()
            for role in ROLES:
                restarts.add_metric([role], float(counts.get(role, 0)))
        yield restarts
        phase = GaugeMetricFamily(
            "psrec_phase", "the coordinator's phase (1 for the current one)",
            labels=["phase"])
        for name in PHASES if beat else ():
            phase.add_metric([name], 1.0 if beat.get("phase") == name
                             else 0.0)
        yield phase
        yield from _families(GaugeMetricFamily, [
            ("psrec_heartbeat_age_seconds", "seconds since the coordinator's "
             "last heartbeat", age),
            ("psrec_train_loss", "mean training loss of the last finished "
             "closure", beat.get("loss")),
            ("psrec_eval_auc", "AUC of the last evaluation",
             (beat.get("eval") or {}).get("auc")),
            ("psrec_eval_logloss", "log loss of the last evaluation",
             (beat.get("eval") or {}).get("logloss")),
            ("psrec_eval_gauc", "GAUC (--group-by) of the last evaluation",
             (beat.get("eval") or {}).get("gauc")),
            ("psrec_last_checkpoint_timestamp_seconds", "when the latest "
             "checkpoint was written (Unix time)",
             beat.get("checkpoint_time")),
            ("psrec_checkpoint_duration_seconds", "how long the last "
             "checkpoint save took", beat.get("checkpoint_seconds"))])
        yield from _follow_families(beat.get("follow") or {})
        yield from _counters(beat)
        tasks = GaugeMetricFamily(
            "psrec_eval_task", "each task's metrics of the last evaluation "
            "(a spec with several labels)", labels=["task", "metric"])
        for task, metrics in sorted(
                ((beat.get("eval") or {}).get("tasks") or {}).items()):
            for metric, value in sorted((metrics or {}).items()):
                if (number := _number(value)) is not None:
                    tasks.add_metric([str(task), str(metric)], number)
        yield tasks

    def describe(self) -> list[Any]:
        return []  # families vary with the file: nothing to pre-describe


def _number(value: Any) -> float | None:
    """A finite float, or None (missing, NaN or not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if value == value and abs(value) != float("inf") else None


def _families(kind: type, specs) -> Iterator[Any]:
    for name, text, value in specs:
        family = kind(name, text)
        if (number := _number(value)) is not None:
            family.add_metric([], number)
        yield family


def _follow_families(follow: Mapping[str, Any]) -> Iterator[Any]:
    """``--follow``: the last partition done (its test-before-train
    metrics, rows, train steps, seconds, export version) and the count of
    partitions done; no samples when the run follows nothing."""
    last = "of the last partition done (--follow)"
    yield from _families(GaugeMetricFamily, [
        (f"psrec_follow_test_{name}", f"test-before-train {text} {last}",
         follow.get(f"test_{name}"))
        for name, text in (("auc", "AUC"), ("logloss", "log loss"),
                           ("calibration", "calibration"),
                           ("gauc", "GAUC (--group-by)"))] + [
        ("psrec_follow_partition_rows", f"rows {last}", follow.get("rows")),
        ("psrec_follow_partition_steps", f"train steps {last}",
         follow.get("steps")),
        ("psrec_follow_partition_seconds", f"seconds from test to export "
         f"{last}", follow.get("seconds")),
        ("psrec_follow_export_version", f"export version {last}",
         follow.get("export_version"))])
    yield from _families(CounterMetricFamily, [
        ("psrec_follow_partitions", "partitions tested, trained and "
         "exported (--follow)", follow.get("partitions_done"))])


def _counters(beat: Mapping[str, Any]) -> Iterator[CounterMetricFamily]:
    yield from _families(CounterMetricFamily, (
        ("psrec_train_steps", "the global training step reached",
         beat.get("step")),
        ("psrec_train_examples", "examples trained on (restored with the "
         "checkpoint)", beat.get("examples"))))
    closures = CounterMetricFamily(
        "psrec_worker_closures", "closures finished per worker by this "
        "coordinator", labels=["worker"])
    for worker, progress in sorted((beat.get("workers") or {}).items()):
        if _number((progress or {}).get("closures")) is not None:
            closures.add_metric([str(worker)], float(progress["closures"]))
    yield closures


def health(collector: HeartbeatCollector,
           stall_timeout: float | None) -> tuple[bool, str]:
    """(healthy, one-line reason): a heartbeat fresher than
    ``stall_timeout`` (any age when None), or a finished run."""
    beat, age = collector.read()
    if beat is None:
        return False, (f"no heartbeat in {collector.path} from this run yet "
                       "(the coordinator has not started or cannot write)")
    what = (f"phase {beat.get('phase')}, step {beat.get('step')}, last "
            f"heartbeat {age:.1f} s ago")
    if beat.get("phase") in FINISHED:
        return True, f"ok: finished ({what})"
    if stall_timeout and age >= stall_timeout:
        return False, (f"stalled: {what}, over --stall-timeout "
                       f"{stall_timeout:g} s")
    return True, f"ok: {what}"


class MetricsServer:
    """``/metrics`` and ``/healthz`` over HTTP in a daemon thread.

    Args:
      sock: a bound TCP socket (see
        :func:`psrec.launch.cli.metrics_flags.reserve_metrics_socket`).
      stall_timeout: ``/healthz``'s limit in seconds (None: any age).
    """

    def __init__(self, sock: socket.socket, collector: HeartbeatCollector,
                 stall_timeout: float | None) -> None:
        self.collector = collector
        self.stall_timeout = stall_timeout
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self._http = _server_on(sock, _handler(self))
        self._thread = threading.Thread(
            target=self._http.serve_forever, name="psrec-metrics",
            kwargs={"poll_interval": 0.2}, daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        return self._http.socket.getsockname()[:2]

    def start(self) -> "MetricsServer":
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self._http.shutdown()
            self._thread.join()
        self._http.server_close()


def _server_on(sock: socket.socket, handler) -> http.server.HTTPServer:
    """A threading HTTP server on an already bound socket."""
    class Server(http.server.ThreadingHTTPServer):
        address_family = sock.family
        daemon_threads = True
    server = Server(sock.getsockname()[:2], handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.server_address = sock.getsockname()[:2]
    server.server_activate()  # listen
    return server


def _handler(owner: MetricsServer):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 -- the http.server name
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(owner.registry),
                           CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                ok, why = health(owner.collector, owner.stall_timeout)
                self._send(200 if ok else 503, (why + "\n").encode(),
                           "text/plain; charset=utf-8")
            else:
                self._send(404, b"psrec serves /metrics and /healthz\n",
                           "text/plain; charset=utf-8")

        def _send(self, code: int, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args) -> None:  # noqa: A002
            pass  # scrapes every few seconds would flood the run's log
    return Handler


@contextlib.contextmanager
def serving(sock: socket.socket | None, workdir: str | Path,
            stall_timeout: float | None, log=None,
            restarts: Callable[[], Mapping[str, int]] | None = None
            ) -> Iterator[MetricsServer | None]:
    """Serves the run in ``workdir`` on ``sock`` while the block runs
    (nothing when ``sock`` is None); says where on ``log``. The heartbeat
    is read where the coordinator writes it: the workdir's local run-state
    folder (:mod:`psrec.launch.monitor.heartbeat`)."""
    from psrec.launch.monitor.heartbeat import heartbeat_path
    from psrec.launch.monitor.heartbeat import run_state_dir
    if sock is None:
        yield None
        return
    server = MetricsServer(sock, HeartbeatCollector(
        heartbeat_path(run_state_dir(workdir)), restarts, since=time.time()),
        stall_timeout).start()
    if log is not None:
        host, port = server.address
        shown = f"[{host}]" if ":" in host else host
        log(f"psrec: metrics on http://{shown}:{port}/metrics, health on "
            f"http://{shown}:{port}/healthz")
    try:
        yield server
    finally:
        server.close()
