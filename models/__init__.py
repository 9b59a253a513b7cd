"""Models: one composable ranking model and its parts.

``models.config`` is plain Python; everything else needs TensorFlow, so the
public names are resolved lazily (importing ``models`` or ``models.config``
does not import TensorFlow, which must see ``TF_USE_LEGACY_KERAS=1`` first;
see ``psrec.runtime``).
"""

import importlib

from psrec.models.config import MODEL_PRESETS
from psrec.models.config import ModelConfig
from psrec.models.config import ModelConfigError
from psrec.models.config import model_config

_LAZY = {
    "RankingModel": "psrec.models.ranking",
    "build_model": "psrec.models.ranking",
    "SparseArch": "psrec.models.embedding",
    "MLP": "psrec.models.blocks",
    "make_interaction": "psrec.models.interaction",
    "OptimizerConfig": "psrec.models.optim",
    "build_optimizers": "psrec.models.optim",
    "ServingModule": "psrec.models.export",
    "export_saved_model": "psrec.models.export",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")


__all__ = [
    "MLP",
    "MODEL_PRESETS",
    "ModelConfig",
    "ModelConfigError",
    "OptimizerConfig",
    "RankingModel",
    "ServingModule",
    "SparseArch",
    "build_model",
    "build_optimizers",
    "export_saved_model",
    "make_interaction",
    "model_config",
]
