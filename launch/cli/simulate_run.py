"""What runs ``psrec k8s simulate``: a rendered job's pods as local
processes in a private network namespace (its parser:
:mod:`psrec.launch.cli.k8s`).

Nothing imported here imports TensorFlow: the command re-executes itself
into its namespace first (:func:`isolate_command`), and the pods are
separate processes.
"""

from __future__ import annotations

import argparse
import sys

from psrec.launch.cli.support import print_result
from psrec.launch.k8s.simulate import simulate
from psrec.launch.local.netns import exposure
from psrec.launch.local.netns import isolate_command


def run_k8s_simulate(args: argparse.Namespace) -> int:
    isolate_command(args.argv)  # a private network, before any server
    exposure(args.allow_exposed, "the simulated job")
    result = simulate(args.file, args.timeout, args.log_dir,
                      log=lambda text: print(f"psrec k8s simulate: {text}",
                                             file=sys.stderr, flush=True))
    print_result(args, result)
    return result.exit_code
