"""What runs ``psrec runs`` and ``psrec show`` (their parsers:
:mod:`psrec.launch.cli.runs`): file reads only, no TensorFlow."""

from __future__ import annotations

import argparse

from psrec.errors import EXIT_OK
from psrec.launch.cli.support import print_json
from psrec.launch.job.runs import find_runs
from psrec.launch.job.runs import read_run

_HEADER = ("name", "model", "data", "steps", "best", "exports", "changed")


def run_runs(args: argparse.Namespace) -> int:
    runs = find_runs(args.folder)
    if args.json:
        print_json({"folder": args.folder,
                    "runs": [run.to_dict() for run in runs]})
        return EXIT_OK
    rows = [_HEADER] + [run.cells() for run in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)
                        ).rstrip(), flush=True)
    return EXIT_OK


def run_show(args: argparse.Namespace) -> int:
    run = read_run(args.workdir)
    if args.json:
        print_json(run.to_dict())
    else:
        print(run.details(), flush=True)
    return EXIT_OK
