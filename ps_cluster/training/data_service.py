"""The tf.data service behind ``--input-mode data-service``.

A dispatcher (one per job, beside the coordinator) hands out the train
split one file of one epoch at a time (``ShardingPolicy.DYNAMIC``) to the
tf.data workers (one per training worker, each its own process), which read,
shuffle, parse and batch; every training worker consumes the one shared job
(see :func:`psrec.data.input.dataset.make_train_dataset_fn`). What TensorFlow
promises for DYNAMIC (``ShardingPolicy`` doc, TF 2.21): at-most-once
visitation -- "no examples will be repeated, but some may be missed if a
tf.data service worker gets restarted while processing a file". A training
worker that dies loses what it (and the tf.data buffers feeding it) held;
the files not yet handed out go to whoever asks next, so later epochs are
read whole (measured: see tests/test_data_service.py).
"""

from __future__ import annotations

from pathlib import Path

from psrec.errors import ConfigError


def dispatcher_address(value: str | None) -> str | None:
    """``value`` (``host:port`` or ``grpc://host:port``) as the dispatcher
    to read through (``grpc://host:port``), or None when blank."""
    value = (value or "").strip()
    if not value:
        return None
    return value if "://" in value else f"grpc://{value}"


def service_options(mode: str, address: str | None, resumes: int,
                    step: int, rows_per_step: int, train_rows: int) -> dict:
    """Keyword arguments of ``make_train_dataset_fn`` for ``mode``, reading
    through the dispatcher at ``address`` (see :func:`dispatcher_address`).

    A job name per coordinator session (``resumes``): a restarted
    coordinator starts a new job (its seed differs) rather than joining the
    old one; its stream starts at the epoch of its step.

    Raises:
      ConfigError: ``data-service`` without a dispatcher.
    """
    first_epoch = step * rows_per_step // max(1, train_rows)
    if mode != "data-service":
        return {"first_epoch": first_epoch}
    if dispatcher_address(address) is None:
        raise ConfigError(
            "`InputConfig.mode` = data-service needs a tf.data service "
            "dispatcher: the local launcher starts one; with an existing "
            "cluster run `psrec data-server --role dispatcher` and one "
            "`psrec data-server --role worker` per worker host, and give "
            "`--data-service HOST:PORT`.")
    return {"data_service": dispatcher_address(address),
            "first_epoch": first_epoch,
            "job_name": f"psrec-train-{resumes}"}


def start_dispatcher(port: int, work_dir: str | Path | None = None):
    """A tf.data service dispatcher on ``port`` (fault-tolerant, its
    journal in ``work_dir``, when one is given)."""
    import tensorflow as tf
    service = tf.data.experimental.service
    return service.DispatchServer(service.DispatcherConfig(
        port=port, work_dir=str(work_dir) if work_dir else None,
        fault_tolerant_mode=work_dir is not None))


def start_worker(port: int, dispatcher: str):
    """A tf.data service worker on ``port`` registered with
    ``dispatcher`` (``host:port``)."""
    import tensorflow as tf
    service = tf.data.experimental.service
    return service.WorkerServer(service.WorkerConfig(
        dispatcher_address=dispatcher.split("://")[-1], port=port))
