"""The ``plain`` backend: core Kubernetes objects only, no operator.

- A headless Service ``<name>`` (``publishNotReadyAddresses``: a task's
  DNS name resolves before it is ready, as TensorFlow needs at start-up).
- StatefulSets ``<name>-ps`` and ``<name>-worker`` (``psrec server``,
  started in parallel); pod ``<name>-ps-3`` is PS task 3 at
  ``<name>-ps-3.<name>.<namespace>.svc:2222``.
- A ``batch/v1`` Job ``<name>-chief`` (``psrec train``), hostname
  ``<name>-chief-0`` in the Service's subdomain, whose ``podFailurePolicy``
  fails the job on psrec's permanent exit codes (1, 2), counts its
  retryable ones (130, 137, 138, 143) against ``backoffLimit``, and
  ignores evictions and preemptions (``DisruptionTarget``).

TF_CONFIG comes from the pod's ordinal without any script: the
``apps.kubernetes.io/pod-index`` label (Kubernetes >= 1.28) is read
through the downward API into ``PSREC_TASK_INDEX``, and the TF_CONFIG
value references it as ``$(PSREC_TASK_INDEX)``, which the kubelet
expands. The StatefulSets keep serving after the Job ends: delete the
objects (``kubectl delete -f``) when it is done.
"""

from __future__ import annotations

import json
from typing import Any

from psrec.errors import RETRYABLE_EXIT_CODES
from psrec.launch.k8s.objects import CONTAINER
from psrec.launch.k8s.objects import PERMANENT_EXIT_CODES
from psrec.launch.k8s.objects import TF_PORT
from psrec.launch.k8s.objects import TF_PORT_NAME
from psrec.launch.k8s.objects import K8sJob
from psrec.launch.k8s.objects import labels
from psrec.launch.k8s.objects import network_policy
from psrec.launch.k8s.objects import pod_template

#: The env var the downward API fills with the StatefulSet pod's ordinal.
INDEX_ENV = "PSREC_TASK_INDEX"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"


def host(job: K8sJob, task_type: str, index: int) -> str:
    """The DNS name and port of a task: ``<pod>.<service>.<ns>.svc``."""
    return (f"{job.name}-{task_type}-{index}.{job.name}.{job.namespace}"
            f".svc:{TF_PORT}")


def cluster(job: K8sJob) -> dict[str, list[str]]:
    """The TF cluster spec of ``job`` (chief, ps, worker)."""
    return {"chief": [host(job, "chief", 0)],
            "ps": [host(job, "ps", i) for i in range(job.ps)],
            "worker": [host(job, "worker", i) for i in range(job.workers)]}


def _tf_config_env(job: K8sJob, task_type: str) -> list[dict[str, Any]]:
    """TF_CONFIG of a task type; the index is the chief's 0, else the
    pod's ordinal (downward API, expanded by the kubelet)."""
    config = {"cluster": cluster(job),
              "task": {"type": task_type, "index": 0}}
    text = json.dumps(config, separators=(",", ":"))
    if task_type == "chief":
        return [{"name": "TF_CONFIG", "value": text}]
    text = text.replace('"index":0}', f'"index":$({INDEX_ENV})}}')
    return [{"name": INDEX_ENV, "valueFrom": {"fieldRef": {
                "fieldPath": f"metadata.labels['{POD_INDEX_LABEL}']"}}},
            {"name": "TF_CONFIG", "value": text}]


def _metadata(job: K8sJob, name: str, component: str | None = None
              ) -> dict[str, Any]:
    return {"name": name, "namespace": job.namespace,
            "labels": labels(job, component)}


def service(job: K8sJob) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _metadata(job, job.name),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": labels(job),
                     "ports": [{"name": TF_PORT_NAME, "port": TF_PORT,
                                "targetPort": TF_PORT, "protocol": "TCP"}]}}


def stateful_set(job: K8sJob, task_type: str) -> dict[str, Any]:
    """The StatefulSet of the PS or worker tasks."""
    replicas = job.ps if task_type == "ps" else job.workers
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": _metadata(job, f"{job.name}-{task_type}", task_type),
            "spec": {"serviceName": job.name, "replicas": replicas,
                     "podManagementPolicy": "Parallel",
                     "selector": {"matchLabels": labels(job, task_type)},
                     "template": pod_template(
                         job, task_type, _tf_config_env(job, task_type))}}


def _exit_codes(values: list[int]) -> dict[str, Any]:
    return {"containerName": CONTAINER, "operator": "In", "values": values}


def coordinator_job(job: K8sJob) -> dict[str, Any]:
    """The coordinator's Job: permanent exit codes fail it at once."""
    template = pod_template(job, "coordinator",
                            _tf_config_env(job, "chief"),
                            restartPolicy="Never",
                            hostname=f"{job.name}-chief-0",
                            subdomain=job.name)
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": _metadata(job, f"{job.name}-chief", "coordinator"),
            "spec": {"backoffLimit": job.backoff_limit, "completions": 1,
                     "parallelism": 1, "template": template,
                     "podFailurePolicy": {"rules": [
                         {"action": "FailJob", "onExitCodes": _exit_codes(
                             list(PERMANENT_EXIT_CODES))},
                         {"action": "Ignore", "onPodConditions": [
                             {"type": "DisruptionTarget",
                              "status": "True"}]},
                         {"action": "Count", "onExitCodes": _exit_codes(
                             sorted(RETRYABLE_EXIT_CODES))},
                     ]}}}


def render_plain(job: K8sJob) -> list[dict[str, Any]]:
    """The objects of the ``plain`` backend, in apply order."""
    return [service(job), stateful_set(job, "ps"),
            stateful_set(job, "worker"), coordinator_job(job),
            network_policy(job)]
