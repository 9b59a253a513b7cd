"""The pods a rendered manifest makes, with the environment Kubernetes
gives each: what ``psrec k8s simulate`` runs.

- TFJob: one pod per replica, named ``<job>-<type>-<i>`` (lower-case
  type), and ``TF_CONFIG`` computed as Kubeflow's training operator does
  (``genClusterSpec``): for every replica type but ``Evaluator`` the
  addresses ``<job>-<type>-<i>.<namespace>.svc:<port>``, the port being
  the ``tfjob-port`` of the ``tensorflow`` container (default 2222); task
  type and index; ``"environment": "cloud"``; Go's compact JSON.
- StatefulSets: pods ``<set>-<ordinal>`` reachable as
  ``<pod>.<serviceName>.<namespace>.svc``; a Job's pod as
  ``<hostname>.<subdomain>.<namespace>.svc``. Their environment is the
  container's, resolved like the kubelet: ``valueFrom.fieldRef`` of the
  pod's name, namespace and labels (``apps.kubernetes.io/pod-index`` is
  the ordinal) and ``$(VAR)`` references to variables defined before.

Every pod's TF_CONFIG is checked to name one and the same cluster in
which the pod's own DNS name and port are its task's address: a manifest
whose pods could not find each other fails here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from typing import Iterable

from psrec.errors import ConfigError
from psrec.launch.k8s.objects import CONTAINER
from psrec.launch.k8s.objects import TF_PORT
from psrec.launch.k8s.objects import TF_PORT_NAME
from psrec.launch.k8s.plain import POD_INDEX_LABEL


@dataclass
class Pod:
    """One pod: its name, DNS host, labels, ``tensorflow`` container and
    resolved environment (``env["TF_CONFIG"]`` names Service hosts)."""

    name: str
    dns: str
    labels: dict[str, str]
    container: dict[str, Any]
    env: dict[str, str]

    @property
    def tf_config(self) -> dict[str, Any]:
        return json.loads(self.env["TF_CONFIG"])

    @property
    def task(self) -> tuple[str, int]:
        task = self.tf_config["task"]
        return task["type"], int(task["index"])

    def port(self, name_or_number: Any) -> int:
        """A container port by name (or a number as is)."""
        if isinstance(name_or_number, int):
            return name_or_number
        for port in self.container.get("ports", []):
            if port.get("name") == name_or_number:
                return int(port["containerPort"])
        raise ConfigError(f"pod {self.name}: no container port named "
                          f"{name_or_number!r}.")


def _tensorflow_container(template: dict[str, Any], owner: str
                          ) -> dict[str, Any]:
    containers = template.get("spec", {}).get("containers", [])
    for item in containers:
        if item.get("name") == CONTAINER:
            return item
    raise ConfigError(
        f"{owner}: no container named {CONTAINER!r} (the training operator "
        "needs that name); rerender with `psrec k8s render`.")


def _tf_port(container: dict[str, Any]) -> int:
    for port in container.get("ports", []):
        if port.get("name") == TF_PORT_NAME:
            return int(port["containerPort"])
    return TF_PORT


def _go_json(value: Any) -> str:
    """JSON as Go's ``json.Marshal`` writes it: compact, map keys sorted,
    struct fields in declaration order (dicts here keep theirs)."""
    def sort_maps(item: Any, struct: bool) -> Any:
        if isinstance(item, dict):
            keys = list(item) if struct else sorted(item)
            return {k: sort_maps(item[k], False) for k in keys}
        return item
    top = {"cluster": sort_maps(value["cluster"], False),
           "task": value["task"], "environment": value["environment"]}
    return json.dumps(top, separators=(",", ":"))


def operator_tf_config(job: dict[str, Any], rtype: str, index: int) -> str:
    """``TF_CONFIG`` of replica ``rtype`` ``index`` of TFJob ``job``, as
    the training operator computes it."""
    name = job["metadata"]["name"]
    namespace = job["metadata"].get("namespace", "default")
    cluster = {}
    for kind, spec in job["spec"]["tfReplicaSpecs"].items():
        if kind == "Evaluator":  # not part of the training cluster
            continue
        port = _tf_port(_tensorflow_container(spec["template"], name))
        rt = kind.lower()
        cluster[rt] = [f"{name}-{rt}-{i}.{namespace}.svc:{port}"
                       for i in range(int(spec.get("replicas", 1)))]
    return _go_json({"cluster": cluster,
                     "task": {"type": rtype.lower(), "index": index},
                     "environment": "cloud"})


def _static_env(container: dict[str, Any]) -> dict[str, str]:
    env = {}
    for item in container.get("env", []):
        if "valueFrom" in item:
            raise ConfigError(
                f"env {item['name']}: valueFrom is not simulated for TFJob "
                "pods; rerender with `psrec k8s render`.")
        env[item["name"]] = _expand(item.get("value", ""), env)
    return env


def tfjob_pods(job: dict[str, Any]) -> list[Pod]:
    name = job["metadata"]["name"]
    namespace = job["metadata"].get("namespace", "default")
    pods = []
    for rtype, spec in job["spec"]["tfReplicaSpecs"].items():
        if rtype == "Evaluator":
            raise ConfigError(
                f"TFJob {name}: an Evaluator replica is not simulated (a "
                "psrec coordinator hangs when the cluster lists one; psrec "
                "evaluates inline).")
        template = spec["template"]
        container = _tensorflow_container(template, f"{name} {rtype}")
        for index in range(int(spec.get("replicas", 1))):
            pod = f"{name}-{rtype.lower()}-{index}"
            env = _static_env(container)
            env["TF_CONFIG"] = operator_tf_config(job, rtype, index)
            pods.append(Pod(pod, f"{pod}.{namespace}.svc",
                            dict(template.get("metadata", {}).get(
                                "labels", {})), container, env))
    return pods


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def _expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion: defined variables are replaced,
    undefined references kept as written, ``$$`` is a literal ``$``."""
    def replace(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))
    return _REFERENCE.sub(replace, value)


