"""Models: ``embedding`` (SparseArch), ``ranking`` (the one composable ranking
model), ``retrieval`` (two towers), ``dynamic`` (collisionless tables),
``build`` (the model of a task), ``optim`` and ``serving`` (exports and
scoring: the only part that touches files).

The configs are plain Python; everything else needs TensorFlow, so the
public names are resolved lazily (importing ``models`` or a config does not
import TensorFlow, which must see ``TF_USE_LEGACY_KERAS=1`` first; see
``psrec.runtime``).
"""

from psrec._lazy import lazy_getattr
from psrec.models.ranking.config import MODEL_PRESETS
from psrec.models.ranking.config import ModelConfig
from psrec.models.ranking.config import ModelConfigError
from psrec.models.ranking.config import model_config
from psrec.models.retrieval.config import RetrievalConfig

__getattr__ = lazy_getattr("psrec.models", {
    "RankingModel": "psrec.models.ranking.model",
    "build_model": "psrec.models.build",
    "SparseArch": "psrec.models.embedding.sparse_arch",
    "MLP": "psrec.models.ranking.blocks",
    "make_interaction": "psrec.models.ranking.interaction",
    "OptimizerConfig": "psrec.models.optim.config",
    "build_optimizers": "psrec.models.optim.optimizers",
    "ServingModule": "psrec.models.serving.export",
    "export_saved_model": "psrec.models.serving.export",
    "RetrievalModel": "psrec.models.retrieval.model",
    "build_retrieval_model": "psrec.models.retrieval.model",
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
