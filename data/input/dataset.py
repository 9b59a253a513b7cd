"""Input functions: per-worker training data and exactly-once eval data.

``make_train_dataset_fn`` returns the ``dataset_fn(input_context)`` that
``ClusterCoordinator.create_per_worker_dataset`` and
``distribute_datasets_from_function`` call once per input pipeline; the
sharding **by file** and the pipeline's stages: ``docs/data.md``
("Per-worker input"). Each file is tagged with its epoch, and every row
carries it (:data:`EPOCH_COLUMN`) so the coordinator can count which train
rows each epoch visited.

Two input modes (``InputConfig.mode``):

* ``static``: the files are split by worker index once; a worker that is
  lost takes its files with it (nobody else reads them), and a restarted
  worker starts its files again.
* ``data-service``: the tf.data service
  (:mod:`psrec.ps_cluster.training.data_service`) hands out one file (of
  one epoch) at a time to whichever tf.data worker asks next, and the
  training workers all consume one shared job, so a lost training
  worker's unread share is read by the others; what it (and the pipelines
  feeding it) held at that moment is not re-read (at-most-once).
"""

from __future__ import annotations

from typing import Callable
from typing import Sequence

import tensorflow as tf

from psrec.data.format.manifest import Manifest
from psrec.data.format.records import ROWS_KEY
from psrec.data.format.records import decode_blocks
from psrec.data.input.config import InputConfig
from psrec.errors import ConfigError
from psrec.errors import check
from psrec.features.spec.spec import ID_COLUMN
from psrec.features.spec.spec import FeatureSpec

Batch = dict[str, tf.Tensor]
# A scalar in every training batch: the input pipeline (worker) it came from.
PIPELINE_COLUMN = "psrec__pipeline"
# A vector in every training batch: the epoch (0-based) of each row.
EPOCH_COLUMN = "psrec__epoch"
DatasetFn = Callable[[tf.distribute.InputContext | None], tf.data.Dataset]


class NotEnoughShardsError(ConfigError):
    """There are fewer shard files than input pipelines."""


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


