"""psrec: parameter-server recommender training on TensorFlow.

Importing ``psrec`` does not import TensorFlow. The names that need it
(models, trainers, clusters) are resolved on first use, after
:func:`configure_environment` has set what TensorFlow must see before its
first import (``TF_USE_LEGACY_KERAS=1``, ``GRPC_FAIL_FAST=use_caller``).

Subpackages: ``psrec.features`` (specs), ``psrec.data`` (ingest,
conversion, input), ``psrec.models`` (the ranking model),
``psrec.ps_cluster`` (strategies, the trainer, checkpoints),
``psrec.launch`` (the CLI, local clusters, the job runner).
"""

import importlib

from psrec._version import __version__
from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.errors import PsrecError
from psrec.errors import RetryableError
from psrec.features.presets import resolve_spec as load_spec
from psrec.features.spec import FeatureSpec
from psrec.models.config import ModelConfig
from psrec.models.config import model_config
from psrec.runtime import configure_environment

# name -> module; each needs TensorFlow, so it is imported on first use.
_LAZY = {
    "build_model": "psrec.models.ranking",
    "LocalCluster": "psrec.launch.local",
    "JobConfig": "psrec.launch.job",
    "run_job": "psrec.launch.job",
}


def __getattr__(name: str):
    if name in _LAZY:
        configure_environment()
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'psrec' has no attribute {name!r}")


__all__ = [
    "ConfigError",
    "DataError",
    "FeatureSpec",
    "JobConfig",
    "LocalCluster",
    "ModelConfig",
    "PsrecError",
    "RetryableError",
    "__version__",
    "build_model",
    "configure_environment",
    "load_spec",
    "model_config",
    "run_job",
]
