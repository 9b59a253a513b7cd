"""Smaller tables for serving: float16 and per-row int8 storage of an
embedding table, dequantized on lookup.

* ``float16``: the table cast to float16; a lookup gathers float16 rows and
  casts them to float32.
* ``int8``: per-row affine quantization. Each row ``x`` keeps its minimum
  ``m`` and maximum ``M``; ``scale = (M - m) / 255`` and the codes
  ``q = round((x - m) / scale) - 128`` (int8, 256 levels: 255 steps) with
  ``bias = m + 128 * scale``, so that ``q * scale + bias`` is ``x`` rounded
  to the nearest level: the error of each value is at most ``scale / 2``
  (plus float32 rounding). A constant row has scale 0, codes -128 and bias
  ``m``: exact, nothing divides by zero. A lookup gathers the codes, scale
  and bias of each distinct id and returns ``codes * scale + bias``.

A row narrower than :data:`INT8_MIN_DIM` values (the ``[rows, 1]`` wide
tables) costs more as int8 codes plus 8 bytes of scale and bias than as
float32, so under ``int8`` such a table is stored as float16
(:func:`storage_dtype`).

The tables are quantized from the model's own (plain, unsharded) variables
in blocks of rows: nothing but the quantized copy and one block exists
beside the float32 table. ``ShardedTablesModel.tables_stored_as``
(``models.embedding.sparse_arch``) has the model read the quantized tables
for the time of an export (the float32 variables are then no longer part of
the model, so a SavedModel written then holds only the quantized ones).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

#: Table storage formats and the bytes of one value (int8: per-row scale
#: and bias besides).
STORAGE_DTYPES = {"float32": 4, "float16": 2, "int8": 1}
#: The narrowest row stored as int8 codes (narrower: float16, smaller).
INT8_MIN_DIM = 3
#: Rows quantized at a time.
BLOCK_ROWS = 65_536
_LEVELS = 255


def storage_dtype(table_dtype: str, dim: int) -> str:
    """How a table of row width ``dim`` is stored under ``table_dtype``:
    ``int8`` falls back to ``float16`` for rows narrower than
    :data:`INT8_MIN_DIM` (where int8 plus scale and bias outweigh float32)."""
    if table_dtype not in STORAGE_DTYPES:
        raise ValueError(f"table dtype {table_dtype!r}: one of "
                         f"{', '.join(STORAGE_DTYPES)}")
    if table_dtype == "int8" and dim < INT8_MIN_DIM:
        return "float16"
    return table_dtype


def quantize_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                             np.ndarray]:
    """``(codes int8 [n, d], scale float32 [n, 1], bias float32 [n, 1])`` of
    float ``rows`` ``[n, d]``: the per-row affine int8 code of the module
    docstring (a constant row: scale 0, exact)."""
    rows = np.asarray(rows, np.float32)
    low = rows.min(axis=1, keepdims=True)
    high = rows.max(axis=1, keepdims=True)
    scale = (high - low) / np.float32(_LEVELS)
    safe = np.where(scale > 0, scale, np.float32(1.0))
    levels = np.where(scale > 0, np.rint((rows - low) / safe), 0.0)
    codes = (np.clip(levels, 0, _LEVELS) - 128).astype(np.int8)
    bias = (low + np.float32(128.0) * scale).astype(np.float32)
    return codes, scale.astype(np.float32), bias


def dequantize_rows(codes, scale, bias) -> tf.Tensor:
    """float32 rows of int8 ``codes`` with their per-row ``scale`` and
    ``bias`` (tensors or arrays)."""
    return tf.cast(codes, tf.float32) * scale + bias


class QuantizedTable(tf.Module):
    """A table stored as ``float16`` or per-row ``int8`` (module docstring);
    :meth:`gather` returns float32 rows.

    Attributes:
      dtype: ``float16`` or ``int8``.
      rows, dim: the table's shape.
    """

    def __init__(self, table, dtype: str, name: str) -> None:
        super().__init__(name=name)
        if dtype not in ("float16", "int8"):
            raise ValueError(f"QuantizedTable dtype {dtype!r}: float16 or "
                             "int8")
        self.dtype = dtype
        self.rows, self.dim = (int(n) for n in table.shape)
        blocks = (table[start:start + BLOCK_ROWS].numpy()
                  for start in range(0, self.rows, BLOCK_ROWS))
        if dtype == "float16":
            self.values = tf.Variable(
                np.concatenate([b.astype(np.float16) for b in blocks]),
                trainable=False, name="values")
            return
        parts = [quantize_rows(block) for block in blocks]  # one at a time
        self.codes, self.scale, self.bias = (
            tf.Variable(np.concatenate([p[i] for p in parts]),
                        trainable=False, name=field)
            for i, field in enumerate(("codes", "scale", "bias")))

    def gather(self, ids: tf.Tensor) -> tf.Tensor:
        """float32 rows ``ids.shape + [dim]`` of int ``ids``."""
        if self.dtype == "float16":
            return tf.cast(tf.gather(self.values, ids), tf.float32)
        return dequantize_rows(tf.gather(self.codes, ids),
                               tf.gather(self.scale, ids),
                               tf.gather(self.bias, ids))

    def stored_bytes(self) -> int:
        """Bytes of the stored values (codes, scale and bias)."""
        if self.dtype == "float16":
            return self.rows * self.dim * 2
        return self.rows * (self.dim + 8)


def quantize_tables(arch, table_dtype: str
                    ) -> dict[str, object]:
    """Every table of ``arch`` (a ``SparseArch`` of plain variables) stored as
    :func:`storage_dtype` says: ``name -> QuantizedTable`` (or the variable
    itself for ``float32``)."""
    storage = table_storage(arch, table_dtype)
    return {name: (table if table_dtype == "float32"
                   else QuantizedTable(table, storage[name], name=name))
            for name, table in arch.tables.items()}


def table_storage(arch, table_dtype: str) -> dict[str, str]:
    """``table name -> storage dtype`` of ``arch``'s tables under
    ``table_dtype`` (what an export records): ``float32`` keeps each table
    as it trained (a 16-bit table stays 16-bit)."""
    return {name: (tf.as_dtype(table.dtype).name if table_dtype == "float32"
                   else storage_dtype(table_dtype, int(table.shape[1])))
            for name, table in arch.tables.items()}
