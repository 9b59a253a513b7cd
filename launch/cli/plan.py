"""The parser of ``psrec plan`` (the bytes each PS task will hold: every
table shard and its optimizer slots, the partitioning and the largest
shard), ``--ps-memory``, and the same check that ``psrec train
--ps-memory`` runs before any server starts. What runs ``psrec plan`` is
:mod:`psrec.launch.cli.plan_run`, imported only when it runs."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from psrec.launch.cli.argtypes import SIZE_HELP
from psrec.launch.cli.argtypes import byte_size
from psrec.launch.cli.argtypes import positive
from psrec.launch.cli.options import add_option
from psrec.launch.cli.support import add_json_flag
from psrec.launch.cli.support import add_model_flag
from psrec.launch.cli.support import add_spec_and_data_flags
from psrec.launch.job.config import JobConfig
from psrec.launch.job.config import StrategyConfig
from psrec.models.optim.config import SPARSE_OPTIMIZERS
from psrec.models.optim.config import OptimizerConfig
from psrec.models.optim.config import slot_text
from psrec.options import default_of
from psrec.ps_cluster.cluster.partition_config import PartitionConfig

if TYPE_CHECKING:
    from psrec.ps_cluster.cluster.tf_config import ClusterSpec

def add_ps_memory_flag(group: argparse._ActionsContainer) -> None:
    """``--ps-memory SIZE``: the budget of one PS task's variables."""
    add_option(group, StrategyConfig, "ps_memory", type=byte_size,
               help="refuse (exit 2, naming the smallest PS count that fits) "
               "when one PS task would hold more than this of table shards, "
               "their optimizer slots and the dense weights; see `psrec "
               "plan`. " + SIZE_HELP)


def check_ps_memory(config: JobConfig, cluster: ClusterSpec | None = None
                    ) -> None:
    """The plan of ``config`` on the PS tasks of ``cluster`` (None: the
    ``config.ps`` local ones) fits ``config.strategy.ps_memory`` (no
    budget: nothing to check), else a PsMemoryError (exit 2). Runs before
    any server starts."""
    if config.strategy.ps_memory is None:
        return
    # Imported here, not at the top: cli/train.py builds ``psrec train``'s
    # parser from this module, so it must not import TensorFlow (the
    # planner does); this check belongs with what runs ``psrec train``.
    from psrec.ps_cluster.planner import plan as planner
    num_ps = config.ps if cluster is None else cluster.num_ps
    model = config.retrieval or config.model  # the task's model
    result = planner.check_plan(planner.plan_partition(
        config.spec, model, num_ps, config.optimizer, config.partition,
        config.strategy.ps_memory))
    print(f"psrec train: PS memory plan: at most "
          f"{planner.format_bytes(result.max_ps_bytes)} on one of {num_ps} PS "
          f"(--ps-memory {planner.format_bytes(result.ps_memory)})",
          file=sys.stderr, flush=True)


def add_plan(sub: argparse._SubParsersAction, name: str
             ) -> argparse.ArgumentParser:
    """``psrec plan``: bytes per PS task, refused over ``--ps-memory``."""
    p = sub.add_parser(
        name, help="bytes per PS task of every table shard and its "
        "optimizer slots; refuse a plan over --ps-memory",
        description="Plan how --strategy ps shards the embedding tables: "
        "the shards and rows of each table as the partitioner cuts them, "
        "the PS task holding each (round-robin, as ParameterServerStrategy "
        "places them), bytes per PS with the optimizer slots and the dense "
        "weights, and the largest shard. With --ps-memory, exit 2 naming "
        "the smallest PS count that fits when a PS task would exceed it.")
    model = p.add_argument_group("model")
    add_spec_and_data_flags(model, spec_beside_data="", data="its spec")
    add_model_flag(model)
    model.add_argument("--optimizer", choices=SPARSE_OPTIMIZERS,
                       default=default_of(OptimizerConfig, "sparse"),
                       help="the optimizer of the tables whose spec names "
                       "none (a table's `optimizer`): its slots (" + ", ".join(
                           slot_text(name)
                           for name in SPARSE_OPTIMIZERS) + " per table "
                       "value, or per row)")
    add_option(model, JobConfig, "table_dtype")
    cluster = p.add_argument_group("cluster")
    cluster.add_argument("--ps", type=positive, required=True,
                         help="number of parameter-server tasks")
    add_option(cluster, PartitionConfig, "kind",
               help="how embedding tables are split across PS tasks (as "
               "`psrec train --partitioner`)")
    add_option(cluster, PartitionConfig, "shards", type=positive)
    add_ps_memory_flag(cluster)
    add_json_flag(p.add_argument_group("output"))
    return p


def check_plan_inputs(args: argparse.Namespace) -> None:
    """What ``psrec plan`` refuses before its run imports TensorFlow: a
    missing manifest (``--data``) or spec (``--spec``)."""
    from psrec.data.format.manifest import Manifest
    from psrec.data.format.manifest import spec_for
    spec_for(Manifest.load(args.data) if args.data else None, args.spec)
