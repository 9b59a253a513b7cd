"""How long the first result of a second ``train()`` on one trainer takes.

The ``psrec bench`` workload on its in-process cluster (2 workers, 1 PS):
a warm-up ``train()`` of 60 steps, then ``--calls`` more ``train()`` calls
of ``--steps`` steps each on the same trainer (the step counter reset
before each, as ``psrec bench`` does for its timed run). Prints, per call,
its wall seconds and the seconds until its first result arrived: what a
call pays before its first closure has run (tracing the train function,
making the per-worker datasets) shows there::

    TF_USE_LEGACY_KERAS=1 python benchmarks/repeated_train.py --calls 4
"""

from __future__ import annotations

import argparse
import json
import time

from psrec.data.input.config import InputConfig
from psrec.launch.job.bench import synthetic_dataset_fn
from psrec.launch.job.bench import workload
from psrec.launch.job.config import BenchConfig
from psrec.ps_cluster.cluster.in_process import in_process_cluster
from psrec.ps_cluster.cluster.partition_config import PartitionConfig
from psrec.ps_cluster.cluster.strategy import build_ps_strategy
from psrec.ps_cluster.training.config import LoopConfig
from psrec.ps_cluster.training.trainer import Trainer


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    config = BenchConfig()
    spec, model, optimizer = workload(config)
    strategy = build_ps_strategy(in_process_cluster(config.workers,
                                                    config.ps),
                                 PartitionConfig())
    trainer = Trainer(strategy, spec, model, optimizer,
                      InputConfig(batch_size=config.batch_size))
    dataset_fn = synthetic_dataset_fn(spec, config.batch_size, True)
    trainer.train(dataset_fn, LoopConfig(
        steps=60, steps_per_closure=config.steps_per_closure,
        checkpoint_every=0))
    for call in range(args.calls):
        trainer.progress.step.assign(0)
        first: list[float] = []
        began = time.perf_counter()

        def on_progress(step, loss, examples, began=began, first=first):
            if not first:
                first.append(time.perf_counter() - began)
        trainer.train(dataset_fn, LoopConfig(
            steps=args.steps, steps_per_closure=config.steps_per_closure,
            checkpoint_every=0), on_progress=on_progress)
        print(json.dumps({"call": call + 1, "seconds": round(
            time.perf_counter() - began, 2), "first_result_seconds": round(
                first[0], 2)}), flush=True)


if __name__ == "__main__":
    _main()
