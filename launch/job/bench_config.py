"""The arguments of ``psrec bench``: :class:`BenchConfig` (plain Python,
each field an option; ``psrec.options``)."""

from __future__ import annotations

import dataclasses

from psrec.data.input.config import InputConfig
from psrec.launch.job.config import JobConfig
from psrec.options import default_of
from psrec.options import option
from psrec.ps_cluster.training.config import LoopConfig


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """The workload and cluster ``psrec bench`` measures. The model, task
    counts, batch size and steps per closure default to the training job's
    (their one source, and their flags: the fields of ``JobConfig``,
    ``InputConfig`` and ``LoopConfig``)."""

    model: str = option(default_of(JobConfig, "model_name"),
                        help="named model configuration")
    workers: int = option(default_of(JobConfig, "workers"),
                          help="worker tasks")
    ps: int = option(default_of(JobConfig, "ps"), help="PS tasks")
    batch_size: int = option(default_of(InputConfig, "batch_size"),
                             help="global batch size (rows per step)")
    buckets: int = option(100_000, flag="--buckets",
                          help="hash buckets per synthetic table")
    dim: int = option(16, flag="--dim", help="embedding dimension")
    steps: int = option(
        300, flag="--steps",
        help="training steps (the run ends at this global step)")
    steps_per_closure: int = option(
        default_of(LoopConfig, "steps_per_closure"),
        help="training steps per scheduled closure (K)")
    single_process: bool = option(
        False, flag="--single-process",
        help="no cluster: train in this process (baseline)")
