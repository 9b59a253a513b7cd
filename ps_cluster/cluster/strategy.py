"""Building the distribution strategy of a job, whichever kind it is.

=========================  ================================================
``ps``                     ``ParameterServerStrategy`` over a cluster: tables
                           sharded across PS tasks by the partitioner, dense
                           towers on workers (their GPUs when visible); the
                           coordinator (this process) schedules closures.
``mirrored``               ``MirroredStrategy`` over the local GPUs, else
                           the (optionally split) CPU; all-reduce.
``multi-worker-mirrored``  ``MultiWorkerMirroredStrategy`` over the workers
                           of ``TF_CONFIG``; every worker runs the job.
``one-device``             ``OneDeviceStrategy`` on the first GPU, else CPU.
=========================  ================================================
"""

from __future__ import annotations

import tensorflow as tf

from psrec.errors import ConfigError
from psrec.errors import check
from psrec.errors import check_choice
from psrec.ps_cluster.cluster.partition_config import PartitionConfig
from psrec.ps_cluster.cluster.partitioning import TablePartitioner
from psrec.ps_cluster.cluster.tf_config import ClusterSpec
from psrec.ps_cluster.cluster.tf_config import TFConfig

STRATEGIES = ("ps", "mirrored", "multi-worker-mirrored", "one-device")
REPLICATED = ("mirrored", "multi-worker-mirrored", "one-device")
COLLECTIVES = ("auto", "ring", "nccl")


class StrategyError(ConfigError):
    """A strategy option is invalid here; names it and the value."""


def build_ps_strategy(cluster: ClusterSpec,
                      partition: PartitionConfig = PartitionConfig()
                      ) -> tf.distribute.ParameterServerStrategy:
    """A PS strategy over ``cluster`` whose tables shard per ``partition``.

    The coordinator (this process) joins the cluster as the ``chief`` job;
    a ``chief`` address in ``cluster`` is not needed (it serves nothing).
    """
    cluster.validate(strategy="ps", allow_remote=True)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster.to_tf_cluster_dict()), rpc_layer="grpc")
    return tf.distribute.ParameterServerStrategy(
        resolver,
        variable_partitioner=TablePartitioner(partition, cluster.num_ps))


def split_cpu(count: int) -> list[str]:
    """Splits the host CPU into ``count`` logical devices (tests, and
    CPU-only machines that want several replicas). Must run before
    TensorFlow initializes its devices.

    Raises:
      StrategyError: ``count`` < 1, or devices already initialized.
    """
    check(count >= 1, "StrategyConfig.cpu_replicas", count, "must be >= 1",
          StrategyError)
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError as error:
        current = len(tf.config.list_logical_devices("CPU"))
        if current != count:
            raise StrategyError(
                f"`StrategyConfig.cpu_replicas` = {count} cannot apply: TensorFlow already "
                f"initialized {current} CPU device(s) in this process; split "
                "the CPU before any other TensorFlow call (e.g. in a fresh "
                "process).") from error
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def has_gpu() -> bool:
    return bool(tf.config.list_physical_devices("GPU"))


def precision_policy(mixed_precision: bool) -> str:
    """``mixed_float16`` with a GPU, ``mixed_bfloat16`` on CPU, or
    ``float32``. Under PS it is the workers' hardware that counts; psrec
    assumes the coordinator sees the same kind of device as its workers."""
    if not mixed_precision:
        return "float32"
    return "mixed_float16" if has_gpu() else "mixed_bfloat16"


def _check_collective(strategy: str, collective: str) -> None:
    check_choice("StrategyConfig.collective", collective, COLLECTIVES,
                 StrategyError)
    if collective == "nccl" and not has_gpu():
        raise StrategyError(
            "`StrategyConfig.collective` = 'nccl' needs GPUs and this machine "
            "has none; use auto or ring.")
    if strategy == "mirrored" and collective == "ring":
        raise StrategyError(
            "`StrategyConfig.collective` = 'ring' selects the collective "
            "implementation of multi-worker-mirrored; with mirrored "
            "use auto (NCCL on GPUs, collective all-reduce on CPU) or nccl.")


def build_replicated_strategy(kind: str, collective: str = "auto",
                              tf_config: TFConfig | None = None,
                              allow_remote: bool = False
                              ) -> tf.distribute.Strategy:
    """The strategy of ``--strategy mirrored|multi-worker-mirrored|
    one-device``. ``multi-worker-mirrored`` uses the cluster and task of
    ``tf_config`` (default: ``TF_CONFIG``); create it before any other
    TensorFlow op of the process.

    Raises:
      StrategyError: bad kind/collective, or no TF_CONFIG task.
      ClusterSpecError: an invalid or unsafe cluster.
    """
    check_choice("StrategyConfig.kind", kind, REPLICATED, StrategyError)
    _check_collective(kind, collective)
    if kind == "one-device":
        gpus = tf.config.list_logical_devices("GPU")
        return tf.distribute.OneDeviceStrategy(
            gpus[0].name if gpus else "/cpu:0")
    if kind == "mirrored":
        devices = None
        if not has_gpu():
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
        ops = tf.distribute.NcclAllReduce() if collective == "nccl" else None
        return tf.distribute.MirroredStrategy(devices=devices,
                                              cross_device_ops=ops)
    config = tf_config or TFConfig.from_env()
    if config is None or config.task is None:
        raise StrategyError(
            "--strategy multi-worker-mirrored needs TF_CONFIG with this "
            "worker's task (each worker runs the same command with its own "
            "TF_CONFIG; `psrec tf-config` writes them), or no TF_CONFIG to "
            "start local workers.")
    config.validate(strategy="multi-worker-mirrored",
                    allow_remote=allow_remote)
    implementation = tf.distribute.experimental.CommunicationImplementation
    options = tf.distribute.experimental.CommunicationOptions(
        implementation={"auto": implementation.AUTO,
                        "ring": implementation.RING,
                        "nccl": implementation.NCCL}[collective])
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(config.cluster.to_tf_cluster_dict()),
        task_type=config.to_dict()["task"]["type"],
        task_id=config.task.index, rpc_layer="grpc")
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver, communication_options=options)


def cluster_resolver(strategy):
    """``strategy``'s cluster resolver, None without one.
    ParameterServerStrategy keeps its resolver on the strategy, not on
    ``extended`` where the public property looks (TF 2.21)."""
    return (getattr(strategy, "cluster_resolver", None)
            or getattr(strategy, "_cluster_resolver", None))


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """The chief writes checkpoints: the ``chief`` task, else worker 0; the
    coordinator under PS, and the only process of the local strategies."""
    if isinstance(strategy, tf.distribute.ParameterServerStrategy):
        return True
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    if resolver.task_type == "chief":
        return True
    jobs = resolver.cluster_spec().as_dict()
    return (resolver.task_type == "worker" and resolver.task_id == 0
            and "chief" not in jobs)


def local_replicas_sharing_memory(strategy: tf.distribute.Strategy) -> int:
    """Replicas of this worker whose copies share one memory: all local
    CPU replicas (logical devices share the host RAM), else 1."""
    devices = strategy.extended.worker_devices
    return len(devices) if all("CPU" in d.upper() for d in devices) else 1
