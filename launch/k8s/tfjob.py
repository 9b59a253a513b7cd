"""The ``tfjob`` backend: one Kubeflow ``kubeflow.org/v1`` TFJob.

The training operator creates one pod and one Service per replica and
gives each pod ``TF_CONFIG`` (:func:`psrec.launch.k8s.pods.operator_tf_config`
computes the same), so the pods here carry no cluster spec of their own.

- ``Chief``: the psrec coordinator (``psrec train`` coordinating the
  cluster of its TF_CONFIG); the job succeeds when it does.
- ``PS`` and ``Worker``: ``psrec server``. No ``Evaluator``: a coordinator
  whose cluster lists one hangs (psrec evaluates inline).
- ``restartPolicy: ExitCode`` everywhere: the operator's code restarts a
  replica whose exit code is >= 128 (psrec's 138 retryable, 130/143
  interrupted, 137 killed) and fails the job on any other (psrec's 1 and
  2 are permanent); ``runPolicy.backoffLimit`` bounds the restarts.
- ``cleanPodPolicy: Running``: PS and worker pods, which serve forever,
  are deleted when the job ends.
"""

from __future__ import annotations

from typing import Any

from psrec.launch.k8s.objects import K8sJob
from psrec.launch.k8s.objects import labels
from psrec.launch.k8s.objects import network_policy
from psrec.launch.k8s.objects import pod_template

#: TFJob replica type -> psrec component, in the order they are written.
REPLICA_TYPES = {"Chief": "coordinator", "PS": "ps", "Worker": "worker"}


def _replicas(job: K8sJob, component: str) -> int:
    return {"coordinator": 1, "ps": job.ps, "worker": job.workers}[component]


def tfjob(job: K8sJob) -> dict[str, Any]:
    """The TFJob object of ``job``."""
    specs = {
        rtype: {"replicas": _replicas(job, component),
                "restartPolicy": "ExitCode",
                "template": pod_template(job, component, [])}
        for rtype, component in REPLICA_TYPES.items()}
    return {
        "apiVersion": "kubeflow.org/v1", "kind": "TFJob",
        "metadata": {"name": job.name, "namespace": job.namespace,
                     "labels": labels(job)},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "Running",
                          "backoffLimit": job.backoff_limit},
            "tfReplicaSpecs": specs,
        },
    }


def render_tfjob(job: K8sJob) -> list[dict[str, Any]]:
    """The objects of the ``tfjob`` backend: the TFJob and its
    NetworkPolicy."""
    return [tfjob(job), network_policy(job)]
