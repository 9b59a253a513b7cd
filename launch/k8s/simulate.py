"""``psrec k8s simulate FILE.yaml``: every pod of a rendered job as a local
process, with the environment Kubernetes would give it.

Each pod (:mod:`psrec.launch.k8s.pods`) runs its ``tensorflow``
container's command (``psrec`` is this interpreter's ``python -P -m
psrec``) with its resolved environment over this process's own (the
installation's paths), ``HOSTNAME`` set to the pod name, and no GPU unless
the container asks for ``nvidia.com/gpu`` (as in Kubernetes). The Service
hosts of TF_CONFIG are mapped to free loopback ports, one per task, and
the coordinator's metrics port to another, since every pod shares this
machine's one network. All pods start at once, as in a cluster: the
coordinator waits for its tasks itself. Probes (TCP connect, HTTP GET;
first success recorded), the stop of every pod when the coordinator exits
(``cleanPodPolicy: Running``) and the exit code: docs/kubernetes.md.

Run as the ``psrec`` command, the simulation enters a private network
namespace first (:mod:`psrec.launch.local.netns`), so none of its servers is
reachable from outside.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import yaml

from psrec.errors import ConfigError
from psrec.errors import RetryableError
from psrec.launch.k8s.objects import METRICS_PORT_NAME
from psrec.launch.k8s.pods import Pod
from psrec.launch.k8s.pods import manifest_pods
from psrec.launch.local.cluster import psrec_command
from psrec.launch.local.cluster import spawn
from psrec.launch.local.cluster import stop_processes
from psrec.launch.local.cluster import tail_log
from psrec.launch.local.cluster import visible_gpus
from psrec.launch.local.cluster import worker_gpus
from psrec.ps_cluster.cluster.addresses import free_loopback_ports
from psrec.ps_cluster.cluster.probe import accepts
from psrec.runtime import role_environment


@dataclass
class SimulateResult:
    """What a simulation did: the coordinator's exit code, where each pod
    ran and logged, and when each probe first succeeded (seconds from the
    start; None: never)."""

    exit_code: int
    coordinator: str
    log_dir: str
    seconds: float
    addresses: dict[str, str] = field(default_factory=dict)
    probes: dict[str, float | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        probes = ", ".join(
            f"{name} {'never' if at is None else f'{at:.1f} s'}"
            for name, at in self.probes.items())
        return (f"simulated {len(self.addresses)} pods in {self.seconds:.1f}"
                f" s: coordinator {self.coordinator} exited "
                f"{self.exit_code}; probes first ok: {probes}; logs in "
                f"{self.log_dir}")


def load_manifest(path: str | Path) -> list[dict[str, Any]]:
    """The objects of a multi-document YAML file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        objects = [o for o in yaml.safe_load_all(text) if o]
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: "
                          f"{' '.join(str(error).split())}") from None
    if not all(isinstance(o, dict) and "kind" in o for o in objects):
        raise ConfigError(f"{path}: every document must be a Kubernetes "
                          "object with a `kind`.")
    return objects


@dataclass
class _Running:
    pod: Pod
    argv: list[str]
    env: dict[str, str]
    log: Path
    process: subprocess.Popen | None = None


def _loopback_map(pods: list[Pod]) -> dict[str, str]:
    """Every TF task address -> its own free loopback address."""
    hosts = [a for addresses in pods[0].tf_config["cluster"].values()
             for a in addresses]
    ports = free_loopback_ports(len(hosts))
    return {h: f"127.0.0.1:{p}" for h, p in zip(hosts, ports)}


def _argv(pod: Pod, metrics: dict[int, int]) -> list[str]:
    command = pod.container.get("command") or ["psrec"]
    if command != ["psrec"]:
        raise ConfigError(
            f"pod {pod.name} runs {command}; simulate runs psrec's own "
            "containers (command [psrec]) only.")
    args = [str(a) for a in pod.container.get("args", [])]
    for i, arg in enumerate(args[:-1]):  # the metrics port, remapped
        if (arg == "--metrics-port" and args[i + 1].isdigit()
                and int(args[i + 1]) in metrics):
            args[i + 1] = str(metrics[int(args[i + 1])])
    return psrec_command("psrec", *args)


def _env(pod: Pod, mapping: dict[str, str], gpus: list[str],
         gpu_index: int, gpu_pods: int) -> dict[str, str]:
    config = pod.tf_config
    config["cluster"] = {kind: [mapping[a] for a in addresses]
                         for kind, addresses in config["cluster"].items()}
    env = role_environment()
    env.pop("TF_CONFIG", None)
    env.update(pod.env)
    env["TF_CONFIG"] = json.dumps(config, separators=(",", ":"))
    env["HOSTNAME"] = pod.name
    if "CUDA_VISIBLE_DEVICES" not in pod.env:
        wants = pod.container.get("resources", {}).get("limits", {}).get(
            "nvidia.com/gpu")
        share = worker_gpus(gpu_index, gpu_pods, gpus) if wants else None
        env["CUDA_VISIBLE_DEVICES"] = share or ""
    return env


