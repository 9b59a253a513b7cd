"""Parameter-server cluster: cluster specs, partitioning, servers, the
strategies of every kind, the one train step and trainer, checkpoints.

``tf_config`` and ``addresses`` are plain Python; the rest needs TensorFlow,
so those names are resolved lazily (importing ``ps_cluster`` does not import
TensorFlow; see ``psrec.runtime``).
"""

from psrec._lazy import lazy_getattr
from psrec.ps_cluster.addresses import ClusterSpecError
from psrec.ps_cluster.tf_config import ClusterSpec
from psrec.ps_cluster.tf_config import TaskInfo
from psrec.ps_cluster.tf_config import TFConfig

__getattr__ = lazy_getattr("psrec.ps_cluster", {
    "PartitionConfig": "psrec.ps_cluster.partitioning",
    "TablePartitioner": "psrec.ps_cluster.partitioning",
    "start_server": "psrec.ps_cluster.server",
    "in_process_cluster": "psrec.ps_cluster.in_process",
    "build_ps_strategy": "psrec.ps_cluster.strategy",
    "build_replicated_strategy": "psrec.ps_cluster.strategy",
    "LoopConfig": "psrec.ps_cluster.train_loop",
    "Trainer": "psrec.ps_cluster.trainer",
    "RetrievalTrainer": "psrec.ps_cluster.retrieval_trainer",
    "TrainStep": "psrec.ps_cluster.step",
    "make_train_function": "psrec.ps_cluster.step",
    "TrainResult": "psrec.ps_cluster.trainer",
    "CheckpointKeeper": "psrec.ps_cluster.checkpoint",
    "RestoreError": "psrec.ps_cluster.checkpoint",
    "CheckpointFolderError": "psrec.ps_cluster.checkpoint_writers",
    "EvalResult": "psrec.ps_cluster.metrics",
    "Watchdog": "psrec.ps_cluster.watchdog",
    "ClusterUnavailableError": "psrec.ps_cluster.errors",
    "ShardingPlan": "psrec.ps_cluster.planner",
    "plan": "psrec.ps_cluster.planner",
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
