"""Size guard of the replicated (mirrored) path.

Under ``MirroredStrategy`` / ``MultiWorkerMirroredStrategy`` every device
holds a full copy of every embedding table and of the optimizer slots. Before
anything is built, :func:`estimate_replicated_bytes` adds up, per device:

* tables: ``rows * dim * 4`` bytes per table, 2 for a 16-bit one (plus
  the ``[rows, 1]`` wide tables of DeepFM / Wide & Deep);
* table slots: the slots of each table's optimizer -- the one its spec
  names, else ``--sparse-optimizer`` -- (``models.optim.config``'s
  ``slot_values``): table-sized ones (Adagrad 1, FTRL 2, SGD 0) and
  one-value-per-row ones (row-wise Adagrad: ``rows * 4`` bytes per table),
  float32 whatever the table's dtype;
* dense weights and their slots (Adam 2, Adagrad 1, SGD 0).

:func:`check_fits` compares the sum with ``memory_fraction`` of the memory
of one device (:func:`device_memory_bytes`) and raises
:class:`ModelTooLargeError` -- naming the size and recommending
``--strategy ps`` -- when it does not fit. The rest of the device is left to
activations, gradients, the all-reduce buffers and the input pipeline.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess

from psrec.errors import ConfigError
from psrec.errors import check
from psrec.errors import check_choice
from psrec.features.spec.dynamic import DYNAMIC_DEFAULTS
from psrec.features.spec.spec import FeatureSpec
from psrec.models.optim.config import SLOT_VALUE_BYTES
from psrec.models.optim.config import OptimizerConfig
from psrec.models.optim.config import slot_values
from psrec.models.optim.config import slots
from psrec.models.optim.config import table_groups
from psrec.models.ranking.config import ModelConfig

GIB = float(1 << 30)
#: The size guard's share of one device's memory, unless told otherwise
#: (``StrategyConfig.memory_fraction``, ``psrec advise``).
DEFAULT_MEMORY_FRACTION = 0.5


class ModelTooLargeError(ConfigError):
    """The replicated tables and slots do not fit the device memory budget."""


@dataclasses.dataclass(frozen=True)
class SizeEstimate:
    """Bytes one replica of the model needs (float32 variables)."""

    table_bytes: int
    table_slot_bytes: int
    dense_bytes: int
    dense_slot_bytes: int

    @property
    def total_bytes(self) -> int:
        return (self.table_bytes + self.table_slot_bytes + self.dense_bytes
                + self.dense_slot_bytes)

    def text(self) -> str:
        return (f"{self.total_bytes / GIB:.3f} GiB per replica (tables "
                f"{self.table_bytes / GIB:.3f} GiB + their slots "
                f"{self.table_slot_bytes / GIB:.3f} GiB, dense "
                f"{self.dense_bytes / GIB:.4f} GiB + slots "
                f"{self.dense_slot_bytes / GIB:.4f} GiB)")


def proxy_spec(spec: FeatureSpec, max_ids: int = 1) -> FeatureSpec:
    """The same features with at most ``max_ids`` ids per categorical
    feature (hashed, packed one after another into small tables).

    The dense part of a model does not depend on table rows, so a model
    built from this spec has the same dense weights and the same per-step
    compute as the real one without allocating the real tables.
    """
    check(max_ids >= 1, "max_ids", max_ids, "must be >= 1")
    next_row = {t.name: 0 for t in spec.tables}
    features = []
    for feature in spec.categorical:
        if feature.history is not None:  # in its item's rows, as before
            features.append(dataclasses.replace(
                feature, hash_buckets=None, vocabulary_file=None,
                row_offset=None, raw_ids=False))
            continue
        ids = min(max_ids, feature.hash_buckets or max_ids)
        features.append(dataclasses.replace(
            feature, hash_buckets=ids, vocabulary_file=None,
            row_offset=next_row[feature.table], share=None, raw_ids=False))
        next_row[feature.table] += ids
    hashed = {"mode": "hashed", **DYNAMIC_DEFAULTS}  # dynamic tables too
    tables = tuple(dataclasses.replace(t, rows=max(1, next_row[t.name]),
                                       **hashed) for t in spec.tables)
    return dataclasses.replace(spec, categorical=tuple(features),
                               tables=tables)


def dense_parameter_count(spec: FeatureSpec, model: ModelConfig) -> int:
    """Trainable weights outside the tables, counted on a model built from
    :func:`proxy_spec` in a throw-away graph (no device is initialized and
    no real table is allocated). ``model`` may also be a two-tower
    ``RetrievalConfig`` (``models.build``)."""
    import tensorflow as tf

    from psrec.models.build import build_model
    from psrec.models.ranking.model import count_parameters
    with tf.Graph().as_default():
        built = build_model(proxy_spec(spec), model)
        return count_parameters(built)["dense"]


def estimate_replicated_bytes(spec: FeatureSpec, model: ModelConfig,
                              optimizer: OptimizerConfig = OptimizerConfig(),
                              dense_parameters: int | None = None
                              ) -> SizeEstimate:
    """Bytes of one replica: tables, their slots, dense weights and slots
    (``dense_parameters`` counted with :func:`dense_parameter_count` unless
    known)."""
    groups = table_groups(spec.tables, optimizer)
    shapes = [(groups[t.name].optimizer, t.rows, t.dim, t.value_bytes)
              for t in spec.tables]
    wide = model.wide_tables(spec)
    shapes += [(groups[t.name].optimizer, t.rows, 1, t.value_bytes)
               for t in spec.tables if t.name in wide]
    tables = sum(rows * dim * size for _, rows, dim, size in shapes)
    table_slots = SLOT_VALUE_BYTES * sum(slot_values(name, rows, dim)
                                         for name, rows, dim, _ in shapes)
    if dense_parameters is None:
        dense_parameters = dense_parameter_count(spec, model)
    dense = 4 * dense_parameters
    return SizeEstimate(table_bytes=tables,
                        table_slot_bytes=table_slots,
                        dense_bytes=dense,
                        dense_slot_bytes=slots(optimizer.dense) * dense)


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """Memory of one device that holds a replica (``GPU`` or ``CPU``: the
    host's physical memory, shared by every logical CPU device) and where
    the figure came from."""

    kind: str
    bytes: int
    source: str


def _host_memory() -> tuple[int, str]:
    try:
        import psutil
        return int(psutil.virtual_memory().total), "psutil"
    except ImportError:
        pass
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024, "/proc/meminfo"
    except OSError:
        pass
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(pages), "sysconf"


def _gpu_memory() -> tuple[int, str] | None:
    """The smallest GPU's memory from ``nvidia-smi`` (no TensorFlow device
    is initialized). TensorFlow's public API reports GPU memory use but not
    capacity, so without ``nvidia-smi`` the size is unknown (None) and the
    guard falls back to host memory."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total",
             "--format=csv,noheader,nounits"], capture_output=True,
            text=True, timeout=20, check=True).stdout
        sizes = [int(float(x)) << 20 for x in out.split() if x.strip()]
        if sizes:
            return min(sizes), "nvidia-smi"
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return None


