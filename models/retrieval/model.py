"""RetrievalModel: a two-tower model built from a spec with ``towers``.

Both towers read one :class:`~psrec.models.embedding.sparse_arch.SparseArch` (tables
sharded on the PS tasks, looked up per table as for ranking); each
concatenates the embeddings of its features (the query tower also the
transformed dense features) and maps them through its MLP to an
``output_dim`` embedding, L2-normalised when ``normalize`` is set. With
``candidate_bias`` each candidate also has a learned bias, the sum of the
wide (``[rows, 1]``) weights of its feature values (the tables of the
candidate features get wide twins in the ``SparseArch``, trained, sharded
and checkpointed as tables): the candidate embedding carries it as one more
column and the query embedding a 1 there. The score of a (query,
candidate) pair is always the dot product of the two embeddings, so the
loss, the exact evaluation, the exported top-k and an external index of the
exported embeddings all rank by ``q . c + bias``.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from psrec.features.spec.spec import DENSE_COLUMN
from psrec.features.spec.spec import FeatureSpec
from psrec.features.transforms.ops import transform_dense
from psrec.models.embedding.sparse_arch import ShardedTablesModel
from psrec.models.embedding.sparse_arch import SparseArch
from psrec.models.ranking.blocks import MLP
from psrec.models.ranking.config import ModelConfigError
from psrec.models.ranking.model import example_batch
from psrec.models.retrieval.config import RetrievalConfig
from psrec.models.retrieval.config import check_no_dynamic_tables


def check_retrieval_spec(spec: FeatureSpec) -> None:
    """Refuses a spec without ``towers``, or with several labels, for the
    retrieval task."""
    if spec.towers is None:
        raise ModelConfigError(
            f"`--task retrieval` needs a spec with `towers` (query and "
            f"candidate features, candidate_id); spec {spec.name!r} has "
            "none: add them (see --spec movielens-retrieval).")
    if spec.multi_task:
        raise ModelConfigError(
            f"`--task retrieval` trains one label; spec {spec.name!r} names "
            f"several ({', '.join(spec.label_names)}): keep one `label` for "
            "retrieval, or train a ranking model.")


class RetrievalModel(ShardedTablesModel):
    """Query and candidate towers over shared, PS-sharded tables (``spec``
    has ``towers``)."""

    def __init__(self, spec: FeatureSpec, config: RetrievalConfig,
                 **kwargs: object) -> None:
        super().__init__(**kwargs)
        check_retrieval_spec(spec)
        self.spec = spec
        self.config = config
        categorical = {f.name for f in spec.categorical}
        self.query_features = tuple(n for n in spec.towers.query
                                    if n in categorical)
        self.candidate_features = tuple(spec.towers.candidate)
        self.sparse_arch = SparseArch(spec, wide=config.wide_tables(spec),
                                      name="sparse_arch")
        self.query_tower = MLP(config.tower_mlp,
                               output_units=config.output_dim,
                               name="query_tower")
        self.candidate_tower = MLP(config.tower_mlp,
                                   output_units=config.output_dim,
                                   name="candidate_tower")

    def get_config(self) -> dict:
        return {"spec": self.spec.to_dict(),
                "config": dataclasses.asdict(self.config)}

    def _embed(self, tower, parts: list[tf.Tensor], training: bool,
               last: tf.Tensor | None) -> tf.Tensor:
        """The tower's output (L2-normalised with ``normalize``), then the
        ``[B]`` column ``last`` with ``candidate_bias``."""
        vector = tf.cast(tower(tf.concat(parts, axis=1), training=training),
                         tf.float32)
        if self.config.normalize:
            vector = tf.math.l2_normalize(vector, axis=1)
        if not self.config.candidate_bias:
            return vector
        return tf.concat([vector, tf.cast(last, tf.float32)[:, None]], 1)

    def query_embedding(self, batch: dict[str, tf.Tensor],
                        training: bool = False) -> tf.Tensor:
        """``[B, embedding_dim]`` embeddings of the query features (last
        column 1 with ``candidate_bias``)."""
        parts, _ = self.sparse_arch.lookup(batch, self.query_features,
                                           training=training)
        if self.spec.dense:  # every dense feature is a query feature
            parts.append(transform_dense(batch[DENSE_COLUMN], self.spec))
        ones = tf.ones_like(parts[0][:, 0])
        return self._embed(self.query_tower, parts, training, ones)

    def candidate_embedding(self, features: dict[str, tf.Tensor],
                            training: bool = False) -> tf.Tensor:
        """``[N, embedding_dim]`` embeddings of candidates given by their
        encoded candidate features (a batch, or catalogue rows); the last
        column is the candidate bias with ``candidate_bias``."""
        parts, bias = self.sparse_arch.lookup(
            features, self.candidate_features, training=training)
        return self._embed(self.candidate_tower, parts, training, bias)

    def call(self, batch: dict[str, tf.Tensor], training: bool = False):
        return (self.query_embedding(batch, training),
                self.candidate_embedding(batch, training))


def build_retrieval_model(spec: FeatureSpec, config: RetrievalConfig
                          ) -> RetrievalModel:
    """Creates the model and all its variables (under a strategy scope, so
    that tables are sharded across the PS tasks)."""
    check_no_dynamic_tables(spec)
    model = RetrievalModel(spec, config, name="retrieval")
    model(example_batch(spec), training=False)
    return model
