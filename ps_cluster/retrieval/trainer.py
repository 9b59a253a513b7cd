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

import dataclasses

import tensorflow as tf

from psrec.data.convert.catalogue import Catalogue
from psrec.models.embedding.sparse_arch import WIDE_SUFFIX
from psrec.models.retrieval.config import RetrievalConfig
from psrec.models.retrieval.loss import CandidateTables
from psrec.models.retrieval.loss import RetrievalLoss
from psrec.models.retrieval.loss import refresh_embeddings
from psrec.ps_cluster.retrieval.eval import SeenTables
from psrec.ps_cluster.retrieval.eval import make_retrieval_eval_function
from psrec.ps_cluster.retrieval.metrics import RetrievalEvalResult
from psrec.ps_cluster.retrieval.metrics import merge_retrieval
from psrec.ps_cluster.retrieval.metrics import popularity_baseline
from psrec.ps_cluster.training.trainer import Trainer


class RetrievalTrainer(Trainer):
    """Trains a two-tower model (see :class:`Trainer` for the arguments;
    ``model_config`` is a :class:`RetrievalConfig`; ``positive_rate`` and
    ``neg_sample_rate`` do not apply: there is no calibrated output bias (the
    candidate bias is learned), and the logits are scores, not
    probabilities).

    Args:
      catalogue: the candidates of the data (``Catalogue.load``); with its
        ``seen`` lists and ``model_config.exclude_seen``, the eval split's
        pairs are ranked without their users' train candidates (the
        model's and the popularity baseline's ranks).
    """

    def __init__(self, strategy: tf.distribute.Strategy, spec,
                 model_config: RetrievalConfig, *args, catalogue: Catalogue,
                 **options) -> None:
        given = sorted({"positive_rate", "neg_sample_rate"} & set(options))
        if given:
            raise TypeError(f"RetrievalTrainer takes no {', '.join(given)} "
                            "(a ranking model's calibration)")
        super().__init__(strategy, spec, model_config, *args, **options)
        self.catalogue = catalogue
        self._baselines: dict = {}  # split -> popularity_baseline
        with strategy.scope():
            self.tables = CandidateTables(catalogue, spec,
                                          model_config.embedding_dim)
            self.seen = SeenTables(catalogue.seen, catalogue.train_counts) if (
                model_config.exclude_seen and catalogue.seen is not None
                and catalogue.seen.pairs) else None
        self.step.example_losses = RetrievalLoss(self.model, self.tables,
                                                 model_config, spec)
        self._refresh = tf.function(
            lambda: refresh_embeddings(self.model, self.tables))

    def _extra_lookups(self, table: str) -> int:
        """The uniform negatives' lookups of the candidate features of
        ``table`` (or of its wide twin: the candidate bias)."""
        candidate = self.spec.towers.candidate
        base = table.removesuffix(WIDE_SUFFIX)
        return self.model.config.uniform_negatives * sum(
            f.max_length for f in self.spec.categorical
            if f.table == base and f.name in candidate)

    def refresh_catalogue(self) -> int:
        """Recomputes every catalogue embedding (one closure under PS);
        returns the entries refreshed."""
        if self.coordinator is None:
            return int(self._refresh())
        value = self.coordinator.schedule(self._refresh)
        self.coordinator.join()
        return int(value.fetch())

    def evaluate(self, manifest, batch_size: int | None = None,
                 split: str = "eval") -> RetrievalEvalResult:
        """Exact recall@k and MRR of ``split``, with the popularity
        baseline of the same pairs beside them (when the catalogue counts
        the split's pairs and its count is the evaluation's); the eval
        split's pairs without their users' train candidates when the
        trainer has the seen lists."""
        result = super().evaluate(manifest, batch_size, split)
        if result.seen_excluded:
            return result  # the baseline was ranked in the same closures
        if split not in self._baselines:
            pairs = self.catalogue.positives(split)
            self._baselines[split] = None if pairs is None else (
                popularity_baseline(self.catalogue.train_counts, pairs),
                int(pairs.sum()))
        baseline = self._baselines[split]
        if baseline is None or baseline[1] != result.count:
            return result  # other pairs than the catalogue counted
        return dataclasses.replace(result, popularity=baseline[0])

    def _eval_function(self, batch_size: int, block_rows: int,
                       splits: tuple[str, ...] = ("eval",)):
        """Exact recall@k and MRR of each pair against the catalogue (less
        its user's train candidates, for the eval split with seen lists),
        after a refresh of the catalogue embeddings."""
        self.refresh_catalogue()
        seen = self.seen if splits == ("eval",) else None
        return (make_retrieval_eval_function(
            self.model, self.tables, self.spec, batch_size, block_rows,
            seen), merge_retrieval(self.tables.size, seen is not None))
