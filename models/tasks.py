"""One entry point that builds the model of a task: a ranking model for a
:class:`~psrec.models.config.ModelConfig`, a two-tower model for a
:class:`~psrec.models.retrieval_config.RetrievalConfig`."""

from __future__ import annotations

from psrec.features.spec import FeatureSpec
from psrec.models import ranking
from psrec.models.config import ModelConfig
from psrec.models.retrieval import build_retrieval_model
from psrec.models.retrieval_config import RetrievalConfig


def build_model(spec: FeatureSpec, config: ModelConfig | RetrievalConfig,
                positive_rate: float | None = None):
    """The model of ``config``'s task with all its variables (call under a
    strategy scope); ``positive_rate`` sets a ranking model's output bias
    (a retrieval model has none)."""
    if isinstance(config, RetrievalConfig):
        return build_retrieval_model(spec, config)
    return ranking.build_model(spec, config, positive_rate)
