"""Feature specification: the single source of truth of a psrec job.

Importing this package does not import TensorFlow; the TF transforms live in
``features.transforms``.
"""

from features.presets import PRESETS
from features.presets import criteo
from features.presets import movielens
from features.presets import resolve_spec
from features.spec import CategoricalFeature
from features.spec import DenseFeature
from features.spec import FeatureSpec
from features.spec import LabelConfig
from features.spec import SpecError
from features.spec import TableConfig

__all__ = [
    "PRESETS",
    "CategoricalFeature",
    "DenseFeature",
    "FeatureSpec",
    "LabelConfig",
    "SpecError",
    "TableConfig",
    "criteo",
    "movielens",
    "resolve_spec",
]
