"""``--input-mode data-service`` on the command line: the flags, the
``psrec data-server`` role command, and the local tf.data service
(:mod:`psrec.launch.supervise.data_service`): one process apart from the
training workers (one TensorFlow import, and a worker that dies takes no
tf.data worker -- nor the files it is reading -- with it) that outlives
coordinator and role restarts. Its dispatcher's address is the job's
``data_service`` (the supervisor hands the coordinator that job); it is
stopped by pid when the job ends (it also dies with the launcher,
``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
from typing import Iterator

from psrec.data.input.config import INPUT_MODES
from psrec.errors import EXIT_OK
from psrec.launch.cli.argtypes import non_negative
from psrec.launch.cli.options import add_option
from psrec.launch.cli.support import UsageError
from psrec.launch.job.config import JobConfig
from psrec.launch.supervise.data_service import LocalDataService
from psrec.ps_cluster.cluster.tf_config import TFConfig
from psrec.ps_cluster.training.data_service import start_dispatcher
from psrec.ps_cluster.training.data_service import start_worker


def add_input_flags(group) -> None:
    """``--input-mode`` and ``--data-service`` of ``psrec train``."""
    group.add_argument(
        "--input-mode", choices=("auto", *INPUT_MODES), default="auto",
        help="static: each worker reads a fixed share of the train files (a "
        "lost worker's share is read by nobody, a restarted one starts it "
        "again); data-service: a tf.data service hands out one file at a "
        "time to whichever worker asks, so a lost worker's remaining files "
        "are read by the others (--strategy ps; local runs start the "
        "service); auto: data-service where psrec starts the "
        "cluster itself with >= 2 workers or a dispatcher is given "
        "(--data-service), static otherwise (one worker, an existing "
        "cluster without --data-service, the other strategies)")
    add_option(group, JobConfig, "data_service", metavar="HOST:PORT",
               help="the tf.data service dispatcher of an existing cluster "
               "(`psrec data-server`), with --input-mode data-service")


def resolve_input_mode(args: argparse.Namespace) -> str:
    """The input mode ``--input-mode auto`` stands for (see its help)."""
    if args.input_mode != "auto":
        return args.input_mode
    if args.strategy != "ps" or getattr(args, "follow", None):
        return "static"  # --follow: each partition's files by worker index
    if args.data_service:
        return "data-service"
    existing = args.cluster or TFConfig.from_env() is not None
    return "data-service" if not existing and args.workers >= 2 else "static"


@contextlib.contextmanager
def local_data_service(config, log=print
                       ) -> Iterator[tuple[object, LocalDataService | None]]:
    """Starts the local tf.data service when ``config`` asks for it (and
    names no dispatcher) -- one process: the dispatcher and one tf.data
    worker per training worker. Yields ``(config, service)``: the job with
    the service's address as its ``data_service``, and the service for the
    supervisor to wait for (:meth:`LocalDataService.wait_ready`, once the
    roles it starts meanwhile are up) and keep alive
    (:meth:`LocalDataService.keep`; None when not started); stops it on
    exit."""
    if config.input.mode != "data-service" or config.data_service:
        yield config, None
        return
    service = LocalDataService(config.workers, config.state_dir,
                               str(config.workdir), log)
    try:
        service.start()
        yield dataclasses.replace(
            config, data_service=f"grpc://{service.address}"), service
    finally:
        service.stop()


def _cmd_data_server(args: argparse.Namespace) -> int:
    if args.role == "worker" and not args.dispatcher:
        raise UsageError("give --dispatcher HOST:PORT with --role worker.")
    local = []  # a local service's tf.data workers, kept while it serves
    if args.role == "dispatcher":
        server = start_dispatcher(args.port, args.work_dir)
        local = [start_worker(0, server.target)  # any free port
                 for _ in range(args.local_workers)]
    else:
        server = start_worker(args.port, args.dispatcher)
    print(f"psrec data-server: tf.data {args.role} on port {args.port} "
          f"(pid {os.getpid()})", flush=True)
    server.join()
    del local
    return EXIT_OK


def add_data_server_command(sub: argparse._SubParsersAction) -> None:
    """Registers ``psrec data-server``."""
    p = sub.add_parser(
        "data-server", help="run one tf.data service role (blocks)",
        description="Run a tf.data service dispatcher or worker for "
        "`psrec train --input-mode data-service --data-service HOST:PORT`.")
    p.add_argument("--role", choices=("dispatcher", "worker"), required=True,
                   help="run the dispatcher (one per job) or a tf.data "
                   "worker (one per training worker host)")
    p.add_argument("--port", type=non_negative, required=True,
                   help="port to listen on (0: any free port)")
    p.add_argument("--dispatcher", default=None,
                   help="HOST:PORT of the dispatcher (--role worker)")
    p.add_argument("--work-dir", default=None,
                   help="dispatcher journal folder: fault-tolerant mode, "
                   "a restarted dispatcher recovers its jobs")
    p.add_argument("--local-workers", type=non_negative, default=0,
                   help="--role dispatcher: also run N tf.data workers in "
                   "this process (a one-machine service, as psrec train "
                   "starts it)")
    p.add_argument("--run-dir", default=None, help=argparse.SUPPRESS)
    p.set_defaults(run=_cmd_data_server)
