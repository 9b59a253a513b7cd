"""Typed, validated cluster specs for TensorFlow multi-process training.

This module models the ``TF_CONFIG`` environment variable that TensorFlow's
``ParameterServerStrategy`` and ``MultiWorkerMirroredStrategy`` read to find
their peers, e.g.::

    {"cluster": {"chief": ["localhost:2222"],
                 "ps": ["localhost:2223"],
                 "worker": ["localhost:2224", "localhost:2225"]},
     "task": {"type": "worker", "index": 1}}

It parses and writes that JSON, and validates it before any gRPC server is
started, so that mistakes surface as a :class:`ClusterSpecError` naming the
problem, the offending value and the fix instead of as a hang or an opaque
TensorFlow error minutes later.

Job names. TensorFlow accepts the jobs ``chief``, ``worker``, ``ps`` and
``evaluator``. Users of this module may also call the coordinator job
``coordinator`` (the name the ParameterServerStrategy docs use for the
role); it is kept as written in :attr:`ClusterSpec.jobs` but always written
out as ``chief`` (see :meth:`ClusterSpec.to_tf_cluster_dict` and
:meth:`TFConfig.to_dict`), because TensorFlow rejects any other job name.

Security. A TensorFlow gRPC server accepts unauthenticated, unencrypted
connections and listens on all network interfaces, whatever host is written
in the cluster spec. :meth:`ClusterSpec.validate` therefore refuses any
non-loopback host unless ``allow_remote=True`` is passed (the CLI's
``--allow-remote``); callers that pass it should print
:data:`REMOTE_WARNING`.

This module is pure Python and never imports TensorFlow; convert with
``tf.train.ClusterSpec(spec.to_tf_cluster_dict())`` where TensorFlow is
available.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import types
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from psrec.errors import ConfigError

__all__ = [
    "ALLOWED_JOBS",
    "COORDINATOR_JOBS",
    "ClusterSpec",
    "ClusterSpecError",
    "REMOTE_WARNING",
    "STRATEGIES",
    "TFConfig",
    "TaskInfo",
    "parse_address",
    "parse_address_list",
    "tf_configs_for_all_tasks",
    "write_tf_config_files",
]

#: Name of the environment variable TensorFlow reads the cluster from.
TF_CONFIG_ENV = "TF_CONFIG"

#: Job names that may name the single coordinator task. TensorFlow only
#: understands ``chief``; ``coordinator`` is mapped to it on output.
COORDINATOR_JOBS: tuple[str, ...] = ("chief", "coordinator")

#: Every job name a cluster spec may contain.
ALLOWED_JOBS: tuple[str, ...] = ("chief", "coordinator", "worker", "ps", "evaluator")

#: Strategies :meth:`ClusterSpec.validate` knows the rules of.
STRATEGIES: tuple[str, ...] = ("ps", "multi-worker-mirrored")

#: Warning to print whenever a cluster with non-loopback hosts is accepted
#: because the user passed ``--allow-remote``.
REMOTE_WARNING = (
    "WARNING: --allow-remote is set and the cluster spec contains non-loopback "
    "hosts. TensorFlow gRPC servers accept unauthenticated, unencrypted "
    "connections and listen on all network interfaces: anyone who can reach "
    "these ports can read and overwrite model variables and run arbitrary "
    "TensorFlow ops (including file and process access) on every task. Run "
    "this cluster only on an isolated, trusted network, firewalled from "
    "everything else. See TensorFlow's SECURITY.md "
    "(https://github.com/tensorflow/tensorflow/blob/master/SECURITY.md)."
)

_TOP_LEVEL_KEYS = ("cluster", "task", "environment", "rpc_layer")
_TASK_KEYS = ("type", "index", "trial")
_TF_NAME = {"coordinator": "chief"}
_JOB_ORDER = ("chief", "coordinator", "ps", "worker", "evaluator")
_HOSTNAME_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")
_EXAMPLE = "'localhost:2222'"


class ClusterSpecError(ConfigError):
    """A cluster spec or ``TF_CONFIG`` is malformed or unsafe.

    The message names the problem, the offending value and how to fix it.
    """


# --------------------------------------------------------------------------
# Addresses
# --------------------------------------------------------------------------


def parse_address(text: str) -> tuple[str, int]:
    """Splits a ``host:port`` address into its host and port.

    IPv6 hosts must be bracketed, e.g. ``[::1]:2222``; the returned host is
    then unbracketed (``::1``). Hostnames are checked for syntax only and are
    never resolved.

    Args:
        text: The address, e.g. ``"localhost:2222"`` or ``"[::1]:2222"``.

    Returns:
        ``(host, port)`` with ``1 <= port <= 65535``.

    Raises:
        ClusterSpecError: If the host or the port is missing or invalid.
    """
    if not isinstance(text, str):
        raise ClusterSpecError(
            f"address {text!r} is a {type(text).__name__}, not a string; "
            f"write it as a 'host:port' string such as {_EXAMPLE}"
        )
    if not text:
        raise ClusterSpecError(
            f"address is an empty string; write it as 'host:port', e.g. {_EXAMPLE}"
        )
    if any(ch.isspace() for ch in text):
        raise ClusterSpecError(
            f"address {text!r} contains whitespace; remove it, e.g. {_EXAMPLE}"
        )
    if "://" in text:
        raise ClusterSpecError(
            f"address {text!r} has a URL scheme; write only 'host:port' "
            f"(e.g. {text.split('://', 1)[1]!r}), without 'grpc://' or similar"
        )
    if text.startswith("["):
        end = text.find("]")
        if end == -1:
            raise ClusterSpecError(
                f"address {text!r} opens '[' but never closes it; write IPv6 "
                "addresses as '[host]:port', e.g. '[::1]:2222'"
            )
        host, rest = text[1:end], text[end + 1 :]
        if not host:
            raise ClusterSpecError(
                f"address {text!r} has an empty host between the brackets; "
                "write e.g. '[::1]:2222'"
            )
        if not rest.startswith(":") or rest == ":":
            raise ClusterSpecError(
                f"address {text!r} has no port after ']'; add one, e.g. "
                f"'[{host}]:2222'"
            )
        port_text = rest[1:]
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            ip = None
        if ip is None or ip.version != 6:
            raise ClusterSpecError(
                f"address {text!r}: {host!r} inside brackets is not an IPv6 "
                "address; use brackets only for IPv6 (e.g. '[::1]:2222') and "
                "write other hosts bare (e.g. 'localhost:2222')"
            )
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ClusterSpecError(
                f"address {text!r} has no port; add one, e.g. '{text}:2222'"
            )
        if ":" in host:
            raise ClusterSpecError(
                f"address {text!r} looks like an unbracketed IPv6 address; "
                "wrap the IPv6 host in brackets, e.g. '[::1]:2222'"
            )
        if not host:
            raise ClusterSpecError(
                f"address {text!r} has an empty host; put a hostname or IP "
                f"before the ':', e.g. 'localhost{text}'"
            )
        _check_hostname(host, text)
    port = _parse_port(port_text, text)
    return host, port


def parse_address_list(text: str) -> tuple[str, ...]:
    """Parses a comma-separated list of addresses, as given on a command line.

    Args:
        text: E.g. ``"localhost:2222,localhost:2223"``. Spaces around the
            commas are ignored.

    Returns:
        The addresses, stripped, in order. An empty or blank string gives
        an empty tuple.

    Raises:
        ClusterSpecError: If an item is empty (e.g. ``"a:1,,b:2"``) or is not
            a valid address.
    """
    if not text.strip():
        return ()
    items = [item.strip() for item in text.split(",")]
    for position, item in enumerate(items):
        if not item:
            raise ClusterSpecError(
                f"address list {text!r} has an empty item at position {position}; "
                "separate addresses with single commas, e.g. "
                "'localhost:2222,localhost:2223'"
            )
        parse_address(item)
    return tuple(items)


def _parse_port(port_text: str, address: str) -> int:
    if not port_text:
        raise ClusterSpecError(
            f"address {address!r} has an empty port; put a port number "
            "(1..65535) after the ':', e.g. 'localhost:2222'"
        )
    if not port_text.isascii() or not port_text.isdigit():
        raise ClusterSpecError(
            f"address {address!r} has port {port_text!r}, which is not a "
            "number; use a port in 1..65535, e.g. 'localhost:2222'"
        )
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ClusterSpecError(
            f"address {address!r} has port {port}, which is out of range; "
            "use a port in 1..65535"
        )
    return port


def _check_hostname(host: str, address: str) -> None:
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    if len(host) > 253 or not all(_HOSTNAME_LABEL.match(label) for label in labels):
        raise ClusterSpecError(
            f"address {address!r} has host {host!r}, which is neither an IP "
            "address nor a valid hostname; use letters, digits, '-' and '.' "
            "only, e.g. 'worker-0.example.internal:2222'"
        )


def _is_loopback_host(host: str) -> bool:
    """True for ``localhost``, ``*.localhost``, 127.0.0.0/8 and ``::1``."""
    lowered = host.lower().rstrip(".")
    if lowered == "localhost" or lowered.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def _canonical_host(host: str) -> str:
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        return host.lower().rstrip(".")


# --------------------------------------------------------------------------
# Task and cluster
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskInfo:
    """The task a process plays: ``TF_CONFIG["task"]``.

    Attributes:
        type: Job name, e.g. ``"worker"``.
        index: Zero-based index into that job's address list.
    """

    type: str
    index: int

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not self.type:
            raise ClusterSpecError(
                f"task type {self.type!r} must be a non-empty string; set "
                "`task.type` in TF_CONFIG to a job name such as 'worker'"
            )
        if isinstance(self.index, bool) or not isinstance(self.index, int):
            raise ClusterSpecError(
                f"task index {self.index!r} ({type(self.index).__name__}) must "
                "be an integer; set `task.index` in TF_CONFIG to e.g. 0"
            )
        if self.index < 0:
            raise ClusterSpecError(
                f"task index {self.index} for job {self.type!r} is negative; "
                "indices start at 0, fix the `task.index` in TF_CONFIG"
            )

    def __str__(self) -> str:
        return f"{self.type}[{self.index}]"


@dataclass(frozen=True, repr=False)
class ClusterSpec:
    """Job name -> addresses of the tasks of a training cluster.

    Construction checks structure only (names are strings, every address is
    a valid ``host:port``); call :meth:`validate` for the policy checks.
    Job order is kept as given, but equality and hashing ignore it.

    Attributes:
        jobs: Read-only mapping of job name to a tuple of ``host:port``
            addresses, task ``i`` of a job being ``jobs[job][i]``.
    """

    jobs: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: types.MappingProxyType({})
    )

    def __post_init__(self) -> None:
        if not isinstance(self.jobs, Mapping):
            raise ClusterSpecError(
                f"cluster must be a mapping of job name to address list, got "
                f"{type(self.jobs).__name__} {self.jobs!r}; write e.g. "
                "{'ps': ['localhost:2223'], 'worker': ['localhost:2224']}"
            )
        frozen: dict[str, tuple[str, ...]] = {}
        for name, addresses in self.jobs.items():
            if not isinstance(name, str) or not name:
                raise ClusterSpecError(
                    f"job name {name!r} must be a non-empty string; use one of "
                    f"{', '.join(ALLOWED_JOBS)}"
                )
            if isinstance(addresses, (str, bytes)) or not isinstance(
                addresses, Sequence
            ):
                raise ClusterSpecError(
                    f"job {name!r} must be a list of 'host:port' strings, got "
                    f"{type(addresses).__name__} {addresses!r}; fix `cluster.{name}` "
                    f"in TF_CONFIG, e.g. \"{name}\": [\"localhost:2222\"]"
                )
            for index, address in enumerate(addresses):
                try:
                    parse_address(address)
                except ClusterSpecError as exc:
                    raise ClusterSpecError(
                        f"job {name!r} task {index}: {exc}"
                    ) from None
            frozen[name] = tuple(addresses)
        object.__setattr__(self, "jobs", types.MappingProxyType(frozen))

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.jobs.items())))

    def __repr__(self) -> str:
        return f"ClusterSpec(jobs={dict(self.jobs)!r})"

    # -- construction ------------------------------------------------------

    @classmethod
    def build(
        cls,
        ps: Sequence[str] | str,
        workers: Sequence[str] | str,
        chief: str | None = None,
    ) -> ClusterSpec:
        """Builds a spec from per-role address lists (as the CLI gets them).

        Args:
            ps: Parameter-server addresses; a comma-separated string is
                split with :func:`parse_address_list`.
            workers: Worker addresses; a string is split likewise.
            chief: Address of the chief/coordinator task, if any.

        Returns:
            A spec with jobs ``chief`` (if given), ``ps`` and ``worker``,
            leaving out roles with no addresses. Not yet validated.

        Raises:
            ClusterSpecError: If an address is malformed.
        """
        jobs: dict[str, tuple[str, ...]] = {}
        if chief is not None and chief.strip():
            jobs["chief"] = (chief.strip(),)
        for name, value in (("ps", ps), ("worker", workers)):
            addresses = (
                parse_address_list(value)
                if isinstance(value, str)
                else tuple(a.strip() if isinstance(a, str) else a for a in value)
            )
            if addresses:
                jobs[name] = addresses
        return cls(jobs)

    @classmethod
    def from_dict(cls, cluster: Any) -> ClusterSpec:
        """Builds a spec from the ``cluster`` value of a ``TF_CONFIG`` dict.

        Raises:
            ClusterSpecError: If ``cluster`` is not a mapping of job name to
                a list of address strings.
        """
        if not isinstance(cluster, Mapping):
            raise ClusterSpecError(
                f"TF_CONFIG `cluster` must be an object mapping job names to "
                f"address lists, got {type(cluster).__name__} {cluster!r}; write "
                "e.g. \"cluster\": {\"ps\": [\"localhost:2223\"], "
                "\"worker\": [\"localhost:2224\"]}"
            )
        for name, addresses in cluster.items():
            if not isinstance(addresses, list):
                raise ClusterSpecError(
                    f"TF_CONFIG `cluster.{name}` must be a list of 'host:port' "
                    f"strings, got {type(addresses).__name__} {addresses!r}; "
                    f"write e.g. \"{name}\": [\"localhost:2222\"]"
                )
            for index, address in enumerate(addresses):
                if not isinstance(address, str):
                    raise ClusterSpecError(
                        f"TF_CONFIG `cluster.{name}[{index}]` is "
                        f"{type(address).__name__} {address!r}, not a string; "
                        "write the address as a 'host:port' string such as "
                        f"{_EXAMPLE}"
                    )
        return cls(dict(cluster))

    # -- accessors ---------------------------------------------------------

    @property
    def ps(self) -> tuple[str, ...]:
        """Addresses of the ``ps`` job (empty if none)."""
        return self.jobs.get("ps", ())

    @property
    def workers(self) -> tuple[str, ...]:
        """Addresses of the ``worker`` job (empty if none)."""
        return self.jobs.get("worker", ())

    @property
    def coordinator_job(self) -> str | None:
        """``"chief"`` or ``"coordinator"``, whichever job is present, or None.

        If (invalidly) both are present, ``"chief"`` wins.
        """
        for name in COORDINATOR_JOBS:
            if name in self.jobs:
                return name
        return None

    @property
    def chief(self) -> str | None:
        """Address of the chief/coordinator task, or None if there is none.

        If that job (invalidly) lists several addresses this is the first;
        :meth:`validate` rejects such specs.
        """
        name = self.coordinator_job
        if name is None or not self.jobs[name]:
            return None
        return self.jobs[name][0]

    @property
    def num_ps(self) -> int:
        """Number of parameter-server tasks."""
        return len(self.ps)

    @property
    def num_workers(self) -> int:
        """Number of worker tasks (not counting the chief)."""
        return len(self.workers)

    def tasks(self) -> tuple[TaskInfo, ...]:
        """Every task, in launch order: chief/coordinator, ps, worker, others."""
        return tuple(
            TaskInfo(name, index)
            for name in self._ordered_job_names()
            for index in range(len(self.jobs[name]))
        )

    def address_of(self, task: TaskInfo) -> str:
        """The ``host:port`` of ``task``.

        Raises:
            ClusterSpecError: If the task's job is not in the cluster or its
                index is out of range.
        """
        _check_task_in_cluster(task, self)
        return self.jobs[task.type][task.index]

    def is_loopback(self) -> bool:
        """True if every task's host is a loopback host (no DNS lookups)."""
        return not self.remote_hosts()

    def remote_hosts(self) -> tuple[str, ...]:
        """Distinct non-loopback hosts, in order of first appearance.

        Wildcard addresses such as ``0.0.0.0`` and ``::`` count as
        non-loopback. Hostnames are not resolved: ``my-laptop`` counts as
        non-loopback even if it resolves to 127.0.1.1.
        """
        seen: dict[str, str] = {}
        for _, _, address in self._iter_addresses():
            host, _ = parse_address(address)
            if not _is_loopback_host(host):
                seen.setdefault(_canonical_host(host), host)
        return tuple(seen.values())

    def to_tf_cluster_dict(self) -> dict[str, list[str]]:
        """The cluster as ``tf.train.ClusterSpec`` / ``TF_CONFIG`` wants it.

        A ``coordinator`` job is renamed ``chief``: TensorFlow only accepts
        the jobs chief, worker, ps and evaluator, and ParameterServerStrategy
        looks for the coordinator under ``chief``. Jobs appear in the order
        chief, ps, worker, then the rest.

        Returns:
            A new dict of job name to a new list of addresses.
        """
        return {
            _TF_NAME.get(name, name): list(self.jobs[name])
            for name in self._ordered_job_names()
        }

    def _ordered_job_names(self) -> list[str]:
        order = {name: rank for rank, name in enumerate(_JOB_ORDER)}
        return sorted(self.jobs, key=lambda n: (order.get(n, len(order)), n))

    # -- validation --------------------------------------------------------

    def validate(self, *, strategy: str = "ps", allow_remote: bool = False) -> None:
        """Checks that the cluster is usable and safe for ``strategy``.

        Args:
            strategy: ``"ps"`` (ParameterServerStrategy) or
                ``"multi-worker-mirrored"`` (MultiWorkerMirroredStrategy).
            allow_remote: Accept non-loopback hosts. Only for isolated
                networks; print :data:`REMOTE_WARNING` when it matters.

        Raises:
            ClusterSpecError: On the first problem found.
        """
        if strategy not in STRATEGIES:
            raise ClusterSpecError(
                f"unknown strategy {strategy!r}; use one of "
                f"{', '.join(repr(s) for s in STRATEGIES)}"
            )
        if not self.jobs:
            raise ClusterSpecError(
                "cluster has no jobs (empty job list); add at least the "
                "'ps' and 'worker' jobs, e.g. --ps localhost:2223 "
                "--workers localhost:2224"
            )
        for name in self.jobs:
            if name not in ALLOWED_JOBS:
                raise ClusterSpecError(
                    f"unknown job name {name!r} in cluster; rename it to one of "
                    f"{', '.join(repr(j) for j in ALLOWED_JOBS)}"
                )
        if all(name in self.jobs for name in COORDINATOR_JOBS):
            raise ClusterSpecError(
                "cluster has both a 'chief' job "
                f"{list(self.jobs['chief'])} and a 'coordinator' job "
                f"{list(self.jobs['coordinator'])}; they name the same single "
                "coordinating task, keep only one of them"
            )
        if "evaluator" in self.jobs:
            raise ClusterSpecError(
                "job 'evaluator' "
                f"{list(self.jobs['evaluator'])} is in the training cluster; "
                "keep the evaluator out of the training cluster and run it as "
                "a separate job (a sidecar evaluator with its own TF_CONFIG) "
                "— see tensorflow#46169"
            )
        for name, addresses in self.jobs.items():
            if not addresses:
                raise ClusterSpecError(
                    f"job {name!r} has an empty address list; add at least one "
                    f"'host:port' to it or remove the {name!r} job"
                )
        if strategy == "ps":
            if not self.ps:
                raise ClusterSpecError(
                    "There must be at least one ps task for ParameterServerStrategy, "
                    f"but the cluster has jobs {sorted(self.jobs)} and no 'ps'; "
                    "add one, e.g. --ps localhost:2223 (cluster 'ps': [...])"
                )
            if not self.workers:
                raise ClusterSpecError(
                    "There must be at least one worker task for "
                    f"ParameterServerStrategy, but the cluster has jobs "
                    f"{sorted(self.jobs)} and no 'worker'; add one, e.g. "
                    "--workers localhost:2224 (cluster 'worker': [...])"
                )
        elif self.ps:
            raise ClusterSpecError(
                f"job 'ps' {list(self.ps)} is not allowed with strategy "
                "'multi-worker-mirrored', which keeps variables on the "
                "workers; remove the ps tasks or use strategy 'ps'"
            )
        coordinator = self.coordinator_job
        if coordinator is not None and len(self.jobs[coordinator]) > 1:
            raise ClusterSpecError(
                f"job {coordinator!r} has {len(self.jobs[coordinator])} addresses "
                f"{list(self.jobs[coordinator])} but there can be at most one "
                f"{coordinator}; keep one address and move the others to 'worker'"
            )
        self._check_duplicates()
        self._check_loopback_mix()
        if not allow_remote:
            self._check_no_remote()

    def _iter_addresses(self) -> Iterable[tuple[str, int, str]]:
        for name, addresses in self.jobs.items():
            for index, address in enumerate(addresses):
                yield name, index, address

    def _check_duplicates(self) -> None:
        # TF gRPC servers bind their port on all interfaces, so two loopback
        # tasks with the same port collide even if their hosts are spelled
        # differently (localhost vs 127.0.0.1).
        seen: dict[tuple[str, int], tuple[str, int, str]] = {}
        for name, index, address in self._iter_addresses():
            host, port = parse_address(address)
            key = (
                ("<loopback>" if _is_loopback_host(host) else _canonical_host(host)),
                port,
            )
            if key in seen:
                first_name, first_index, first_address = seen[key]
                if first_address == address:
                    detail = f"address {address!r} is used by both"
                else:
                    detail = (
                        f"addresses {first_address!r} and {address!r} are the "
                        "same host:port (loopback hosts all reach this machine, "
                        "where each TF server binds its port) for both"
                    )
                raise ClusterSpecError(
                    f"duplicate host:port: {detail} task {first_name}[{first_index}] "
                    f"and task {name}[{index}]; give every task its own port"
                )
            seen[key] = (name, index, address)

    def _check_loopback_mix(self) -> None:
        loopback, remote = [], []
        for name, index, address in self._iter_addresses():
            host, _ = parse_address(address)
            (loopback if _is_loopback_host(host) else remote).append(
                f"{name}[{index}]={address}"
            )
        if loopback and remote:
            raise ClusterSpecError(
                f"cluster mixes loopback addresses ({', '.join(loopback)}) with "
                f"non-loopback hosts ({', '.join(remote)}); loopback addresses "
                "(localhost, 127.x, ::1) only reach the local machine, so tasks "
                "on other machines could not connect to them. Use loopback for "
                "every task (single machine) or each machine's reachable "
                "hostname/IP for every task"
            )

    def _check_no_remote(self) -> None:
        for name, index, address in self._iter_addresses():
            host, _ = parse_address(address)
            if _is_loopback_host(host):
                continue
            hint = ""
            if _canonical_host(host) in ("0.0.0.0", "::"):
                hint = (
                    f" ({host} is a wildcard bind address, not an address other "
                    "tasks can connect to; use the machine's hostname or IP)"
                )
            raise ClusterSpecError(
                f"non-loopback host {host!r} (task {name}[{index}] = {address!r}) "
                "needs --allow-remote (allow_remote=True): TensorFlow gRPC "
                "servers accept unauthenticated, unencrypted connections on all "
                "interfaces, so remote clusters must run on an isolated network. "
                f"Use localhost addresses for a single-machine cluster{hint}"
            )


