"""The catalogue on the cluster and the sampled-softmax retrieval loss.

:class:`CandidateTables` holds what training and evaluation read from the
catalogue (``data.convert.catalogue``), as variables created under the strategy
scope, so under ``ParameterServerStrategy`` they live on the PS tasks and
closures read only the rows they need:

* ``log_q`` ``[candidate table rows, 1]``: the log of each candidate-id
  row's share of the train rows (sharded like a table: looked up per
  batch, never read whole);
* ``features``: each candidate feature's encoded rows for every catalogue
  entry (uniform negatives and evaluation gather from them);
* ``embeddings``: the catalogue's candidate embeddings in chunks of at most
  ``chunk_rows`` rows (one variable each, spread over the PS tasks),
  refreshed before each evaluation by assigning into these preallocated
  variables -- never by creating new ones (the TFRS ``BruteForce.index()``
  trap).

The loss is TFRS' ``tasks.Retrieval`` softmax over in-batch negatives,
written out so that it runs inside a psrec step on every strategy.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from psrec.data.convert.catalogue import Catalogue
from psrec.features.spec.spec import FeatureSpec
from psrec.models.embedding.sparse_arch import table_creation_scope
from psrec.models.retrieval.config import RetrievalConfig
from psrec.models.retrieval.model import RetrievalModel

CHUNK_ROWS = 65_536
#: The logit of a removed negative (an accidental hit): exp() is 0.
_REMOVED = -1e9


class CandidateTables(tf.Module):
    """The catalogue as variables (create under the strategy scope); ``spec``
    has ``towers``, ``dim`` is the candidate embedding width."""

    def __init__(self, catalogue: Catalogue, spec: FeatureSpec, dim: int,
                 chunk_rows: int = CHUNK_ROWS) -> None:
        super().__init__(name="candidate_tables")
        candidate_id = spec.towers.candidate_id
        feature = next(f for f in spec.categorical
                       if f.name == candidate_id)
        counts = np.zeros(spec.table(feature.table).rows, np.float64)
        np.add.at(counts, catalogue.features[candidate_id],
                  catalogue.train_counts)
        total = max(1.0, counts.sum())
        # A row never trained on counts as half a row: finite, and rarer
        # than any row seen.
        log_q = np.log(np.maximum(counts, 0.5) / total).astype(np.float32)
        with table_creation_scope():
            self.log_q = tf.Variable(log_q[:, None], trainable=False,
                                     name="log_q")
        self.size = catalogue.size
        self.features = {
            name: tf.Variable(values, trainable=False, name=f"rows_{name}")
            for name, values in catalogue.features.items()}
        self.bounds = [(start, min(self.size, start + chunk_rows))
                       for start in range(0, self.size, chunk_rows)]
        self.embeddings = [
            tf.Variable(tf.zeros([end - start, dim]), trainable=False,
                        name=f"embeddings_{i}")
            for i, (start, end) in enumerate(self.bounds)]

    def rows(self, index: tf.Tensor) -> dict[str, tf.Tensor]:
        """The candidate features of catalogue entries ``index`` [n]."""
        return {name: tf.gather(variable, index)
                for name, variable in self.features.items()}

    def log_q_of(self, ids: tf.Tensor) -> tf.Tensor:
        """``[n]`` log sampling probabilities of candidate-id rows."""
        return tf.reshape(tf.nn.embedding_lookup(self.log_q, ids), [-1])


def refresh_embeddings(model: RetrievalModel, tables: CandidateTables
                       ) -> tf.Tensor:
    """Assigns the current candidate embedding of every catalogue entry
    into the chunk variables (inside a ``tf.function``; idempotent, so a
    retried closure is harmless). Returns the rows refreshed."""
    for (start, end), variable in zip(tables.bounds, tables.embeddings):
        index = tf.range(start, end, dtype=tf.int64)
        variable.assign(model.candidate_embedding(tables.rows(index)))
    return tf.constant(tables.size, tf.int64)


class RetrievalLoss:
    """Per-example sampled-softmax losses of a batch (``TrainStep``'s
    ``example_losses``).

    Row ``i``'s positive is its own candidate; the negatives are the other
    rows' candidates (and ``uniform_negatives`` catalogue entries). Logits
    are ``q . c / temperature`` minus, with ``logq``, the log of each
    negative's expected count in the sample (``log(B * p)`` in the batch,
    ``log(n / N)`` for uniform ones); negatives with the positive's id are
    removed with ``remove_accidental_hits``. Rows with label 0 are not
    trained on as queries (their candidates still serve as negatives).
    """

    def __init__(self, model: RetrievalModel, tables: CandidateTables,
                 config: RetrievalConfig, spec: FeatureSpec) -> None:
        self.model = model
        self.tables = tables
        self.config = config
        self.label = spec.label.name
        self.candidate_id = spec.towers.candidate_id

    def __call__(self, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        config = self.config
        query = self.model.query_embedding(batch, training=True)
        candidates = self.model.candidate_embedding(batch, training=True)
        ids = tf.reshape(batch[self.candidate_id], [-1])
        rows = tf.shape(ids)[0]
        logits = tf.matmul(query, candidates, transpose_b=True)
        logits /= config.temperature
        if config.logq:
            expected = self.tables.log_q_of(ids) + tf.math.log(
                tf.cast(rows, tf.float32))
            logits -= expected[None, :]
        if config.remove_accidental_hits:
            same = tf.logical_and(tf.equal(ids[:, None], ids[None, :]),
                                  tf.logical_not(tf.eye(rows, dtype=tf.bool)))
            logits = tf.where(same, _REMOVED, logits)
        if config.uniform_negatives:
            logits = tf.concat([logits, self._uniform(query, ids)], axis=1)
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.range(rows), logits=logits)
        return losses * tf.cast(tf.reshape(batch[self.label], [-1]) > 0,
                                tf.float32)

    def _uniform(self, query: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
        """Logits of ``uniform_negatives`` catalogue entries drawn
        uniformly (with replacement) for the whole batch."""
        count = self.config.uniform_negatives
        index = tf.random.uniform([count], 0, self.tables.size,
                                  dtype=tf.int64)
        rows = self.tables.rows(index)
        negatives = self.model.candidate_embedding(rows, training=True)
        logits = tf.matmul(query, negatives, transpose_b=True)
        logits /= self.config.temperature
        if self.config.logq:
            logits -= math.log(count / self.tables.size)
        if self.config.remove_accidental_hits:
            logits = tf.where(
                tf.equal(ids[:, None], rows[self.candidate_id][None, :]),
                _REMOVED, logits)
        return logits
