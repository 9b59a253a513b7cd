"""RankingModel: embeddings -> bottom MLP -> interaction -> top MLP -> logit.

One class for DLRM, DCN-v2, DeepFM and Wide & Deep; the
:class:`models.ranking.config.ModelConfig` picks the interaction and the wide part.
Parts are named by role, as in TorchRec: ``sparse_arch`` (PS-sharded
tables), ``dense_arch`` (bottom MLP on transformed dense features),
``interaction_arch`` and ``over_arch`` (top MLP).

The model takes the batch dict produced by ``data.format.records.decode_blocks``
(raw dense matrix + categorical row ids) and returns logits ``[B]`` -- or,
for a spec with several labels, ``{task: logits [B]}`` (one over arch per
task, ``over_arch`` the first task's, ``over_arch_<task>`` the others',
on the shared representation or the ``task_arch``'s MMoE / PLE output for
the task: ``models.ranking.tasks``; a ``given`` label's logit is that of
the product of its and its base task's probabilities, ESMM, with its own
under ``<task>_given_<base>``); the
dense transforms of the spec are applied inside, so the exported model can
take raw values. :func:`task_outputs` reads either form as a dict.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf
import tf_keras

from psrec.features.spec.spec import DENSE_COLUMN
from psrec.features.spec.spec import FeatureSpec
from psrec.features.transforms.ops import transform_dense
from psrec.models.embedding.attention import BehaviorTransformer
from psrec.models.embedding.attention import TargetAttention
from psrec.models.embedding.sparse_arch import ShardedTablesModel
from psrec.models.embedding.sparse_arch import SparseArch
from psrec.models.ranking.blocks import MLP
from psrec.models.ranking.config import COMMON_WIDTH_INTERACTIONS
from psrec.models.ranking.config import ModelConfig
from psrec.models.ranking.config import check_model_spec
from psrec.models.ranking.config import initial_logit
from psrec.models.ranking.interaction import make_interaction
from psrec.models.ranking.tasks import make_task_arch


def _history_attention(spec: FeatureSpec, config: ModelConfig
                       ) -> dict[str, tf_keras.layers.Layer]:
    """The pooling layer of each history with ``combiner: din`` or
    ``bst`` (``models.embedding.attention``), sized by ``config``."""
    layers = {}
    for feature in spec.categorical:
        name = f"attention_{feature.name}"
        if feature.combiner == "din":
            layers[feature.name] = TargetAttention(
                config.attention_mlp, config.attention_softmax, name=name)
        elif feature.combiner == "bst":
            layers[feature.name] = BehaviorTransformer(
                feature.max_length, spec.table(feature.table).dim,
                config.bst_heads, config.bst_ff_units, name=name)
    return layers


def _initial_outputs(spec: FeatureSpec, positive_rate: float | None,
                     label_means: dict[str, float]
                     ) -> dict[str, float | None]:
    """Each task's initial output (the bias of its over arch's output
    layer; None: the default initialisation): an ``mse`` task's train
    mean, the first 0/1 task's base-rate logit."""
    starts = {}
    for i, label in enumerate(spec.labels):
        if label.loss == "mse":
            starts[label.name] = label_means.get(label.name)
        else:
            starts[label.name] = (initial_logit(positive_rate)
                                  if i == 0 and positive_rate is not None
                                  else None)
    return starts


