"""The optimizer registry and :class:`OptimizerConfig` (plain Python).

One :class:`OptimizerKind` per optimizer says everything psrec knows about
it: how it is built (a legacy ``tf_keras`` optimizer class -- or psrec's
``RowwiseAdagrad``, ``models.optim.rowwise`` -- and its arguments, built by
:func:`psrec.models.optim.optimizers.build_optimizers`), the slot values it
keeps per trained ``[rows, dim]`` variable -- ``slots`` of its size and
``row_slots`` of ``[rows, 1]`` (:func:`slot_values`, read by the size
guard, ``models.optim.sizing``, and the PS planner,
``ps_cluster.planner.plan``) -- and how its learning rate scales with the
update size (:func:`batch_scale`): **linearly** for SGD (Goyal et al.
2017), by the **square root** for the adaptive ones -- Adagrad (row-wise
too), Adam, FTRL -- whose steps are normalised by gradient
statistics (Malladi et al. 2022, "On the SDEs and Scaling Rules for
Adaptive Gradient Algorithms").

The choices of ``psrec train --sparse-optimizer/--dense-optimizer`` and
``psrec plan --optimizer`` are this registry's names; the sparse ones are
the names a table of the spec may give as its own ``optimizer``
(``features.spec.columns.TABLE_OPTIMIZERS``).

Per-table optimizers: :func:`table_groups` gives each table its
:class:`TableGroup` -- the optimizer and learning rate the table names, or
the flags' -- and tables of one ``(optimizer, lr)`` share one optimizer
object, named by :attr:`TableGroup.name` in checkpoints.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from psrec.errors import check
from psrec.errors import check_at_least
from psrec.features.spec.columns import TABLE_OPTIMIZERS
from psrec.options import Codec
from psrec.options import check_choices
from psrec.options import option


@dataclasses.dataclass(frozen=True)
class OptimizerKind:
    """One optimizer: the class that builds it (``tf_keras.optimizers.legacy``
    or ``models.optim.rowwise``) and its arguments beside the learning rate,
    its slot variables per trained variable -- ``slots`` each of its size,
    ``row_slots`` each of one value per row (``[rows, 1]``) --, its
    ``scaling`` (``linear`` or ``sqrt``) and whether it may train the
    ``dense`` towers (the tables' choices are the spec's
    ``TABLE_OPTIMIZERS``).
    """

    name: str
    keras_class: str
    arguments: tuple[tuple[str, Any], ...]
    slots: int
    scaling: str
    dense: bool = False
    row_slots: int = 0


OPTIMIZERS: dict[str, OptimizerKind] = {kind.name: kind for kind in (
    OptimizerKind("adagrad", "Adagrad", (("initial_accumulator_value", 0.1),),
                  slots=1, scaling="sqrt", dense=True),
    OptimizerKind("rowwise_adagrad", "RowwiseAdagrad",
                  (("initial_accumulator_value", 0.1),), slots=0,
                  scaling="sqrt", row_slots=1),
    OptimizerKind("ftrl", "Ftrl", (), slots=2, scaling="sqrt"),
    OptimizerKind("sgd", "SGD", (), slots=0, scaling="linear", dense=True),
    OptimizerKind("adam", "Adam", (), slots=2, scaling="sqrt", dense=True),
)}

SPARSE_OPTIMIZERS = TABLE_OPTIMIZERS
DENSE_OPTIMIZERS = tuple(sorted(
    (name for name, kind in OPTIMIZERS.items() if kind.dense),
    key=lambda name: name != "adam"))


def slots(optimizer: str) -> int:
    """Variable-sized slots ``optimizer`` keeps per trained variable (its
    one-value-per-row slots are ``OPTIMIZERS[optimizer].row_slots``)."""
    return OPTIMIZERS[optimizer].slots


def slot_values(optimizer: str, rows: int, dim: int) -> int:
    """Values of the slots ``optimizer`` keeps for a ``[rows, dim]``
    variable: ``slots * rows * dim + row_slots * rows``."""
    kind = OPTIMIZERS[optimizer]
    return rows * (kind.slots * dim + kind.row_slots)


#: Bytes of one slot value: slots are float32 whatever the table's dtype
#: (a 16-bit table is updated in float32, ``models.optim.rounding``).
SLOT_VALUE_BYTES = 4


def slot_text(optimizer: str) -> str:
    """``adagrad 1``, ``rowwise_adagrad 1/row``: its slots per table value
    (or per row), for help texts."""
    kind = OPTIMIZERS[optimizer]
    return (f"{optimizer} {kind.row_slots}/row" if kind.row_slots
            else f"{optimizer} {kind.slots}")


def row_bytes(optimizer: str, dim: int, value_bytes: int = 4) -> int:
    """Bytes of one ``dim``-wide row of a table trained by ``optimizer``:
    its values (``value_bytes`` each: 4 float32, 2 bfloat16) and its
    slots' (float32, :data:`SLOT_VALUE_BYTES`): what the PS planner and the
    size guard count."""
    return (value_bytes * dim
            + SLOT_VALUE_BYTES * slot_values(optimizer, 1, dim))


def batch_scale(optimizer: str, batch_size: int, base_batch_size: int
                ) -> float:
    """The learning-rate factor of ``optimizer`` for updates of
    ``batch_size`` rows when the rate was given for ``base_batch_size``."""
    ratio = batch_size / base_batch_size
    return ratio if OPTIMIZERS[optimizer].scaling == "linear" else (
        math.sqrt(ratio))


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(Codec, where="optimizer"):
    """Optimizers and learning-rate policy (each field an option)."""

    sparse: str = option(
        "adagrad", flag="--sparse-optimizer", choices=SPARSE_OPTIMIZERS,
        help="optimizer of the embedding tables whose spec names none (a "
        "table's `optimizer`; its slots per table value, or per row: " + ", ".join(slot_text(name)
                                   for name in SPARSE_OPTIMIZERS) + ")")
    dense: str = option(
        "adam", flag="--dense-optimizer", choices=DENSE_OPTIMIZERS,
        help="optimizer of the dense towers")
    sparse_lr: float = option(
        0.2, flag="--sparse-lr",
        help="embedding-table learning rate at --base-batch-size, of the "
        "tables whose spec names none (a table's `lr`)")
    dense_lr: float = option(
        0.001, flag="--dense-lr",
        help="dense-tower learning rate at --base-batch-size")
    base_batch_size: int = option(
        1024, flag="--base-batch-size",
        help="the update size (rows) the learning rates are given for. They "
        "are scaled to --batch-size x --grad-accum-steps: linearly for sgd, "
        "by the square root for adagrad/rowwise_adagrad/adam/ftrl (the "
        "scaling rule valid for adaptive optimizers)")
    warmup_steps: int = option(
        100, flag="--warmup-steps",
        help="linear learning-rate warmup from 0 over N steps")

    def __post_init__(self) -> None:
        check_choices(self)
        for key in ("sparse_lr", "dense_lr"):
            value = getattr(self, key)
            check(math.isfinite(value) and value > 0,
                  f"OptimizerConfig.{key}", value,
                  "must be a finite number > 0")
        check_at_least(self, 1, "base_batch_size")
        check_at_least(self, 0, "warmup_steps")


#: The checkpoint name of the optimizer of the tables that name none (and
#: of the only one before tables could name theirs).
DEFAULT_GROUP = "sparse_optimizer"


@dataclasses.dataclass(frozen=True)
class TableGroup:
    """The optimizer of a group of tables: its registry ``optimizer`` and
    learning rate ``lr`` (at ``base_batch_size``); ``name`` is its object's
    name in checkpoints: ``sparse_optimizer`` for the flags'
    (``--sparse-optimizer`` at ``--sparse-lr``), else
    ``sparse_optimizer_<optimizer>`` at ``--sparse-lr`` and
    ``sparse_optimizer_<optimizer>_lr<lr>`` (``.`` written ``p``) at a
    table's own rate."""

    optimizer: str
    lr: float
    name: str


