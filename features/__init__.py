"""Feature specification: the single source of truth of a psrec job.

Importing this package does not import TensorFlow; the TF transforms live in
``features.transforms``.
"""

from psrec.features.presets import PRESETS
from psrec.features.presets import criteo
from psrec.features.presets import movielens
from psrec.features.presets import resolve_spec
from psrec.features.spec import CategoricalFeature
from psrec.features.spec import DenseFeature
from psrec.features.spec import FeatureSpec
from psrec.features.spec import LabelConfig
from psrec.features.spec import SpecError
from psrec.features.spec import TableConfig

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
