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
``psrec plan --optimizer`` are this registry's names.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from psrec.errors import check
from psrec.errors import check_at_least
from psrec.options import Codec
from psrec.options import check_choices
from psrec.options import option


@dataclasses.dataclass(frozen=True)
class OptimizerKind:
    """One optimizer: the class that builds it (``tf_keras.optimizers.legacy``
    or ``models.optim.rowwise``) and its arguments beside the learning rate,
    its slot variables per trained variable -- ``slots`` each of its size,
    ``row_slots`` each of one value per row (``[rows, 1]``) --, its
    ``scaling`` (``linear`` or ``sqrt``) and the ``roles`` it takes:
    ``sparse`` (the tables) and/or ``dense`` (the towers).
    """

    name: str
    keras_class: str
    arguments: tuple[tuple[str, Any], ...]
    slots: int
    scaling: str
    roles: tuple[str, ...]
    row_slots: int = 0


OPTIMIZERS: dict[str, OptimizerKind] = {kind.name: kind for kind in (
    OptimizerKind("adagrad", "Adagrad", (("initial_accumulator_value", 0.1),),
                  slots=1, scaling="sqrt", roles=("sparse", "dense")),
    OptimizerKind("rowwise_adagrad", "RowwiseAdagrad",
                  (("initial_accumulator_value", 0.1),), slots=0,
                  scaling="sqrt", roles=("sparse",), row_slots=1),
    OptimizerKind("ftrl", "Ftrl", (), slots=2, scaling="sqrt",
                  roles=("sparse",)),
    OptimizerKind("sgd", "SGD", (), slots=0, scaling="linear",
                  roles=("sparse", "dense")),
    OptimizerKind("adam", "Adam", (), slots=2, scaling="sqrt",
                  roles=("dense",)),
)}

SPARSE_OPTIMIZERS = tuple(name for name, kind in OPTIMIZERS.items()
                          if "sparse" in kind.roles)
DENSE_OPTIMIZERS = tuple(sorted(
    (name for name, kind in OPTIMIZERS.items() if "dense" in kind.roles),
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


def state_bytes(optimizer: str, rows: int, dim: int,
                value_bytes: int = 4) -> int:
    """Bytes of a ``[rows, dim]`` table of ``value_bytes`` a value (4
    float32, 2 bfloat16/float16) with ``optimizer``'s float32 slots: what
    the PS planner and the size guard count."""
    return (rows * dim * value_bytes
            + SLOT_VALUE_BYTES * slot_values(optimizer, rows, dim))


def slot_text(optimizer: str) -> str:
    """``adagrad 1``, ``rowwise_adagrad 1/row``: its slots per table value
    (or per row), for help texts."""
    kind = OPTIMIZERS[optimizer]
    return (f"{optimizer} {kind.row_slots}/row" if kind.row_slots
            else f"{optimizer} {kind.slots}")


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
        help="optimizer of the embedding tables (its slots per table value, "
        "or per row: " + ", ".join(slot_text(name)
                                   for name in SPARSE_OPTIMIZERS) + ")")
    dense: str = option(
        "adam", flag="--dense-optimizer", choices=DENSE_OPTIMIZERS,
        help="optimizer of the dense towers")
    sparse_lr: float = option(
        0.2, flag="--sparse-lr",
        help="embedding-table learning rate at --base-batch-size")
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
