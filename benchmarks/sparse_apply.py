"""The sparse update of one table, fused kernel against whole rows.

Times psrec's table optimizers (``models.optim``) applying one
``IndexedSlices`` gradient of ``--ids`` distinct random rows to a float32
``--rows`` x ``--dim`` table, two ways: ``single_writer=False`` (the
optimizer's own path: TensorFlow's fused sparse kernel, or row-wise
Adagrad's scatters; what a PS cluster runs) and ``single_writer=True``
(gather the rows and their slots' rows, update in float32, assign them
back: what one device and the mirrored strategies run). Each call applies
``--steps`` updates inside one ``tf.function``; the two ways alternate for
``--rounds`` rounds; prints ms per update, the median of the rounds with
their spread, and kernel / whole rows.

    python benchmarks/sparse_apply.py
    python benchmarks/sparse_apply.py --optimizers adagrad --rows 52000000
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from psrec.features.spec.columns import TABLE_OPTIMIZERS  # noqa: E402


def _apply_function(name: str, single_writer: bool, args):
    """A function applying ``--steps`` updates; returns its seconds."""
    import numpy as np
    import tensorflow as tf

    from psrec.models.optim.optimizers import make_optimizer
    table = tf.Variable(tf.zeros([args.rows, args.dim]))
    optimizer = make_optimizer(name, 0.05, single_writer=single_writer)
    optimizer._create_all_weights([table])  # noqa: SLF001
    rng = np.random.default_rng(0)
    ids = tf.constant(rng.choice(args.rows, args.ids, replace=False))
    grad = tf.constant(rng.normal(size=(args.ids, args.dim)), tf.float32)
    shape = tf.constant([args.rows, args.dim], tf.int64)

    @tf.function
    def steps():
        for _ in tf.range(args.steps):
            optimizer.apply_gradients([(tf.IndexedSlices(grad, ids, shape),
                                        table)])
        return tf.constant(0)

    def timed() -> float:
        began = time.perf_counter()
        steps().numpy()
        return time.perf_counter() - began
    timed()  # trace and warm up
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--optimizers", default=",".join(TABLE_OPTIMIZERS))
    parser.add_argument("--rows", type=int, default=2_600_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--ids", type=int, default=26_624,
                        help="distinct rows per update (bench: 26 x 1024)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print("| optimizer | fused kernel ms | whole rows ms | kernel / rows |")
    print("|---|---|---|---|")
    for name in args.optimizers.split(","):
        functions = {way: _apply_function(name, way, args)
                     for way in (False, True)}
        times: dict[bool, list[float]] = {False: [], True: []}
        for index in range(args.rounds):
            for way in ((False, True) if index % 2 == 0 else (True, False)):
                times[way].append(1000 * functions[way]() / args.steps)
        ratios = [k / r for k, r in zip(times[False], times[True])]

        def cell(values: list[float]) -> str:
            return (f"{statistics.median(values):.2f} "
                    f"[{min(values):.2f} to {max(values):.2f}]")
        print(f"| {name} | {cell(times[False])} | {cell(times[True])} | "
              f"{cell(ratios)} |", flush=True)
    print(f"({args.rows:,} x {args.dim} float32 table, {args.ids:,} distinct "
          f"rows per update, {args.rounds} rounds of {args.steps} updates)")


if __name__ == "__main__":
    main()