class RankingModel(ShardedTablesModel):
    """A CTR ranking model built from a feature spec.

    Every named model works on every spec with at least one categorical
    feature (:func:`models.ranking.config.check_model_spec`): without dense
    features there is no bottom MLP and ``dot``/``fm`` interact the
    embeddings only; for ``dot``/``fm`` a table whose ``dim`` differs from
    the widest table's is projected to that width by a learned linear map
    (``project_<table>``, a dense variable).

    Args:
      positive_rate: the training split's share of positives. When given,
        the untrained model predicts it: the output layer's bias starts at
        ``log(p / (1 - p))`` and the kernels of the layers that add to the
        logit (the top MLP's output layer, ``wide_dense``) at zero, like the
        wide tables, so the initial logit is the bias (plus, for ``fm``,
        the FM term of the random field vectors: near 0, since ``deepfm``
        starts them small, ``ModelConfig.init_scale``). None: default
        initialisation, bias 0. Only the first task's, and only a 0/1 one.
      label_means: ``{label: train mean}`` of ``loss: mse`` labels: the
        output of each such task starts at its mean (its over arch's output
        layer: zero kernel, the mean as bias), not at 0, so its first steps
        do not all go to learning the offset.
    """

    def __init__(self, spec: FeatureSpec, config: ModelConfig,
                 positive_rate: float | None = None,
                 label_means: dict[str, float] | None = None,
                 **kwargs: object) -> None:
        super().__init__(**kwargs)
        check_model_spec(spec, config)
        self.spec = spec
        self.config = config
        self.positive_rate = positive_rate
        self.label_means = dict(label_means or {})
        starts = _initial_outputs(spec, positive_rate, self.label_means)
        bias = starts[spec.label.name]
        width = None
        if config.interaction in COMMON_WIDTH_INTERACTIONS:
            width = max(t.dim for t in spec.tables)
        self.sparse_arch = SparseArch(
            spec, wide=config.wide_tables(spec),
            default_scale=config.init_scale,
            attention=_history_attention(spec, config), name="sparse_arch")
        self.projections = {
            t.name: tf_keras.layers.Dense(width, use_bias=False,
                                          name=f"project_{t.name}")
            for t in spec.tables if width is not None and t.dim != width}
        # Under a mixed-precision policy the logit layers stay float32.
        logit_dtype = "float32" if _mixed_precision() else None
        self.dense_arch = (MLP(config.bottom_mlp, output_units=width,
                               batch_norm=config.batch_norm,
                               name="dense_arch") if spec.dense else None)
        if (self.dense_arch is not None and self.dense_arch.out is not None
                and config.init_scale is not None):
            # The dense field vector starts at the embeddings' scale (not
            # yet built: the kernel is created on the first call).
            self.dense_arch.out.kernel_initializer = (
                tf_keras.initializers.RandomNormal(stddev=config.init_scale))
        self.interaction_arch = make_interaction(config)
        self.over_arch = MLP(config.top_mlp, output_units=1,
                             batch_norm=config.batch_norm,
                             output_dtype=logit_dtype, output_bias=bias,
                             name="over_arch")
        # Further tasks (multi-task specs): one over arch each, on the
        # shared representation or on the task arch's output for the task
        # (``ModelConfig.task_towers``); the first task's is ``over_arch``.
        self.task_arch = make_task_arch(config, spec.label_names)
        self.task_over_archs = {
            label.name: MLP(config.top_mlp, output_units=1,
                            batch_norm=config.batch_norm,
                            output_dtype=logit_dtype,
                            output_bias=starts[label.name],
                            name=f"over_arch_{label.name}")
            for label in spec.further_labels}
        wide_options = {"dtype": logit_dtype} if logit_dtype else {}
        if bias is not None:
            wide_options["kernel_initializer"] = "zeros"
        self.wide_dense = (tf_keras.layers.Dense(1, name="wide_dense",
                                                 **wide_options)
                           if config.wide and spec.dense else None)

    def get_config(self) -> dict:
        return {"spec": self.spec.to_dict(),
                "config": dataclasses.asdict(self.config),
                "positive_rate": self.positive_rate,
                "label_means": dict(self.label_means)}

    @classmethod
    def from_config(cls, config: dict, custom_objects=None) -> RankingModel:
        return cls(FeatureSpec.from_dict(config["spec"]),
                   ModelConfig(**config["config"]),
                   positive_rate=config.get("positive_rate"),
                   label_means=config.get("label_means"))

    def call(self, batch: dict[str, tf.Tensor], training: bool = False):
        embeddings, wide_logit = self.sparse_arch(batch)
        return self.head(embeddings, wide_logit, batch, training=training)

    def dense_layers(self) -> dict[str, object]:
        """Every part of the model but its tables, by role (what a split
        export's dense SavedModel holds)."""
        parts = {"projections": dict(self.projections),
                 "interaction_arch": self.interaction_arch,
                 "over_arch": self.over_arch}
        for name in ("dense_arch", "wide_dense", "task_arch"):
            if getattr(self, name) is not None:
                parts[name] = getattr(self, name)
        if self.task_over_archs:
            parts["task_over_archs"] = dict(self.task_over_archs)
        if self.sparse_arch.attention:  # a history's din / bst layer
            parts["attention"] = dict(self.sparse_arch.attention)
        return parts

    def head(self, embeddings: list[tf.Tensor], wide_logit, batch,
             training: bool = False):
        """The logits ``[B]`` of the pooled ``embeddings`` (spec order) and
        ``wide_logit`` (None without a wide part) that
        :class:`SparseArch` returns, with the dense matrix of ``batch``:
        everything after the table lookups (a multi-task spec: the logits
        of every task, by name)."""
        embeddings = [
            self.projections[f.table](e) if f.table in self.projections
            else e for f, e in zip(self.spec.categorical, embeddings)]
        if self.dense_arch is not None:
            dense = transform_dense(batch[DENSE_COLUMN], self.spec)
            dense_out = self.dense_arch(dense)
        else:  # no dense features: a zero-width dense vector
            dense_out = tf.zeros([tf.shape(embeddings[0])[0], 0],
                                 embeddings[0].dtype)
        if self.compute_dtype != "float32":  # mixed precision: one dtype in
            embeddings = [tf.cast(e, self.compute_dtype) for e in embeddings]
            dense_out = tf.cast(dense_out, self.compute_dtype)
        features, extra = self.interaction_arch(dense_out, embeddings)
        # Logits (and so the loss) are float32 whatever the policy; under
        # float32 these casts are no-ops. The first-order (wide) and FM
        # terms add to every task's logit.
        shared = [tf.cast(term, tf.float32) for term in (extra, wide_logit)
                  if term is not None]
        if self.wide_dense is not None:
            shared.append(tf.cast(tf.reshape(self.wide_dense(dense), [-1]),
                                  tf.float32))
        logits = {}
        inputs = (self.task_arch(features, training=training)
                  if self.task_arch is not None
                  else [features] * len(self.spec.labels))
        for (name, over_arch), task_input in zip(self.over_archs(), inputs):
            logit = tf.cast(tf.reshape(over_arch(task_input), [-1]),
                            tf.float32)
            for term in shared:
                logit += term
            logits[name] = logit
        if not self.spec.multi_task:
            return logits[self.spec.label.name]
        for label in self.spec.further_labels:
            if label.given is not None:  # a funnel (ESMM): P(given and it)
                logits[conditional_name(label)] = logits[label.name]
                logits[label.name] = product_logit(logits[label.given],
                                                   logits[label.name])
        return logits

    def over_archs(self) -> list[tuple[str, MLP]]:
        """``(task, over arch)`` of every task, the first task first."""
        return [(self.spec.label.name, self.over_arch),
                *self.task_over_archs.items()]


