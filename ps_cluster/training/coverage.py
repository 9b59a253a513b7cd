"""Per-epoch coverage: which train rows each epoch actually trained on.

Every training batch carries its rows' ids (``psrec__id``) and epochs
(``psrec__epoch``, see :mod:`psrec.data.input.dataset`). The counting train
function returns them with each finished call; the coordinator tallies them
per epoch. A closure lost with its worker returns nothing, so rows that a
dead worker held are not counted: the tally is what training saw.

The tally keeps one byte per row id and epoch (a visited-row map): 100 MB
an epoch for 100M rows.

What can be judged: an epoch the run finished -- it trained at least as
many rows as that epoch and every earlier one of the session hold; the
epoch still in progress when the run stopped is not judged. The input
reads ahead of training (shuffle buffers, the tf.data service's buffered
elements, in-flight requests), and what it holds when the run stops is
never trained: a straggling element there can still hold rows of an epoch
or two back (measured: 404 rows of epoch 3 in a clean 200-step run, 175
of epoch 2 in the README's 100-step run, as reported), and of several
epochs when an epoch is shorter than the read-ahead (a worker the
coordinator gave few closures held 11,264 rows of epochs 2-4 of 8,312 rows
each). So the finished epochs' missing rows are reported only when,
together, they exceed what the input can hold read ahead (``read_ahead``:
:data:`READ_AHEAD_BATCHES` batches per worker, whatever the epoch's size);
a lost worker's share (half of every epoch after the loss under
``--input-mode static``) soon does.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import numpy as np

# A finished epoch that saw fewer of the train rows than this is reported
# (when the read-ahead cannot explain the missing rows, below).
WARN_BELOW = 0.99
# Batches per worker that the input may hold, read ahead and untrained,
# when the run stops (measured: under 2 batches of 256 rows, 2 workers).
READ_AHEAD_BATCHES = 8


@dataclasses.dataclass(frozen=True)
class EpochCoverage:
    """One epoch's visit of the train split.

    Attributes:
      epoch: 1-based.
      seen: distinct train rows trained on, tagged with this epoch.
      repeats: rows trained on more than once in this epoch (a closure
        re-run after a worker loss).
      finished: the run trained at least the rows of this epoch and of
        every earlier one of the session (the epoch in progress when the
        run stopped is not judged).
    """

    epoch: int
    seen: int
    rows: int
    repeats: int
    finished: bool
    read_ahead: int = 0  # rows the input may hold untrained at the end

    @property
    def fraction(self) -> float:
        return self.seen / self.rows if self.rows else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "fraction": self.fraction}


class CoverageTally:
    """The ids seen per epoch of a split of ``rows`` train rows, on the
    coordinator."""

    def __init__(self, rows: int, read_ahead: int = 0) -> None:
        self.rows = rows
        self.read_ahead = read_ahead
        self._seen: dict[int, np.ndarray] = {}  # epoch -> visited row ids
        self._added: collections.Counter = collections.Counter()

    def add(self, ids, epochs) -> None:
        ids, epochs = np.asarray(ids), np.asarray(epochs)
        for epoch in np.unique(epochs):
            mine = ids[epochs == epoch]
            seen = self._seen.get(int(epoch), np.zeros(0, bool))
            top = int(mine.max()) + 1 if mine.size else 0
            if top > seen.size:  # grow geometrically: ids reach all rows
                grown = np.zeros(max(top, 2 * seen.size), bool)
                grown[:seen.size] = seen
                seen = grown
            seen[mine] = True
            self._seen[int(epoch)] = seen
            self._added[int(epoch)] += int(mine.size)

    def epochs(self) -> list[EpochCoverage]:
        """The epochs seen so far, in order."""
        first = min(self._seen, default=0)
        trained = sum(self._added.values())  # rows trained this session
        out = []
        for epoch in sorted(self._seen):
            seen = int(np.count_nonzero(self._seen[epoch]))
            out.append(EpochCoverage(
                epoch=epoch + 1, seen=seen, rows=self.rows,
                repeats=self._added[epoch] - seen,
                finished=trained >= (epoch - first + 1) * self.rows,
                read_ahead=self.read_ahead))
        return out


def coverage_warning(epochs: list[EpochCoverage], mode: str) -> str | None:
    """The warning for finished epochs that saw fewer than
    :data:`WARN_BELOW` of the train rows, when together they miss more rows
    than the input's read-ahead at the end can hold; None: nothing to
    report."""
    finished = [e for e in epochs if e.finished]
    missing = sum(e.rows - e.seen for e in finished)
    short = [e for e in finished if e.fraction < WARN_BELOW]
    if not short or missing <= short[0].read_ahead:
        return None
    listed = ", ".join(f"epoch {e.epoch}: {100 * e.fraction:.1f}%"
                       for e in short)
    why = ("under --input-mode static the files of a worker that stops "
           "(lost, or restarted: it starts its files again) are read by "
           "nobody; --input-mode data-service hands them to the other "
           "workers" if mode == "static" else
           "the tf.data service hands each row out at most once, so rows "
           "that a lost worker or tf.data worker held are not read again")
    return (f"train rows not visited: {listed} saw fewer than "
            f"{100 * WARN_BELOW:.0f}% of the train rows ({missing} rows "
            f"missing, more than the input reads ahead); {why}.")


def new_tally(rows: int | None, rows_per_step: int, workers: int
              ) -> CoverageTally | None:
    """The tally of a split of ``rows`` rows (None: not counted), read by
    ``workers`` pipelines of ``rows_per_step`` rows a step."""
    if rows is None:
        return None
    return CoverageTally(rows, READ_AHEAD_BATCHES * max(1, workers)
                         * rows_per_step)
