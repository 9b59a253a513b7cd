"""Building the ParameterServerStrategy and its ClusterCoordinator."""

from __future__ import annotations

import tensorflow as tf

from psrec.ps_cluster.partitioning import PartitionConfig
from psrec.ps_cluster.partitioning import TablePartitioner
from psrec.ps_cluster.spec import ClusterSpec


def build_strategy(cluster: ClusterSpec,
                   partition: PartitionConfig = PartitionConfig()
                   ) -> tf.distribute.ParameterServerStrategy:
    """A PS strategy over ``cluster`` whose tables shard per ``partition``.

    The coordinator (this process) joins the cluster as the ``chief`` job;
    a ``chief`` address in ``cluster`` is not needed (it serves nothing).
    """
    cluster.validate(strategy="ps", allow_remote=True)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster.to_tf_cluster_dict()), rpc_layer="grpc")
    return tf.distribute.ParameterServerStrategy(
        resolver,
        variable_partitioner=TablePartitioner(partition, cluster.num_ps))


def build_coordinator(strategy: tf.distribute.ParameterServerStrategy
                      ) -> tf.distribute.coordinator.ClusterCoordinator:
    return tf.distribute.coordinator.ClusterCoordinator(strategy)
