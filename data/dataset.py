"""Input functions: per-worker training data and exactly-once eval data.

``make_train_dataset_fn`` returns the ``dataset_fn(input_context)`` that
``ClusterCoordinator.create_per_worker_dataset`` and
``distribute_datasets_from_function`` call once per input pipeline. Files are
sharded **by file** across pipelines: each pipeline reads only its own
shards (never every worker reading every file -- the classic failure where
loss jumps when going from 1 to 4 workers).

Pipeline: shard files -> shuffle files (seeded) -> repeat -> interleave
records -> shuffle records (seeded) -> batch block records -> parse the
batch (vectorised) and shuffle its rows (stateless, seeded) -> rebatch to the
per-replica batch size -> prefetch.
"""

from __future__ import annotations

import dataclasses
from typing import Callable
from typing import Sequence

import tensorflow as tf

from psrec.data.manifest import Manifest
from psrec.data.records import decode_blocks
from psrec.errors import ConfigError
from psrec.errors import check_at_least
from psrec.features.spec import FeatureSpec

Batch = dict[str, tf.Tensor]
# A scalar in every training batch: the input pipeline (worker) it came from.
PIPELINE_COLUMN = "psrec__pipeline"
DatasetFn = Callable[[tf.distribute.InputContext | None], tf.data.Dataset]


class NotEnoughShardsError(ConfigError):
    """There are fewer shard files than input pipelines."""


@dataclasses.dataclass(frozen=True)
class InputConfig:
    """How training data is read.

    Attributes:
      batch_size: global batch size (rows per step across all replicas in
        sync; under parameter servers every worker step uses the full batch
        since each replica group is one worker).
      shuffle_records: shuffle buffer, in block records (x block_rows rows).
      cycle_length: files read in parallel by one pipeline.
      seed: shuffle seed; resumed runs pass a different seed offset so the
        same order is not replayed.
    """

    batch_size: int = 1024
    shuffle_records: int = 64
    cycle_length: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        check_at_least(self, 1, "batch_size", "shuffle_records",
                       "cycle_length")


def shard_files(files: Sequence[str], num_pipelines: int,
                pipeline_id: int) -> list[str]:
    """The files of one input pipeline: every ``num_pipelines``-th file.

    Raises:
      NotEnoughShardsError: when there are fewer files than pipelines (some
        pipeline would get nothing, or every pipeline everything).
    """
    if len(files) < num_pipelines:
        raise NotEnoughShardsError(
            f"{len(files)} shard file(s) cannot feed {num_pipelines} input "
            f"pipelines without overlap; convert with `--shards "
            f"{num_pipelines}` (or a multiple of it) so that every pipeline "
            "reads its own files.")
    return list(files[pipeline_id::num_pipelines])


def _records_per_parse(batch_size: int, block_rows: int) -> int:
    # Parse enough blocks to fill a batch, and at least 4 so that the row
    # shuffle mixes blocks from different places of the stream.
    return max(4, -(-batch_size // block_rows))


def _parse_and_mix(spec: FeatureSpec, seed: tf.Tensor) -> Callable:
    def parse(index: tf.Tensor, records: tf.Tensor) -> Batch:
        batch = decode_blocks(records, spec)
        rows = tf.shape(batch[spec.label.name])[0]
        order = tf.random.experimental.stateless_shuffle(
            tf.range(rows), seed=tf.stack([seed, index]))
        return {name: tf.gather(value, order) for name, value in batch.items()}
    return parse


def make_train_dataset_fn(manifest: Manifest, spec: FeatureSpec,
                          config: InputConfig, *, epochs: int | None = None,
                          split: str = "train",
                          ps_workers: int | None = None) -> DatasetFn:
    """Returns ``dataset_fn(input_context)`` for training.

    Under ``ParameterServerStrategy`` every worker's ``input_context`` says
    1 pipeline, id 0 (there is no synchronisation between workers), so
    sharding by it would make every worker read every file. With
    ``ps_workers`` set, the pipeline is instead the worker's own index,
    ``tf.distribute.coordinator.experimental_get_current_worker_index()``,
    a value bound when the dataset is created on that worker.

    Args:
      manifest: the converted data.
      spec: the feature spec (must match the manifest's spec hash).
      config: batch size, shuffling, seed.
      epochs: None repeats forever (training); a number gives a finite
        stream with the last partial batch kept (audits).
      split: which split to read.
      ps_workers: number of PS-strategy workers (see above); None shards by
        ``input_context`` (mirrored strategies, audits, single process).
    """
    files = manifest.files(split)
    block_rows = manifest.block_rows
    drop_remainder = epochs is None
    if ps_workers is not None:
        shard_files(files, ps_workers, 0)  # fail early, on the coordinator

    def dataset_fn(context: tf.distribute.InputContext | None = None
                   ) -> tf.data.Dataset:
        batch_size = (context.get_per_replica_batch_size(config.batch_size)
                      if context else config.batch_size)
        if ps_workers is not None:
            pipelines = ps_workers
            pipeline = tf.distribute.coordinator.experimental_get_current_worker_index()
            dataset = tf.data.Dataset.from_tensor_slices(files).shard(
                pipelines, pipeline)
            most = -(-len(files) // pipelines)
        else:
            pipelines = context.num_input_pipelines if context else 1
            index = context.input_pipeline_id if context else 0
            mine = shard_files(files, pipelines, index)
            pipeline = tf.constant(index, tf.int64)
            dataset = tf.data.Dataset.from_tensor_slices(mine)
            most = len(mine)
        seed = tf.constant(config.seed, tf.int64) * 1000 + tf.cast(
            pipeline, tf.int64)
        dataset = dataset.shuffle(most, seed=config.seed,
                                  reshuffle_each_iteration=True)
        dataset = dataset.repeat(epochs)
        dataset = dataset.interleave(
            tf.data.TFRecordDataset, cycle_length=min(config.cycle_length,
                                                      most),
            block_length=1, num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True)
        dataset = dataset.shuffle(config.shuffle_records, seed=config.seed,
                                  reshuffle_each_iteration=True)
        dataset = dataset.batch(_records_per_parse(batch_size, block_rows))
        dataset = dataset.enumerate().map(
            _parse_and_mix(spec, seed), num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True)
        dataset = dataset.rebatch(batch_size, drop_remainder=drop_remainder)
        tag = tf.cast(pipeline, tf.int64)
        dataset = dataset.map(lambda batch: {**batch, PIPELINE_COLUMN: tag})
        return dataset.prefetch(tf.data.AUTOTUNE)

    return dataset_fn


def make_eval_dataset(files: Sequence[str], spec: FeatureSpec,
                      batch_size: int, block_rows: int) -> tf.data.Dataset:
    """Every example of ``files`` exactly once, in file order.

    Works both eagerly and inside a ``tf.function`` (files may be a string
    tensor), which is how the coordinator evaluates one shard per closure.
    """
    dataset = tf.data.TFRecordDataset(files)
    dataset = dataset.batch(_records_per_parse(batch_size, block_rows))
    dataset = dataset.map(lambda records: decode_blocks(records, spec),
                          num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=True)
    return dataset.rebatch(batch_size, drop_remainder=False).prefetch(
        tf.data.AUTOTUNE)