def _epoch_files(files: tf.Tensor, count: tf.Tensor, seed: tf.Tensor,
                 first_epoch: int, epochs: int | None) -> tf.data.Dataset:
    """``(epoch, file)`` for epoch ``first_epoch`` on: every file of
    ``files[:count]`` once per epoch, in an order drawn from ``(seed,
    epoch)``. A range source, so the tf.data service can hand it out one
    element (one file of one epoch) at a time."""
    count = tf.cast(count, tf.int64)
    start = first_epoch * count
    stop = (tf.constant(2 ** 62, tf.int64) if epochs is None
            else (first_epoch + epochs) * count)

    def pick(i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        epoch = i // count
        j = tf.random.experimental.index_shuffle(
            i % count, tf.stack([seed, epoch]), count - 1)
        return epoch, tf.gather(files, j)

    return tf.data.Dataset.range(start, stop).map(pick)


def _tagged_records(epoch: tf.Tensor, path: tf.Tensor) -> tf.data.Dataset:
    return tf.data.TFRecordDataset(path).map(lambda record: (record, epoch))


def _parse_and_mix(spec: FeatureSpec, seed: tf.Tensor) -> Callable:
    def parse(records: tf.Tensor, epochs: tf.Tensor) -> Batch:
        batch = decode_blocks(records, spec)
        # The first row's id seeds the row order: deterministic, and a
        # source-free dataset (the tf.data service splits its one source).
        index = batch[ID_COLUMN][0]
        per_record = tf.io.parse_example(
            records, {ROWS_KEY: tf.io.FixedLenFeature([1], tf.int64)})
        batch[EPOCH_COLUMN] = tf.repeat(
            epochs, tf.reshape(per_record[ROWS_KEY], [-1]))
        rows = tf.shape(batch[spec.label.name])[0]
        order = tf.random.experimental.stateless_shuffle(
            tf.range(rows), seed=tf.stack([seed, index]))
        return {name: tf.gather(value, order) for name, value in batch.items()}
    return parse


def make_train_dataset_fn(manifest: Manifest, spec: FeatureSpec,
                          config: InputConfig, *, epochs: int | None = None,
                          split: str = "train",
                          ps_workers: int | None = None,
                          data_service: str | None = None,
                          job_name: str = "psrec-train",
                          first_epoch: int = 0) -> DatasetFn:
    """Returns ``dataset_fn(input_context)`` for training.

    Under ``ParameterServerStrategy`` every worker's ``input_context`` says
    1 pipeline, id 0 (there is no synchronisation between workers), so
    sharding by it would make every worker read every file. With
    ``ps_workers`` set, the pipeline is instead the worker's own index,
    ``tf.distribute.coordinator.experimental_get_current_worker_index()``,
    a value bound when the dataset is created on that worker.

    Args:
      spec: the feature spec (must match the manifest's spec hash).
      epochs: None repeats forever (training); a number gives a finite
        stream with the last partial batch kept (audits).
      ps_workers: number of PS-strategy workers (see above); None shards by
        ``input_context`` (mirrored strategies, audits, single process).
      data_service: the tf.data service dispatcher (``grpc://host:port``)
        when ``config.mode`` is ``data-service``: every pipeline then reads
        the one shared job ``job_name`` of the whole train split.
      first_epoch: the epoch the stream starts at (a resumed run starts at
        the epoch of its step, so its rows are tagged with that epoch).
    """
    files = manifest.files(split)
    block_rows = manifest.block_rows
    drop_remainder = epochs is None
    serviced = config.mode == "data-service"
    # At most a quarter of one reader's records of an epoch: a buffer that
    # holds more mixes epochs (a row seen twice in a row, the next epoch
    # started before this one ended).
    readers = ps_workers or 1
    shuffle = max(1, min(config.shuffle_records, -(-manifest.rows(split)
                                                  // block_rows)
                         // readers // 4))
    check(not serviced or data_service is not None, "InputConfig.mode",
          config.mode, "needs a tf.data service dispatcher address")
    if ps_workers is not None and not serviced:
        shard_files(files, ps_workers, 0)  # fail early, on the coordinator

    def dataset_fn(context: tf.distribute.InputContext | None = None
                   ) -> tf.data.Dataset:
        batch_size = (context.get_per_replica_batch_size(config.batch_size)
                      if context else config.batch_size)
        if serviced:  # one job over every file, whoever consumes it
            pipelines, index = 1, 0
        elif ps_workers is not None:
            pipelines = ps_workers
            index = tf.cast(tf.distribute.coordinator
                            .experimental_get_current_worker_index(),
                            tf.int64)
        else:
            pipelines = context.num_input_pipelines if context else 1
            index = context.input_pipeline_id if context else 0
        if isinstance(index, int):
            mine = tf.constant(shard_files(files, pipelines, index))
            pipeline = tf.constant(index, tf.int64)
        else:
            mine = tf.gather(files, tf.range(index, len(files), pipelines))
            pipeline = index
        most = -(-len(files) // pipelines)
        seed = tf.constant(config.seed, tf.int64) * 1000 + pipeline
        dataset = _epoch_files(mine, tf.size(mine), seed, first_epoch,
                               epochs)
        # Under the service each tf.data worker reads one (epoch, file) at
        # a time: with a wider cycle the workers held workers x cycle files
        # open (a whole epoch of the demo's 8), which mixed epochs past the
        # coverage judge's two-epoch horizon (a false "not visited"
        # warning in `make demo`) and made a lost tf.data worker lose more.
        cycle = 1 if serviced else min(config.cycle_length, most)
        dataset = dataset.interleave(
            _tagged_records, cycle_length=cycle,
            block_length=1, num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True)
        dataset = dataset.shuffle(shuffle, seed=config.seed,
                                  reshuffle_each_iteration=True)
        dataset = dataset.batch(_records_per_parse(batch_size, block_rows))
        dataset = dataset.map(
            _parse_and_mix(spec, seed), num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True)
        dataset = dataset.rebatch(batch_size, drop_remainder=drop_remainder)
        if serviced:
            return _distributed(dataset, data_service, job_name)
        tag = tf.cast(pipeline, tf.int64)
        dataset = dataset.map(lambda batch: {**batch, PIPELINE_COLUMN: tag})
        return dataset.prefetch(tf.data.AUTOTUNE)

    return dataset_fn


def _distributed(dataset: tf.data.Dataset, service: str, job_name: str
                 ) -> tf.data.Dataset:
    """``dataset`` read through the tf.data service: the dispatcher hands
    its source's elements (one file of one epoch each) to the tf.data
    workers as they ask (``DYNAMIC``); every consumer of ``job_name`` reads
    the one shared job; the batch is tagged with the consuming worker's index.

    ``max_outstanding_requests`` stays TensorFlow's (autotuned): a fixed
    limit made a killed training worker lose fewer rows, but after a restart
    of the tf.data service process requests wait on the dead tf.data
    workers' tasks, which the recovered dispatcher still lists, and training
    crawled (tests/test_data_service.py).
    """
    dataset = dataset.apply(tf.data.experimental.service.distribute(
        processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
        service=service, job_name=job_name))
    try:
        worker = tf.cast(tf.distribute.coordinator
                         .experimental_get_current_worker_index(), tf.int64)
    except (RuntimeError, ValueError):  # not on a PS worker
        worker = tf.constant(0, tf.int64)
    return dataset.map(lambda batch: {**batch, PIPELINE_COLUMN: worker})


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
