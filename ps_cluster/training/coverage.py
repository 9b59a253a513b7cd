"""Per-epoch coverage: which train rows each epoch actually trained on.

Every training batch carries its rows' ids (``psrec__id``) and epochs
(``psrec__epoch``, see :mod:`psrec.data.input.dataset`). The counting train
function returns them with each finished call; the coordinator tallies them
per epoch. A closure lost with its worker returns nothing, so rows that a
dead worker held are not counted: the tally is what training saw.

The tally keeps one byte per row id and epoch (a visited-row map): 100 MB
an epoch for 100M rows.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import numpy as np

# A finished epoch that saw fewer of the train rows than this is reported.
WARN_BELOW = 0.99


@dataclasses.dataclass(frozen=True)
class EpochCoverage:
    """One epoch's visit of the train split.

    Attributes:
      epoch: 1-based.
      seen: distinct train rows trained on, tagged with this epoch.
      repeats: rows trained on more than once in this epoch (a closure
        re-run after a worker loss).
      finished: rows of an epoch two later were trained on too: the stream
        moved past this epoch by a whole epoch, so every row of it should
        have come out of the input buffers (the last two epochs of a run
        are not judged: file interleaving and the shuffle buffer mix
        neighbouring epochs).
    """

    epoch: int
    seen: int
    rows: int
    repeats: int
    finished: bool

    @property
    def fraction(self) -> float:
        return self.seen / self.rows if self.rows else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "fraction": self.fraction}


class CoverageTally:
    """The ids seen per epoch of a split of ``rows`` train rows, on the
    coordinator."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
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
        last = max(self._seen, default=-1)
        out = []
        for epoch in sorted(self._seen):
            seen = int(np.count_nonzero(self._seen[epoch]))
            out.append(EpochCoverage(
                epoch=epoch + 1, seen=seen, rows=self.rows,
                repeats=self._added[epoch] - seen,
                finished=epoch + 1 < last))
        return out


def coverage_warning(epochs: list[EpochCoverage], mode: str) -> str | None:
    """The warning for finished epochs that saw fewer than
    :data:`WARN_BELOW` of the train rows (None: none did)."""
    short = [e for e in epochs if e.finished and e.fraction < WARN_BELOW]
    if not short:
        return None
    listed = ", ".join(f"epoch {e.epoch}: {100 * e.fraction:.1f}%"
                       for e in short)
    why = ("under --input-mode static a lost worker's files are read by "
           "nobody (and a restarted one starts them again); "
           "--input-mode data-service hands them to the other workers"
           if mode == "static" else
           "rows held by a lost worker (or a lost tf.data worker's file) "
           "are not re-read: the tf.data service visits at most once")
    return (f"train rows not visited: {listed} saw fewer than "
            f"{100 * WARN_BELOW:.0f}% of the train rows; {why}.")


def new_tally(rows: int | None) -> CoverageTally | None:
    return None if rows is None else CoverageTally(rows)
