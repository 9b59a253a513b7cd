"""An in-process cluster for tests: all PS and worker servers in this process.

Once an in-process TensorFlow server is created there is no way to stop it,
so there can be one cluster per process (tests: one per test module run in
its own process, or one shared per session). Fault tests need real OS
processes instead (``launch.local.cluster``).
"""

from __future__ import annotations

import threading

from psrec.ps_cluster.cluster.server import start_server
from psrec.ps_cluster.cluster.tf_config import ClusterSpec
from psrec.ps_cluster.cluster.tf_config import TaskInfo
from psrec.ps_cluster.cluster.tf_config import loopback_cluster

_LOCK = threading.Lock()
_CLUSTER: ClusterSpec | None = None


def in_process_cluster(num_workers: int = 2, num_ps: int = 1) -> ClusterSpec:
    """Starts (once per process) and returns a loopback in-process cluster.

    Calling it again with the same shape returns the same cluster; another
    shape is an error, since the first servers cannot be stopped.
    """
    global _CLUSTER
    with _LOCK:
        if _CLUSTER is not None:
            if (_CLUSTER.num_workers, _CLUSTER.num_ps) != (num_workers, num_ps):
                raise RuntimeError(
                    "an in-process cluster with "
                    f"{_CLUSTER.num_workers} workers and {_CLUSTER.num_ps} PS "
                    "already runs in this process and cannot be stopped; use "
                    "one cluster shape per process.")
            return _CLUSTER
        cluster = loopback_cluster(num_workers, num_ps)
        for job in ("worker", "ps"):
            for index in range(len(cluster.jobs[job])):
                start_server(cluster, TaskInfo(job, index))
        _CLUSTER = cluster
        return cluster
