"""``psrec bench``: the measuring instrument.

Workload (the same as ``shared/bench/tutorial_baseline.py``, so the two can
be compared side by side in one run): 13 dense + 26 categorical features,
each hashed into ``buckets`` rows of one shared table of width ``dim``;
DCN-v2 with 2 cross layers + MLP 256-128-1; Adagrad; synthetic examples
generated a whole batch at a time inside tf.data on each worker (no disk).
The cluster is in-process like the baseline's; ``single_process`` runs the
same model and step with no cluster at all.
"""

from __future__ import annotations

import statistics
import time

import tensorflow as tf

from psrec.data.input.config import InputConfig
from psrec.data.input.dataset import PIPELINE_COLUMN
from psrec.features.spec.presets import criteo
from psrec.features.spec.spec import DENSE_COLUMN
from psrec.features.spec.spec import ID_COLUMN
from psrec.features.spec.spec import FeatureSpec
from psrec.launch.job.config import BenchConfig
from psrec.models.optim.config import OptimizerConfig
from psrec.models.ranking.config import ModelConfig
from psrec.models.ranking.config import model_config
from psrec.ps_cluster.cluster.in_process import in_process_cluster
from psrec.ps_cluster.cluster.partition_config import PartitionConfig
from psrec.ps_cluster.training.config import LoopConfig


def synthetic_dataset_fn(spec: FeatureSpec, batch_size: int,
                         on_ps_workers: bool, buckets: int | None = None,
                         offsets: list[int] | None = None):
    """Whole synthetic batches in the decoded-record format, per worker.

    Feature ``j``'s ids are ``offsets[j] + U[0, buckets)`` (default: the
    spec's hash buckets and row offsets). Each worker's stream is seeded by
    its own index (under ParameterServerStrategy every ``input_context``
    says pipeline 0, so that would give every worker the same batches)."""
    if buckets is None:
        buckets = spec.categorical[0].hash_buckets
    if offsets is None:
        offsets = [f.row_offset for f in spec.categorical]
    offsets = tf.constant(offsets, tf.int64)
    num_dense, num_sparse = len(spec.dense), len(spec.categorical)

    def dataset_fn(context: tf.distribute.InputContext | None = None):
        if on_ps_workers:
            pipeline = (tf.distribute.coordinator
                        .experimental_get_current_worker_index())
        else:
            pipeline = tf.constant(context.input_pipeline_id if context else 0,
                                   tf.int64)

        def batch(i):
            seed = tf.stack([i, pipeline])
            dense = tf.random.stateless_uniform([batch_size, num_dense],
                                                seed=seed)
            raw = tf.random.stateless_uniform(
                [batch_size, num_sparse], seed=seed + 1, maxval=buckets,
                dtype=tf.int64)
            logit = (tf.reduce_sum(dense, 1) - 6.5 + tf.reduce_sum(
                tf.cast(raw % 7 == 0, tf.float32), 1) - 3.7)
            label = tf.cast(tf.random.stateless_uniform(
                [batch_size], seed=seed + 2) < tf.sigmoid(logit), tf.float32)
            ids = raw + offsets
            return {DENSE_COLUMN: dense, spec.label.name: label,
                    ID_COLUMN: tf.zeros([batch_size], tf.int64),
                    PIPELINE_COLUMN: pipeline,
                    **{feature.name: ids[:, j]
                       for j, feature in enumerate(spec.categorical)}}

        return tf.data.Dataset.range(2 ** 62).map(
            batch, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
                tf.data.AUTOTUNE)

    return dataset_fn


def workload(config: BenchConfig) -> tuple[FeatureSpec, ModelConfig,
                                            OptimizerConfig]:
    """The bench's spec, model and optimizers (also
    ``benchmarks/repeated_train.py``'s)."""
    spec = criteo(buckets=config.buckets, dim=config.dim)
    model = model_config(config.model)
    optimizer = OptimizerConfig(sparse="adagrad", dense="adagrad",
                                sparse_lr=0.05, dense_lr=0.05,
                                base_batch_size=config.batch_size,
                                warmup_steps=0)
    return spec, model, optimizer


def _result(config: BenchConfig, seconds: float, closure_seconds: list[float],
            loss: float) -> dict:
    return {
        "examples_per_sec": round(config.steps * config.batch_size / seconds,
                                  1),
        "step_time_ms_p50": round(
            1000 * statistics.median(closure_seconds)
            / config.steps_per_closure, 3),
        "seconds": round(seconds, 3), "steps": config.steps,
        "batch_size": config.batch_size, "model": config.model,
        "workers": 0 if config.single_process else config.workers,
        "ps": 0 if config.single_process else config.ps,
        "steps_per_closure": config.steps_per_closure, "loss": loss,
    }


def _measure(config: BenchConfig, strategy, on_ps_workers: bool) -> dict:
    """Warm-up, then the timed run, of psrec's own trainer and step."""
    from psrec.ps_cluster.training.trainer import Trainer
    spec, model_cfg, optimizer_cfg = workload(config)
    trainer = Trainer(strategy, spec, model_cfg, optimizer_cfg,
                      InputConfig(batch_size=config.batch_size))
    dataset_fn = synthetic_dataset_fn(spec, config.batch_size,
                                       on_ps_workers)
    warm = max(config.steps_per_closure * 5, config.steps // 5)
    trainer.train(dataset_fn, LoopConfig(
        steps=warm, steps_per_closure=config.steps_per_closure,
        checkpoint_every=0))
    trainer.progress.step.assign(0)
    began = time.perf_counter()
    result = trainer.train(dataset_fn, LoopConfig(
        steps=config.steps, steps_per_closure=config.steps_per_closure,
        checkpoint_every=0))
    return _result(config, time.perf_counter() - began,
                   list(result.closure_seconds), result.final_loss)


def run_bench(config: BenchConfig) -> dict:
    """Runs the benchmark; returns the JSON-able result.

    ``step_time_ms_p50`` is the median, over closures, of a closure's wall
    time measured on its worker divided by its steps: the time of one
    training step on one worker, PS round trips included.
    """
    if config.single_process:  # the same model and step, no cluster
        return _measure(config, tf.distribute.get_strategy(), False)
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    strategy = build_ps_strategy(
        in_process_cluster(config.workers, config.ps), PartitionConfig())
    return _measure(config, strategy, True)