_LABEL_FIELD = re.compile(r"^metadata\.labels\['([^']+)'\]$")


def _field(path: str, pod: str, namespace: str,
           labels: dict[str, str]) -> str:
    fields = {"metadata.name": pod, "metadata.namespace": namespace}
    if path in fields:
        return fields[path]
    match = _LABEL_FIELD.match(path)
    if match and match.group(1) in labels:
        return labels[match.group(1)]
    raise ConfigError(f"pod {pod}: fieldRef {path!r} has no value here "
                      "(simulated: metadata.name, metadata.namespace and "
                      "the pod's labels).")


def _resolved_env(container: dict[str, Any], pod: str, namespace: str,
                  labels: dict[str, str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in container.get("env", []):
        source = item.get("valueFrom")
        if source is None:
            env[item["name"]] = _expand(item.get("value", ""), env)
        elif "fieldRef" in source:
            env[item["name"]] = _field(source["fieldRef"]["fieldPath"], pod,
                                       namespace, labels)
        else:
            raise ConfigError(f"pod {pod}: env {item['name']}: only "
                              "fieldRef sources are simulated.")
    return env


def _plain_pod(owner: dict[str, Any], pod: str, dns: str,
               labels: dict[str, str]) -> Pod:
    namespace = owner["metadata"].get("namespace", "default")
    template = owner["spec"]["template"]
    labels = {**template.get("metadata", {}).get("labels", {}), **labels}
    container = _tensorflow_container(template, owner["metadata"]["name"])
    env = _resolved_env(container, pod, namespace, labels)
    if "TF_CONFIG" not in env:
        raise ConfigError(f"pod {pod}: no TF_CONFIG in its environment.")
    return Pod(pod, dns, labels, container, env)


def plain_pods(objects: Iterable[dict[str, Any]]) -> list[Pod]:
    pods = []
    for item in objects:
        namespace = item["metadata"].get("namespace", "default")
        name = item["metadata"]["name"]
        if item["kind"] == "StatefulSet":
            service = item["spec"]["serviceName"]
            for ordinal in range(int(item["spec"].get("replicas", 1))):
                pod = f"{name}-{ordinal}"
                pods.append(_plain_pod(
                    item, pod, f"{pod}.{service}.{namespace}.svc",
                    {POD_INDEX_LABEL: str(ordinal),
                     "statefulset.kubernetes.io/pod-name": pod}))
        elif item["kind"] == "Job":
            spec = item["spec"]["template"]["spec"]
            if "hostname" not in spec or "subdomain" not in spec:
                raise ConfigError(f"Job {name}: its pod needs hostname and "
                                  "subdomain to be addressable.")
            pods.append(_plain_pod(
                item, spec["hostname"],
                f"{spec['hostname']}.{spec['subdomain']}.{namespace}.svc",
                {}))
    return pods


def manifest_pods(objects: list[dict[str, Any]]) -> list[Pod]:
    """Every pod of a rendered manifest (a TFJob, or StatefulSets and a
    Job), checked to form one cluster (see module docstring)."""
    jobs = [o for o in objects if o.get("kind") == "TFJob"]
    if len(jobs) > 1:
        raise ConfigError("the manifest holds several TFJobs; simulate one.")
    pods = tfjob_pods(jobs[0]) if jobs else plain_pods(objects)
    if not pods:
        raise ConfigError("the manifest has no TFJob, StatefulSet or Job to "
                          "simulate; render one with `psrec k8s render`.")
    _check_one_cluster(pods)
    return pods


def _check_one_cluster(pods: list[Pod]) -> None:
    cluster = pods[0].tf_config["cluster"]
    seen = set()
    for pod in pods:
        config = pod.tf_config
        if config["cluster"] != cluster:
            raise ConfigError(f"pod {pod.name}'s TF_CONFIG names another "
                              f"cluster than pod {pods[0].name}'s.")
        kind, index = pod.task
        own = f"{pod.dns}:{_tf_port(pod.container)}"
        listed = cluster.get(kind, [])
        if index >= len(listed) or listed[index] != own:
            raise ConfigError(
                f"pod {pod.name} ({own}) is task {kind}:{index} but the "
                f"cluster lists {listed[index] if index < len(listed) else 'no such task'}"
                " there: its peers could not reach it.")
        seen.add((kind, index))
    missing = [f"{k}:{i}" for k, hosts in cluster.items()
               for i in range(len(hosts)) if (k, i) not in seen]
    if missing:
        raise ConfigError(f"the cluster lists tasks no pod runs: "
                          f"{', '.join(missing)}.")
