"""What runs ``psrec plan``: the sharding planner, which uses TensorFlow's
partitioner (its parser: :mod:`psrec.launch.cli.plan`)."""

from __future__ import annotations

import argparse

from psrec.data.format.manifest import Manifest
from psrec.data.format.manifest import spec_for
from psrec.errors import EXIT_OK
from psrec.launch.cli.support import print_result
from psrec.models.ranking.config import model_config
from psrec.ps_cluster.planner.plan import check_plan
from psrec.ps_cluster.planner.plan import plan
from psrec.ps_cluster.planner.plan import plan_text


def run_plan(args: argparse.Namespace) -> int:
    spec = spec_for(Manifest.load(args.data) if args.data else None,
                    args.spec).with_table_dtype(args.table_dtype)
    result = plan(spec, model_config(args.model), args.ps,
                  optimizer=args.optimizer, shards=args.table_shards,
                  partitioner=args.partitioner, ps_memory=args.ps_memory)
    print_result(args, result, text=plan_text(result))
    check_plan(result)
    return EXIT_OK