def conditional_name(label) -> str:
    """The output of a ``given`` label's own (conditional) probability:
    ``conversion_given_click`` -- pCVR in ESMM's terms."""
    return f"{label.name}_given_{label.given}"


def product_logit(first: tf.Tensor, second: tf.Tensor) -> tf.Tensor:
    """The logit of ``sigmoid(first) * sigmoid(second)`` (ESMM's pCTCVR =
    pCTR x pCVR), from log-probabilities: finite for any finite inputs."""
    log_p = tf.math.log_sigmoid(first) + tf.math.log_sigmoid(second)
    log_p = tf.minimum(log_p, -1e-7)  # p < 1: log(1 - p) stays finite
    return log_p - tf.math.log(-tf.math.expm1(log_p))


def task_labels(spec: FeatureSpec, batch: dict[str, tf.Tensor]
                ) -> dict[str, tuple[tf.Tensor, tf.Tensor]]:
    """``{task: (target, present)}`` of a multi-task batch: a label column
    holds NaN where the row lacks the label (``present`` False, target 0);
    a ``given`` label's target is ``given x label`` over every row -- a
    row whose ``given`` is 0 has target 0 even without the label itself
    (ESMM trains on the whole impression space)."""
    values = {label.name: tf.cast(batch[label.name], tf.float32)
              for label in spec.labels}
    found = {name: tf.math.is_finite(value) for name, value in values.items()}
    clean = {name: tf.where(found[name], value, 0.0)
             for name, value in values.items()}
    targets = {}
    for label in spec.labels:
        if label.given is None:
            targets[label.name] = (clean[label.name], found[label.name])
            continue
        base = label.given
        absent = tf.logical_and(found[base], tf.equal(clean[base], 0.0))
        targets[label.name] = (
            clean[base] * clean[label.name],
            tf.logical_and(found[base],
                           tf.logical_or(found[label.name], absent)))
    return targets


