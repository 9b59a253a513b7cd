"""Serving exports of a two-tower model, loadable with plain
``tf.saved_model.load`` (no cluster, no psrec):

* the top-K SavedModel: ``serving_default`` takes the raw query features
  (as ``models.serving.export`` describes raw inputs, the query tower's only) and
  returns ``candidate_ids`` ``[batch, K]`` (the raw candidate ids, string
  or int64 as in the data) and ``scores`` ``[batch, K]``, best first: an
  exact streaming top-k (``models.retrieval.topk``) over the catalogue embeddings it
  holds as variables;
* the query tower SavedModel: ``serving_default`` -> ``embedding``
  ``[batch, embedding_dim]``, for an external index (ScaNN, a vector
  store);
* the candidate embeddings with their raw ids (``candidates.parquet``:
  ``raw_id``, ``embedding``), the other half of such an index.

With ``candidate_bias`` the last column is 1 in the query embeddings and
the candidate's bias in the candidate embeddings: the dot product is the
model's score, for the top-k here and for an external index alike.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tensorflow as tf

from psrec.data.convert.catalogue import Catalogue
from psrec.features.spec.spec import FeatureSpec
from psrec.models.retrieval.loss import CHUNK_ROWS
from psrec.models.retrieval.model import RetrievalModel
from psrec.models.retrieval.topk import streaming_top_k
from psrec.models.serving.export import ServingModule

QUERY_TOWER_DIR = "query_tower"
EMBEDDINGS_NAME = "candidates.parquet"


def query_spec(spec: FeatureSpec) -> FeatureSpec:
    """The spec of the query tower's inputs alone (same row offsets and
    tables, so raw values encode as in training)."""
    query = set(spec.towers.query)
    categorical = tuple(f for f in spec.categorical if f.name in query)
    tables = {f.table for f in categorical}
    return dataclasses.replace(
        spec, categorical=categorical, towers=None,
        tables=tuple(t for t in spec.tables if t.name in tables),
        derived=tuple(d for d in spec.derived if d.name in query))


class QueryServing(ServingModule):
    """Raw query features -> query embeddings."""

    def __init__(self, model: RetrievalModel, spec: FeatureSpec) -> None:
        super().__init__(model, query_spec(spec))

    def query_embedding(self, raw: dict[str, tf.Tensor]) -> tf.Tensor:
        return self.model.query_embedding(self.model_batch(raw))

    def _serve(self, raw: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return {"embedding": self.query_embedding(raw)}


class TopKServing(QueryServing):
    """Raw query features -> the ``k`` best catalogue entries (``k`` capped
    at N) of the ``[N, d]`` catalogue ``embeddings`` with their ``[N]``
    ``raw_ids``; ``model`` has plain variables."""

    def __init__(self, model: RetrievalModel, spec: FeatureSpec,
                 embeddings: np.ndarray, raw_ids: np.ndarray, k: int,
                 chunk_rows: int = CHUNK_ROWS) -> None:
        super().__init__(model, spec)
        self.k = min(int(k), len(raw_ids))
        self.chunks = [
            tf.Variable(embeddings[start:start + chunk_rows],
                        trainable=False, name=f"embeddings_{i}")
            for i, start in enumerate(range(0, len(raw_ids), chunk_rows))]
        self.candidate_ids = tf.Variable(raw_ids, trainable=False,
                                         name="candidate_ids")

    def _serve(self, raw: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        scores, index = streaming_top_k(self.query_embedding(raw),
                                        self.chunks, self.k)
        return {"candidate_ids": tf.gather(self.candidate_ids, index),
                "scores": scores}


def candidate_embeddings(model: RetrievalModel, catalogue: Catalogue,
                         batch: int = CHUNK_ROWS) -> np.ndarray:
    """``[N, d]`` embeddings of every catalogue entry."""
    parts = []
    for start in range(0, catalogue.size, batch):
        rows = {name: tf.constant(values[start:start + batch])
                for name, values in catalogue.features.items()}
        parts.append(model.candidate_embedding(rows).numpy())
    return np.concatenate(parts, axis=0)


def _raw_ids(catalogue: Catalogue) -> np.ndarray:
    ids = catalogue.raw_ids
    return (ids.astype(object).astype(str) if ids.dtype.kind in "OUS"
            else ids.astype(np.int64))


def export_retrieval(model: RetrievalModel, spec: FeatureSpec,
                     catalogue: Catalogue, folder: str | Path,
                     k: int = 100) -> dict[str, object]:
    """Writes the top-K SavedModel into ``folder``, the query tower into
    ``folder/query_tower`` and the embeddings into
    ``folder/candidates.parquet``; returns what was written."""
    folder = str(folder)
    embeddings = candidate_embeddings(model, catalogue)
    raw_ids = _raw_ids(catalogue)
    top = TopKServing(model, spec, embeddings, raw_ids, k)
    tf.saved_model.save(top, folder, signatures={"serving_default":
                                                  top.serve})
    query = QueryServing(model, spec)
    query_dir = tf.io.gfile.join(folder, QUERY_TOWER_DIR)
    tf.saved_model.save(query, query_dir,
                        signatures={"serving_default": query.serve})
    table = pa.table({
        "raw_id": pa.array(raw_ids.tolist()),
        "embedding": pa.array(embeddings.tolist(),
                              pa.list_(pa.float32()))})
    buffer = pa.BufferOutputStream()  # any URI: written by tf.io.gfile
    pq.write_table(table, buffer)
    with tf.io.gfile.GFile(tf.io.gfile.join(folder, EMBEDDINGS_NAME),
                           "wb") as file:
        file.write(buffer.getvalue().to_pybytes())
    return {"task": "retrieval", "k": top.k, "catalogue": catalogue.size,
            "query_tower": QUERY_TOWER_DIR, "embeddings": EMBEDDINGS_NAME,
            "query_inputs": sorted(query_spec(spec).raw_inputs)}
