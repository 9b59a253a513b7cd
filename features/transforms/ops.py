"""Feature transforms as TensorFlow ops, shared by conversion, training and
serving so that the three can never disagree.

* :class:`CategoricalEncoder` turns raw categorical values (strings or ints)
  into embedding-table row ids: a stable FarmHash fingerprint of the value's
  string form (``tf.strings.to_hash_bucket_fast``), or a vocabulary lookup,
  plus the feature's row offset (raw ids of a dynamic table: the
  fingerprint itself, in ``[0, 2**63 - 1)``, of the value prefixed with the
  feature's name -- its ``share`` root's -- so features of one table keep
  their ids apart); multi-hot lists become ``[batch,
  max_length]`` ids with padding dropped (:meth:`CategoricalEncoder.encode_lists`).
* The missing/padding values, the same at conversion and at serving: a
  missing single value (null, ``""`` or, for ints, ``-1``) is hashed as the
  missing token ``""``; in a multi-hot list a null, ``""`` (string lists) or
  ``-1`` (int lists) element is padding: it is dropped, and the list's
  remaining values move up (only they count towards ``max_length``).
* :func:`derive_all` computes the spec's derived columns (time parts,
  buckets, crosses) from raw values.
* :func:`transform_dense` applies the spec's dense transforms to a
  ``[batch, num_dense]`` matrix of raw values (NaN = missing).
"""

from __future__ import annotations

from typing import Mapping
from typing import Sequence

import numpy as np
import tensorflow as tf

from psrec.features.spec.columns import CategoricalFeature
from psrec.features.spec.derived import CROSS_SEPARATOR
from psrec.features.spec.derived import EPOCH_MS
from psrec.features.spec.derived import TIME_KINDS
from psrec.features.spec.derived import DerivedFeature
from psrec.features.spec.derived import parse_pattern
from psrec.features.spec.dynamic import RAW_ID_BUCKETS
from psrec.features.spec.spec import FeatureSpec

MISSING_TOKEN = ""  # how a missing categorical value is hashed
MISSING_INT = -1  # the missing value of an int64 feature (no null in int64)
PAD_ID = -1  # the row id of a multi-hot padding slot (masked by the model)
ID_SPACE_SEPARATOR = "\x1f"  # raw ids hash "<feature>\x1f<value>"


def as_strings(values: tf.Tensor) -> tf.Tensor:
    """The string form that hashing and vocabularies see: ints in decimal,
    except :data:`MISSING_INT`, which is the missing token like a null."""
    values = tf.convert_to_tensor(values)
    if values.dtype == tf.string:
        return values
    return tf.where(tf.equal(values, tf.cast(MISSING_INT, values.dtype)),
                    MISSING_TOKEN, tf.strings.as_string(values))


def padding_value(dtype: tf.DType) -> str | int:
    """The multi-hot padding element of raw values of ``dtype``: ``""`` for
    strings, :data:`MISSING_INT` for ints (nulls are filled with it)."""
    return MISSING_TOKEN if dtype == tf.string else MISSING_INT


class CategoricalEncoder(tf.Module):
    """Maps raw categorical values to table row ids, feature by feature: the
    same object serves ``psrec convert`` (eagerly) and the exported serving
    function."""

    def __init__(self, spec: FeatureSpec, name: str | None = None) -> None:
        super().__init__(name=name)
        self._features = {f.name: f for f in spec.categorical}
        self._tables = {}
        for feature in spec.categorical:
            if feature.vocabulary_file is None:
                continue
            vocabulary = feature.vocabulary()
            initializer = tf.lookup.KeyValueTensorInitializer(
                tf.constant(vocabulary, tf.string),
                tf.range(1, len(vocabulary) + 1, dtype=tf.int64))
            # 0 is the out-of-vocabulary id.
            self._tables[feature.name] = tf.lookup.StaticHashTable(
                initializer, default_value=0)

    def _id_space(self, feature: CategoricalFeature) -> str:
        """The feature whose ids a raw-id feature uses: the root of its
        ``share`` chain (features of one dynamic table keep apart ids,
        as the ranges of a hashed table do), itself when not sharing."""
        seen = {feature.name}
        while feature.share is not None and feature.share in self._features:
            feature = self._features[feature.share]
            if feature.name in seen:
                break
            seen.add(feature.name)
        return feature.name

    def feature(self, name: str) -> CategoricalFeature:
        return self._features[name]

    def encode(self, name: str, values: tf.Tensor) -> tf.Tensor:
        """int64 row ids of feature ``name`` for raw ``values`` (string or
        integer, any shape), of the same shape."""
        feature = self._features[name]
        strings = as_strings(values)
        if feature.raw_ids:  # a dynamic table: the 64-bit fingerprint itself
            salted = tf.strings.join([self._id_space(feature), strings],
                                     separator=ID_SPACE_SEPARATOR)
            return tf.strings.to_hash_bucket_fast(salted, RAW_ID_BUCKETS)
        if feature.hash_buckets is not None:
            bucket = tf.strings.to_hash_bucket_fast(
                strings, feature.hash_buckets)
        else:
            bucket = self._tables[name].lookup(strings)
        return bucket + feature.row_offset

    def encode_lists(self, name: str,
                     values: tf.Tensor | tf.RaggedTensor) -> tf.Tensor:
        """Row ids ``[batch, max_length]`` of multi-hot lists of feature ``name``.

        Padding elements (:func:`padding_value`) are dropped and the rest
        keep their order; the first ``max_length`` of them are encoded and
        the remaining slots are :data:`PAD_ID`. ``values``: ``[batch, n]`` raw
        values, dense (serving: padded rows) or ragged (conversion: one list per
        row), string or int.
        """
        feature = self._features[name]
        if not isinstance(values, tf.RaggedTensor):
            values = tf.RaggedTensor.from_tensor(tf.convert_to_tensor(values))
        pad = padding_value(values.dtype)
        values = tf.ragged.boolean_mask(values, tf.not_equal(values, pad))
        ids = tf.ragged.map_flat_values(self.encode, name, values)
        return ids.to_tensor(default_value=tf.constant(PAD_ID, tf.int64),
                             shape=[None, feature.max_length])


