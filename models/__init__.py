"""Models: one composable ranking model and its parts.

``models.config`` is plain Python; everything else needs TensorFlow, so the
public names are resolved lazily (importing ``models`` or ``models.config``
does not import TensorFlow, which must see ``TF_USE_LEGACY_KERAS=1`` first;
see ``psrec.runtime``).
"""

from psrec._lazy import lazy_getattr
from psrec.models.config import MODEL_PRESETS
from psrec.models.config import ModelConfig
from psrec.models.config import ModelConfigError
from psrec.models.config import model_config
from psrec.models.retrieval_config import RetrievalConfig

__getattr__ = lazy_getattr("psrec.models", {
    "RankingModel": "psrec.models.ranking",
    "build_model": "psrec.models.ranking",
    "SparseArch": "psrec.models.embedding",
    "MLP": "psrec.models.blocks",
    "make_interaction": "psrec.models.interaction",
    "OptimizerConfig": "psrec.models.optim",
    "build_optimizers": "psrec.models.optim",
    "ServingModule": "psrec.models.export",
    "export_saved_model": "psrec.models.export",
    "RetrievalModel": "psrec.models.retrieval",
    "build_retrieval_model": "psrec.models.retrieval",
})


__all__ = [
    "MLP",
    "MODEL_PRESETS",
    "ModelConfig",
    "ModelConfigError",
    "OptimizerConfig",
    "RankingModel",
    "RetrievalConfig",
    "RetrievalModel",
    "ServingModule",
    "SparseArch",
    "build_model",
    "build_optimizers",
    "build_retrieval_model",
    "export_saved_model",
    "make_interaction",
    "model_config",
]
