"""The parts every rendered Kubernetes object shares: the job's shape
(:class:`K8sJob`), its labels, the ``tensorflow`` container of each role
(command, environment, ports, probes, resources, security context) and the
NetworkPolicy that isolates the job.

Pure Python and plain dicts (no Kubernetes client): :mod:`k8s_tfjob` and
:mod:`k8s_plain` assemble these into a TFJob or into StatefulSets and a
Job, :mod:`k8s_render` writes them as YAML.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psrec.options import option

#: The container name the Kubeflow training operator requires (it reads
#: the port and the exit code of the container with this name).
CONTAINER = "tensorflow"
BACKENDS = ("tfjob", "plain")
#: The operator's default TF port and the container port name it reads.
TF_PORT = 2222
TF_PORT_NAME = "tfjob-port"
METRICS_PORT_NAME = "metrics"
#: psrec's permanent exit codes (psrec.errors): a restart cannot help.
PERMANENT_EXIT_CODES = (1, 2)
#: Where ``--pvc`` mounts its claim in every pod.
PVC_MOUNT = "/mnt/psrec"

# Kubelet probe timing: the coordinator may check its data (every byte)
# before it serves /healthz, so its startup probe allows 15 minutes.
_COORDINATOR_STARTUP = {"periodSeconds": 10, "failureThreshold": 90,
                        "timeoutSeconds": 5}
_COORDINATOR_LIVENESS = {"periodSeconds": 30, "failureThreshold": 3,
                         "timeoutSeconds": 5}
_SERVER_STARTUP = {"periodSeconds": 5, "failureThreshold": 60,
                   "timeoutSeconds": 3}
_SERVER_LIVENESS = {"periodSeconds": 20, "failureThreshold": 3,
                    "timeoutSeconds": 3}


@dataclass(frozen=True)
class K8sJob:
    """Everything the rendered objects depend on (validated by
    :func:`psrec.launch.k8s.render.job_from_args`)."""

    name: str = option(flag="--name", help="job name (DNS label)")
    image: str = option(
        flag="--image", help="psrec image (see Dockerfile), ideally by digest")
    workdir: str = option(
        flag="--workdir",
        help="URI every pod can write (checkpoints, exports)")
    ps_memory: str = option(
        flag="--ps-memory",
        help="memory of each PS task, e.g. 8Gi (default: planned from the "
        "spec and model by the sharding planner)")
    namespace: str = option("default", flag="--namespace",
                            help="namespace of every object")
    workers: int = option(2, flag="--workers", help="worker tasks")
    ps: int = option(1, flag="--ps", help="parameter-server tasks")
    data: str | None = option(
        None, flag="--data",
        help="manifest URI of converted data every pod can read (default: "
        "synthetic data generated into --workdir)")
    gpus_per_worker: int = option(
        0, flag="--gpus-per-worker",
        help="nvidia.com/gpu limit of each worker")
    worker_memory: str | None = option(
        None, flag="--worker-memory",
        help="memory of each worker, e.g. 4Gi (default: none set)")
    metrics_port: int = option(
        9090, flag="--metrics-port",
        help="the coordinator's Prometheus /metrics and /healthz port")
    monitoring_namespace: str = option(
        "monitoring", flag="--monitoring-namespace",
        help="the only namespace admitted to the metrics port")
    backoff_limit: int = option(
        6, flag="--backoff-limit",
        help="restarts on retryable exit codes before the job fails")
    pvc: str | None = option(
        None, flag="--pvc",
        help="a PersistentVolumeClaim mounted at /mnt/psrec in every pod "
        "(for local --data/--workdir paths)")
    train_args: tuple[str, ...] = option(
        default_factory=tuple,
        help="extra `psrec train` arguments for the coordinator")


def labels(job: K8sJob, component: str | None = None) -> dict[str, str]:
    """The labels of the job's objects; with ``component`` (coordinator,
    ps, worker) those of one role's pods."""
    out = {"app.kubernetes.io/name": "psrec",
           "app.kubernetes.io/instance": job.name}
    if component:
        out["app.kubernetes.io/component"] = component
    return out


def coordinator_args(job: K8sJob) -> list[str]:
    """``psrec train`` coordinating the cluster of its TF_CONFIG, serving
    /metrics and /healthz on the pod's address (kubelet probes and
    Prometheus reach it there; the NetworkPolicy limits who can). It gets
    the PS pods' memory as ``--ps-memory``: it refuses (exit 2, before
    training) a plan whose PS variables would not fit in it."""
    args = ["train"]
    if job.data is not None:
        args += ["--data", job.data]
    args += ["--workdir", job.workdir, "--workers", str(job.workers),
             "--ps", str(job.ps), "--allow-remote",
             "--metrics-port", str(job.metrics_port),
             "--metrics-host", "0.0.0.0", "--ps-memory", job.ps_memory]
    return args + list(job.train_args)


