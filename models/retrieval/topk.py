"""Streaming exact top-k over a catalogue held in chunks.

``matmul`` + ``top_k`` per chunk, merged into a running top-k: memory is
one chunk's scores, never the whole ``[queries, catalogue]`` matrix. The
same function runs inside a ``ParameterServerStrategy`` closure against
chunk variables on the PS tasks and in the exported top-K SavedModel
against its own variables. (TFRS' ``FactorizedTopK`` fed a candidates
*dataset* fails under ``ParameterServerStrategy``: the dataset lives on
the coordinator; ``BruteForce.index()`` creates new variables per call.)
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf


def streaming_top_k(query: tf.Tensor, chunks: Sequence, k: int
                    ) -> tuple[tf.Tensor, tf.Tensor]:
    """The ``k`` best dot-product scores of each query row over the
    concatenated ``chunks`` (``[n_i, d]`` tensors or variables, static row
    counts), best first, with their int64 row indices in the
    concatenation. ``k`` is capped at the total row count."""
    values = indices = None
    offset = 0
    for chunk in chunks:
        size = int(chunk.shape[0])
        scores = tf.matmul(query, chunk, transpose_b=True)
        top, index = tf.math.top_k(scores, k=min(k, size))
        index = tf.cast(index, tf.int64) + offset
        if values is None:
            values, indices = top, index
        else:
            merged = tf.concat([values, top], axis=1)
            width = min(k, int(merged.shape[1]))
            values, where = tf.math.top_k(merged, k=width)
            indices = tf.gather(tf.concat([indices, index], axis=1), where,
                                batch_dims=1)
        offset += size
    return values, indices
