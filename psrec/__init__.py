"""psrec: parameter-server recommender training on TensorFlow.

Importing ``psrec`` does not import TensorFlow. The names that need it
(models, trainers, clusters) are resolved on first use, after
:func:`configure_environment` has set what TensorFlow must see before its
first import (``TF_USE_LEGACY_KERAS=1``, ``GRPC_FAIL_FAST=use_caller``).

Subpackages: ``psrec.features`` (specs), ``psrec.data`` (ingest,
conversion, input), ``psrec.models`` (ranking and retrieval models,
serving), ``psrec.ps_cluster`` (strategies, the trainer, checkpoints),
``psrec.launch`` (the CLI, local clusters, the job runner); the layer order
is in ``docs/architecture.md``.
"""

from psrec._lazy import lazy_getattr
from psrec._version import __version__
from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.errors import PsrecError
from psrec.errors import RetryableError
from psrec.features.spec.presets import resolve_spec as load_spec
from psrec.features.spec.spec import FeatureSpec
from psrec.models.ranking.config import ModelConfig
from psrec.models.ranking.config import model_config
from psrec.runtime import configure_environment

# name -> module, imported on first use: they need TensorFlow, or belong
# to the launch layer that nothing below it may import.
__getattr__ = lazy_getattr("psrec", {
    "build_model": "psrec.models.build",
    "Trainer": "psrec.ps_cluster.training.trainer",
    "build_ps_strategy": "psrec.ps_cluster.cluster.strategy",
    "build_replicated_strategy": "psrec.ps_cluster.cluster.strategy",
    "in_process_cluster": "psrec.ps_cluster.cluster.in_process",
    "run_job": "psrec.launch.job.run",
    "JobConfig": "psrec.launch.job.config",
    "LocalCluster": "psrec.launch.local.cluster",
    "StrategyConfig": "psrec.launch.job.config",
})


__all__ = [
    "ConfigError",
    "DataError",
    "FeatureSpec",
    "JobConfig",
    "LocalCluster",
    "ModelConfig",
    "PsrecError",
    "RetryableError",
    "StrategyConfig",
    "Trainer",
    "__version__",
    "build_model",
    "build_ps_strategy",
    "build_replicated_strategy",
    "configure_environment",
    "in_process_cluster",
    "load_spec",
    "model_config",
    "run_job",
]
