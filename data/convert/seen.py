"""Each user's train candidates, for the eval pairs (``seen.parquet``).

A retrieval evaluation ranks each held-out (query, candidate) pair against
the whole catalogue. The candidates the query's user has already been seen
with in the train split are never that user's held-out pairs (a MovieLens
user rates a movie once), so the standard protocol leaves them out of the
ranking (``ps_cluster.retrieval.eval``). The user is the raw value of the
spec's ``towers.query_id``.

``psrec convert`` of such a spec writes ``seen.parquet`` beside
``candidates.parquet`` (before the manifest, which commits both): one row per
user with a positive eval row (and one row, user null, for the pairs of rows
without a user), with

* ``seen``: the catalogue rows of the user's train positives (distinct,
  ascending),
* ``pair_ids``: the example ids (``psrec__id``) of the user's positive eval
  rows,
* ``pair_candidates``: the catalogue row of each of those rows' candidate.

Rows are in order of each user's first appearance in the log, so a re-run
writes the same file. Conversion keeps two int64 per train positive and
three per eval positive until the end (16 and 24 bytes), plus one entry per
distinct user and candidate; the file holds the seen lists of the users
with eval pairs only.
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
from psrec.data.format.files import atomic_output
from psrec.data.format.files import open_arrow_input
from psrec.data.format.files import parquet_sink
from psrec.features.spec.spec import FeatureSpec
from psrec.features.transforms.ops import MISSING_INT
from psrec.features.transforms.ops import MISSING_TOKEN
from psrec.uri_path import as_path

SEEN_NAME = "seen.parquet"


def _numbered(values: np.ndarray, numbers: dict) -> np.ndarray:
    """Each value's number in ``numbers`` (new values get the next ones,
    in order of first appearance)."""
    unique, first, inverse = np.unique(values, return_index=True,
                                       return_inverse=True)
    for i in np.argsort(first, kind="stable"):
        numbers.setdefault(unique[i].item(), len(numbers))
    codes = np.array([numbers[v.item()] for v in unique], np.int64)
    return codes[inverse.reshape(-1)] if len(values) else codes


class SeenCollector:
    """Collects the train positives and the eval pairs of a conversion, per
    user (``spec.towers.query_id`` is set)."""

    def __init__(self, spec: FeatureSpec) -> None:
        self.spec = spec
        self.user_dtype = tower_column_dtype(
            spec, "query_id", "a user is one raw value of it.")
        self.item_dtype = spec.raw_inputs[spec.towers.candidate_id][0]
        self._missing = (MISSING_TOKEN if self.user_dtype == "string"
                         else MISSING_INT)
        self._users: dict = {}
        self._items: dict = {}
        self._train: list[tuple[np.ndarray, np.ndarray]] = []
        self._eval: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, batch: pa.RecordBatch, columns: dict[str, np.ndarray],
            ids: np.ndarray, to_train: np.ndarray,
            to_eval: np.ndarray | None) -> None:
        """One converted batch: ``columns`` its encoded features, ``ids``
        its example ids, ``to_train``/``to_eval`` its rows of each split."""
        towers = self.spec.towers
        users = serving_values(batch.column(towers.query_id),
                               self.user_dtype, towers.query_id)
        items = serving_values(batch.column(towers.candidate_id),
                               self.item_dtype, towers.candidate_id)
        positive = columns[self.spec.label.name] > 0
        known = users != self._missing
        train = to_train & positive & known
        self._train.append((_numbered(users[train], self._users),
                            _numbered(items[train], self._items)))
        if to_eval is not None:
            pairs = to_eval & positive
            user = np.full(int(pairs.sum()), -1, np.int64)  # -1: no user
            user[known[pairs]] = _numbered(users[pairs & known], self._users)
            self._eval.append((ids[pairs], user,
                               _numbered(items[pairs], self._items)))

    def write(self, out_dir: str | Path, catalogue_keys: list) -> str:
        """Writes ``seen.parquet`` (atomically); ``catalogue_keys``: the
        catalogue's raw ids in its row order. Returns the file's name."""
        row_of = {key: i for i, key in enumerate(catalogue_keys)}
        rows = np.array([row_of[k] for k in self._items], np.int64)
        empty = np.zeros(0, np.int64)
        train_users = np.concatenate([u for u, _ in self._train] or [empty])
        train_items = rows[np.concatenate([i for _, i in self._train]
                                          or [empty])]
        pair_ids, pair_users, pair_items = (
            np.concatenate([part[k] for part in self._eval] or [empty])
            for k in range(3))
        pair_items = rows[pair_items]
        # users with an eval pair, in order of first appearance; -1 last
        users = np.unique(pair_users)
        users = np.concatenate([users[users >= 0], users[users < 0]])
        seen = np.unique(train_users * len(rows) + train_items)
        seen_users, seen_items = np.divmod(seen, max(1, len(rows)))
        starts = np.searchsorted(seen_users, users, "left")
        ends = np.searchsorted(seen_users, users, "right")
        order = np.argsort(pair_users, kind="stable")
        pair_starts = np.searchsorted(pair_users[order], users, "left")
        pair_ends = np.searchsorted(pair_users[order], users, "right")
        table = pa.table({
            "seen": [seen_items[s:e].tolist() if u >= 0 else []
                     for u, s, e in zip(users, starts, ends)],
            "pair_ids": [pair_ids[order[s:e]].tolist()
                         for s, e in zip(pair_starts, pair_ends)],
            "pair_candidates": [pair_items[order[s:e]].tolist()
                                for s, e in zip(pair_starts, pair_ends)]},
            schema=pa.schema([(name, pa.list_(pa.int64())) for name in (
                "seen", "pair_ids", "pair_candidates")]))
        with atomic_output(as_path(out_dir) / SEEN_NAME) as tmp, \
                parquet_sink(tmp) as sink:
            pq.write_table(table, sink)
        return SEEN_NAME


@dataclasses.dataclass(frozen=True)
class SeenItems:
    """A loaded ``seen.parquet``, as the arrays the evaluation looks up:
    the eval pairs by example id (``pair_ids`` ascending, each pair's
    ``pair_users`` row of the seen lists and ``pair_candidates`` catalogue
    row), and each user's seen catalogue rows
    ``seen[offsets[u]:offsets[u + 1]]``."""

    pair_ids: np.ndarray
    pair_users: np.ndarray
    pair_candidates: np.ndarray
    offsets: np.ndarray
    seen: np.ndarray

    @classmethod
    def load(cls, root: str | Path) -> SeenItems | None:
        """Reads ``root/seen.parquet``; None when the conversion wrote none
        (no ``towers.query_id``, or converted before psrec wrote it)."""
        path = as_path(root) / SEEN_NAME
        if not path.is_file():
            return None
        with open_arrow_input(path) as source:
            table = pq.read_table(source)

        def lengths(name: str) -> np.ndarray:
            return np.asarray(pc.list_value_length(table.column(name))
                              .to_numpy(), np.int64)

        def flat(name: str) -> np.ndarray:
            return np.asarray(pc.list_flatten(table.column(name)).to_numpy(),
                              np.int64)

        users = np.repeat(np.arange(table.num_rows, dtype=np.int64),
                          lengths("pair_ids"))
        pair_ids = flat("pair_ids")
        order = np.argsort(pair_ids, kind="stable")
        return cls(pair_ids=pair_ids[order], pair_users=users[order],
                   pair_candidates=flat("pair_candidates")[order],
                   offsets=np.concatenate([[0], np.cumsum(lengths("seen"))]
                                          ).astype(np.int64),
                   seen=flat("seen"))

    @property
    def pairs(self) -> int:
        return len(self.pair_ids)
