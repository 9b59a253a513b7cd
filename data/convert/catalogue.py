"""The candidate catalogue of a retrieval spec, counted at conversion.

``psrec convert`` of a spec with ``towers`` writes ``candidates.parquet``
beside the shards (before the manifest, which commits it): one row per
distinct raw value of the ``candidate_id`` column seen in any split, with

* ``raw_id``: the value as serving takes it (string or int64),
* ``train_count``: its rows in the train split (positive labels only: the
  rows a retrieval model trains on), whose shares are the sampling
  probabilities of the logQ correction and which rank the popularity
  baseline of the evaluation,
* ``eval_count``: its positive rows in the eval split (the pairs of the
  evaluation whose candidate it is; the popularity baseline's recall is
  computed from these counts),
* one column per candidate-tower feature: its encoded table rows (``[L]``
  lists for multi-hot features), from the candidate's first row.

Evaluation ranks each held-out pair against every catalogue row, and the
export serves top-K raw ids from it. Rows are ordered by raw id, so a
re-run writes the same file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from psrec.data.convert.checks import serving_values
from psrec.data.convert.checks import tower_column_dtype
from psrec.data.convert.seen import SeenItems
from psrec.data.format.files import atomic_output
from psrec.data.format.files import open_arrow_input
from psrec.data.format.files import parquet_sink
from psrec.errors import DataError
from psrec.features.spec.spec import FeatureSpec
from psrec.uri_path import as_path

CATALOGUE_NAME = "candidates.parquet"
RAW_ID = "raw_id"
TRAIN_COUNT = "train_count"
EVAL_COUNT = "eval_count"


class CatalogueCollector:
    """Collects the distinct candidates of a conversion, batch by batch
    (``spec`` has ``towers``)."""

    def __init__(self, spec: FeatureSpec) -> None:
        towers = spec.towers
        self.dtype = tower_column_dtype(
            spec, "candidate_id", "the catalogue and the exported top-K "
            "model return its raw values.")
        self.spec = spec
        self.features = [f for f in spec.categorical
                         if f.name in towers.candidate]
        self._first: dict = {}  # raw id -> {feature: encoded rows}
        self._counts: dict = {TRAIN_COUNT: {}, EVAL_COUNT: {}}

    def add(self, batch: pa.RecordBatch, columns: dict[str, np.ndarray],
            to_train: np.ndarray, to_eval: np.ndarray | None = None) -> None:
        """One converted batch: ``columns`` its encoded features,
        ``to_train`` and ``to_eval`` its rows written to each split."""
        ids = serving_values(batch.column(self.spec.towers.candidate_id),
                             self.dtype, self.spec.towers.candidate_id)
        label = columns[self.spec.label.name] > 0
        for name, rows in ((TRAIN_COUNT, to_train), (EVAL_COUNT, to_eval)):
            if rows is None:
                continue
            counts = self._counts[name]
            for value, count in zip(*np.unique(ids[rows & label],
                                               return_counts=True)):
                key = value.item()
                counts[key] = counts.get(key, 0) + int(count)
        unique, first = np.unique(ids, return_index=True)
        for value, row in zip(unique, first):
            key = value.item()
            if key not in self._first:
                self._first[key] = {f.name: columns[f.name][row]
                                    for f in self.features}

    def keys(self) -> list:
        """The raw ids in catalogue row order."""
        return sorted(self._first)

    def write(self, out_dir: str | Path) -> str:
        """Writes ``candidates.parquet`` (atomically); returns its name."""
        keys = self.keys()
        data = {RAW_ID: pa.array(keys, pa.string() if self.dtype == "string"
                                 else pa.int64()),
                **{name: pa.array([counts.get(k, 0) for k in keys],
                                  pa.int64())
                   for name, counts in self._counts.items()}}
        for feature in self.features:
            rows = [self._first[k][feature.name] for k in keys]
            data[feature.name] = (
                pa.array([r.tolist() for r in rows], pa.list_(pa.int64()))
                if feature.multi_hot else pa.array(
                    np.asarray(rows, np.int64)))
        with atomic_output(as_path(out_dir) / CATALOGUE_NAME) as tmp, \
                parquet_sink(tmp) as sink:
            pq.write_table(pa.table(data), sink)
        return CATALOGUE_NAME


@dataclasses.dataclass(frozen=True)
class Catalogue:
    """A loaded catalogue: ``raw_ids`` [N], ``train_counts`` [N],
    ``features`` (candidate feature -> int64 rows, ``[N]`` or ``[N, L]``),
    ``eval_counts`` [N] (None in a catalogue written before psrec
    counted them) and ``seen``, each eval pair's user's train candidates
    (``seen.parquet``; None without ``towers.query_id``)."""

    raw_ids: np.ndarray
    train_counts: np.ndarray
    features: dict[str, np.ndarray]
    eval_counts: np.ndarray | None = None
    seen: SeenItems | None = None

    @property
    def size(self) -> int:
        return len(self.raw_ids)

    def positives(self, split: str) -> np.ndarray | None:
        """[N]: each candidate's positive rows in ``split`` (``train`` or
        ``eval``); None when the catalogue does not count them."""
        if split == "train":
            return self.train_counts
        return self.eval_counts if split == "eval" else None

    @classmethod
    def load(cls, root: str | Path, spec: FeatureSpec) -> Catalogue:
        """Reads ``root/candidates.parquet`` for ``spec``."""
        path = as_path(root) / CATALOGUE_NAME
        if not path.is_file():
            raise DataError(
                f"{path} does not exist: retrieval needs the candidate "
                "catalogue that `psrec convert` writes for a spec with "
                "`towers`; convert the data again with such a spec (e.g. "
                "--spec movielens-retrieval).")
        with open_arrow_input(path) as source:
            table = pq.read_table(source)
        if table.num_rows == 0:
            raise DataError(f"{path} holds no candidate; convert data with "
                            "rows.")
        features = {}
        for feature in spec.categorical:
            if feature.name not in spec.towers.candidate:
                continue
            column = table.column(feature.name)
            if feature.multi_hot:
                values = pc.list_flatten(column).to_numpy()
                features[feature.name] = np.asarray(values, np.int64).reshape(
                    table.num_rows, feature.max_length)
            else:
                features[feature.name] = np.asarray(column.to_numpy(),
                                                    np.int64)
        return cls(raw_ids=table.column(RAW_ID).to_numpy(zero_copy_only=False),
                   train_counts=np.asarray(
                       table.column(TRAIN_COUNT).to_numpy(), np.int64),
                   features=features,
                   eval_counts=np.asarray(
                       table.column(EVAL_COUNT).to_numpy(), np.int64)
                   if EVAL_COUNT in table.column_names else None,
                   seen=SeenItems.load(root))