def device_memory_bytes(kind: str | None = None) -> DeviceMemory:
    """Memory of one replica's device: a GPU when the machine has one (or
    ``kind="GPU"``), else the host."""
    check_choice("kind", kind, (None, "GPU", "CPU"))
    if kind in (None, "GPU"):
        gpu = _gpu_memory()
        if gpu is not None:
            return DeviceMemory("GPU", *gpu)
        if kind == "GPU":
            raise ValueError("`kind` = 'GPU' but this machine has no GPU.")
    return DeviceMemory("CPU", *_host_memory())


def check_fits(estimate: SizeEstimate, memory: DeviceMemory,
               memory_fraction: float = DEFAULT_MEMORY_FRACTION,
               replicas_sharing_memory: int = 1) -> None:
    """Stops a replicated run whose tables and slots exceed
    ``memory_fraction`` of the device memory, shared by
    ``replicas_sharing_memory`` replicas (logical CPU devices all share the
    host's RAM): a :class:`ModelTooLargeError` with the size and
    ``--strategy ps``."""
    check(0.0 < memory_fraction <= 1.0, "memory_fraction", memory_fraction,
          "must be in (0, 1]")
    check(replicas_sharing_memory >= 1, "replicas_sharing_memory",
          replicas_sharing_memory, "must be >= 1")
    need = estimate.total_bytes * replicas_sharing_memory
    budget = memory_fraction * memory.bytes
    if need > budget:
        copies = (f" x {replicas_sharing_memory} replicas sharing it"
                  if replicas_sharing_memory > 1 else "")
        raise ModelTooLargeError(
            f"replicated tables and optimizer slots need "
            f"{estimate.text()}{copies} = {need / GIB:.3f} GiB, over "
            f"`StrategyConfig.memory_fraction` = {memory_fraction:g} of the "
            f"{memory.bytes / GIB:.1f} GiB of one {memory.kind} "
            f"({budget / GIB:.3f} GiB); every replica of a mirrored strategy "
            "holds every table whole. Use --strategy ps to shard the tables "
            "across parameter servers (or raise "
            "`StrategyConfig.memory_fraction`).")
