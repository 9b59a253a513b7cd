"""The writers of a conversion: blocks of rows round-robin into the shards
of a split, and bad rows into the quarantine Parquet, each under a temporary
name until published."""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tensorflow as tf

from psrec.data.format.files import open_sink
from psrec.data.format.manifest import ShardInfo
from psrec.data.format.manifest import sha256_file
from psrec.data.format.records import encode_block
from psrec.features.spec.spec import ID_COLUMN
from psrec.uri import arrow_supports
from psrec.uri_path import UriPath

QUARANTINE_NAME = "quarantine.parquet"
SHARD_NAME_RE = re.compile(r"^(train|eval)-\d{5}-of-\d{5}\.tfrecord$")
_QUARANTINE_SCHEMA = pa.schema([
    ("source_file", pa.string()), ("row", pa.int64()),
    ("reason", pa.string()), ("record", pa.string())])


def shard_name(split: str, index: int, num_shards: int) -> str:
    return f"{split}-{index:05d}-of-{num_shards:05d}.tfrecord"


class ShardWriter:
    """Cuts a stream of rows into blocks written round-robin to shards."""

    def __init__(self, out_dir: Path | UriPath, split: str, num_shards: int,
                 block_rows: int) -> None:
        self.names = [shard_name(split, i, num_shards)
                      for i in range(num_shards)]
        self.tmp_paths = [out_dir / f".{name}.tmp" for name in self.names]
        self._writers = [tf.io.TFRecordWriter(str(p)) for p in self.tmp_paths]
        self._rows = [0] * num_shards
        self._pending: list[dict[str, np.ndarray]] = []
        self._pending_rows = 0
        self._blocks = 0
        self._block_rows = block_rows

    def add(self, columns: dict[str, np.ndarray]) -> None:
        rows = len(columns[ID_COLUMN])
        if not rows:
            return
        self._pending.append(columns)
        self._pending_rows += rows
        if self._pending_rows >= self._block_rows:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        if not self._pending:
            return
        merged = {k: np.concatenate([p[k] for p in self._pending])
                  for k in self._pending[0]}
        total = len(merged[ID_COLUMN])
        full = total - total % self._block_rows
        end = total if final else full
        for start in range(0, end, self._block_rows):
            block = {k: v[start:start + self._block_rows]
                     for k, v in merged.items()}
            shard = self._blocks % len(self._writers)
            self._writers[shard].write(encode_block(block))
            self._rows[shard] += len(block[ID_COLUMN])
            self._blocks += 1
        rest = {k: v[end:] for k, v in merged.items()}
        self._pending = [rest] if total > end else []
        self._pending_rows = total - end

    def close(self) -> None:
        self._flush(final=True)
        for writer in self._writers:
            writer.close()

    @property
    def rows(self) -> int:
        """The rows written so far (all, once closed)."""
        return sum(self._rows)

    def publish(self, out_dir: Path | UriPath) -> tuple[ShardInfo, ...]:
        infos = []
        for name, tmp, rows in zip(self.names, self.tmp_paths, self._rows):
            infos.append(ShardInfo(file=name, rows=rows,
                                   bytes=tmp.stat().st_size,
                                   sha256=sha256_file(tmp)))
            tmp.replace(out_dir / name)
        return tuple(infos)

    def discard(self) -> None:
        for path in self.tmp_paths:
            path.unlink(missing_ok=True)


class Quarantine:
    """Streams bad rows to a Parquet file under a temporary name (through
    ``tf.io.gfile`` on a store only TensorFlow reaches, e.g. ``ram://``)."""

    def __init__(self, out_dir: Path | UriPath) -> None:
        self.path = out_dir / QUARANTINE_NAME
        self._tmp = out_dir / f".{QUARANTINE_NAME}.tmp"
        self._writer: pq.ParquetWriter | None = None
        self._handle = None  # the gfile the writer writes to, if any
        self.reasons: collections.Counter = collections.Counter()

    def add(self, source: str, first_row: int, rows: np.ndarray,
            reasons: np.ndarray, batch: pa.RecordBatch) -> None:
        """Adds rows ``rows`` of ``batch``, whose first row is row
        ``first_row`` of ``source``."""
        records = [json.dumps(r, default=str, sort_keys=True)
                   for r in batch.take(pa.array(rows)).to_pylist()]
        self.reasons.update(reasons.tolist())
        table = pa.table({"source_file": [source] * len(rows),
                          "row": rows.astype(np.int64) + first_row,
                          "reason": reasons.tolist(), "record": records},
                         schema=_QUARANTINE_SCHEMA)
        if self._writer is None:
            sink = str(self._tmp)
            if not arrow_supports(sink):
                sink = self._handle = open_sink(self._tmp)
            self._writer = pq.ParquetWriter(sink, _QUARANTINE_SCHEMA)
        self._writer.write_table(table)

    @property
    def count(self) -> int:
        return sum(self.reasons.values())

    def close(self) -> str | None:
        if self._writer is None:
            self.path.unlink(missing_ok=True)
            return None
        self._close_writer()
        self._tmp.replace(self.path)
        return str(self.path)

    def _close_writer(self) -> None:
        self._writer.close()
        if self._handle is not None:
            self._handle.close()

    def discard(self) -> None:
        if self._writer is not None:
            self._close_writer()
        self._tmp.unlink(missing_ok=True)