def server_args() -> list[str]:
    """``psrec server``: one PS or worker task from TF_CONFIG (hosts are
    Service names, hence ``--allow-remote``)."""
    return ["server", "--allow-remote"]


def base_env(component: str) -> list[dict[str, Any]]:
    """Environment of every role: fail fast on a lost task inside calls
    that allow it, tf_keras, unbuffered logs; PS tasks see no GPU."""
    env = [{"name": "GRPC_FAIL_FAST", "value": "use_caller"},
           {"name": "TF_USE_LEGACY_KERAS", "value": "1"},
           {"name": "PYTHONUNBUFFERED", "value": "1"}]
    if component == "ps":
        env.append({"name": "CUDA_VISIBLE_DEVICES", "value": ""})
    return env


def _resources(job: K8sJob, component: str) -> dict[str, Any]:
    if component == "ps":
        memory = {"memory": job.ps_memory}
        return {"requests": dict(memory), "limits": dict(memory)}
    if component == "worker":
        out: dict[str, Any] = {}
        if job.worker_memory:
            out = {"requests": {"memory": job.worker_memory},
                   "limits": {"memory": job.worker_memory}}
        if job.gpus_per_worker:
            out.setdefault("limits", {})["nvidia.com/gpu"] = (
                job.gpus_per_worker)
        return out
    return {}


def _probes(job: K8sJob, component: str) -> dict[str, Any]:
    if component == "coordinator":
        http = {"httpGet": {"path": "/healthz", "port": METRICS_PORT_NAME}}
        return {"startupProbe": {**http, **_COORDINATOR_STARTUP},
                "livenessProbe": {**http, **_COORDINATOR_LIVENESS}}
    tcp = {"tcpSocket": {"port": TF_PORT_NAME}}
    return {"startupProbe": {**tcp, **_SERVER_STARTUP},
            "livenessProbe": {**tcp, **_SERVER_LIVENESS}}


def container(job: K8sJob, component: str,
              env: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``tensorflow`` container of a role (coordinator, ps, worker):
    ``psrec`` with its arguments, ``env`` (after :func:`base_env`), the
    TF port (and the metrics port on the coordinator), probes, resources
    and a non-root, no-privilege security context."""
    ports = [{"name": TF_PORT_NAME, "containerPort": TF_PORT,
              "protocol": "TCP"}]
    if component == "coordinator":
        ports.append({"name": METRICS_PORT_NAME,
                      "containerPort": job.metrics_port, "protocol": "TCP"})
    out = {
        "name": CONTAINER, "image": job.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["psrec"],
        "args": (coordinator_args(job) if component == "coordinator"
                 else server_args()),
        "env": base_env(component) + env,
        "ports": ports,
        **_probes(job, component),
        "securityContext": {"allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
    }
    resources = _resources(job, component)
    if resources:
        out["resources"] = resources
    if job.pvc:
        out["volumeMounts"] = [{"name": "psrec", "mountPath": PVC_MOUNT}]
    return out


def pod_spec(job: K8sJob, component: str, env: list[dict[str, Any]],
             **extra: Any) -> dict[str, Any]:
    """The pod spec of a role around its :func:`container`; ``extra``
    fields (restartPolicy, hostname, ...) are added as given."""
    spec: dict[str, Any] = {
        **extra,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 60,
        "securityContext": {"runAsNonRoot": True,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container(job, component, env)],
    }
    if job.pvc:
        spec["volumes"] = [{"name": "psrec", "persistentVolumeClaim": {
            "claimName": job.pvc}}]
    return spec


def pod_template(job: K8sJob, component: str, env: list[dict[str, Any]],
                 **extra: Any) -> dict[str, Any]:
    """A pod template; the coordinator's carries the conventional
    ``prometheus.io/*`` scrape annotations of its metrics port (honoured
    by Prometheus' Kubernetes pod discovery as most charts configure it;
    a PodMonitor can select the same labels)."""
    metadata: dict[str, Any] = {"labels": labels(job, component)}
    if component == "coordinator":
        metadata["annotations"] = {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(job.metrics_port),
            "prometheus.io/path": "/metrics"}
    return {"metadata": metadata,
            "spec": pod_spec(job, component, env, **extra)}


def network_policy(job: K8sJob) -> dict[str, Any]:
    """Ingress to the job's pods (TensorFlow's gRPC servers have no
    authentication): the gRPC port from the job's own pods only, the
    metrics port from the monitoring namespace only; nothing else (egress
    stays open: data and checkpoints live in object storage)."""
    own = {"podSelector": {"matchLabels": labels(job)}}
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": f"{job.name}-isolation",
                     "namespace": job.namespace, "labels": labels(job)},
        "spec": {
            "podSelector": {"matchLabels": labels(job)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [own],
                 "ports": [{"protocol": "TCP", "port": TF_PORT}]},
                {"from": [{"namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name":
                        job.monitoring_namespace}}}],
                 "ports": [{"protocol": "TCP", "port": job.metrics_port}]},
            ],
        },
    }