def dense_constants(spec: FeatureSpec) -> dict[str, np.ndarray]:
    """Per-column constants of the dense transforms, as float32 vectors."""
    features = spec.dense
    return {
        "log1p": np.array([f.transform == "log1p" for f in features]),
        "mean": np.array([f.mean if f.transform == "standardize" else 0.0
                          for f in features], np.float32),
        "std": np.array([f.std if f.transform == "standardize" else 1.0
                         for f in features], np.float32),
        "default": np.array([f.default for f in features], np.float32),
    }


def transform_dense(raw: tf.Tensor, spec: FeatureSpec) -> tf.Tensor:
    """Applies the dense transforms to ``raw`` of shape ``[batch, D]``; NaN
    marks a missing value and becomes the feature's default first."""
    constants = dense_constants(spec)
    raw = tf.cast(raw, tf.float32)
    filled = tf.where(tf.math.is_nan(raw), constants["default"], raw)
    logged = tf.math.log1p(tf.maximum(filled, 0.0))
    x = tf.where(constants["log1p"], logged, filled)
    return (x - constants["mean"]) / constants["std"]


# -- derived features (features.spec.derived) ---------------------------------


def _days_from_civil(y: tf.Tensor, m: tf.Tensor, d: tf.Tensor) -> tf.Tensor:
    """Days since 1970-01-01 of a proleptic Gregorian date (int64 ops)."""
    y = y - tf.cast(m <= 2, tf.int64)
    era = tf.math.floordiv(y, 400)
    yoe = y - era * 400
    shift = tf.where(m > 2, tf.constant(-3, tf.int64), tf.constant(9, tf.int64))
    doy = (153 * (m + shift) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _time_parts(feature: DerivedFeature, values: tf.Tensor
                ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(hour, day_of_week, valid) of raw time values."""
    if feature.pattern in (None, EPOCH_MS):
        seconds = tf.cast(values, tf.int64)
        valid = tf.not_equal(seconds, -1)
        if feature.pattern == EPOCH_MS:
            seconds = tf.math.floordiv(seconds, 1000)
        days = tf.math.floordiv(seconds, 86400)
        hour = tf.math.floordiv(tf.math.floormod(seconds, 86400), 3600)
        return hour, tf.math.floormod(days + 3, 7), valid
    regex, fields, placeholder = parse_pattern(feature.pattern)
    strings = as_strings(values)
    valid = tf.strings.regex_full_match(strings, regex)
    safe = tf.where(valid, strings, placeholder)

    def field(token: str, default: int) -> tf.Tensor:
        if token not in fields:
            return tf.fill(tf.shape(safe), tf.constant(default, tf.int64))
        start, width = fields[token]
        return tf.strings.to_number(tf.strings.substr(safe, start, width),
                                    out_type=tf.int64)

    year = (field("YYYY", 2000) if "YYYY" in fields
            else 2000 + field("YY", 0))
    days = _days_from_civil(year, field("MM", 1), field("DD", 1))
    return field("HH", 0), tf.math.floormod(days + 3, 7), valid


def derive(feature: DerivedFeature, inputs: Sequence[tf.Tensor]) -> tf.Tensor:
    """The derived string values ``[batch]`` of raw ``inputs`` (one tensor
    per source, in the serving form: NaN / -1 / "" for missing)."""
    if feature.kind in TIME_KINDS:
        hour, weekday, valid = _time_parts(feature, inputs[0])
        value = hour if feature.kind == "hour_of_day" else weekday
        return tf.where(valid, tf.strings.as_string(value), MISSING_TOKEN)
    if feature.kind == "bucketize":
        x = tf.cast(inputs[0], tf.float32)
        index = tf.raw_ops.Bucketize(
            input=x, boundaries=[float(b) for b in feature.boundaries])
        return tf.where(tf.math.is_nan(x), MISSING_TOKEN,
                        tf.strings.as_string(index))
    return tf.strings.join([as_strings(v) for v in inputs],
                           separator=CROSS_SEPARATOR)


def derive_all(derived: Sequence[DerivedFeature],
               raw: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Every derived column, in spec order (a source may be an earlier
    derived column), from ``raw`` input tensors."""
    values: dict[str, tf.Tensor] = {}
    for feature in derived:
        inputs = [values[s] if s in values else raw[s]
                  for s in feature.sources]
        values[feature.name] = derive(feature, inputs)
    return values
