"""What runs ``psrec k8s render``: the job's Kubernetes objects, its PS
memory planned with TensorFlow's partitioner (its parser:
:mod:`psrec.launch.cli.k8s`)."""

from __future__ import annotations

import argparse
import sys

from psrec.errors import EXIT_OK
from psrec.launch.cli import train
from psrec.launch.k8s.render import job_from_args
from psrec.launch.k8s.render import render
from psrec.launch.k8s.render import storage_warnings
from psrec.launch.k8s.render import to_yaml
from psrec.launch.k8s.render import write_outputs


def run_k8s_render(args: argparse.Namespace) -> int:
    job = job_from_args(args, train.add_commands)
    for warning in storage_warnings(job):
        print(warning, file=sys.stderr)
    written = write_outputs(job, to_yaml(render(job, args.backend)),
                            args.out)
    if written:
        print(f"psrec k8s render: wrote {', '.join(written)} ({args.backend}"
              f": {job.workers} workers + {job.ps} PS, PS memory "
              f"{job.ps_memory})", file=sys.stderr)
    return EXIT_OK
