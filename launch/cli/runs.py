"""The parsers of the ``psrec`` commands that read what runs left on disk:
``runs`` lists the workdirs of a folder, ``show`` summarises one. They,
and what runs them (:mod:`psrec.launch.cli.runs_run`), import no
TensorFlow and start nothing."""

from __future__ import annotations

import argparse

from psrec.launch.cli.support import add_json_flag
from psrec.launch.job.runs import RUNS_FOLDER


def add_runs(sub: argparse._SubParsersAction, name: str
             ) -> argparse.ArgumentParser:
    """``psrec runs [DIR]``: one line per run."""
    p = sub.add_parser(
        name, help="list the runs (workdirs) of a folder",
        description="One line per run (a folder with checkpoints/job.json): "
        "name, model, data, steps done, best metric, export versions, last "
        "change. Reads files only: no TensorFlow, no cluster.")
    p.add_argument("folder", nargs="?", default=RUNS_FOLDER, metavar="DIR",
                   help="folder of workdirs, or one workdir (default: "
                   f"{RUNS_FOLDER}, where psrec train's --workdir is by "
                   "default)")
    add_json_flag(p)
    return p


def add_show(sub: argparse._SubParsersAction, name: str
             ) -> argparse.ArgumentParser:
    """``psrec show WORKDIR``: one run's summary."""
    p = sub.add_parser(
        name, help="one run's summary: spec, model, data, metrics, exports",
        description="Spec, model, data, steps done, best and final metrics, "
        "export versions and wall time of one run, read from its files "
        "(checkpoints/job.json, checkpoints/best.json, summary.json, "
        "export/): no TensorFlow, no cluster.")
    p.add_argument("workdir", metavar="WORKDIR",
                   help="the run's folder (psrec train --workdir)")
    add_json_flag(p)
    return p
