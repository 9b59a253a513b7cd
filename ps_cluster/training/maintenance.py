"""Admission and eviction of the dynamic tables, at join boundaries.

The training loop (``ps_cluster.training.loop``) cuts its closures at every
multiple of a dynamic table's ``maintenance_every`` steps, waits for the
closures in flight (``join``) and calls :class:`Maintainer` on the
coordinator: the only writer of the id -> row maps, so concurrent closures
never give two ids one row. Rows given to newly admitted ids -- free, or
taken from evicted ids -- get fresh initial values (the wide twin: zeros)
and fresh optimizer slots.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from psrec.models.dynamic.table import reset_rows
from psrec.models.embedding.sparse_arch import WIDE_SUFFIX


class Maintainer:
    """Maintains the dynamic tables of a model's ``sparse_arch``; the slots
    of reset rows are reset too, in the table's own optimizer:
    ``optimizers`` (table name -> optimizer) or, a table it does not name,
    ``optimizer``; ``on_reset(table name, rows)`` is told them (the delta
    checkpoints' changed rows)."""

    def __init__(self, sparse_arch, optimizer,
                 optimizers: dict | None = None, on_reset=None) -> None:
        self.sparse_arch = sparse_arch
        self.optimizer = optimizer
        self.optimizers = dict(optimizers or {})
        self.on_reset = on_reset or (lambda name, rows: None)
        self.tables = dict(sparse_arch.dynamic_tables)
        self.admitted = self.evicted = 0  # by this process, for reports

    def next_due(self, step: int) -> int:
        """The first step after ``step`` at which a table is maintained."""
        return min((step // t.config.maintenance_every + 1)
                   * t.config.maintenance_every for t in self.tables.values())

    def due(self, step: int) -> bool:
        return any(step % t.config.maintenance_every == 0
                   for t in self.tables.values())

    def __call__(self, step: int) -> None:
        """Maintains the tables due at ``step`` (no closure in flight)."""
        for name, table in self.tables.items():
            if step % table.config.maintenance_every:
                continue
            done = table.maintain(step)
            self.admitted += done.admitted
            self.evicted += done.evicted
            if done.rows.size:
                self.reset(name, done.rows)

    def reset(self, name: str, rows: np.ndarray) -> None:
        """Fresh values and slots for ``rows`` of table ``name`` (and of
        its wide twin)."""
        optimizer = self.optimizers.get(name, self.optimizer)
        reset_rows(self.sparse_arch.tables[name], rows,
                   self.tables[name].fresh_rows(int(rows.size)), optimizer)
        self.on_reset(name, rows)
        wide = self.sparse_arch.tables.get(name + WIDE_SUFFIX)
        if wide is not None:
            reset_rows(wide, rows, tf.zeros([rows.size, 1]), optimizer)
            self.on_reset(name + WIDE_SUFFIX, rows)


def dynamic_maintainer(trainer) -> Maintainer | None:
    """The maintainer of ``trainer``'s model, None without dynamic tables."""
    arch = getattr(trainer.model, "sparse_arch", None)
    if not getattr(arch, "dynamic_tables", None):
        return None
    return Maintainer(arch, trainer.sparse_optimizer,
                      trainer.table_optimizers,
                      trainer.changes and trainer.mark_reset_rows)
