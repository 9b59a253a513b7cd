"""A job process: a ``psrec train`` job that one of psrec's own launchers
hands over in a ``job.json`` file, run in a child process.

* ``coordinator JOB.json --cluster CLUSTER.json``: the coordinator of a
  supervised local cluster (:func:`psrec.launch.supervise.supervisor.
  supervise` starts it, and again after every restart; the cluster file
  holds the roles still live);
* ``worker JOB.json``: one worker of a local multi-worker-mirrored run
  (:mod:`psrec.launch.job.local_workers`), its task in ``TF_CONFIG``.

The job file is the :class:`~psrec.launch.job.config.JobConfig` codec's
``job.json``, the job exactly as the launcher resolved it (input mode, the
local tf.data service's address in ``data_service``); the launcher checked
the job's data before starting this process and recorded it
(``record_verified``), so it is loaded from that record, not read again.
Nothing else reaches the process: no ``psrec train`` flags, no environment
variable of psrec's (``TF_CONFIG`` is TensorFlow's channel for a worker's
task). Its failures end as ``psrec train``'s do: one line and its exit code.

Run only by :func:`psrec.launch.job.run.job_process_command`; not a user
command.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from psrec.launch.cli.main import Parser
from psrec.launch.cli.main import run_command
from psrec.launch.cli.main import start_process
from psrec.launch.monitor.progress_bar import progress_for
from psrec.progress import set_default_progress


def _parser() -> argparse.ArgumentParser:
    from psrec.launch.job.run import JOB_PROCESS
    from psrec.launch.job.run import JOB_ROLES
    parser = Parser(prog=JOB_PROCESS, usage=f"python -m {JOB_PROCESS} "
                    "{coordinator,worker} JOB.json [--cluster FILE] [--json]",
                    description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=JOB_ROLES)
    parser.add_argument("job", help="the job.json the launcher wrote")
    parser.add_argument("--cluster", default=None,
                        help="coordinator: the cluster file to coordinate")
    parser.add_argument("--json", action="store_true",
                        help="print the result as `psrec train --json`")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    start_process()
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if (args.cluster is None) == (args.role == "coordinator"):
        parser.error("the coordinator needs --cluster FILE; a worker "
                        "takes none (its task is in TF_CONFIG)")
    set_default_progress(progress_for(args))  # as `psrec train` reports
    return run_command("train", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    from psrec.launch.cli.train import coordinate
    from psrec.launch.cli.train import train_here
    from psrec.launch.job.config import JobConfig
    from psrec.ps_cluster.cluster.tf_config import TFConfig
    config = JobConfig.from_dict(json.loads(Path(args.job).read_text()))
    if args.role == "worker":
        return train_here(args, config, data_verified=True)
    cluster = TFConfig.from_file(args.cluster)
    cluster.validate(strategy="ps",
                     allow_remote=config.strategy.allow_remote)
    return coordinate(args, config, cluster.cluster, data_verified=True)


if __name__ == "__main__":
    sys.exit(main())
