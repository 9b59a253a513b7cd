"""RetrievalModel: a two-tower model built from a spec with ``towers``.

Both towers read one :class:`~psrec.models.embedding.sparse_arch.SparseArch` (tables
sharded on the PS tasks, looked up per table as for ranking); each
concatenates the embeddings of its features (the query tower also the
transformed dense features) and maps them through its MLP to an
``output_dim`` embedding, L2-normalised when ``normalize`` is set. The
score of a (query, candidate) pair is the dot product of the two.
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
        self.sparse_arch = SparseArch(spec, name="sparse_arch")
        self.query_tower = MLP(config.tower_mlp,
                               output_units=config.output_dim,
                               name="query_tower")
        self.candidate_tower = MLP(config.tower_mlp,
                                   output_units=config.output_dim,
                                   name="candidate_tower")

    def get_config(self) -> dict:
        return {"spec": self.spec.to_dict(),
                "config": dataclasses.asdict(self.config)}

    def _embed(self, tower, parts: list[tf.Tensor], training: bool
               ) -> tf.Tensor:
        vector = tf.cast(tower(tf.concat(parts, axis=1), training=training),
                         tf.float32)
        return (tf.math.l2_normalize(vector, axis=1) if self.config.normalize
                else vector)

    def query_embedding(self, batch: dict[str, tf.Tensor],
                        training: bool = False) -> tf.Tensor:
        """``[B, output_dim]`` embeddings of the query features."""
        parts = self.sparse_arch.lookup(batch, self.query_features,
                                        training=training)
        if self.spec.dense:  # every dense feature is a query feature
            parts.append(transform_dense(batch[DENSE_COLUMN], self.spec))
        return self._embed(self.query_tower, parts, training)

    def candidate_embedding(self, features: dict[str, tf.Tensor],
                            training: bool = False) -> tf.Tensor:
        """``[N, output_dim]`` embeddings of candidates given by their
        encoded candidate features (a batch, or catalogue rows)."""
        parts = self.sparse_arch.lookup(features, self.candidate_features,
                                        training=training)
        return self._embed(self.candidate_tower, parts, training)

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
