"""The task arch: the shared representation -> one input per task's over
arch (``ModelConfig.task_towers``).

* ``shared-bottom``: every task's over arch reads the shared representation
  itself (no layer here).
* ``mmoe`` (Ma et al., KDD 2018): ``experts`` MLPs on the shared
  representation; each task mixes their outputs with its own softmax gate
  (a linear layer of the representation).
* ``ple`` (Tang et al., RecSys 2020, progressive layered extraction):
  ``ple_levels`` extraction levels, each with ``experts`` shared experts and
  ``task_experts`` experts per task; a task's gate mixes its own and the
  shared experts, and below the last level a shared gate mixes every expert
  into the next level's shared input. A task's input to a level is its own
  output of the level below (the shared representation at the first).

Parts are named by role: ``expert_<i>``, ``gate_<task>`` (MMoE);
``level_<l>``, ``shared_expert_<i>``, ``<task>_expert_<i>``,
``gate_<task>`` and ``shared_gate`` (PLE).
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf
import tf_keras

from psrec.models.ranking.blocks import MLP


def _mix(gate: tf_keras.layers.Dense, x: tf.Tensor,
         experts: list[tf.Tensor]) -> tf.Tensor:
    """The softmax-gated mixture of the ``experts``' outputs
    (``[B, units]`` each), the gate reading ``x``."""
    weights = tf.nn.softmax(gate(x), axis=-1)  # [B, E]
    stacked = tf.stack(experts, axis=1)  # [B, E, units]
    return tf.reduce_sum(stacked * tf.expand_dims(weights, -1), axis=1)


class MMoE(tf_keras.layers.Layer):
    """Shared experts, one softmax gate per task."""

    def __init__(self, tasks: Sequence[str], experts: int,
                 units: Sequence[int], batch_norm: str = "none",
                 **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.tasks = tuple(tasks)
        self.experts = [MLP(units, batch_norm=batch_norm, name=f"expert_{i}")
                        for i in range(experts)]
        self.gates = {task: tf_keras.layers.Dense(experts,
                                                  name=f"gate_{task}")
                      for task in self.tasks}

    def call(self, x: tf.Tensor, training=None) -> list[tf.Tensor]:
        outputs = [expert(x, training=training) for expert in self.experts]
        return [_mix(self.gates[task], x, outputs) for task in self.tasks]


class _ExtractionLevel(tf_keras.layers.Layer):
    """One PLE level: shared and per-task experts, a gate per task and
    (``last`` False) the shared gate feeding the next level."""

    def __init__(self, tasks: Sequence[str], experts: int, task_experts: int,
                 units: Sequence[int], batch_norm: str, last: bool,
                 **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.tasks = tuple(tasks)
        self.shared_experts = [
            MLP(units, batch_norm=batch_norm, name=f"shared_expert_{i}")
            for i in range(experts)]
        self.task_experts = {
            task: [MLP(units, batch_norm=batch_norm,
                       name=f"{task}_expert_{i}")
                   for i in range(task_experts)] for task in self.tasks}
        self.gates = {task: tf_keras.layers.Dense(
            task_experts + experts, name=f"gate_{task}")
            for task in self.tasks}
        self.shared_gate = None if last else tf_keras.layers.Dense(
            task_experts * len(self.tasks) + experts, name="shared_gate")

    def call(self, task_inputs: list[tf.Tensor], shared: tf.Tensor,
             training=None) -> tuple[list[tf.Tensor], tf.Tensor | None]:
        shared_out = [e(shared, training=training)
                      for e in self.shared_experts]
        own = {task: [e(x, training=training)
                      for e in self.task_experts[task]]
               for task, x in zip(self.tasks, task_inputs)}
        outputs = [_mix(self.gates[task], x, own[task] + shared_out)
                   for task, x in zip(self.tasks, task_inputs)]
        if self.shared_gate is None:
            return outputs, None
        every = [o for task in self.tasks for o in own[task]] + shared_out
        return outputs, _mix(self.shared_gate, shared, every)


class PLE(tf_keras.layers.Layer):
    """Progressive layered extraction: ``levels`` extraction levels."""

    def __init__(self, tasks: Sequence[str], experts: int, task_experts: int,
                 units: Sequence[int], levels: int, batch_norm: str = "none",
                 **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.tasks = tuple(tasks)
        self.levels = [
            _ExtractionLevel(self.tasks, experts, task_experts, units,
                             batch_norm, last=level == levels - 1,
                             name=f"level_{level}")
            for level in range(levels)]

    def call(self, x: tf.Tensor, training=None) -> list[tf.Tensor]:
        task_inputs, shared = [x] * len(self.tasks), x
        for level in self.levels:
            task_inputs, shared = level(task_inputs, shared,
                                        training=training)
        return task_inputs


def make_task_arch(config, tasks: Sequence[str]
                   ) -> tf_keras.layers.Layer | None:
    """The task arch of ``config.task_towers`` for ``tasks`` (None for
    ``shared-bottom``: the over arches read the shared representation)."""
    if config.task_towers == "mmoe":
        return MMoE(tasks, config.experts, config.expert_units,
                    config.batch_norm, name="task_arch")
    if config.task_towers == "ple":
        return PLE(tasks, config.experts, config.task_experts,
                   config.expert_units, config.ple_levels, config.batch_norm,
                   name="task_arch")
    return None
