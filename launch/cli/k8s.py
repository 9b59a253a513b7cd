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
from psrec.launch.cli.options import add_option
from psrec.launch.cli.support import add_json_flag
from psrec.launch.k8s.objects import BACKENDS
from psrec.launch.k8s.objects import K8sJob
from psrec.launch.local.netns import add_allow_exposed_flag
from psrec.options import field_named
from psrec.options import option_of


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
    p.add_argument("--backend", choices=BACKENDS, default=BACKENDS[0],
                   help="TFJob for Kubeflow's training operator, or plain "
                   "Kubernetes objects")
    for name, type in (("name", None), ("image", None), ("namespace", None),
                       ("workers", positive), ("ps", positive), ("data", None),
                       ("workdir", None)):
        add_option(p, K8sJob, name, type=type)
    p.add_argument("--spec", default=None,
                   help="feature spec (preset or local file) to size the "
                   "PS tasks from, when --data is not local (default: the "
                   "spec beside a local --data); the coordinator reads the "
                   "one beside --data (or give `-- --spec PRESET`)")
    add_option(p, K8sJob, "gpus_per_worker", type=non_negative)
    add_option(p, K8sJob, "ps_memory", default=None)
    add_option(p, K8sJob, "worker_memory")
    add_option(p, K8sJob, "metrics_port", type=positive)
    add_option(p, K8sJob, "monitoring_namespace")
    add_option(p, K8sJob, "backoff_limit", type=non_negative)
    add_option(p, K8sJob, "pvc")
    p.add_argument("--out", default=None,
                   help="YAML file (default: stdout); dashboard.json is "
                   "written beside it")
    p.add_argument("train_args", nargs="*", metavar="-- TRAIN_ARGS",
                   help=option_of(field_named(K8sJob, "train_args")).help)
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
