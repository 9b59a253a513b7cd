"""Feature specification: the single source of truth of a psrec job.

``spec`` holds the spec and its parts (plain Python: importing this package
does not import TensorFlow); ``transforms`` holds their TensorFlow ops.
"""

from psrec.features.spec.columns import CategoricalFeature
from psrec.features.spec.columns import DenseFeature
from psrec.features.spec.columns import LabelConfig
from psrec.features.spec.columns import SpecError
from psrec.features.spec.columns import TableConfig
from psrec.features.spec.derived import DerivedFeature
from psrec.features.spec.presets import PRESETS
from psrec.features.spec.presets import criteo
from psrec.features.spec.presets import movielens
from psrec.features.spec.presets import resolve_spec
from psrec.features.spec.spec import FeatureSpec
from psrec.features.spec.towers import TowersConfig

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
