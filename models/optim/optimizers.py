"""Optimizers: a sparse-friendly one for tables, another for the dense part.

Legacy tf_keras optimizers are used on purpose: under
``ParameterServerStrategy`` the new optimizers' slots fail to restore into
partitioned variables (tf-keras#838). Adagrad (default for tables) applies
``IndexedSlices`` gradients as sparse updates on the PS that owns each row;
Adam (default for the dense part) keeps its slots beside the dense weights.
Row-wise Adagrad (``models.optim.rowwise``) keeps one accumulator per table
row instead of one per value: ``1/dim`` of Adagrad's slot memory.

Learning rates are given at ``base_batch_size`` (the rows of one update)
and scaled to the actual update size by the rule that holds for each
optimizer: **linearly** for SGD (Goyal et al. 2017), by the **square root**
for the adaptive ones -- Adagrad (row-wise too), Adam, FTRL -- whose steps
are normalised by gradient statistics (Malladi et al. 2022, "On the SDEs and Scaling Rules
for Adaptive Gradient Algorithms"). A linear warmup over ``warmup_steps``
comes first.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras

from psrec.models.optim.config import DEFAULT_GROUP
from psrec.models.optim.config import OPTIMIZERS
from psrec.models.optim.config import OptimizerConfig
from psrec.models.optim.config import batch_scale
from psrec.models.optim.config import table_groups
from psrec.models.optim.rounding import SGD
from psrec.models.optim.rounding import Adagrad
from psrec.models.optim.rounding import Ftrl
from psrec.models.optim.rowwise import RowwiseAdagrad


class ScaledWarmup(tf_keras.optimizers.schedules.LearningRateSchedule):
    """The rate ``base_lr`` given for ``base_batch_size`` rows, scaled to the
    ``batch_size`` rows of one update by ``optimizer``'s rule
    (:func:`batch_scale`) and ramped up linearly from 0 over ``warmup_steps``
    steps."""

    def __init__(self, base_lr: float, batch_size: int, base_batch_size: int,
                 warmup_steps: int, optimizer: str = "sgd") -> None:
        self.base_lr = base_lr
        self.batch_size = batch_size
        self.base_batch_size = base_batch_size
        self.warmup_steps = warmup_steps
        self.optimizer = optimizer
        self.peak = base_lr * batch_scale(optimizer, batch_size,
                                          base_batch_size)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        if self.warmup_steps == 0:
            return tf.constant(self.peak, tf.float32)
        ramp = tf.minimum(1.0, (step + 1.0) / float(self.warmup_steps))
        return self.peak * ramp

    def get_config(self) -> dict:
        return {"base_lr": self.base_lr, "batch_size": self.batch_size,
                "base_batch_size": self.base_batch_size,
                "warmup_steps": self.warmup_steps,
                "optimizer": self.optimizer}


#: The registry's classes that are psrec's own: the legacy ``tf_keras``
#: ones with :class:`~psrec.models.optim.rounding.Float32Rows` (16-bit
#: tables updated in float32), and row-wise Adagrad (the others, Adam, are
#: ``tf_keras.optimizers.legacy``'s: dense weights are float32).
_OWN_CLASSES = {"RowwiseAdagrad": RowwiseAdagrad, "Adagrad": Adagrad,
                "Ftrl": Ftrl, "SGD": SGD}


def make_optimizer(name: str, lr, single_writer: bool = False
                   ) -> tf_keras.optimizers.legacy.Optimizer:
    """The registry entry ``name``'s optimizer (``models.optim.config``);
    ``single_writer``: see :class:`~psrec.models.optim.rounding.Float32Rows`
    (psrec's own classes; Adam has no sparse path of its own)."""
    kind = OPTIMIZERS[name]
    own = _OWN_CLASSES.get(kind.keras_class)
    if own is None:
        return getattr(tf_keras.optimizers.legacy, kind.keras_class)(
            lr, **dict(kind.arguments))
    return own(lr, single_writer=single_writer, **dict(kind.arguments))


def _scheduled(config: OptimizerConfig, batch_size: int, name: str,
               lr: float, single_writer: bool = False
               ) -> tf_keras.optimizers.legacy.Optimizer:
    """Optimizer ``name`` at rate ``lr`` scaled to ``batch_size`` rows and
    warmed up (:class:`ScaledWarmup`)."""
    return make_optimizer(name, ScaledWarmup(lr, batch_size, config.base_batch_size,
                                    config.warmup_steps, name),
                 single_writer)


def build_optimizers(config: OptimizerConfig, batch_size: int
                     ) -> tuple[tf_keras.optimizers.legacy.Optimizer,
                                tf_keras.optimizers.legacy.Optimizer]:
    """Returns ``(sparse_optimizer, dense_optimizer)`` -- the flags' --;
    build them under the same strategy scope as the model."""
    return (_scheduled(config, batch_size, config.sparse, config.sparse_lr),
            _scheduled(config, batch_size, config.dense, config.dense_lr))


def build_table_optimizers(config: OptimizerConfig, batch_size: int, tables,
                           single_writer: bool = False) -> tuple[dict, dict]:
    """The tables' optimizers: ``(by group, by table)`` -- group name
    (``models.optim.config.TableGroup.name``; ``sparse_optimizer``, the
    flags', always first) -> its optimizer, and table name -> its group's
    optimizer -- for the spec's ``tables``. One optimizer per distinct
    ``(optimizer, lr)``; build them under the model's strategy scope.
    ``single_writer``: no other process or worker updates the tables while a
    step applies its update (true of every strategy but the PS one; see
    :class:`~psrec.models.optim.rounding.Float32Rows`)."""
    groups = table_groups(tables, config)
    by_group = {DEFAULT_GROUP: _scheduled(config, batch_size, config.sparse,
                                          config.sparse_lr, single_writer)}
    for group in groups.values():
        if group.name not in by_group:
            by_group[group.name] = _scheduled(config, batch_size,
                                              group.optimizer, group.lr,
                                              single_writer)
    return by_group, {table: by_group[group.name]
                      for table, group in groups.items()}