def _check_task_in_cluster(task: TaskInfo, cluster: ClusterSpec) -> None:
    if task.type not in cluster.jobs:
        raise ClusterSpecError(
            f"task type {task.type!r} is not a job in the cluster (jobs: "
            f"{', '.join(repr(j) for j in cluster.jobs) or 'none'}); fix the "
            "`task.type` in TF_CONFIG or add the job to `cluster`"
        )
    size = len(cluster.jobs[task.type])
    if task.index >= size:
        indices = f"indices 0..{size - 1}" if size else "no valid indices"
        raise ClusterSpecError(
            f"task index {task.index} is out of range for job {task.type!r} "
            f"which has {size} task{'' if size == 1 else 's'} ({indices}); fix "
            "the `task.index` in TF_CONFIG"
        )


# --------------------------------------------------------------------------
# TF_CONFIG
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class TFConfig:
    """A parsed ``TF_CONFIG``: the cluster and this process's task.

    The task is checked against the cluster on construction (its job exists
    and its index is in range).

    Attributes:
        cluster: The cluster spec.
        task: This process's task, or None (a coordinator that is not listed
            as a task, or a config that only describes the cluster).
    """

    cluster: ClusterSpec
    task: TaskInfo | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.cluster, ClusterSpec):
            raise ClusterSpecError(
                f"TFConfig.cluster must be a ClusterSpec, got "
                f"{type(self.cluster).__name__}; build it with ClusterSpec(...)"
            )
        if self.task is not None:
            _check_task_in_cluster(self.task, self.cluster)

    @classmethod
    def from_json(cls, text: str) -> TFConfig:
        """Parses ``TF_CONFIG`` JSON.

        The keys ``environment`` and ``rpc_layer`` are accepted but their
        values are ignored (and not written back by :meth:`to_json`).

        Raises:
            ClusterSpecError: On malformed JSON, a missing ``cluster``,
                unknown keys, a malformed cluster, or a task that does not
                fit the cluster.
        """
        if not isinstance(text, str) or not text.strip():
            raise ClusterSpecError(
                f"TF_CONFIG is empty ({text!r}); set it to a JSON object such as "
                '{"cluster": {"ps": ["localhost:2223"], "worker": '
                '["localhost:2224"]}, "task": {"type": "worker", "index": 0}}'
            )
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            snippet = text if len(text) <= 80 else text[:77] + "..."
            raise ClusterSpecError(
                f"TF_CONFIG is not valid JSON ({exc.msg} at line {exc.lineno} "
                f"column {exc.colno}): {snippet!r}; fix the JSON, e.g. use "
                "double quotes and no trailing commas"
            ) from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> TFConfig:
        """Builds a config from an already-decoded ``TF_CONFIG`` object.

        Raises:
            ClusterSpecError: As :meth:`from_json`.
        """
        if not isinstance(data, Mapping):
            raise ClusterSpecError(
                f"TF_CONFIG must be a JSON object, got {type(data).__name__} "
                f"{data!r}; write it as {{\"cluster\": {{...}}, \"task\": {{...}}}}"
            )
        unknown = [key for key in data if key not in _TOP_LEVEL_KEYS]
        if unknown:
            raise ClusterSpecError(
                f"TF_CONFIG has unknown top-level key(s) "
                f"{', '.join(repr(k) for k in unknown)}; allowed keys are "
                f"{', '.join(repr(k) for k in _TOP_LEVEL_KEYS)} — remove or "
                "rename them (check the spelling)"
            )
        if "cluster" not in data:
            raise ClusterSpecError(
                "TF_CONFIG has no `cluster` key; add one, e.g. "
                '"cluster": {"ps": ["localhost:2223"], "worker": ["localhost:2224"]}'
            )
        cluster = ClusterSpec.from_dict(data["cluster"])
        return cls(cluster, _task_from_json(data.get("task")))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TFConfig | None:
        """Reads ``TF_CONFIG`` from the environment.

        Args:
            environ: Environment to read; defaults to ``os.environ``.

        Returns:
            The parsed config, or None if ``TF_CONFIG`` is unset or blank.

        Raises:
            ClusterSpecError: If ``TF_CONFIG`` is set but invalid.
        """
        env = os.environ if environ is None else environ
        text = env.get(TF_CONFIG_ENV)
        if text is None or not text.strip():
            return None
        return cls.from_json(text)

    def to_dict(self) -> dict[str, Any]:
        """The config as a ``TF_CONFIG`` object (coordinator named ``chief``).

        ``task`` is left out when it is None.
        """
        out: dict[str, Any] = {"cluster": self.cluster.to_tf_cluster_dict()}
        if self.task is not None:
            out["task"] = {
                "type": _TF_NAME.get(self.task.type, self.task.type),
                "index": self.task.index,
            }
        return out

    def to_json(self) -> str:
        """Compact, deterministic (sorted keys) JSON for ``TF_CONFIG``.

        ``from_json(c.to_json()) == c`` holds unless ``c`` uses the job name
        ``coordinator``, which is written as ``chief``.
        """
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def is_coordinator(self) -> bool:
        """True if this process coordinates: no task, or a chief/coordinator."""
        return self.task is None or self.task.type in COORDINATOR_JOBS

    def validate(self, *, strategy: str = "ps", allow_remote: bool = False) -> None:
        """Validates the cluster (see :meth:`ClusterSpec.validate`) and task.

        Raises:
            ClusterSpecError: On the first problem found.
        """
        self.cluster.validate(strategy=strategy, allow_remote=allow_remote)
        if self.task is not None:
            _check_task_in_cluster(self.task, self.cluster)


