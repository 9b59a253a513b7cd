"""The parsers of ``psrec k8s render`` and ``psrec k8s simulate``: a
training job as Kubernetes objects, and those objects run locally as a
check. They import no TensorFlow; what runs them is
:mod:`psrec.launch.cli.render_run` and :mod:`psrec.launch.cli.simulate_run`,
imported only when one runs."""

from __future__ import annotations

import argparse

from psrec.launch.cli.argtypes import non_negative
from psrec.launch.cli.argtypes import positive
from psrec.launch.cli.argtypes import positive_float
from psrec.launch.cli.support import add_json_flag
from psrec.launch.local.netns import add_allow_exposed_flag


def add_render(sub: argparse._SubParsersAction, name: str
               ) -> argparse.ArgumentParser:
    """``psrec k8s render``."""
    p = sub.add_parser(
        name, help="write the Kubernetes objects of a training job",
        description="Write a training job as Kubernetes objects (multi-"
        "document YAML): a Kubeflow TFJob (--backend tfjob) or "
        "StatefulSets, a headless Service and a Job (--backend plain); "
        "both with a NetworkPolicy. Extra `psrec train` arguments for the "
        "coordinator follow `--`, e.g. `-- --steps 1000 --model dcn`.")
    p.add_argument("--backend", choices=("tfjob", "plain"), default="tfjob",
                   help="TFJob for Kubeflow's training operator, or plain "
                   "Kubernetes objects")
    p.add_argument("--name", required=True, help="job name (DNS label)")
    p.add_argument("--image", required=True,
                   help="psrec image (see Dockerfile), ideally by digest")
    p.add_argument("--namespace", default="default",
                   help="namespace of every object")
    p.add_argument("--workers", type=positive, default=2,
                   help="worker tasks")
    p.add_argument("--ps", type=positive, default=1,
                   help="parameter-server tasks")
    p.add_argument("--data", default=None,
                   help="manifest URI of converted data every pod can read "
                   "(default: synthetic data generated into --workdir)")
    p.add_argument("--workdir", required=True,
                   help="URI every pod can write (checkpoints, exports)")
    p.add_argument("--spec", default=None,
                   help="feature spec (preset or local file) to size the "
                   "PS tasks from, when --data is not local (default: the "
                   "spec beside a local --data); the coordinator reads the "
                   "one beside --data (or give `-- --spec PRESET`)")
    p.add_argument("--gpus-per-worker", type=non_negative, default=0,
                   help="nvidia.com/gpu limit of each worker")
    p.add_argument("--ps-memory", default=None,
                   help="memory of each PS task, e.g. 8Gi (default: "
                   "planned from the spec and model by the sharding "
                   "planner)")
    p.add_argument("--worker-memory", default=None,
                   help="memory of each worker, e.g. 4Gi (default: none "
                   "set)")
    p.add_argument("--metrics-port", type=positive, default=9090,
                   help="the coordinator's Prometheus /metrics and "
                   "/healthz port")
    p.add_argument("--monitoring-namespace", default="monitoring",
                   help="the only namespace admitted to the metrics port")
    p.add_argument("--backoff-limit", type=non_negative, default=6,
                   help="restarts on retryable exit codes before the job "
                   "fails")
    p.add_argument("--pvc", default=None,
                   help="a PersistentVolumeClaim mounted at /mnt/psrec in "
                   "every pod (for local --data/--workdir paths)")
    p.add_argument("--out", default=None,
                   help="YAML file (default: stdout); dashboard.json is "
                   "written beside it")
    p.add_argument("train_args", nargs="*", metavar="-- TRAIN_ARGS",
                   help="extra `psrec train` arguments for the coordinator")
    return p


def add_simulate(sub: argparse._SubParsersAction, name: str
                 ) -> argparse.ArgumentParser:
    """``psrec k8s simulate``."""
    p = sub.add_parser(
        name, help="run a rendered job's pods as local processes",
        description="Run every pod of a rendered job (psrec k8s render) as "
        "a local process with the environment Kubernetes would give it "
        "(TF_CONFIG as the training operator or the StatefulSet ordinals "
        "make it; Service names mapped to loopback ports), in a private "
        "network namespace; exits with the coordinator's code.")
    p.add_argument("file", help="the rendered YAML")
    p.add_argument("--timeout", type=positive_float, default=3600.0,
                   help="seconds before every pod is stopped (exit 138)")
    p.add_argument("--log-dir", default=None,
                   help="where each pod's log goes (default: a new "
                   "temporary folder)")
    add_allow_exposed_flag(p)
    add_json_flag(p)
    return p


def add_k8s(sub: argparse._SubParsersAction, name: str
            ) -> argparse._SubParsersAction:
    """``psrec k8s``: the parser of the group; returns where its
    sub-commands (``render``, ``simulate``) are added."""
    p = sub.add_parser(name, help="run psrec on Kubernetes: render "
                       "manifests, simulate them locally")
    return p.add_subparsers(dest="k8s_command", required=True,
                            metavar="COMMAND",
                            help="render: write the objects; simulate: run "
                            "them locally")
