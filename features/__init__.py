"""Feature specification: the single source of truth of a psrec job.

Importing this package does not import TensorFlow; the TF transforms live in
``features.transforms``.
"""

from psrec.features.columns import CategoricalFeature
from psrec.features.columns import DenseFeature
from psrec.features.columns import LabelConfig
from psrec.features.columns import SpecError
from psrec.features.columns import TableConfig
from psrec.features.derived import DerivedFeature
from psrec.features.presets import PRESETS
from psrec.features.presets import criteo
from psrec.features.presets import movielens
from psrec.features.presets import resolve_spec
from psrec.features.spec import FeatureSpec
from psrec.features.towers import TowersConfig

__all__ = [
    "PRESETS",
    "CategoricalFeature",
    "DenseFeature",
    "DerivedFeature",
    "FeatureSpec",
    "LabelConfig",
    "SpecError",
    "TableConfig",
    "TowersConfig",
    "criteo",
    "movielens",
    "resolve_spec",
]
