"""Starting one TensorFlow gRPC server for a PS or worker task."""

from __future__ import annotations

import tensorflow as tf

from psrec.ps_cluster.cluster.tf_config import ClusterSpec
from psrec.ps_cluster.cluster.tf_config import TaskInfo

SERVER_JOBS = ("ps", "worker")


def server_config(cluster: ClusterSpec, task_type: str) -> tf.compat.v1.ConfigProto:
    """The session config of a role.

    Workers: ``inter_op_parallelism_threads`` >= workers + 1. With fewer
    threads the first closure that touches a PS variable can hang for
    minutes on a 2-core machine (measured here; TF's own in-process test
    helper sets the same bound, b/172296720). PS tasks: no GPU, since they
    only store and update variables.
    """
    config = tf.compat.v1.ConfigProto()
    if task_type == "worker":
        config.inter_op_parallelism_threads = max(
            cluster.num_workers + 1, config.inter_op_parallelism_threads)
    else:
        config.device_count["GPU"] = 0
    return config


def start_server(cluster: ClusterSpec, task: TaskInfo) -> tf.distribute.Server:
    """Starts the gRPC server of ``task`` (it serves until the process ends).

    TensorFlow binds it to ``0.0.0.0``/``[::]`` whatever host the cluster
    spec names, with no authentication and no TLS: anyone who reaches the
    port can run graphs in this process. Keep it on a private network
    (a local cluster runs in a private network namespace,
    ``psrec.launch.local.netns``).

    Raises:
      ValueError: if the task is not a PS or worker task of the cluster
        (a ``ClusterSpecError`` when it is not in the cluster at all).
    """
    if task.type not in SERVER_JOBS:
        raise ValueError(
            f"task type {task.type!r} does not run a server; `psrec server` "
            f"runs {' or '.join(SERVER_JOBS)} tasks (the coordinator runs "
            "`psrec train`).")
    cluster.address_of(task)  # checks the task is in the cluster
    return tf.distribute.Server(
        tf.train.ClusterSpec(cluster.to_tf_cluster_dict()),
        job_name=task.type, task_index=task.index, protocol="grpc",
        config=server_config(cluster, task.type), start=True)
