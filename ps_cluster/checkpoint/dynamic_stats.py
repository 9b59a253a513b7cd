"""The state of a checkpoint's dynamic tables, read from its files alone
(no cluster, no model): ``psrec embeddings stats``.

Each ``mode: dynamic`` table saves, under
``model/sparse_arch/dynamic_tables/<table>/``, its ``row_ids`` (the id each
row holds, -1: free, -2: the default row; checkpoints written before the
maps were sharded have no entry for the default row), the pending
``counts`` table and its ``admitted`` / ``evicted`` totals
(``psrec.models.dynamic.table``). Row variables and maps are saved whole:
rows per shard are those of the run (``psrec embeddings stats`` plans them
from the ``job.json`` beside the checkpoint, as the partitioner cut them)
or an even split (the last row, the default row, is neither used nor
free), and ids pending per shard are counted as the run routes them
(``models.dynamic.shards.owner``: id modulo the shards with rows). A saved
map starts with a marker pair of key -1, not counted.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping
from typing import Sequence

import numpy as np
import tensorflow as tf

from psrec.errors import ConfigError
from psrec.uri_path import as_path

PREFIX = "model/sparse_arch/dynamic_tables/"
_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"
DEFAULT_ROW = -2  # row_ids of the default row (models.dynamic_table)


@dataclasses.dataclass(frozen=True)
class TableStats:
    """One dynamic table's rows and ids (``shards``: rows used per shard)."""

    name: str
    capacity: int
    rows_used: int
    admitted: int
    evicted: int
    pending: int
    shards: tuple[dict, ...]

    @property
    def rows_free(self) -> int:
        return self.capacity - self.rows_used

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "shards": list(self.shards),
                "rows_free": self.rows_free}


@dataclasses.dataclass(frozen=True)
class DynamicStats:
    checkpoint: str
    tables: tuple[TableStats, ...]

    def to_dict(self) -> dict:
        return {"checkpoint": self.checkpoint,
                "tables": [t.to_dict() for t in self.tables]}

    def summary(self) -> str:
        if not self.tables:
            return f"{self.checkpoint}: no dynamic tables."
        lines = [f"{self.checkpoint}:"]
        for t in self.tables:
            lines.append(
                f"  {t.name}: {t.rows_used:,} of {t.capacity:,} rows used "
                f"({t.rows_free:,} free), {t.admitted:,} admitted, "
                f"{t.evicted:,} evicted, ids pending admission: {t.pending:,}")
            for shard in t.shards:
                lines.append(
                    f"    shard {shard['index']}: rows {shard['first_row']}.."
                    f"{shard['first_row'] + shard['rows'] - 1}, "
                    f"{shard['rows_used']:,} used, "
                    f"{shard['rows_free']:,} free, "
                    f"{shard['pending']:,} ids pending")
        return "\n".join(lines)


def resolve_checkpoint(path: str) -> str:
    """``path`` itself (a checkpoint prefix) or a folder's latest one."""
    if as_path(path).is_dir():
        latest = tf.train.latest_checkpoint(str(path))
        if latest is None:
            raise ConfigError(f"checkpoint folder {path!r} holds no "
                              "checkpoint; give a checkpoint prefix such as "
                              "DIR/ckpt-100 or a folder with one.")
        return latest
    if not tf.io.gfile.exists(f"{path}.index"):
        raise ConfigError(f"checkpoint {path!r} does not exist (no "
                          f"{path}.index); give a checkpoint prefix such as "
                          "DIR/ckpt-100 or its folder.")
    return str(path)


def even_shards(rows: int, shards: int) -> list[int]:
    """Rows per shard of the strategy's "div" split of ``rows``."""
    return [rows // shards + (1 if i < rows % shards else 0)
            for i in range(shards)]


def _shards(row_ids: np.ndarray, sizes: Sequence[int],
            pending: np.ndarray) -> tuple[dict, ...]:
    """Rows used/free and ids pending of each shard of ``sizes`` rows."""
    held = np.split(row_ids, np.cumsum(sizes)[:-1])
    admitting = [k for k, part in enumerate(held)
                 if np.count_nonzero(part >= -1)]  # shards with rows
    counter = (np.asarray(admitting)[pending % len(admitting)]
               if admitting and pending.size else np.zeros([0], np.int64))
    out, start = [], 0
    for index, (size, part) in enumerate(zip(sizes, held)):
        out.append({"index": index, "first_row": start, "rows": size,
                    "rows_used": int(np.count_nonzero(part >= 0)),
                    "rows_free": int(np.count_nonzero(part == -1)),
                    "pending": int(np.count_nonzero(counter == index))})
        start += size
    return tuple(out)


def _pending(reader, keys, base: str) -> np.ndarray:
    """The ids pending admission, without the marker pair. A checkpoint
    written before the marker has no tensor for an empty pending table (a
    save cut into slices drops empty tensors): none pending."""
    key = base + "counts/.ATTRIBUTES/table-keys"
    if key not in keys:
        return np.zeros([0], np.int64)
    pending = reader.get_tensor(key)
    return pending[pending >= 0]


def dynamic_stats(checkpoint: str, shards: int = 1,
                  shard_rows: Mapping[str, Sequence[int]] | None = None
                  ) -> DynamicStats:
    """The dynamic tables of ``checkpoint`` (a prefix or a folder), rows
    per shard: ``shard_rows[table]`` (the run's shard sizes) when given,
    else an even split into ``shards``."""
    path = resolve_checkpoint(checkpoint)
    reader = tf.compat.v1.train.NewCheckpointReader(path)
    keys = reader.get_variable_to_shape_map()
    names = sorted({k[len(PREFIX):].split("/")[0] for k in keys
                    if k.startswith(PREFIX)})
    tables = []
    for name in names:
        base = PREFIX + name + "/"
        row_ids = reader.get_tensor(base + "row_ids" + _VALUE)
        capacity = int(np.count_nonzero(row_ids != DEFAULT_ROW))
        if row_ids.size == capacity:  # saved before: no default row entry
            row_ids = np.append(row_ids, DEFAULT_ROW)
        pending = _pending(reader, keys, base)
        tables.append(TableStats(
            name=name, capacity=capacity,
            rows_used=int(np.count_nonzero(row_ids >= 0)),
            admitted=int(reader.get_tensor(base + "admitted" + _VALUE)),
            evicted=int(reader.get_tensor(base + "evicted" + _VALUE)),
            pending=int(pending.size),
            shards=_shards(row_ids, (shard_rows or {}).get(name) or
                           even_shards(row_ids.size, shards), pending)))
    return DynamicStats(path, tuple(tables))
