"""``psrec k8s render``: a validated :class:`K8sJob` from the command's
arguments, and its objects as multi-document YAML.

PS memory: ``--ps-memory`` when given; else the sharding planner's
largest PS share (``psrec plan``) plus headroom for the TensorFlow
runtime, planned from ``--spec`` or the spec saved beside a local
``--data`` (with neither, the synthetic data's criteo preset). A remote
``--data`` without ``--spec`` needs ``--ps-memory``.

The extra ``psrec train`` arguments (after ``--``) are parsed by
``psrec train``'s own parser here, so a typo fails at render time, not
in the cluster.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any
from typing import Sequence

import yaml

from psrec.data.format.manifest import Manifest
from psrec.data.format.manifest import spec_for
from psrec.errors import ConfigError
from psrec.errors import check
from psrec.launch.k8s.objects import BACKENDS
from psrec.launch.k8s.objects import K8sJob
from psrec.launch.k8s.plain import render_plain
from psrec.launch.k8s.tfjob import render_tfjob
from psrec.launch.monitor.dashboard import grafana_dashboard
from psrec.models.ranking.config import model_config
from psrec.options import option_values
from psrec.ps_cluster.planner.plan import plan
from psrec.uri import is_uri

_RENDERERS = dict(zip(BACKENDS, (render_tfjob, render_plain)))
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^\d+(\.\d+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
#: Flags render sets itself; repeating them after ``--`` is refused.
_OWN_FLAGS = ("--data", "--workdir", "--workers", "--ps", "--ps-memory",
              "--allow-remote", "--metrics-port", "--metrics-host",
              "--cluster", "--strategy", "--json")
_MIB = 1 << 20
#: PS memory = planned bytes x 1.25 + 512 MiB (TF runtime, gRPC buffers).
_PS_HEADROOM, _PS_RUNTIME_BYTES = 1.25, 512 * _MIB


def check_name(flag: str, value: str, longest: int = 63) -> str:
    if len(value) > longest or not _DNS_LABEL.match(value):
        raise ConfigError(
            f"`{flag}` = {value!r} is not a valid Kubernetes name: use at "
            f"most {longest} lower-case letters, digits and '-', starting "
            "with a letter and ending with a letter or digit.")
    return value


def check_quantity(flag: str, value: str | None) -> str | None:
    if value is not None and not _QUANTITY.match(value):
        raise ConfigError(
            f"`{flag}` = {value!r} is not a Kubernetes memory quantity; "
            "write e.g. 4Gi, 512Mi or 8G.")
    return value


def _train_namespace(train_args: Sequence[str], add_train_command
                     ) -> argparse.Namespace:
    """``train_args`` parsed by ``psrec train``'s parser, which
    ``add_train_command(subparsers)`` adds (errors raise
    :class:`ConfigError` naming them)."""

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # type: ignore[override]
            raise ConfigError(
                f"the `psrec train` arguments after `--` "
                f"({' '.join(train_args)}): {' '.join(message.split())}.")

    parser = _Parser(prog="psrec")
    add_train_command(parser.add_subparsers(
        dest="command", parser_class=_Parser))
    for arg in train_args:
        if arg.split("=", 1)[0] in _OWN_FLAGS:
            raise ConfigError(
                f"`{arg}` after `--` is set by `psrec k8s render` itself; "
                f"give it as a render option (see `psrec k8s render "
                "--help`), not after `--`.")
    return parser.parse_args(["train", *train_args])


def is_local(uri: str | None) -> bool:
    """A local path (``file://`` included, as everywhere in psrec)."""
    return uri is not None and not is_uri(uri)


def planned_ps_memory(args: argparse.Namespace,
                      train: argparse.Namespace) -> str:
    """The PS memory quantity from the sharding planner (see module
    docstring)."""
    spec_source = args.spec or train.spec
    if spec_source is None and args.data is not None and not is_local(
            args.data):
        raise ConfigError(
            f"`--ps-memory` is required with a remote --data ({args.data}) "
            "and no --spec: the spec to plan from is not readable here; "
            "give --spec FILE or --ps-memory e.g. 8Gi.")
    manifest = Manifest.load(args.data) if is_local(args.data) else None
    spec = spec_for(manifest, spec_source)
    sharding = plan(spec, model_config(train.model), args.ps,
                    shards=train.table_shards,
                    partitioner=train.partitioner)
    needed = sharding.max_ps_bytes * _PS_HEADROOM + _PS_RUNTIME_BYTES
    return f"{math.ceil(needed / _MIB)}Mi"


def job_from_args(args: argparse.Namespace, add_train_command) -> K8sJob:
    """The :class:`K8sJob` of ``psrec k8s render``'s arguments (those
    after ``--``: :func:`_train_namespace`)."""
    train_args = tuple(args.train_args)
    train = _train_namespace(train_args, add_train_command)
    if args.spec and train.spec:
        raise ConfigError(
            "give --spec once: as a render option (planning only; the "
            "coordinator reads the spec saved beside --data) or after `--` "
            "(the coordinator's, also planned from).")
    ps_memory = (check_quantity("--ps-memory", args.ps_memory)
                 or planned_ps_memory(args, train))
    check(args.metrics_port <= 65535, "--metrics-port", args.metrics_port,
          "must be a TCP port, 1 to 65535")
    if not args.image.strip() or any(c.isspace() for c in args.image):
        raise ConfigError(f"`--image` = {args.image!r} must be an image "
                          "reference such as registry/psrec:1.0.")
    return option_values(
        args, K8sJob, name=check_name("--name", args.name, longest=40),
        namespace=check_name("--namespace", args.namespace),
        ps_memory=ps_memory, train_args=train_args,
        worker_memory=check_quantity("--worker-memory", args.worker_memory),
        monitoring_namespace=check_name("--monitoring-namespace",
                                        args.monitoring_namespace))


def render(job: K8sJob, backend: str) -> list[dict[str, Any]]:
    """The Kubernetes objects of ``job`` under ``backend``."""
    return _RENDERERS[backend](job)


class _PlainDumper(yaml.SafeDumper):
    """Writes a repeated object in full each time (no ``&id``/``*id``
    anchors: kubectl reads them, but people and some tools do not)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(objects: Sequence[dict[str, Any]]) -> str:
    return yaml.dump_all(list(objects), Dumper=_PlainDumper,
                         sort_keys=False, default_flow_style=False,
                         width=1000)


def storage_warnings(job: K8sJob) -> list[str]:
    """Local paths every pod must share: they need ``--pvc`` (mounted at
    the same path) or an object-store URI."""
    return [f"psrec k8s render: warning: {flag} {value} is a local path: "
            "every pod must see it (give --pvc CLAIM and a path under "
            f"/mnt/psrec, or an object-store URI such as gs://...)."
            for flag, value in (("--data", job.data),
                                ("--workdir", job.workdir))
            if is_local(value) and job.pvc is None]


def write_outputs(job: K8sJob, text: str, out: str | None) -> list[str]:
    """Writes the YAML to ``out`` (stdout when None) and, beside a file,
    the Grafana dashboard ``dashboard.json``; returns the paths written."""
    if out is None:
        sys.stdout.write(text)
        return []
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    board = path.parent / "dashboard.json"
    board.write_text(json.dumps(grafana_dashboard(job.name), indent=2) + "\n",
                     encoding="utf-8")
    return [str(path), str(board)]
