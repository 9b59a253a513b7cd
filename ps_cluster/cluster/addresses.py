"""``host:port`` addresses of cluster tasks: parsing, loopback detection
and the address rules of a cluster. Pure Python (no TensorFlow)."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Sequence

from psrec.errors import ConfigError

_HOSTNAME_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")


class ClusterSpecError(ConfigError):
    """A cluster spec or ``TF_CONFIG`` is malformed or unsafe."""


def parse_address(text: str) -> tuple[str, int]:
    """``"host:port"`` -> ``(host, port)``; IPv6 hosts are bracketed
    (``[::1]:2222`` -> ``("::1", 2222)``). Hostnames are never resolved."""
    def bad(problem: str) -> ClusterSpecError:
        return ClusterSpecError(f"address {text!r} {problem}")

    if not isinstance(text, str):
        raise ClusterSpecError(
            f"address {text!r} is a {type(text).__name__}, not a string; write "
            "it as a 'host:port' string such as 'localhost:2222'")
    if not text:
        raise ClusterSpecError("address is an empty string; write it as "
                               "'host:port', e.g. 'localhost:2222'")
    if any(ch.isspace() for ch in text):
        raise bad("contains whitespace; remove it, e.g. 'localhost:2222'")
    if "://" in text:
        raise bad(f"has a URL scheme; write only 'host:port' (e.g. "
                  f"{text.split('://', 1)[1]!r}), without 'grpc://' or similar")
    if text.startswith("["):
        host, end, rest = text[1:].partition("]")
        if not end:
            raise bad("opens '[' but never closes it; write IPv6 addresses "
                      "as '[host]:port', e.g. '[::1]:2222'")
        if not host:
            raise bad("has an empty host between the brackets; write e.g. "
                      "'[::1]:2222'")
        if not rest.startswith(":") or rest == ":":
            raise bad(f"has no port after ']'; add one, e.g. '[{host}]:2222'")
        ip = _ip(host)
        if ip is None or ip.version != 6:
            raise bad(f"has {host!r} inside brackets, which is not an IPv6 "
                      "address; use brackets only for IPv6 (e.g. '[::1]:2222')"
                      " and write other hosts bare (e.g. 'localhost:2222')")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise bad(f"has no port; add one, e.g. '{text}:2222'")
        if ":" in host:
            raise bad("looks like an unbracketed IPv6 address; wrap the IPv6 "
                      "host in brackets, e.g. '[::1]:2222'")
        if not host:
            raise bad("has an empty host; put a hostname or IP before the "
                      f"':', e.g. 'localhost{text}'")
        labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
        if _ip(host) is None and (
                len(host) > 253
                or not all(_HOSTNAME_LABEL.match(label) for label in labels)):
            raise bad(f"has host {host!r}, which is neither an IP address nor "
                      "a valid hostname; use letters, digits, '-' and '.' "
                      "only, e.g. 'worker-0.example.internal:2222'")
    if not port_text:
        raise bad("has an empty port; put a port number (1..65535) after the "
                  "':', e.g. 'localhost:2222'")
    if not port_text.isascii() or not port_text.isdigit():
        raise bad(f"has port {port_text!r}, which is not a number; use a port "
                  "in 1..65535, e.g. 'localhost:2222'")
    if not 1 <= int(port_text) <= 65535:
        raise bad(f"has port {int(port_text)}, which is out of range; use a "
                  "port in 1..65535")
    return host, int(port_text)


def parse_address_list(text: str) -> tuple[str, ...]:
    """``"h:p, h:p"`` (a command-line list) -> the checked addresses."""
    if not text.strip():
        return ()
    items = tuple(item.strip() for item in text.split(","))
    for position, item in enumerate(items):
        if not item:
            raise ClusterSpecError(
                f"address list {text!r} has an empty item at position "
                f"{position}; separate addresses with single commas, e.g. "
                "'localhost:2222,localhost:2223'")
        parse_address(item)
    return items


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def is_loopback_host(host: str) -> bool:
    """``localhost``, ``*.localhost``, 127.0.0.0/8 and ``::1`` (no DNS)."""
    lowered = host.lower().rstrip(".")
    if lowered == "localhost" or lowered.endswith(".localhost"):
        return True
    ip = _ip(host)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip is not None and ip.is_loopback


def _canonical_host(host: str) -> str:
    ip = _ip(host)
    return ip.compressed if ip is not None else host.lower().rstrip(".")


def check_addresses(tasks: Sequence[tuple[str, str]],
                    allow_remote: bool) -> None:
    """Checks the ``(task name, address)`` pairs of a cluster: every task
    has its own port, loopback and other hosts are not mixed, and other
    hosts need ``allow_remote``."""
    seen: dict[tuple[str, int], tuple[str, str]] = {}
    loopback, remote = [], []
    for task, address in tasks:
        host, port = parse_address(address)
        # A TF server binds its port on all interfaces, so loopback
        # tasks collide on equal ports however their host is spelled.
        is_loopback = is_loopback_host(host)
        key = ("<loopback>" if is_loopback else _canonical_host(host), port)
        if key in seen:
            first, first_address = seen[key]
            detail = (f"address {address!r} is used by both"
                      if first_address == address else
                      f"addresses {first_address!r} and {address!r} are the "
                      "same host:port (loopback hosts all reach this machine,"
                      " where each TF server binds its port) for both")
            raise ClusterSpecError(
                f"duplicate host:port: {detail} task {first} and task {task};"
                " give every task its own port")
        seen[key] = (task, address)
        (loopback if is_loopback else remote).append((task, address, host))
    if loopback and remote:
        raise ClusterSpecError(
            f"cluster mixes loopback addresses ({_listing(loopback)}) with "
            f"non-loopback hosts ({_listing(remote)}); loopback addresses "
            "(localhost, 127.x, ::1) only reach the local machine, so tasks "
            "on other machines could not connect to them. Use loopback for "
            "every task (single machine) or each machine's reachable "
            "hostname/IP for every task")
    if remote and not allow_remote:
        task, address, host = remote[0]
        hint = ""
        if _canonical_host(host) in ("0.0.0.0", "::"):
            hint = (f" ({host} is a wildcard bind address, not an address "
                    "other tasks can connect to; use the machine's hostname "
                    "or IP)")
        raise ClusterSpecError(
            f"non-loopback host {host!r} (task {task} = {address!r}) needs "
            "`StrategyConfig.allow_remote`: TensorFlow gRPC servers "
            "accept unauthenticated, unencrypted connections on all "
            "interfaces, so remote clusters must run on an isolated network. "
            f"Use localhost addresses for a single-machine cluster{hint}")


def _listing(tasks: list[tuple[str, str, str]]) -> str:
    return ", ".join(f"{task}={address}" for task, address, _ in tasks)


def free_loopback_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held until all are
    chosen so they differ)."""
    sockets, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in sockets:
            s.close()
    return ports
