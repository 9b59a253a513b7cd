"""The psrec record format: blocks of rows packed into one ``tf.train.Example``.

One protobuf per row costs ~8.6k rows/s to build in Python; packing a block
of rows per record, each column stored as one little-endian byte string,
makes conversion and parsing vectorised while staying exact (the bytes are
the float32/int64 values themselves).

A block record has these features (all ``bytes_list`` with one value, except
``__rows__``):

* ``__rows__``: int64, the number of rows ``n`` in the block;
* ``psrec__id``: n int64 example ids (unique over a conversion);
* each label column: n float32 (0/1, or the value of an ``mse`` label;
  NaN where a multi-task spec's row lacks that label: the task's mask);
* ``psrec__dense``: n x D float32 raw dense values, row-major, spec order;
* each categorical column: n int64 row ids, or n x L for a multi-hot
  feature (padded with -1).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterable
from typing import Iterator
from typing import Mapping
from typing import Sequence

import numpy as np
import tensorflow as tf

from psrec.errors import DataError
from psrec.features.spec.spec import DENSE_COLUMN
from psrec.features.spec.spec import ID_COLUMN
from psrec.features.spec.spec import FeatureSpec
from psrec.features.transforms.ops import PAD_ID as PAD_ID  # the padding id

ROWS_KEY = "__rows__"


class CorruptRecordError(DataError):
    """A TFRecord file failed its CRC check or is truncated."""

    def __init__(self, path: str, offset: int | None, detail: str) -> None:
        self.path = path
        self.offset = offset
        where = f" near byte {offset}" if offset is not None else ""
        super().__init__(
            f"corrupted TFRecord file {path}{where}: {detail}. The file "
            "fails its CRC check or is truncated; re-run `psrec convert` to "
            "rebuild the shards (nothing was skipped)."
        )


def column_dtypes(spec: FeatureSpec) -> dict[str, np.dtype]:
    """The little-endian numpy dtype of every byte-packed column."""
    dtypes = {ID_COLUMN: np.dtype("<i8"),
              **{name: np.dtype("<f4") for name in spec.label_names}}
    if spec.dense:
        dtypes[DENSE_COLUMN] = np.dtype("<f4")
    for feature in spec.categorical:
        dtypes[feature.name] = np.dtype("<i8")
    return dtypes


def encode_block(columns: Mapping[str, np.ndarray]) -> bytes:
    """Serialises one block (all columns have the same leading length)."""
    rows = {len(v) for v in columns.values()}
    if len(rows) != 1:
        raise ValueError(f"block columns have different lengths: {rows}")
    feature = {
        ROWS_KEY: tf.train.Feature(
            int64_list=tf.train.Int64List(value=[rows.pop()])),
    }
    for name, values in columns.items():
        feature[name] = tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[values.tobytes()]))
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    return example.SerializeToString()


def decode_blocks(serialized: tf.Tensor,
                  spec: FeatureSpec) -> dict[str, tf.Tensor]:
    """Parses a vector ``serialized`` of block records (a string tensor
    ``[k]``) written with ``spec`` into one batch of rows.

    Returns:
      ``{"psrec__id": [n] int64, label: [n] float32, "psrec__dense": [n, D]
      float32, categorical: [n] or [n, L] int64}`` where ``n`` is the total
      number of rows of the k blocks, in order.
    """
    dtypes = column_dtypes(spec)
    features = {ROWS_KEY: tf.io.FixedLenFeature([1], tf.int64)}
    features.update(
        {name: tf.io.FixedLenFeature([], tf.string) for name in dtypes})
    parsed = tf.io.parse_example(serialized, features)
    out = {}
    for name, dtype in dtypes.items():
        joined = tf.strings.reduce_join(parsed[name], axis=0)
        out[name] = tf.io.decode_raw(joined, tf.as_dtype(dtype.type))
    if DENSE_COLUMN in out:
        out[DENSE_COLUMN] = tf.reshape(out[DENSE_COLUMN], [-1, len(spec.dense)])
    for feature in spec.categorical:
        if feature.multi_hot:
            out[feature.name] = tf.reshape(out[feature.name],
                                           [-1, feature.max_length])
    return out


@contextlib.contextmanager
def corruption_named(paths: Sequence[str | Path]) -> Iterator[None]:
    """Turns a ``DataLossError`` raised inside into the
    :class:`CorruptRecordError` that names the corrupted file of ``paths``
    (tf.data's own message gives only a byte offset)."""
    try:
        yield
    except tf.errors.DataLossError as error:
        located = locate_corruption(paths)
        raise (located or error) from error


def locate_corruption(paths: Iterable[str | Path]) -> CorruptRecordError | None:
    """Reads each file alone and returns an error naming the first bad one
    (tf.data's ``DataLossError`` gives a byte offset but not the file), None
    when every file reads cleanly."""
    for path in paths:
        offset = 0
        try:
            for record in tf.data.TFRecordDataset(str(path)):
                offset += len(record.numpy()) + 16  # length, 2 CRCs
        except tf.errors.DataLossError as error:
            return CorruptRecordError(str(path), offset, error.message.split(
                "[Op:")[0].split("}}")[-1].strip())
    return None
