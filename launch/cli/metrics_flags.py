"""``psrec train``'s ``--metrics-port``/``--metrics-host`` and the metrics
socket.

The socket is bound by :func:`reserve_metrics_socket` at the very start of
``psrec train``, before the run re-executes itself into its private network
namespace (:mod:`psrec.launch.local.netns`): a socket belongs to the namespace it
was created in, so the supervisor serving it from inside the namespace is
still reachable from the machine's own network, while the TensorFlow
servers beside it are not. The bound socket crosses the ``exec`` as an
inherited file descriptor named in ``PSREC_METRICS_FD``, which the
re-executed process takes (and removes from the environment, so no child
sees it). Binding first also makes a taken port a one-line error before any
data is prepared. The bind address and what it exposes: docs/monitoring.md.
"""

from __future__ import annotations

import argparse
import os
import socket

from psrec.errors import ConfigError
from psrec.launch.cli.argtypes import non_negative

#: The inherited, already bound metrics socket's file descriptor.
FD_ENV = "PSREC_METRICS_FD"
DEFAULT_HOST = "127.0.0.1"


def add_metrics_flags(group) -> None:
    """``--metrics-port`` and ``--metrics-host``."""
    group.add_argument("--metrics-port", type=non_negative, default=0,
                       metavar="PORT",
                       help="serve Prometheus metrics (psrec_*) on "
                       "/metrics and a health check on /healthz (503 when "
                       "the coordinator's heartbeat is older than "
                       "--stall-timeout) on this port; 0: off. Served by "
                       "the supervisor of a local cluster (reachable "
                       "outside its private network), or by the "
                       "coordinator of an existing cluster (--cluster, "
                       "TF_CONFIG). --strategy ps only")
    group.add_argument("--metrics-host", default=DEFAULT_HOST,
                       metavar="HOST",
                       help="address the metrics port binds: "
                       f"{DEFAULT_HOST} is this machine only; 0.0.0.0 or :: "
                       "for a Prometheus on another host or pod")


def check_metrics_flags(args: argparse.Namespace) -> None:
    """Refuses a metrics port the run cannot serve (exit 2)."""
    if args.metrics_port > 65535:
        raise ConfigError(
            f"--metrics-port {args.metrics_port}: not a TCP port; give "
            "1-65535, or 0 for no metrics.")
    if args.metrics_port and args.strategy != "ps":
        raise ConfigError(
            f"--metrics-port applies to --strategy ps only (the metrics "
            f"come from the PS coordinator's heartbeat); drop it for "
            f"--strategy {args.strategy}.")


def reserve_metrics_socket(args: argparse.Namespace
                           ) -> socket.socket | None:
    """The bound (not yet listening) metrics socket of this run: the one
    inherited across psrec's re-execution, else a new one on
    ``--metrics-host:--metrics-port`` (None when the port is 0). The
    descriptor is left inheritable and named in ``PSREC_METRICS_FD`` until
    :func:`take_metrics_socket` claims it."""
    if not args.metrics_port:
        return None
    inherited = _inherited()
    if inherited is not None:
        if inherited.getsockname()[1] == args.metrics_port:
            return inherited
        inherited.detach()  # not ours: leave that descriptor alone
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            args.metrics_host, args.metrics_port, type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as error:
        raise ConfigError(
            f"--metrics-host {args.metrics_host!r}: not an address of this "
            f"machine ({error.strerror}); give an IP such as 127.0.0.1 or "
            "0.0.0.0.") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as error:
        sock.close()
        raise ConfigError(
            f"--metrics-port {args.metrics_port} on {args.metrics_host}: "
            f"cannot bind ({error.strerror}); pick a free port, or 0 for no "
            "metrics.") from None
    sock.set_inheritable(True)
    os.environ[FD_ENV] = str(sock.fileno())
    return sock


def _inherited() -> socket.socket | None:
    """The socket ``PSREC_METRICS_FD`` names, if it is one."""
    try:
        return socket.socket(fileno=int(os.environ[FD_ENV]))
    except (KeyError, ValueError, OSError):
        return None


def take_metrics_socket(sock: socket.socket | None) -> socket.socket | None:
    """Claims the reserved socket for this process: no child inherits it
    or its environment variable from here on."""
    os.environ.pop(FD_ENV, None)
    if sock is not None:
        sock.set_inheritable(False)
    return sock


def isolate_keeping_metrics(args: argparse.Namespace
                            ) -> socket.socket | None:
    """``psrec train``'s first step: checks the metrics flags, binds the
    metrics socket in the caller's network namespace, then
    :func:`psrec.launch.local.netns.isolate_train` (which may re-execute this
    command in a private namespace, the socket inherited); returns the
    socket to serve, or None."""
    from psrec.launch.local.netns import isolate_train
    check_metrics_flags(args)
    sock = reserve_metrics_socket(args)
    isolate_train(args)
    return take_metrics_socket(sock)


def serving(sock: socket.socket | None, workdir, stall_timeout: float | None,
            log=None, restarts=None):
    """:func:`psrec.launch.monitor.metrics_http.serving`, imported on first use (it
    loads ``prometheus_client``; the CLI imports this module)."""
    from psrec.launch.monitor.metrics_http import serving as serve
    return serve(sock, workdir, stall_timeout, log, restarts)
