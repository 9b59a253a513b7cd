"""Which rows of a conversion go to the eval split (``psrec convert``).

Rows are numbered in input order (the row id). Eval rows are:

* ``tail``: the last ``eval_fraction`` of the rows -- by row id, or, with
  ``order_by``, by that column (ascending, ties broken by row id), so
  time-ordered evaluation does not need time-ordered files;
* ``hash``: a stable hash of the row id below ``eval_fraction``;
* ``files``: every row of the inputs whose name matches ``eval_files``.

Only the ``order_by`` column is read ahead (one column of every input, not
the rows); the decision is then a lookup per row id while the rows stream.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from pathlib import Path
from typing import Any
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.errors import did_you_mean


class OrderColumnError(DataError):
    """The ``order_by`` column holds nulls."""


def splitmix64(ids: np.ndarray, salt: int = 0) -> np.ndarray:
    """A stable, well-mixed uint64 hash of each id (splitmix64 of ``ids
    XOR salt``, pure numpy); different salts give independent hashes."""
    z = (ids.astype(np.uint64) ^ np.uint64(salt)) + np.uint64(
        0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _hash_below(ids: np.ndarray, fraction: float) -> np.ndarray:
    z = splitmix64(ids)
    return (z % np.uint64(1_000_000)) < np.uint64(int(fraction * 1_000_000))


def matches(path: str, pattern: str) -> bool:
    """Whether an input's file name (or its path as given) matches a glob."""
    return (fnmatch.fnmatchcase(Path(path).name, pattern)
            or fnmatch.fnmatchcase(path, pattern))


def _order_column(paths: Sequence[str], column: str) -> pa.ChunkedArray:
    """The ``column`` of every input, in row-id order (only that column is
    read)."""
    chunks, kind = [], None
    for path in paths:
        schema = pq.read_schema(path)
        if column not in schema.names:
            raise ConfigError(
                f"`--order-by` = {column!r} is not a column of {path}; its "
                f"columns: {', '.join(schema.names)}"
                f"{did_you_mean(column, schema.names) or '.'}")
        values = pq.read_table(path, columns=[column]).column(column)
        if kind is not None and values.type != kind:
            raise ConfigError(
                f"`--order-by` = {column!r} is {values.type} in {path} but "
                f"{kind} in {paths[0]}; give the column one type in every "
                "input.")
        kind = values.type
        missing = pc.is_null(values, nan_is_null=True)
        count = pc.sum(missing).as_py()
        if count:
            first = pc.index(missing, True).as_py()
            raise OrderColumnError(
                f"{path}: `--order-by` column {column!r} is null (or NaN) in "
                f"{count} rows (first: row {first}); rows without "
                "an order cannot be placed in time: fill or drop them before "
                "converting.")
        chunks += values.chunks
    return pa.chunked_array(chunks, type=kind)


def _order_eval_mask(paths: Sequence[str], column: str, total_rows: int,
                     eval_rows: int) -> np.ndarray:
    values = _order_column(paths, column)
    try:  # a stable sort: equal values keep row-id order
        order = pc.sort_indices(values)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError) as error:
        raise ConfigError(
            f"`--order-by` = {column!r} is of type {values.type}, which has "
            "no order; give a number, time or text column.") from error
    mask = np.zeros(total_rows, bool)
    if eval_rows:
        mask[order.to_numpy()[total_rows - eval_rows:]] = True
    return mask


@dataclasses.dataclass(frozen=True)
class EvalSplit:
    """Decides eval membership by row id (see the module docstring);
    build one with :func:`plan_split`."""

    mode: str
    eval_fraction: float
    total_rows: int
    order_by: str | None = None
    eval_files: str | None = None
    # Per row id, whether it is an eval row (``order_by``).
    mask: np.ndarray | None = dataclasses.field(default=None, repr=False)
    # File start row ids and whether each file is eval (``eval_files``).
    starts: np.ndarray | None = dataclasses.field(default=None, repr=False)
    file_is_eval: np.ndarray | None = dataclasses.field(default=None,
                                                        repr=False)

    @property
    def has_eval(self) -> bool:
        """Whether an eval split is written at all."""
        return self.eval_fraction > 0 or self.eval_files is not None

    def is_eval(self, ids: np.ndarray) -> np.ndarray:
        """Per row id (int64 array), whether the row belongs to eval."""
        if self.file_is_eval is not None:
            files = np.searchsorted(self.starts, ids, side="right") - 1
            return self.file_is_eval[files]
        if self.eval_fraction == 0:
            return np.zeros(len(ids), bool)
        if self.mask is not None:
            return self.mask[ids]
        if self.mode == "tail":
            return ids >= self.total_rows - self.eval_rows
        return _hash_below(ids, self.eval_fraction)

    @property
    def eval_rows(self) -> int:
        """Rows in eval under ``tail`` (before bad rows are dropped)."""
        return int(round(self.total_rows * self.eval_fraction))

    def to_dict(self) -> dict[str, Any]:
        """The record in ``manifest.json``'s ``split``."""
        record: dict[str, Any] = {"mode": self.mode,
                                  "eval_fraction": self.eval_fraction}
        if self.order_by is not None:
            record["order_by"] = self.order_by
        if self.eval_files is not None:
            record["eval_files"] = self.eval_files
        return record


def plan_split(paths: Sequence[str], rows: Sequence[int], *, mode: str,
               eval_fraction: float, order_by: str | None = None,
               eval_files: str | None = None) -> EvalSplit:
    """The eval membership of a conversion of ``paths`` (with ``rows``
    rows each)."""
    total = int(sum(rows))
    if eval_files is not None:
        file_is_eval = np.array([matches(p, eval_files) for p in paths])
        if not file_is_eval.any() or file_is_eval.all():
            which = "none" if not file_is_eval.any() else "all"
            raise ConfigError(
                f"`--eval-files` = {eval_files!r} matches {which} of the "
                f"{len(paths)} inputs ({', '.join(Path(p).name for p in paths)}"
                "); it must name some inputs for eval and leave others for "
                "train.")
        eval_share = sum(r for r, e in zip(rows, file_is_eval) if e)
        starts = np.cumsum([0, *rows[:-1]]).astype(np.int64)
        return EvalSplit("files", round(eval_share / total, 6) if total
                         else 0.0, total, eval_files=eval_files,
                         starts=starts, file_is_eval=file_is_eval)
    split = EvalSplit(mode, eval_fraction, total, order_by=order_by)
    if order_by is not None:
        mask = _order_eval_mask(paths, order_by, total, split.eval_rows)
        split = dataclasses.replace(split, mask=mask)
    return split
