"""``--input-mode data-service`` on the command line: the flags, the
``psrec data-server`` role command, and the local tf.data service.

The local launcher starts one dispatcher and one tf.data worker per
training worker, each its own OS process on a free loopback port (beside
the PS/worker roles, so a training worker that dies does not take a tf.data
worker -- and the files it is reading -- with it), passes the dispatcher's
address to the coordinator in ``PSREC_DATA_SERVICE`` and stops them by pid
when the job ends (each also dies with the launcher, ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from psrec.errors import EXIT_OK
from psrec.launch.argtypes import non_negative
from psrec.launch.cli_support import UsageError
from psrec.launch.local import die_with_parent
from psrec.launch.local import stop_processes
from psrec.launch.local import wait_listening
from psrec.ps_cluster.addresses import free_loopback_ports
from psrec.ps_cluster.data_service import ADDRESS_ENV
from psrec.runtime import role_environment

_START_TIMEOUT = 120.0  # seconds for the tf.data roles to listen


def add_input_flags(group) -> None:
    """``--input-mode`` and ``--data-service`` of ``psrec train``."""
    group.add_argument(
        "--input-mode", choices=("static", "data-service"), default="static",
        help="static: each worker reads a fixed share of the train files (a "
        "lost worker's share is read by nobody, a restarted one starts it "
        "again); data-service: a tf.data service hands out one file at a "
        "time to whichever worker asks, so a lost worker's remaining files "
        "are read by the others (--strategy ps; local runs start the "
        "service)")
    group.add_argument(
        "--data-service", default=None, metavar="HOST:PORT",
        help="the tf.data service dispatcher of an existing cluster "
        "(`psrec data-server`), with --input-mode data-service")


def use_dispatcher_flag(args: argparse.Namespace) -> None:
    """``--data-service`` reaches the trainer as :data:`ADDRESS_ENV`."""
    if getattr(args, "data_service", None):
        os.environ[ADDRESS_ENV] = args.data_service


@contextlib.contextmanager
def local_data_service(config, log=print) -> Iterator[None]:
    """Starts the local tf.data service when ``config`` asks for it (and
    no dispatcher was given), with :data:`ADDRESS_ENV` set for the
    coordinator; stops it on exit."""
    if config.input.mode != "data-service" or os.environ.get(ADDRESS_ENV):
        yield
        return
    logs = Path(config.workdir) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    ports = free_loopback_ports(config.workers + 1)
    dispatcher = f"127.0.0.1:{ports[0]}"
    roles = [("dispatcher", ports[0], [])] + [
        ("worker", port, ["--dispatcher", dispatcher])
        for port in ports[1:]]
    processes: list[tuple[str, subprocess.Popen]] = []
    try:
        for index, (role, port, extra) in enumerate(roles):
            name = (f"data-{role}" if role == "dispatcher"
                    else f"data-worker-{index - 1}")
            with open(logs / f"{name}.log", "ab") as out:
                processes.append((name, subprocess.Popen(
                    [sys.executable, "-P", "-m", "psrec", "data-server",
                     "--role", role, "--port", str(port), "--run-dir",
                     str(config.workdir), *extra],
                    stdout=out, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env=role_environment(),
                    preexec_fn=die_with_parent)))
        deadline = time.monotonic() + _START_TIMEOUT
        for (name, process), (_, port, _) in zip(processes, roles):
            wait_listening(name, process, f"127.0.0.1:{port}",
                           logs / f"{name}.log", deadline, _START_TIMEOUT)
        log(f"tf.data service: dispatcher {dispatcher} + {config.workers} "
            f"tf.data workers (data pids "
            f"{', '.join(str(p.pid) for _, p in processes)})")
        os.environ[ADDRESS_ENV] = f"grpc://{dispatcher}"
        yield
    finally:
        os.environ.pop(ADDRESS_ENV, None)
        stop_processes([p for _, p in processes])


def _cmd_data_server(args: argparse.Namespace) -> int:
    from psrec.ps_cluster.data_service import start_dispatcher
    from psrec.ps_cluster.data_service import start_worker
    if args.role == "worker" and not args.dispatcher:
        raise UsageError("give --dispatcher HOST:PORT with --role worker.")
    if args.role == "dispatcher":
        server = start_dispatcher(args.port, args.work_dir)
    else:
        server = start_worker(args.port, args.dispatcher)
    print(f"psrec data-server: tf.data {args.role} on port {args.port} "
          f"(pid {os.getpid()})", flush=True)
    server.join()
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
    p.add_argument("--run-dir", default=None, help=argparse.SUPPRESS)
    p.set_defaults(run=_cmd_data_server)
