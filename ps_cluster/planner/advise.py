"""``psrec advise``: which strategy suits a model on this machine, measured
(the timings: :mod:`psrec.ps_cluster.planner.advise_measure`).

The recommendation (:func:`recommend`): tables + slots over
``memory_fraction`` of one device -> ``ps``; else
``T_allreduce / T_compute <= threshold`` (0.3) -> ``mirrored``; else
``T_ps / T_compute <= threshold`` -> ``ps``; else ``single-device``: above
the threshold communication eats the gain of a second device.

Caveat, printed with the result: on one machine the all-reduce crosses
memory (or NVLink/PCIe), not a network; across machines, multiply by the
ratio of memory to network bandwidth.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any
from typing import Callable

from psrec.errors import check
from psrec.features.spec.spec import FeatureSpec
from psrec.models.optim.config import OptimizerConfig
from psrec.models.optim.config import table_row_bytes
from psrec.models.optim.sizing import DEFAULT_MEMORY_FRACTION
from psrec.models.optim.sizing import GIB
from psrec.models.optim.sizing import DeviceMemory
from psrec.models.optim.sizing import SizeEstimate
from psrec.models.optim.sizing import device_memory_bytes
from psrec.models.optim.sizing import estimate_replicated_bytes
from psrec.models.ranking.config import DEFAULT_MODEL
from psrec.models.ranking.config import ModelConfig
from psrec.models.ranking.config import model_config as named_model
from psrec.ps_cluster.planner.advise_measure import gradient_traffic
from psrec.ps_cluster.planner.advise_measure import measure_allreduce
from psrec.ps_cluster.planner.advise_measure import measure_compute
from psrec.ps_cluster.planner.advise_measure import measure_ps
from psrec.ps_cluster.planner.advise_measure import traffic_bytes

DEFAULT_THRESHOLD = 0.3


@dataclasses.dataclass(frozen=True)
class Measurements:
    """Seconds per training step of each part, and the bytes moved.

    Attributes:
      compute_s: one step's compute on one device.
      allreduce_s: one update's gradient all-reduce/all-gather.
      ps_s: one step's PS round trip.
      allreduce_bytes: bytes each replica contributes per update.
      ps_bytes: bytes one worker step moves to and from the PS.
      allreduce_devices: the devices the all-reduce ran between.
    """

    compute_s: float
    allreduce_s: float
    ps_s: float
    allreduce_bytes: int
    ps_bytes: int
    allreduce_devices: str

    @property
    def mirrored_ratio(self) -> float:
        return self.allreduce_s / self.compute_s

    @property
    def ps_ratio(self) -> float:
        return self.ps_s / self.compute_s


@dataclasses.dataclass(frozen=True)
class Advice:
    """The measurements, the size check and the recommendation."""

    spec_name: str
    model_name: str
    batch_size: int
    size: SizeEstimate
    memory: DeviceMemory
    memory_fraction: float
    threshold: float
    measurements: Measurements
    recommendation: str
    reasons: tuple[str, ...]
    seconds: float
    local_gpus: int = 0
    # (table, optimizer, bytes per row with its slots), per table.
    tables: tuple[tuple[str, str, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["size"]["total_bytes"] = self.size.total_bytes
        data["measurements"]["mirrored_ratio"] = self.measurements.mirrored_ratio
        data["measurements"]["ps_ratio"] = self.measurements.ps_ratio
        return data

    def summary(self) -> str:
        m = self.measurements
        budget = self.memory_fraction * self.memory.bytes
        return "\n".join([
            f"psrec advise: spec {self.spec_name!r}, model "
            f"{self.model_name!r}, {self.batch_size} rows per replica step",
            f"  T_compute   one step on one device        "
            f"{1000 * m.compute_s:8.2f} ms",
            f"  T_allreduce mirrored, {m.allreduce_devices}, "
            f"{m.allreduce_bytes / 2**20:6.2f} MiB "
            f"{1000 * m.allreduce_s:8.2f} ms  T_comm/T_compute = "
            f"{m.mirrored_ratio:.3f}",
            f"  T_ps        PS loopback,        {m.ps_bytes / 2**20:6.2f} MiB "
            f"{1000 * m.ps_s:8.2f} ms  T_comm/T_compute = {m.ps_ratio:.3f}",
            f"  replicated tables + slots: {self.size.text()}",
            *(["  tables (optimizer, bytes/row with slots): " + ", ".join(
                f"{name} {optimizer} {size:,}"
                for name, optimizer, size in self.tables)]
              if self.tables else []),
            f"  budget: {self.memory_fraction:g} x "
            f"{self.memory.bytes / GIB:.1f} GiB {self.memory.kind} = "
            f"{budget / GIB:.2f} GiB",
            f"  recommendation: {self.recommendation}",
            *[f"    - {reason}" for reason in self.reasons],
            f"  (measured in {self.seconds:.0f} s; the all-reduce ran within "
            "one machine -- across machines scale it by memory/network "
            "bandwidth)",
        ])


def recommend(size: SizeEstimate, memory: DeviceMemory,
              measurements: Measurements, memory_fraction: float = DEFAULT_MEMORY_FRACTION,
              threshold: float = DEFAULT_THRESHOLD,
              local_gpus: int | None = None
              ) -> tuple[str, tuple[str, ...]]:
    """The strategy and its reasons (see the module docstring's rule).

    ``local_gpus``, when given and below 2, adds a note to a ``mirrored``
    recommendation: the replicas must be GPUs or machines, since logical
    CPU devices share the same cores.
    """
    check(0.0 < memory_fraction <= 1.0, "memory_fraction", memory_fraction,
          "must be in (0, 1]")
    check(threshold > 0, "threshold", threshold, "must be > 0")
    budget = memory_fraction * memory.bytes
    fits = size.total_bytes <= budget
    mirrored, ps = measurements.mirrored_ratio, measurements.ps_ratio
    fit_text = (f"tables + optimizer slots {size.total_bytes / GIB:.3f} GiB "
                f"per replica {'fit in' if fits else 'exceed'} "
                f"{memory_fraction:g} of one {memory.kind}'s "
                f"{memory.bytes / GIB:.1f} GiB ({budget / GIB:.2f} GiB)")
    if not fits:
        return "ps", (fit_text + ": a replica cannot hold every table; "
                      "shard them across parameter servers",
                      f"PS round trip T_comm/T_compute = {ps:.2f}")
    if mirrored <= threshold:
        reasons = (
            fit_text,
            f"all-reduce T_comm/T_compute = {mirrored:.2f} <= {threshold:g}:"
            " synchronous data parallelism keeps most of the gain of each "
            "added replica, and converges like one device with a larger "
            "batch")
        if local_gpus is not None and local_gpus < 2:
            reasons += (
                f"this machine has {local_gpus} GPU(s): use --strategy "
                "mirrored on a machine with several GPUs, or "
                "multi-worker-mirrored across machines; logical CPU devices "
                "share the same cores and bring no speed-up",)
        return "mirrored", reasons
    if ps <= threshold:
        return "ps", (
            fit_text,
            f"all-reduce T_comm/T_compute = {mirrored:.2f} > {threshold:g}: "
            "the all-reduce eats the gain of mirrored replicas",
            f"PS round trip T_comm/T_compute = {ps:.2f} <= {threshold:g}: "
            "workers exchange only the rows they touch")
    return "single-device", (
        fit_text,
        f"all-reduce T_comm/T_compute = {mirrored:.2f} and PS round trip "
        f"{ps:.2f} both exceed {threshold:g}: communication eats the gain of "
        "a second device; train on one device (or raise the batch so "
        "compute grows and re-run advise)")


def advise(spec: FeatureSpec, model_name: str = DEFAULT_MODEL, *,
           model: ModelConfig | None = None, batch_size: int = 1024,
           optimizer: OptimizerConfig = OptimizerConfig(),
           memory_fraction: float = DEFAULT_MEMORY_FRACTION, threshold: float = DEFAULT_THRESHOLD,
           repeats: int = 5, memory: DeviceMemory | None = None,
           log: Callable[[str], None] | None = None) -> Advice:
    """Measures this machine and recommends a strategy for the model.

    Args:
      model_name: the named configuration (``model`` overrides it).
      batch_size: rows of one replica's (or worker's) step.
      memory_fraction: the size guard's share of device memory.
      threshold: the T_comm/T_compute above which communication is said
        to eat the gain.
      repeats: timed repetitions per measurement (median).
      memory: the device memory (default: measured).

    Raises:
      AdviseError: a measurement subprocess failed.
    """
    check(batch_size >= 1, "batch_size", batch_size, "must be >= 1")
    check(repeats >= 1, "repeats", repeats, "must be >= 1")
    began = time.perf_counter()
    say = log or (lambda text: None)
    config = model or named_model(model_name)
    size = estimate_replicated_bytes(spec, config, optimizer)
    memory = memory or device_memory_bytes()
    traffic = gradient_traffic(spec, config, batch_size, size.dense_bytes // 4)
    say("measuring one training step on one device ...")
    compute = measure_compute(spec, config, batch_size, optimizer, repeats)
    say("measuring one gradient all-reduce between 2 replicas ...")
    allreduce, devices = measure_allreduce(traffic, repeats)
    say("measuring one parameter-server round trip (loopback) ...")
    ps = measure_ps(spec, traffic, repeats)
    measurements = Measurements(
        compute_s=compute, allreduce_s=allreduce, ps_s=ps,
        allreduce_bytes=traffic_bytes(traffic),
        ps_bytes=2 * traffic_bytes(traffic), allreduce_devices=devices)
    import tensorflow as tf
    gpus = len(tf.config.list_physical_devices("GPU"))
    choice, reasons = recommend(size, memory, measurements, memory_fraction,
                                threshold, gpus)
    return Advice(spec_name=spec.name, model_name=model_name,
                  batch_size=batch_size, size=size, memory=memory,
                  memory_fraction=memory_fraction, threshold=threshold,
                  measurements=measurements, recommendation=choice,
                  reasons=reasons, seconds=time.perf_counter() - began,
                  local_gpus=gpus,
                  tables=table_row_bytes(spec.tables, optimizer))