def _probe_targets(pod: Pod, address: str, metrics: dict[int, int]
                   ) -> dict[str, tuple[str, Any]]:
    """``{"<pod> <probe>": ("tcp", address) | ("http", url)}``."""
    out = {}
    for kind in ("startupProbe", "livenessProbe"):
        probe = pod.container.get(kind)
        if not probe:
            continue
        name = f"{pod.name} {kind}"
        if "tcpSocket" in probe:
            out[name] = ("tcp", address)
        elif "httpGet" in probe:
            port = pod.port(probe["httpGet"]["port"])
            port = metrics.get(port, port)
            out[name] = ("http", f"http://127.0.0.1:{port}"
                         f"{probe['httpGet'].get('path', '/')}")
    return out


def _probe_ok(kind: str, target: str) -> bool:
    if kind == "tcp":
        return accepts(target)
    try:
        with urllib.request.urlopen(target, timeout=2) as response:
            return 200 <= response.status < 400
    except (urllib.error.URLError, OSError):
        return False


def _plan(pods: list[Pod], log_dir: Path
          ) -> tuple[list[_Running], dict[str, str], dict[str, tuple]]:
    mapping = _loopback_map(pods)
    metrics_ports = [p.port(METRICS_PORT_NAME) for p in pods
                     if any(x.get("name") == METRICS_PORT_NAME
                            for x in p.container.get("ports", []))]
    metrics = dict(zip(metrics_ports, free_loopback_ports(
        len(metrics_ports))))
    gpus = visible_gpus()
    gpu_pods = [p for p in pods if p.container.get("resources", {}).get(
        "limits", {}).get("nvidia.com/gpu")]
    running, addresses, probes = [], {}, {}
    for pod in pods:
        kind, index = pod.task
        address = mapping[pod.tf_config["cluster"][kind][index]]
        addresses[pod.name] = address
        index_of_gpu = gpu_pods.index(pod) if pod in gpu_pods else 0
        running.append(_Running(
            pod, _argv(pod, metrics),
            _env(pod, mapping, gpus, index_of_gpu, max(1, len(gpu_pods))),
            log_dir / f"{pod.name}.log"))
        probes.update(_probe_targets(pod, address, metrics))
    return running, addresses, probes


def simulate(path: str | Path, timeout: float, log_dir: str | Path | None
             = None, log=print) -> SimulateResult:
    """Runs the job of manifest ``path`` locally (see module docstring).

    Raises:
      ConfigError: the manifest is not a job psrec can simulate.
      RetryableError: the coordinator did not exit within ``timeout`` s.
    """
    pods = manifest_pods(load_manifest(path))
    chiefs = [p for p in pods if p.task[0] == "chief"]
    if len(chiefs) != 1:
        raise ConfigError(f"{path}: the job needs exactly one chief "
                          f"(coordinator) pod, found {len(chiefs)}.")
    folder = Path(log_dir or tempfile.mkdtemp(prefix="psrec-simulate-"))
    folder.mkdir(parents=True, exist_ok=True)
    running, addresses, probes = _plan(pods, folder)
    began = time.monotonic()
    try:
        for item in running:
            item.process = spawn(item.argv, item.log, item.env)
            log(f"pod {item.pod.name} ({':'.join(map(str, item.pod.task))})"
                f" as {addresses[item.pod.name]}, pid {item.process.pid}")
        chief = next(r for r in running if r.pod is chiefs[0])
        code, seen = _watch(chief, probes, began, began + timeout, timeout)
    finally:
        stop_processes([r.process for r in running])
    if code != 0:
        log(f"coordinator {chief.pod.name} exited {code}; log tail:\n"
            f"{tail_log(chief.log)}")
    return SimulateResult(code, chief.pod.name, str(folder),
                          time.monotonic() - began, addresses, seen)


def _watch(chief: _Running, probes: dict[str, tuple], began: float,
           deadline: float, timeout: float
           ) -> tuple[int, dict[str, float | None]]:
    """Tries the probes not yet passed, waiting on the coordinator between
    rounds, until it exits; returns its code and the probes' first
    success times."""
    seen: dict[str, float | None] = {name: None for name in probes}
    while True:
        for name, (kind, target) in probes.items():
            if seen[name] is None and _probe_ok(kind, target):
                seen[name] = round(time.monotonic() - began, 2)
        try:
            return chief.process.wait(timeout=0.5), seen
        except subprocess.TimeoutExpired:
            if time.monotonic() > deadline:
                raise RetryableError(
                    f"the coordinator {chief.pod.name} did not exit within "
                    f"{timeout:.0f} s (--timeout); every pod was stopped. "
                    f"Log tail:\n{tail_log(chief.log)}") from None
