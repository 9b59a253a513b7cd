"""Probing a cluster's tasks from outside TensorFlow.

TensorFlow's connection to a cluster that is not up blocks (in calls that
hold the GIL) without printing anything, and its errors after a lost task
do not say which task was lost. A TCP connect to each task's port answers
both questions cheaply and independently of TF:

* :func:`wait_reachable`: before the coordinator connects, wait (bounded by
  ``--connect-timeout``) until every PS and worker port accepts a
  connection; past the timeout fail naming the unreachable tasks;
* :func:`unreachable_tasks`: after an error, which tasks are down.

A task that is alive but frozen (SIGSTOP) still accepts connections (the
kernel completes the handshake): the stall watchdog covers that case.
"""

from __future__ import annotations

import socket
import time
from typing import Callable

from psrec.errors import RetryableError
from psrec.ps_cluster.cluster.tf_config import ClusterSpec


class ClusterUnavailableError(RetryableError):
    """A PS task (or the whole cluster) became unreachable. Retryable: the
    PS tasks and the coordinator must be restarted, and training resumes
    from the latest checkpoint (TF cannot recover a lost PS in-process)."""


def accepts(address: str, timeout: float = 1.0) -> bool:
    """True when ``host:port`` accepts a TCP connection."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)),
                                      timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def unreachable_tasks(cluster: ClusterSpec, timeout: float = 1.0
                      ) -> list[str]:
    """``"ps-0 (127.0.0.1:2222)"`` for each task whose port refuses."""
    return [f"{t.name} ({cluster.address_of(t)})"
            for t in cluster.tasks() if t.type in ("ps", "worker")
            if not accepts(cluster.address_of(t), timeout)]


def wait_reachable(cluster: ClusterSpec, timeout: float,
                   log: Callable[[str], None] | None = None,
                   interval: float = 0.5) -> None:
    """Returns once every PS and worker port accepts a connection.

    Raises:
      ClusterUnavailableError: some did not within ``timeout`` seconds
        (retryable: the cluster may still be starting); names each.
    """
    deadline = time.monotonic() + timeout
    told = False
    while True:
        down = unreachable_tasks(cluster, timeout=min(1.0, interval * 2))
        if not down:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise ClusterUnavailableError(
                f"cannot connect to the cluster: {len(down)} task(s) not "
                f"reachable after --connect-timeout {timeout:g} s: "
                f"{', '.join(down)}. Start them (psrec server) or fix the "
                "cluster spec.")
        if log is not None and not told:
            log(f"waiting up to {timeout:g} s for {', '.join(down)} "
                "(--connect-timeout)")
            told = True
        time.sleep(min(interval, left))


def lost_task_message(cluster: ClusterSpec | None) -> str:
    """Which tasks stopped answering, for the message of a cluster error."""
    if cluster is None:
        return "the lost task is unknown"
    down = unreachable_tasks(cluster)
    if down:
        return f"not reachable now: {', '.join(down)}"
    return ("every task still accepts connections (one may have restarted "
            "with fresh state, or be frozen)")
