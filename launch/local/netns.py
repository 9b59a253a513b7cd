"""A private network for the local cluster: a Linux network namespace
whose only interface is loopback (why, and what it guarantees:
``docs/cluster.md``).

How: ``psrec train`` (local cluster, as the ``psrec`` command) re-executes
itself, same pid, as ``python -c <netns.main()> ARGS``, which calls
``unshare(CLONE_NEWNET)`` (root), else ``unshare(CLONE_NEWUSER |
CLONE_NEWNET)`` with the caller's uid and gid mapped to themselves
(unprivileged user namespaces), brings ``lo`` up, and runs the command on.
Every child inherits the namespace. Where neither is allowed, the local
cluster is refused unless ``--allow-exposed`` is given, and then a warning
names every port and who can reach it.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import os
import socket
import struct
import sys
from pathlib import Path
from typing import Callable
from typing import Mapping
from typing import Sequence

from psrec.errors import ConfigError
from psrec.ps_cluster.cluster.tf_config import TFConfig

#: Set to 1: behave as if network namespaces were unavailable (tests).
NO_NETNS_ENV = "PSREC_NO_NETNS"
#: Set by the re-executed process: "private", or "unavailable: <why>".
STATE_ENV = "PSREC_NETNS"

#: What a local run prints when its cluster is isolated.
ISOLATED = ("psrec: local cluster in a private network namespace (loopback "
            "only): unreachable from other hosts")

# What the re-executed process runs (``-c``, not ``-m``: this module is
# already imported by ``psrec.launch`` when ``-m`` would run it).
_ENTRY = ("import sys; from psrec.launch.local.netns import enter_and_record; "
          "enter_and_record(); from psrec.launch.cli.main import main; "
          "sys.exit(main(sys.argv[1:]))")
_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = "16sH22x"  # struct ifreq: name, flags, rest of the union


class ExposedError(ConfigError):
    """The local cluster would be reachable from other hosts."""


def forced_unavailable() -> bool:
    return os.environ.get(NO_NETNS_ENV, "").strip() not in ("", "0")


def interfaces() -> list[str]:
    """The network interfaces of this process's namespace."""
    lines = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    return [line.split(":", 1)[0].strip() for line in lines if ":" in line]


def private_network() -> bool:
    """True when this process's network namespace has no interface but
    loopback (what psrec's re-execution sets up, or ``unshare -rn``)."""
    if forced_unavailable():
        return False
    try:
        return set(interfaces()) <= {"lo"}
    except OSError:  # no /proc: not Linux
        return False