def _task_from_json(task: Any) -> TaskInfo | None:
    if task is None:
        return None
    if not isinstance(task, Mapping):
        raise ClusterSpecError(
            f"TF_CONFIG `task` must be an object, got {type(task).__name__} "
            f"{task!r}; write e.g. \"task\": {{\"type\": \"worker\", \"index\": 0}}"
        )
    if not task:
        return None
    unknown = [key for key in task if key not in _TASK_KEYS]
    if unknown:
        raise ClusterSpecError(
            f"TF_CONFIG `task` has unknown key(s) "
            f"{', '.join(repr(k) for k in unknown)}; allowed keys are 'type' "
            "and 'index' — remove or rename them"
        )
    for key in ("type", "index"):
        if key not in task:
            raise ClusterSpecError(
                f"TF_CONFIG `task` {dict(task)!r} has no {key!r}; add it, e.g. "
                '"task": {"type": "worker", "index": 0}'
            )
    return TaskInfo(task["type"], task["index"])


# --------------------------------------------------------------------------
# Per-task configs
# --------------------------------------------------------------------------


def tf_configs_for_all_tasks(spec: ClusterSpec) -> list[TFConfig]:
    """One ``TF_CONFIG`` per task of ``spec``.

    The spec is not validated here; call :meth:`ClusterSpec.validate` first.

    Returns:
        Configs in the order chief/coordinator, ps 0.., worker 0.., then any
        other jobs, each sharing ``spec`` and naming its own task.
    """
    return [TFConfig(spec, task) for task in spec.tasks()]


def write_tf_config_files(spec: ClusterSpec, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Writes one ``TF_CONFIG`` JSON file per task into ``out_dir``.

    Files are named ``<type>-<index>.json`` after the task as written in the
    JSON (so a ``coordinator`` task becomes ``chief-0.json``) and hold
    :meth:`TFConfig.to_json` plus a newline. ``out_dir`` is created if
    needed and existing files of those names are overwritten.

    Returns:
        The paths written, in :func:`tf_configs_for_all_tasks` order.
    """
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for config in tf_configs_for_all_tasks(spec):
        task = config.to_dict()["task"]
        path = directory / f"{task['type']}-{task['index']}.json"
        path.write_text(config.to_json() + "\n", encoding="utf-8")
        paths.append(path)
    return paths


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


def loopback_cluster(num_workers: int, num_ps: int) -> ClusterSpec:
    """A cluster spec of free ports on 127.0.0.1 (the local default)."""
    ports = free_loopback_ports(num_workers + num_ps)
    return ClusterSpec.build(
        ps=[f"127.0.0.1:{p}" for p in ports[num_workers:]],
        workers=[f"127.0.0.1:{p}" for p in ports[:num_workers]])
