"""Feature transforms as TensorFlow ops, shared by conversion, training and
serving so that the three can never disagree.

* :class:`CategoricalEncoder` turns raw categorical values (strings or ints)
  into embedding-table row ids: a stable FarmHash fingerprint of the value's
  string form (``tf.strings.to_hash_bucket_fast``), or a vocabulary lookup,
  plus the feature's row offset.
* :func:`transform_dense` applies the spec's dense transforms to a
  ``[batch, num_dense]`` matrix of raw values (NaN = missing).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from psrec.features.columns import CategoricalFeature
from psrec.features.spec import FeatureSpec

MISSING_TOKEN = ""  # how a missing categorical value is hashed


def as_strings(values: tf.Tensor) -> tf.Tensor:
    """The string form that hashing and vocabularies see (ints in decimal)."""
    values = tf.convert_to_tensor(values)
    if values.dtype == tf.string:
        return values
    return tf.strings.as_string(values)


class CategoricalEncoder(tf.Module):
    """Maps raw categorical values to table row ids, feature by feature.

    The same object is used eagerly by ``psrec convert`` and inside the
    exported serving function, so training and serving ids are identical.
    """

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

    def feature(self, name: str) -> CategoricalFeature:
        return self._features[name]

    def encode(self, name: str, values: tf.Tensor) -> tf.Tensor:
        """Returns int64 row ids of the same shape as ``values``.

        Args:
          name: the categorical feature's name.
          values: raw values, string or integer, any shape.
        """
        feature = self._features[name]
        strings = as_strings(values)
        if feature.hash_buckets is not None:
            bucket = tf.strings.to_hash_bucket_fast(
                strings, feature.hash_buckets)
        else:
            bucket = self._tables[name].lookup(strings)
        return bucket + feature.row_offset


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
    """Applies the dense transforms to ``raw`` of shape ``[batch, D]``.

    NaN marks a missing value and becomes the feature's default before the
    transform. ``log1p`` is ``log(1 + max(x, 0))``.
    """
    constants = dense_constants(spec)
    raw = tf.cast(raw, tf.float32)
    filled = tf.where(tf.math.is_nan(raw), constants["default"], raw)
    logged = tf.math.log1p(tf.maximum(filled, 0.0))
    x = tf.where(constants["log1p"], logged, filled)
    return (x - constants["mean"]) / constants["std"]
