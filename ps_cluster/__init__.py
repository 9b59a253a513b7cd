"""Parameter-server cluster: cluster specs, partitioning, servers, the
coordinator's training loop, checkpoints and the mirrored alternative.

``ps_cluster.spec`` is plain Python; the rest needs TensorFlow, so those
names are resolved lazily (importing ``ps_cluster`` does not import
TensorFlow; see ``launch.runtime``).
"""

import importlib

from ps_cluster.spec import ClusterSpec
from ps_cluster.spec import ClusterSpecError
from ps_cluster.spec import TaskInfo
from ps_cluster.spec import TFConfig

_LAZY = {
    "PartitionConfig": "ps_cluster.partitioning",
    "TablePartitioner": "ps_cluster.partitioning",
    "start_server": "ps_cluster.server",
    "in_process_cluster": "ps_cluster.in_process",
    "build_strategy": "ps_cluster.strategy",
    "build_coordinator": "ps_cluster.strategy",
    "LoopConfig": "ps_cluster.train_loop",
    "PSTrainer": "ps_cluster.trainer",
    "TrainResult": "ps_cluster.trainer",
    "CheckpointKeeper": "ps_cluster.checkpoint",
    "RestoreError": "ps_cluster.checkpoint",
    "EvalResult": "ps_cluster.metrics",
    "Watchdog": "ps_cluster.watchdog",
    "ClusterUnavailableError": "ps_cluster.errors",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ps_cluster' has no attribute {name!r}")


__all__ = [
    "CheckpointKeeper",
    "ClusterSpec",
    "ClusterSpecError",
    "ClusterUnavailableError",
    "EvalResult",
    "LoopConfig",
    "PSTrainer",
    "PartitionConfig",
    "RestoreError",
    "TFConfig",
    "TablePartitioner",
    "TaskInfo",
    "TrainResult",
    "Watchdog",
    "build_coordinator",
    "build_strategy",
    "in_process_cluster",
    "start_server",
]