def task_outputs(outputs, spec: FeatureSpec) -> dict[str, tf.Tensor]:
    """``{task: output [B]}`` of a model's outputs: the dict of a
    multi-task model as it is, the one tensor of a single-label model under
    its label's name."""
    if isinstance(outputs, dict):
        return outputs
    return {spec.label.name: outputs}


def shifted_outputs(model, spec: FeatureSpec, shift: float,
                    batch: dict[str, tf.Tensor]):
    """The model's outputs on ``batch`` with ``shift`` (``log(R)`` of
    negatives kept at rate ``R``, ``psrec convert --neg-sample-rate``)
    added to the first task's logits: negative sampling reads the first
    label, so only its base rate moved."""
    outputs = model(batch)
    if not isinstance(outputs, dict):
        return tf.cast(outputs, tf.float32) + shift
    first = spec.label.name
    return {**outputs, first: tf.cast(outputs[first], tf.float32) + shift}


def _mixed_precision() -> bool:
    """True when the global Keras policy computes in float16/bfloat16."""
    return tf_keras.mixed_precision.global_policy().compute_dtype != "float32"


def example_batch(spec: FeatureSpec, rows: int = 2) -> dict[str, tf.Tensor]:
    """A batch of zeros with the model's input structure (to build it)."""
    batch = {}
    if spec.dense:
        batch[DENSE_COLUMN] = tf.zeros([rows, len(spec.dense)])
    for feature in spec.categorical:
        shape = [rows, feature.max_length] if feature.multi_hot else [rows]
        batch[feature.name] = tf.fill(shape, tf.constant(
            feature.row_offset or 0, tf.int64))
    return batch


def build_ranking_model(spec: FeatureSpec, config: ModelConfig,
                        positive_rate: float | None = None,
                        label_means: dict[str, float] | None = None
                        ) -> RankingModel:
    """Creates the model and all its variables (call under a strategy scope
    so that tables are sharded across PS tasks); ``positive_rate``,
    ``label_means``: see :class:`RankingModel`.

    Raises:
      ModelConfigError: a spec the model cannot be built on, or a
        ``positive_rate`` outside (0, 1).
    """
    check_model_spec(spec, config)
    initial_logit(positive_rate)
    model = RankingModel(spec, config, positive_rate=positive_rate,
                         label_means=label_means, name="ranking")
    model(example_batch(spec), training=False)
    return model


def count_parameters(model: RankingModel) -> dict[str, int]:
    return {
        "embedding": int(sum(np.prod(v.shape) for v in
                             model.embedding_variables())),
        "dense": int(sum(np.prod(v.shape) for v in model.dense_variables())),
    }
