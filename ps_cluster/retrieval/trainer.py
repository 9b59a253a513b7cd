"""The retrieval task on the one trainer: same strategies, optimizers,
checkpoints, executors and loop as ranking; only the loss (a sampled
softmax, :class:`~psrec.models.retrieval.loss.RetrievalLoss`) and the
evaluation (exact recall@k/MRR against the whole catalogue,
:mod:`psrec.ps_cluster.retrieval.eval`) differ.

The catalogue's variables (:class:`CandidateTables`) are created under the
strategy scope after the model, outside the checkpoint: they are derived
from the data (``candidates.parquet``) and the model, so a resumed run
rebuilds them.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from psrec.data.convert.catalogue import Catalogue
from psrec.data.format.manifest import Manifest
from psrec.models.retrieval.config import RetrievalConfig
from psrec.models.retrieval.loss import CandidateTables
from psrec.models.retrieval.loss import RetrievalLoss
from psrec.models.retrieval.loss import refresh_embeddings
from psrec.ps_cluster.retrieval.eval import make_retrieval_eval_function
from psrec.ps_cluster.retrieval.metrics import RetrievalEvalResult
from psrec.ps_cluster.retrieval.metrics import merge_retrieval
from psrec.ps_cluster.training.loop import evaluate_files
from psrec.ps_cluster.training.step import ids_per_example
from psrec.ps_cluster.training.step import pad_slices
from psrec.ps_cluster.training.trainer import Trainer


def trainer_class(retrieval: RetrievalConfig | None, spec,
                  manifest: Manifest):
    """``Trainer`` for ranking; for retrieval, ``RetrievalTrainer`` with
    the catalogue of ``manifest`` bound."""
    if retrieval is None:
        return Trainer
    return functools.partial(RetrievalTrainer, catalogue=Catalogue.load(
        manifest.root, spec))


class RetrievalTrainer(Trainer):
    """Trains a two-tower model (see :class:`Trainer` for the arguments;
    ``model_config`` is a :class:`RetrievalConfig`).

    Args:
      catalogue: the candidates of the data (``Catalogue.load``).
    """

    def __init__(self, strategy: tf.distribute.Strategy, spec,
                 model_config: RetrievalConfig, *args, catalogue: Catalogue,
                 **kwargs) -> None:
        kwargs.pop("positive_rate", None)  # no output bias to set
        kwargs.pop("neg_sample_rate", None)  # logits are not probabilities
        super().__init__(strategy, spec, model_config, *args, **kwargs)
        with strategy.scope():
            self.tables = CandidateTables(catalogue, spec,
                                          model_config.output_dim)
        self.step.example_losses = RetrievalLoss(self.model, self.tables,
                                                 model_config, spec)
        self._refresh = tf.function(
            lambda: refresh_embeddings(self.model, self.tables))

    def _padding(self):
        """As for ranking, plus the rows of the uniform negatives' lookups
        (replicated strategies pad table gradients to a static bound)."""
        if self.is_ps or self.replicas == 1:
            return None
        per_replica = self.input_config.batch_size // self.replicas
        extra = self.model.config.uniform_negatives
        candidate = self.spec.towers.candidate
        rows = [self.micro_batches * (
            per_replica * ids_per_example(self.spec, name)
            + extra * sum(f.max_length for f in self.spec.categorical
                          if f.table == name and f.name in candidate))
            for name in self.model.sparse_arch.tables]
        return lambda grads: [pad_slices(g, r) for g, r in zip(grads, rows)]

    def best_tracker(self, loop):
        """None: the ranking metrics of ``--keep-best`` do not apply (the
        export is the latest checkpoint)."""
        return None

    def refresh_catalogue(self) -> int:
        """Recomputes every catalogue embedding (one closure under PS);
        returns the entries refreshed."""
        if self.coordinator is None:
            return int(self._refresh())
        value = self.coordinator.schedule(self._refresh)
        self.coordinator.join()
        return int(value.fetch())

    def evaluate(self, manifest: Manifest, batch_size: int | None = None,
                 split: str = "eval") -> RetrievalEvalResult:
        """Exact recall@k and MRR of every pair of ``split`` against the
        whole catalogue (one call or closure per shard, after a refresh of
        the catalogue embeddings)."""
        self.refresh_catalogue()
        function = make_retrieval_eval_function(
            self.model, self.tables, self.spec,
            batch_size or self.input_config.batch_size, manifest.block_rows)
        return evaluate_files(function, manifest.files(split),
                              self.coordinator,
                              combine=merge_retrieval(self.tables.size),
                              on_part=self.eval_beat)