def _group(optimizer: str, lr: float, config: OptimizerConfig
           ) -> TableGroup:
    if (optimizer, lr) == (config.sparse, config.sparse_lr):
        return TableGroup(optimizer, lr, DEFAULT_GROUP)
    rate = "" if lr == config.sparse_lr else "_lr" + f"{lr:g}".replace(
        ".", "p")
    return TableGroup(optimizer, lr, f"{DEFAULT_GROUP}_{optimizer}{rate}")


def table_groups(tables, config: OptimizerConfig) -> dict[str, TableGroup]:
    """``table name -> TableGroup`` of ``tables`` (the spec's
    ``TableConfig``): the ``optimizer`` and ``lr`` each names, the flags'
    (``config.sparse``, ``config.sparse_lr``) for what it leaves out."""
    return {t.name: _group(t.optimizer or config.sparse,
                           t.lr or config.sparse_lr, config)
            for t in tables}


def table_row_bytes(tables, config: OptimizerConfig
                    ) -> tuple[tuple[str, str, int], ...]:
    """``(table, optimizer, bytes per row with its slots)`` of each of the
    spec's ``tables`` (in each table's dtype), as ``psrec plan`` and
    ``psrec advise`` show them."""
    groups = table_groups(tables, config)
    return tuple((t.name, groups[t.name].optimizer,
                  row_bytes(groups[t.name].optimizer, t.dim, t.value_bytes))
                 for t in tables)