def enter_private_network() -> str | None:
    """Moves this (single-threaded) process into a new network namespace
    with only ``lo``, up. Returns None on success, else why it could not."""
    if forced_unavailable():
        return f"{NO_NETNS_ENV}=1 is set"
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux-only (this is {sys.platform})"
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(_CLONE_NEWNET) != 0:
        plain = os.strerror(ctypes.get_errno())
        if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
            return (f"unshare(CLONE_NEWNET): {plain}; unshare(CLONE_NEWUSER"
                    f"|CLONE_NEWNET): {os.strerror(ctypes.get_errno())}")
        try:  # keep our own uid/gid inside the user namespace
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
            Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
        except OSError as error:
            return f"mapping uid/gid into a user namespace: {error}"
    try:
        _loopback_up()
    except OSError as error:
        return f"bringing up lo in the new namespace: {error}"
    if not private_network():
        return f"the new namespace has interfaces {interfaces()}"
    return None


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack(_IFREQ, b"lo", 0)
        flags = struct.unpack(_IFREQ, fcntl.ioctl(sock, _SIOCGIFFLAGS,
                                                  request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS,
                    struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def isolate_train(args: argparse.Namespace) -> None:
    """``psrec train``'s first step: a run that starts a local cluster
    (``ps`` without ``--cluster``, or ``multi-worker-mirrored``, and no
    ``TF_CONFIG``) goes into a private network namespace before anything
    else (:func:`isolate_command`); where none can be made it is refused
    here, before its data is prepared, unless ``--allow-exposed``."""
    if not (args.strategy == "multi-worker-mirrored"
            or (args.strategy == "ps" and not args.cluster)) or (
                TFConfig.from_env() is not None):
        return
    isolate_command(args.argv)
    if namespace_failed():
        exposure(args.allow_exposed)


def add_allow_exposed_flag(group: argparse._ActionsContainer) -> None:
    group.add_argument("--allow-exposed", action="store_true",
                       help="start the local cluster even where no private "
                       "network namespace can be made; its servers then "
                       "listen on all interfaces (a warning names every "
                       "port)")


def announce(exposed: str | None, warning: Callable[[], str], log) -> None:
    """Says where a local cluster can be reached from: ``log`` that it is
    private, or the warning (on stderr) when ``exposed``."""
    if exposed is None:
        log(ISOLATED)
    else:
        print(warning(), file=sys.stderr, flush=True)


def isolate_command(argv: Sequence[str]) -> None:
    """Re-executes this ``psrec`` command (same pid, same arguments) inside
    a private network namespace, unless it already runs in one or was
    re-executed already. Does nothing when ``argv`` is not this process's
    own command line (``main([...])`` called from Python: a process cannot
    be replaced under its caller); :func:`exposure` then decides."""
    if (private_network() or os.environ.get(STATE_ENV)
            or list(sys.argv[1:]) != list(argv)):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    env = dict(os.environ, **{STATE_ENV: "entering"})
    os.execve(sys.executable,
              [sys.executable, "-P", "-c", _ENTRY, *argv], env)


def unavailable_reason() -> str | None:
    """Why this process is not in a private network (None when it is)."""
    if private_network():
        return None
    state = os.environ.get(STATE_ENV, "")
    if state.startswith("unavailable: "):
        return state[len("unavailable: "):]
    if forced_unavailable():
        return f"{NO_NETNS_ENV}=1 is set"
    return ("this process is not in a private network namespace (psrec "
            "enters one only when run as the `psrec` command)")


def namespace_failed() -> bool:
    """True in a process re-executed to enter a namespace that could not
    make one."""
    return os.environ.get(STATE_ENV, "").startswith("unavailable: ")


def exposure(allow_exposed: bool, what: str = "the local cluster"
             ) -> str | None:
    """None when this process is in a private network; else the reason,
    when ``allow_exposed`` (the caller prints :func:`exposed_warning`), else
    :class:`ExposedError`."""
    why = unavailable_reason()
    if why is not None and not allow_exposed:
        raise ExposedError(
            f"cannot isolate {what} in a private network "
            f"namespace ({why}); its TensorFlow servers would listen on all "
            "interfaces, where any host that reaches this machine can run "
            "code through them. Pass --allow-exposed to run anyway, or run "
            "where network namespaces are allowed (root, or unprivileged "
            "user namespaces).")
    return why


def machine_addresses() -> list[str]:
    """The non-loopback IP addresses of this process's network namespace
    (IPv4 from /proc/net/fib_trie, IPv6 from /proc/net/if_inet6)."""
    found: list[str] = []
    try:
        previous = ""
        for line in Path("/proc/net/fib_trie").read_text().splitlines():
            if "/32 host LOCAL" in line and not previous.startswith("127."):
                if previous not in found:
                    found.append(previous)
            if line.strip().startswith("|--"):
                previous = line.strip()[3:].strip()
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0]
            address = socket.inet_ntop(socket.AF_INET6, bytes.fromhex(raw))
            if address != "::1" and address not in found:
                found.append(address)
    except OSError:
        pass
    return found


def exposed_warning(ports: Mapping[str, int], why: str) -> str:
    """The ``--allow-exposed`` warning: every role's port, and who can
    reach it."""
    listed = ", ".join(f"{role} on port {port}"
                       for role, port in ports.items())
    addresses = ", ".join(machine_addresses()) or "none found"
    return (f"psrec: WARNING: --allow-exposed and no private network "
            f"({why}): TensorFlow's servers listen on ALL interfaces, not "
            f"127.0.0.1: {listed}; any host that can reach this machine's "
            f"addresses ({addresses}) can connect to these ports without "
            "authentication and run code through them (read and write "
            f"files as uid {os.geteuid()}).")


def listening(pid: int | str = "self", port: int | None = None
              ) -> list[tuple[str, int]]:
    """(address, port) of the TCP sockets ``pid`` listens on (its own
    sockets, found by inode in its namespace's /proc tables)."""
    base = Path(f"/proc/{pid}")
    inodes = set()
    for fd in (base / "fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            lines = (base / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # LISTEN
                continue
            raw, hex_port = fields[1].split(":")
            data = bytes.fromhex(raw)
            # /proc prints the address as 32-bit words in host order.
            data = b"".join(data[i:i + 4][::-1] for i in range(0, len(data), 4))
            address = (socket.inet_ntop(family, data), int(hex_port, 16))
            if port is None or address[1] == port:
                found.append(address)
    return found


def describe_listening(port: int) -> str:
    """Where this process really listens on ``port``, for ``psrec
    server``: the bound address and, for a wildcard, every interface
    address it covers."""
    bound = listening("self", port)
    if not bound:
        return f"port {port}: no listening socket found"
    names = ", ".join(f"[{a}]:{p}" if ":" in a else f"{a}:{p}"
                      for a, p in bound)
    if not any(a in ("0.0.0.0", "::") for a, _ in bound):
        return names
    loopback = ["127.0.0.1", "::1"] if "lo" in interfaces() else []
    where = ("a private network namespace, loopback only"
             if private_network() else "every interface of this machine")
    return (f"{names} = {where}: "
            f"{', '.join(loopback + machine_addresses())}")


def print_listening(port: int) -> None:
    """``psrec server``'s report of where it really listens, and, outside
    a private network, that TensorFlow's server has no auth and no TLS."""
    print(f"psrec server: listening on {describe_listening(port)}",
          flush=True)
    if not private_network():
        print("psrec server: warning: TensorFlow's gRPC server has no "
              "authentication and no TLS: any host that reaches these "
              "addresses can run graphs in this process (read and write its "
              "files); keep the cluster on a private network (README, "
              "Security)", file=sys.stderr, flush=True)


def enter_and_record() -> None:
    """What the re-executed ``psrec`` runs first (``-c``, then the CLI):
    enters a private network namespace, or records why it could not in
    ``PSREC_NETNS`` for psrec to refuse or warn."""
    why = enter_private_network()
    os.environ[STATE_ENV] = "private" if why is None else f"unavailable: {why}"
