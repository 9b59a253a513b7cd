"""A fresh process for the dynamic-table reshard test: restores a checkpoint
of ``tests/test_dynamic_table.py`` into an in-process cluster of 1 worker +
3 PS (the test process has 2 PS) and prints, as one JSON line, the stats of
every dynamic table and the PS tasks the ``big`` table's shards live on.

Run as ``python -m tests._dynamic_helpers reshard-dynamic --checkpoint CKPT
--spec JSON`` from the repository root; ends with ``os._exit`` (in-process
servers cannot be stopped).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from psrec.runtime import configure_environment

configure_environment()

from psrec.data.dataset import InputConfig  # noqa: E402
from psrec.features.spec import FeatureSpec  # noqa: E402
from psrec.models.config import ModelConfig  # noqa: E402
from psrec.models.optim import OptimizerConfig  # noqa: E402
from psrec.ps_cluster.in_process import in_process_cluster  # noqa: E402
from psrec.ps_cluster.partitioning import PartitionConfig  # noqa: E402
from psrec.ps_cluster.strategy import build_ps_strategy  # noqa: E402
from psrec.ps_cluster.trainer import Trainer  # noqa: E402

MODEL = ModelConfig(interaction="concat", top_mlp=(8,), wide=True)


def _reshard(args: argparse.Namespace) -> dict:
    spec = FeatureSpec.from_dict(json.loads(args.spec))
    strategy = build_ps_strategy(in_process_cluster(1, 3),
                                 PartitionConfig(kind="fixed"))
    trainer = Trainer(strategy, spec, MODEL, OptimizerConfig(),
                      InputConfig(batch_size=64),
                      checkpoint_dir=Path(args.checkpoint).parent)
    trainer.keeper.restore(args.checkpoint)  # verified by value
    arch = trainer.model.sparse_arch
    out = {name: table.stats() for name, table in arch.dynamic_tables.items()}
    out["ps_devices"] = len({v.device for v in arch.tables["big"].variables})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("reshard-dynamic")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--spec", required=True)
    args = parser.parse_args()
    try:
        print(json.dumps(_reshard(args)), flush=True)
    except BaseException as error:  # noqa: BLE001 -- reported, then exit
        print(f"failed: {error!r}", file=sys.stderr, flush=True)
        os._exit(1)
    os._exit(0)


if __name__ == "__main__":
    main()
