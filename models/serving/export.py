"""Serving export: a SavedModel that takes raw feature values.

The serving signature ``serving_default`` takes one tensor per input column,
exactly as in the Parquet input:

* dense features: ``float32 [batch]`` (NaN = missing -> the spec's default);
* the raw sources of derived features (``features.spec.derived``): the
  ``source_dtype`` of the derived feature, ``[batch]`` (a source that is
  itself a feature is given once, as that feature);
* categorical features: ``string [batch]`` or ``int64 [batch]`` (the spec's
  ``dtype``); ``""`` (strings) or ``-1`` (ints) is the "missing" value, the
  value a null gets at conversion;
* multi-hot features: ``[batch, n]`` of the same dtype, padded with ``""``
  (strings) or ``-1`` (ints) anywhere in a row; padding is dropped and the
  first ``max_length`` remaining values are used -- exactly what conversion
  does with null, ``""`` and ``-1`` list elements.

and returns ``{"probability": [batch], "logit": [batch]}`` -- of the first
task, for a spec with several labels, which adds ``<task>_score`` for every
task: the probability of a ``logloss`` task, the predicted value of an
``mse`` one; a ``given`` task's is the product of its base task's and its
own conditional probability (ESMM's pCTCVR), which is output too as
``<task>_given_<base>_score`` (pCVR). Hashing and
vocabulary lookups run through ``features.transforms.ops.CategoricalEncoder``
(the ops used by ``psrec convert``) and the dense transforms are inside the
model, so serving sees what training saw. The model is rebuilt without any
distribution strategy (plain variables; ``tf.saved_model.load`` cannot load
sharded variables) and restored from the checkpoint, verified by value.

The tables are stored as trained (float32) or, with ``table_dtype``
(``psrec export --table-dtype``), as float16 or per-row int8 and
dequantized on lookup (``models.embedding.quantize``); the signature is the
same.
"""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from psrec.features.spec.spec import DENSE_COLUMN
from psrec.features.spec.spec import FeatureSpec
from psrec.features.transforms.ops import CategoricalEncoder
from psrec.features.transforms.ops import derive_all
from psrec.models.dynamic.table import freeze_tables
from psrec.models.ranking.model import RankingModel
from psrec.models.ranking.model import conditional_name
from psrec.models.ranking.model import task_outputs

_DTYPES = {"string": tf.string, "int64": tf.int64, "float32": tf.float32}
#: The suffix of each task's output of a multi-task export.
TASK_SUFFIX = "_score"


def serving_signature(spec: FeatureSpec) -> dict[str, tf.TensorSpec]:
    """The raw-input signature derived from the spec: one tensor per raw
    input column (a derived feature's sources, not the derived column)."""
    return {name: tf.TensorSpec([None, None] if is_list else [None],
                                _DTYPES[dtype], name=name)
            for name, (dtype, is_list) in spec.raw_inputs.items()}


def dense_batch(spec: FeatureSpec, raw: dict[str, tf.Tensor]
                ) -> dict[str, tf.Tensor]:
    """``{DENSE_COLUMN: [batch, dense features]}`` of raw dense values
    (``{}`` without dense features)."""
    if not spec.dense:
        return {}
    return {DENSE_COLUMN: tf.stack(
        [tf.cast(raw[f.name], tf.float32) for f in spec.dense], axis=1)}


def encode_ids(encoder: CategoricalEncoder, spec: FeatureSpec,
               raw: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """``feature name -> int64 ids`` (``[batch]``, multi-hot ``[batch,
    max_length]`` padded with -1) of the raw values of every categorical
    feature (derived ones from their sources)."""
    derived = derive_all(spec.derived, raw)
    ids = {}
    for feature in spec.categorical:
        values = derived.get(feature.name, raw.get(feature.name))
        if feature.multi_hot:
            ids[feature.name] = encoder.encode_lists(feature.name, values)
        else:
            ids[feature.name] = encoder.encode(feature.name, values)
    return ids


class ServingModule(tf.Module):
    """Raw values -> model batch -> click probability.

    ``logit_shift`` is added to the model's logit before both outputs:
    ``log(R)`` for a model trained on negatives kept at rate ``R``
    (``psrec convert --neg-sample-rate``), so served probabilities are
    calibrated; it is saved as the variable ``logit_shift``.
    """

    def __init__(self, model: RankingModel, spec: FeatureSpec,
                 logit_shift: float = 0.0) -> None:
        super().__init__(name="psrec_serving")
        freeze_tables(model)  # dynamic tables: a static id -> row snapshot
        self.model = model
        self.encoder = CategoricalEncoder(spec)
        self._spec = spec
        self.logit_shift = tf.Variable(float(logit_shift), trainable=False,
                                       dtype=tf.float32, name="logit_shift")
        self.serve = tf.function(self._serve,
                                 input_signature=[serving_signature(spec)])

    def model_batch(self, raw: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """The model's input batch for raw values (ids, dense matrix)."""
        return {**dense_batch(self._spec, raw),
                **encode_ids(self.encoder, self._spec, raw)}

    def _serve(self, raw: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        spec = self._spec
        outputs = task_outputs(self.model(self.model_batch(raw),
                                          training=False), spec)
        outputs = {name: tf.cast(value, tf.float32)
                   for name, value in outputs.items()}
        logit = outputs[spec.label.name] + self.logit_shift
        served = {"probability": tf.sigmoid(logit), "logit": logit}
        if spec.multi_task:  # one score per task, the first one too
            outputs[spec.label.name] = logit
            for label in spec.labels:
                value = outputs[label.name]
                served[label.name + TASK_SUFFIX] = (
                    value if label.regression else tf.sigmoid(value))
                if label.given is not None:  # ESMM: pCVR beside pCTCVR
                    name = conditional_name(label)
                    served[name + TASK_SUFFIX] = tf.sigmoid(outputs[name])
        return served


def export_outputs(spec: FeatureSpec) -> dict[str, str]:
    """``{task (or a given task's conditional): its output}`` of a
    multi-task export (``psrec_export.json``'s ``tasks``)."""
    outputs = {}
    for label in spec.labels:
        outputs[label.name] = label.name + TASK_SUFFIX
        if label.given is not None:
            name = conditional_name(label)
            outputs[name] = name + TASK_SUFFIX
    return outputs


def export_saved_model(model: RankingModel, spec: FeatureSpec,
                       out_dir: str | Path, logit_shift: float = 0.0,
                       table_dtype: str = "float32") -> str:
    """Writes the serving SavedModel of a model with plain variables into
    ``out_dir`` (a path or URI; ``logit_shift``: see
    :class:`ServingModule`; ``table_dtype``: how its tables are stored,
    ``ExportConfig.table_dtype``) and returns ``out_dir`` as a string.
    Versioned export folders are :mod:`psrec.models.serving.versions`'
    business."""
    out = str(out_dir)
    with model.tables_stored_as(table_dtype):
        module = ServingModule(model, spec, logit_shift=logit_shift)
        tf.saved_model.save(module, out,
                            signatures={"serving_default": module.serve})
    return out
