"""Distributed training: ``cluster`` (cluster specs, servers, strategies of
every kind, the partitioner), ``evaluation`` (streaming metrics),
``checkpoint``, ``training`` (the one trainer and train step), ``retrieval``
(the retrieval task on the trainer) and ``planner`` (PS memory, advice).

``cluster.tf_config`` and ``cluster.addresses`` are plain Python; the rest
needs TensorFlow, so those names are resolved lazily (importing
``ps_cluster`` does not import TensorFlow; see ``psrec.runtime``).
"""

from psrec._lazy import lazy_getattr
from psrec.ps_cluster.cluster.addresses import ClusterSpecError
from psrec.ps_cluster.cluster.tf_config import ClusterSpec
from psrec.ps_cluster.cluster.tf_config import TaskInfo
from psrec.ps_cluster.cluster.tf_config import TFConfig

__getattr__ = lazy_getattr("psrec.ps_cluster", {
    "PartitionConfig": "psrec.ps_cluster.cluster.partition_config",
    "TablePartitioner": "psrec.ps_cluster.cluster.partitioning",
    "start_server": "psrec.ps_cluster.cluster.server",
    "in_process_cluster": "psrec.ps_cluster.cluster.in_process",
    "build_ps_strategy": "psrec.ps_cluster.cluster.strategy",
    "build_replicated_strategy": "psrec.ps_cluster.cluster.strategy",
    "LoopConfig": "psrec.ps_cluster.training.config",
    "Trainer": "psrec.ps_cluster.training.trainer",
    "RetrievalTrainer": "psrec.ps_cluster.retrieval.trainer",
    "TrainStep": "psrec.ps_cluster.training.step",
    "make_train_function": "psrec.ps_cluster.training.step",
    "TrainResult": "psrec.ps_cluster.training.trainer",
    "CheckpointKeeper": "psrec.ps_cluster.checkpoint.keeper",
    "RestoreError": "psrec.ps_cluster.checkpoint.keeper",
    "CheckpointFolderError": "psrec.ps_cluster.checkpoint.writers",
    "EvalResult": "psrec.ps_cluster.evaluation.metrics",
    "Watchdog": "psrec.ps_cluster.training.watchdog",
    "ClusterUnavailableError": "psrec.ps_cluster.cluster.probe",
    "ShardingPlan": "psrec.ps_cluster.planner.plan",
    "plan": "psrec.ps_cluster.planner.plan",
})


__all__ = [
    "CheckpointFolderError",
    "CheckpointKeeper",
    "ClusterSpec",
    "ClusterSpecError",
    "ClusterUnavailableError",
    "EvalResult",
    "LoopConfig",
    "Trainer",
    "TrainStep",
    "PartitionConfig",
    "RestoreError",
    "RetrievalTrainer",
    "ShardingPlan",
    "TFConfig",
    "TablePartitioner",
    "TaskInfo",
    "TrainResult",
    "Watchdog",
    "build_ps_strategy",
    "build_replicated_strategy",
    "in_process_cluster",
    "make_train_function",
    "plan",
    "start_server",
]
