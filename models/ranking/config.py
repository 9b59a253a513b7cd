"""Model configuration: one ranking model, four named configurations.

DLRM, DCN-v2, DeepFM and Wide & Deep are not four classes: they are values
of :class:`ModelConfig` that pick the interaction and whether a wide
(first-order) part is added. ``MODEL_PRESETS`` is the only name -> config
mapping.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from psrec.errors import ConfigError
from psrec.errors import check
from psrec.errors import check_choice
from psrec.errors import did_you_mean
from psrec.options import Codec
from psrec.options import option

if TYPE_CHECKING:
    from psrec.features.spec.spec import FeatureSpec

INTERACTIONS = ("dot", "cross", "fm", "concat")
#: Interactions that combine field vectors with dot products: every field
#: must have one width (tables of other widths are projected to it).
COMMON_WIDTH_INTERACTIONS = ("dot", "fm")
BATCH_NORMS = ("none", "batch", "sync")
#: How the tasks of a multi-task spec share the model
#: (``models.ranking.tasks``).
TASK_TOWERS = ("shared-bottom", "mmoe", "ple")


class ModelConfigError(ConfigError):
    """A model configuration value is invalid."""


@dataclasses.dataclass(frozen=True)
class ModelConfig(Codec, where="model"):
    """Architecture of :class:`models.ranking.model.RankingModel`."""

    interaction: str = option(
        "cross", choices=INTERACTIONS,
        help="``dot`` (DLRM pairwise dot products), ``cross`` (DCN-v2 cross "
        "network, ``tfrs.layers.dcn.Cross``), ``fm`` (factorization machine "
        "second-order term, DeepFM) or ``concat`` (plain concatenation, "
        "Wide & Deep's deep part)")
    bottom_mlp: tuple[int, ...] = option(
        (),
        help="hidden widths of the dense-feature MLP; for ``dot`` and ``fm`` "
        "a final projection to the embedding width is added, since dense and "
        "sparse vectors must share a width there. Empty: raw transformed "
        "dense features go straight to the interaction")
    top_mlp: tuple[int, ...] = option(
        (256, 128),
        help="hidden widths of the MLP above the interaction (a final 1-unit "
        "logit layer is always added)")
    cross_layers: int = option(
        2, help="number of cross layers (``cross``)")
    cross_low_rank: int | None = option(
        None, flag="--cross-low-rank",
        help="rank of the DCN cross layers' low-rank kernels (default: the "
        "model configuration's)")
    wide: bool = option(
        False, help="add a first-order linear part (one weight per embedding "
        "row, sharded like the tables, plus a linear term on dense features)")
    batch_norm: str = option(
        "none", choices=BATCH_NORMS,
        help="batch normalization after each hidden layer of both MLP "
        "towers: ``none``, ``batch`` (per-replica statistics) or ``sync`` "
        "(statistics all-reduced across the replicas in sync, for the "
        "mirrored strategies; ``psrec train --sync-batch-norm``)")
    init_scale: float | None = option(
        None, help="initialisation scale of the field vectors the "
        "interaction combines: the rows of the tables whose spec leaves "
        "``scale`` unset (with the table's ``initializer``) and, for ``dot`` "
        "and ``fm``, the kernel of the dense tower's projection to the "
        "embedding width (normal, this stddev). None: the defaults (tables "
        "``1/sqrt(dim)``, Glorot). DeepFM sets ``0.01`` "
        "(:data:`FM_INIT_SCALE`): its second-order term, a sum over all "
        "field pairs added to the logit, is then near 0 at the start")

    task_towers: str = option(
        "shared-bottom", flag="--task-towers", choices=TASK_TOWERS,
        help="how the tasks of a spec with several labels share the model: "
        "``shared-bottom`` (one over arch per task on the shared "
        "representation), ``mmoe`` (--experts shared experts mixed by a "
        "softmax gate per task) or ``ple`` (progressive layered extraction: "
        "shared and per-task experts over --ple-levels levels)")
    experts: int = option(
        4, flag="--experts",
        help="shared experts of ``mmoe``, and of each ``ple`` level")
    task_experts: int = option(
        1, flag="--task-experts",
        help="experts of each task in each ``ple`` level")
    expert_units: tuple[int, ...] = option(
        (64,), flag="--expert-units",
        help="hidden widths of each expert MLP (``mmoe``, ``ple``), e.g. "
        "128,64")
    ple_levels: int = option(
        1, flag="--ple-levels",
        help="extraction levels of ``ple`` (one or more)")

    attention_mlp: tuple[int, ...] = option(
        (36,), flag="--attention-mlp",
        help="hidden widths of the target-attention MLP of each history "
        "feature with ``combiner: din`` (DIN), e.g. 80,40")
    attention_softmax: bool = option(
        False, flag="--attention-softmax",
        help="normalise a ``din`` history's attention weights by a softmax "
        "over its items (default: the raw scores, as in the DIN paper)")
    bst_heads: int = option(
        2, flag="--bst-heads",
        help="attention heads of the transformer layer of each history "
        "feature with ``combiner: bst`` (BST); each head is "
        "ceil(dim / heads) wide, dim the history's embedding width")
    bst_ff_units: int | None = option(
        None, flag="--bst-ff-units",
        help="hidden width of the feed-forward part of that transformer "
        "layer (default: 4 x the history's embedding width, as in the "
        "Transformer)")

    def __post_init__(self) -> None:
        object.__setattr__(self, "attention_mlp", tuple(self.attention_mlp))
        object.__setattr__(self, "bottom_mlp", tuple(self.bottom_mlp))
        object.__setattr__(self, "top_mlp", tuple(self.top_mlp))
        object.__setattr__(self, "expert_units", tuple(self.expert_units))
        check_choice("task_towers", self.task_towers, TASK_TOWERS,
                     ModelConfigError)
        for key in ("experts", "task_experts", "ple_levels", "bst_heads"):
            value = getattr(self, key)
            check(isinstance(value, int) and not isinstance(value, bool)
                  and value >= 1, key, value, "must be an integer >= 1",
                  ModelConfigError)
        if not self.expert_units or any(
                not isinstance(w, int) or w < 1 for w in self.expert_units):
            raise ModelConfigError(
                f"`expert_units` = {self.expert_units!r} must hold one or "
                "more positive integers.")
        check_choice("interaction", self.interaction, INTERACTIONS,
                     ModelConfigError)
        for key in ("bottom_mlp", "top_mlp", "attention_mlp"):
            widths = getattr(self, key)
            if any(not isinstance(w, int) or w < 1 for w in widths):
                raise ModelConfigError(
                    f"`{key}` = {widths!r} must hold positive integers.")
        if self.interaction == "cross" and self.cross_layers < 1:
            raise ModelConfigError(
                f"`cross_layers` = {self.cross_layers!r} must be >= 1 for the "
                "cross interaction.")
        check_choice("batch_norm", self.batch_norm, BATCH_NORMS,
                     ModelConfigError)
        for key in ("cross_low_rank", "bst_ff_units"):
            value = getattr(self, key)
            check(value is None or (isinstance(value, int)
                                    and not isinstance(value, bool)
                                    and value >= 1),
                  key, value, "must be an integer >= 1 or None",
                  ModelConfigError)
        scale = self.init_scale
        check(scale is None or (isinstance(scale, (int, float))
                                and not isinstance(scale, bool)
                                and math.isfinite(scale) and scale > 0),
              "init_scale", scale, "must be a finite number > 0 or None",
              ModelConfigError)

    def wide_tables(self, spec: FeatureSpec) -> tuple[str, ...]:
        """The tables of ``spec`` with a wide (``[rows, 1]``) twin: all
        with ``wide``, else none (``RetrievalConfig.wide_tables`` has the
        two-tower model's)."""
        return tuple(t.name for t in spec.tables) if self.wide else ()


#: DeepFM's initialisation scale of the field vectors (``init_scale``): at
#: the tables' default ``1/sqrt(dim)`` its FM term starts with a standard
#: deviation of several logits on Criteo, which the model must unlearn.
FM_INIT_SCALE = 0.01


MODEL_PRESETS: dict[str, ModelConfig] = {
    "dlrm": ModelConfig(interaction="dot", bottom_mlp=(64,)),
    "dcn": ModelConfig(interaction="cross"),
    "deepfm": ModelConfig(interaction="fm", wide=True,
                          init_scale=FM_INIT_SCALE),
    "wide_deep": ModelConfig(interaction="concat", wide=True),
}


#: The model ``--model`` names when not given: DeepFM, measured above DCN-v2
#: on the Criteo sample, MovieLens and synthetic Criteo at the default flags
#: (docs/decisions.md, Issue 23, "Default-flag quality").
DEFAULT_MODEL = "deepfm"


def model_config(name: str, **overrides: object) -> ModelConfig:
    """A named configuration, optionally with fields replaced; an unknown
    name or field is a :class:`ModelConfigError`."""
    if name not in MODEL_PRESETS:
        raise ModelConfigError(
            f"`--model` = {name!r} is not one of "
            f"{', '.join(MODEL_PRESETS)}"
            f"{did_you_mean(name, MODEL_PRESETS) or '.'}")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ModelConfigError(
            f"unknown model option(s) {unknown}; allowed: {sorted(fields)}"
            f"{did_you_mean(unknown[0], sorted(fields)) or '.'}")
    return dataclasses.replace(MODEL_PRESETS[name], **overrides)


_DEFAULT = ModelConfig()
#: The options of each history combiner (refused on a spec without one).
_HISTORY_OPTIONS = {"din": ("attention_mlp", "attention_softmax"),
                    "bst": ("bst_heads", "bst_ff_units")}


def check_model_spec(spec: FeatureSpec, config: ModelConfig,
                     name: str | None = None) -> None:
    """Refuses a spec the model cannot be built on, before anything starts.

    Pure Python (no TensorFlow). What every model supports: no dense
    features (``dot`` and ``fm`` then interact the embeddings only), a
    single categorical feature, multi-hot features, and tables of different
    widths (``dot`` and ``fm`` project each narrower or wider table to the
    widest table's ``dim`` with a learned linear map). ``name`` is the
    ``--model`` the message names.
    """
    model = (f"`--model` = {name!r}" if name is not None
             else f"`interaction` = {config.interaction!r}")
    if not spec.categorical:
        raise ModelConfigError(
            f"{model} needs at least one categorical feature (embedding "
            f"table); spec {spec.name!r} has only dense features "
            f"{[f.name for f in spec.dense]}: add a categorical feature and "
            "its table to the spec.")
    for combiner, keys in _HISTORY_OPTIONS.items():
        if any(f.combiner == combiner for f in spec.categorical):
            continue
        unused = [key for key in keys
                  if getattr(config, key) != getattr(_DEFAULT, key)]
        if unused:
            raise ModelConfigError(
                f"`{unused[0]}` = {getattr(config, unused[0])!r} applies to "
                f"a user history with `combiner: {combiner}`; spec "
                f"{spec.name!r} has none: drop it or attend a history.")


def initial_logit(positive_rate: float | None) -> float:
    """The output bias that makes an untrained model predict the base rate:
    ``log(p / (1 - p))``; 0 when ``positive_rate`` is None."""
    if positive_rate is None:
        return 0.0
    ok = (isinstance(positive_rate, (int, float))
          and not isinstance(positive_rate, bool)
          and 0.0 < positive_rate < 1.0)
    check(ok, "positive_rate", positive_rate,
          "must be in (0, 1) (the training split's share of positives; "
          "a split of one class cannot train a classifier)",
          ModelConfigError)
    return math.log(positive_rate / (1.0 - positive_rate))
