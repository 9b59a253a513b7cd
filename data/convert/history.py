"""User-history lists built while converting (``features.spec.history``).

The log is read once, in the order of its rows, which must be the order of
each history's ``order`` column (non-decreasing over all inputs, in the
order they are given; a row that goes back in time stops the conversion:
sort the log first). Each history feature keeps, per user (``by`` value),
a ring buffer of the ``max_length`` most recent ``of`` values: memory grows
with the number of distinct users times ``max_length`` values, not with
the log. A row's list is its user's buffer *before* the row's own time:
events of the same time are added only when a later time arrives, so a row
never sees itself, a same-time event or a later one. A missing user
(null) gets an empty list and is not recorded; a missing item is skipped.
Lists are most recent first (the first ``max_length`` of a longer request
list are its most recent, as at serving).
"""

from __future__ import annotations

import collections

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tensorflow as tf

from psrec.data.convert.checks import serving_values
from psrec.errors import DataError
from psrec.features.spec.columns import CategoricalFeature
from psrec.features.spec.spec import FeatureSpec
from psrec.features.transforms.ops import padding_value


class HistoryOrderError(DataError):
    """The log is not in time order, which a history needs: bad data
    (exit 1)."""


def order_values(column: pa.Array) -> np.ndarray:
    """An order column as numbers (a timestamp as its integer ticks)."""
    if pa.types.is_timestamp(column.type):
        column = pc.cast(column, pa.int64())
    return np.asarray(column.to_numpy(zero_copy_only=False))


class _UserHistories:
    """The ring buffers of one history feature (see the module docstring)."""

    def __init__(self, feature: CategoricalFeature, item_dtype: str,
                 user_dtype: str) -> None:
        self.feature = feature
        self.item_dtype, self.user_dtype = item_dtype, user_dtype
        self.buffers: dict = {}
        self.pending: list = []  # (user, item) of the current time
        self.time = None  # the current time, None before the first row

    def lists(self, users: np.ndarray, items: np.ndarray,
              times: np.ndarray) -> tuple[list, np.ndarray]:
        """The flat history values and each row's list length."""
        no_user = padding_value(tf.as_dtype(self.user_dtype))
        no_item = padding_value(tf.as_dtype(self.item_dtype))
        length = self.feature.max_length
        flat: list = []
        lengths = np.zeros(len(users), np.int64)
        for i, (user, item, time) in enumerate(zip(users.tolist(),
                                                   items.tolist(),
                                                   times.tolist())):
            if self.time is None or time > self.time:
                for key, value in self.pending:  # strictly earlier now
                    buffer = self.buffers.get(key)
                    if buffer is None:
                        buffer = self.buffers[key] = collections.deque(
                            maxlen=length)
                    buffer.appendleft(value)
                self.pending.clear()
                self.time = time
            if user == no_user:
                continue
            buffer = self.buffers.get(user)
            if buffer:
                flat.extend(buffer)
                lengths[i] = len(buffer)
            if item != no_item:
                self.pending.append((user, item))
        return flat, lengths


class HistoryBuilder:
    """Builds every history feature of a spec over the rows of a log, batch
    after batch (one builder per conversion)."""

    def __init__(self, spec: FeatureSpec) -> None:
        inputs = spec.raw_inputs
        self._histories = [
            _UserHistories(f, inputs[f.history.of][0],
                           inputs[f.history.by][0])
            for f in spec.categorical if f.history is not None]
        self._last: dict[str, tuple] = {}  # order column -> (time, where)

    def __bool__(self) -> bool:
        return bool(self._histories)

    def _check_order(self, column: str, times: np.ndarray,
                     where: str, rows: np.ndarray) -> None:
        previous = self._last.get(column)
        joined = (times if previous is None
                  else np.concatenate([[previous[0]], times]))
        back = np.flatnonzero(np.diff(joined) < 0)
        if back.size:
            shift = 0 if previous is None else 1
            at = back[0] + 1 - shift  # the row that goes back, in times
            before = (previous[1] if at == 0 and previous is not None
                      else f"{where} row {rows[at - 1]}")
            raise HistoryOrderError(
                f"{where} row {rows[at]}: {column!r} = {times[at]} comes "
                f"after {joined[back[0]]} ({before}); a history feature "
                f"needs the log in {column!r} order: sort the input by "
                f"{column!r} (and give the files in time order).")
        if len(times):
            self._last[column] = (times[-1], f"{where} row {rows[-1]}")

    def lists(self, batch: pa.RecordBatch, where: str,
              rows: np.ndarray) -> dict[str, tf.RaggedTensor]:
        """Each history feature's raw value lists of the rows of ``batch``
        (good rows only; ``rows``: their row numbers in ``where``, the
        input file, for messages)."""
        found, order = {}, {}
        for history in self._histories:
            source = history.feature.history
            if source.order not in order:  # each order column checked once
                order[source.order] = order_values(batch.column(
                    source.order))
                self._check_order(source.order, order[source.order], where,
                                  rows)
            times = order[source.order]
            users = serving_values(batch.column(source.by),
                                   history.user_dtype, source.by)
            items = serving_values(batch.column(source.of),
                                   history.item_dtype, source.of)
            flat, lengths = history.lists(users, items, times)
            dtype = tf.as_dtype(history.item_dtype)
            found[history.feature.name] = tf.RaggedTensor.from_row_lengths(
                tf.constant(flat, dtype, shape=[len(flat)]), lengths)
        return found
