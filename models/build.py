"""One entry point that builds the model of a task: a ranking model for a
:class:`~psrec.models.ranking.config.ModelConfig`, a two-tower model for a
:class:`~psrec.models.retrieval.config.RetrievalConfig`."""

from __future__ import annotations

from psrec.features.spec.spec import FeatureSpec
from psrec.models.ranking.config import ModelConfig
from psrec.models.ranking.model import build_ranking_model
from psrec.models.retrieval.config import RetrievalConfig
from psrec.models.retrieval.model import build_retrieval_model


def build_model(spec: FeatureSpec, config: ModelConfig | RetrievalConfig,
                positive_rate: float | None = None,
                label_means: dict[str, float] | None = None):
    """The model of ``config``'s task with all its variables (call under a
    strategy scope); ``positive_rate`` and ``label_means`` set a ranking
    model's initial outputs (a retrieval model has none)."""
    if isinstance(config, RetrievalConfig):
        return build_retrieval_model(spec, config)
    return build_ranking_model(spec, config, positive_rate, label_means)
