"""Continuous training on a partitioned log (``psrec train --follow DIR``):
for each new partition, in name order, test (evaluate the current model
on all of its rows), then train (one pass, or ``--epochs``), checkpoint and
export; then wait for the next. The state that makes each partition
trained exactly once, and its protocol, are
:mod:`psrec.launch.job.follow_state`'s.

The coordinator runs this loop (under the supervisor's restarts: a
restarted coordinator restores the latest checkpoint, reads the state and
resumes the partition in progress in its phase).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Callable

from psrec.data.format.manifest import Manifest
from psrec.errors import ConfigError
from psrec.launch.job import runtime as job_runtime
from psrec.launch.job.config import JobConfig
from psrec.launch.job.data import check_enough_shards
from psrec.launch.job.follow_state import FollowState
from psrec.launch.job.follow_state import Partition
from psrec.launch.job.follow_state import PartitionRecord
from psrec.launch.job.follow_state import partitions
from psrec.launch.job.follow_state import pending
from psrec.launch.job.follow_state import test_metrics
from psrec.launch.job.reporting import input_options
from psrec.ps_cluster.training.loop import steps_for_epochs
from psrec.ps_cluster.training.loop import steps_per_epoch
from psrec.uri_path import as_path
from psrec.uri_path import shown_path

#: Seconds between two heartbeats while waiting for a partition.
_WAIT_BEAT = 1.0


@dataclasses.dataclass(frozen=True)
class FollowResult:
    """What one coordinator session of ``--follow`` did."""

    state: FollowState
    processed: tuple[str, ...]  # partitions finished by this session
    step: int
    start_step: int
    examples: int
    seconds: float
    final_loss: float
    export: str | None  # the newest export version's folder
    waiting_for: str | None  # the partition the run stopped before


def first_ready(config: JobConfig, log, beat: Callable[[str], None],
                stop: Callable[[], bool]) -> Manifest | None:
    """The manifest of the first ready partition (done or not: the trainer
    takes its base rate, which a restore overwrites), waiting for one
    unless ``--once``; None when there is none to wait for."""
    follow = config.follow
    announced = False
    while True:
        for partition in partitions(follow.dir):
            if partition.ready:
                return Manifest.load(partition.path)
        if follow.once or stop():
            return None
        if not announced:
            log(f"--follow {follow.dir}: no partition is ready yet; polling "
                f"every {follow.poll_seconds:g} s")
            announced = True
        _wait(follow.poll_seconds, beat, stop)


def _wait(seconds: float, beat: Callable[[str], None],
          stop: Callable[[], bool]) -> None:
    """Sleeps ``seconds`` in short slices, beating the heartbeat (phase
    ``waiting``), until a stop is requested."""
    end = time.monotonic() + seconds
    while not stop():
        beat("waiting")
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(_WAIT_BEAT, left))


class Follower:
    """The partition loop of one coordinator session.

    Args:
      trainer: restored (or warm-started, or fresh) at its latest
        checkpoint.
      errors: ``manifest -> context manager`` turning cluster errors into
        psrec errors (``run.translated_errors`` bound to the cluster).
      heartbeat: the coordinator's heartbeat writer (None: none).
      reporter: the progress reporter of the run (None: not the chief).
    """

    def __init__(self, config: JobConfig, trainer, log, errors,
                 heartbeat=None, reporter=None, watchdog=None) -> None:
        self.config = config
        self.follow = config.follow
        self.trainer = trainer
        self.log = log
        self.errors = errors
        self.heartbeat = heartbeat
        self.reporter = reporter
        self.beat = job_runtime.beat_all(heartbeat, watchdog)
        self.workdir = as_path(config.workdir)
        self.checkpoint_dir = config.checkpoint_dir
        self._announced_wait: str | None = None
        self._examples = 0
        self._loss = float("nan")

    # -- the loop ----------------------------------------------------------

    def run(self, stop: job_runtime.StopRequest) -> FollowResult:
        """Processes partitions until ``--once`` finds none ready, the
        ``--follow-until`` partition is done, or a stop is requested."""
        began = time.perf_counter()
        start = self._step()
        state = FollowState.load(self.checkpoint_dir, self.follow.dir)
        state.check_step(start, self.checkpoint_dir / "follow.json")
        self._check_until(state)
        processed: list[str] = []
        waiting_for = None
        if state.current is not None:
            self.log(f"follow: resuming partition {state.current.partition} "
                     f"(phase {state.current.phase}) at step {start}")
        self._publish(state)
        while not stop.requested():
            if state.current is None:
                if self.follow.until in state.done_names:
                    break
                ready, waiting = pending(self.follow.dir, state.done_names)
                if not ready:
                    waiting_for = waiting.name if waiting else None
                    if self.follow.once:
                        self._say_waiting(waiting, final=True)
                        break
                    self._say_waiting(waiting)
                    _wait(self.follow.poll_seconds, self.beat,
                          stop.requested)
                    continue
                self._warn_late(ready[0], state)
                state = self._test(ready[0], state)
            state, interrupted = self._advance(state, stop)
            if interrupted is not None:
                job_runtime.finish(self.heartbeat, stop, self.trainer,
                                   interrupted)
            if state.current is None:
                processed.append(state.done[-1].partition)
        if stop.requested():
            job_runtime.finish(self.heartbeat, stop, self.trainer,
                               self._step())
        elif self.heartbeat is not None:
            self.heartbeat.publish("done")
        exported = [r for r in state.done if r.export_version is not None]
        return FollowResult(
            state=state, processed=tuple(processed), step=self._step(),
            start_step=start, examples=self._examples,
            seconds=time.perf_counter() - began, final_loss=self._loss,
            export=(str(self.workdir / "export" / str(
                exported[-1].export_version)) if exported else None),
            waiting_for=waiting_for)

    def _advance(self, state: FollowState, stop
                 ) -> tuple[FollowState, int | None]:
        """Takes the partition in progress through its remaining phases
        (train, then export); returns the new state and the step a stop
        interrupted training at (None: not interrupted)."""
        record = state.current
        manifest = self._manifest(record.partition)
        if record.phase == "train":
            if self._step() < record.end_step:
                interrupted = self._train(record, manifest, stop)
                if interrupted is not None:
                    return state, interrupted
            # The checkpoint at end_step exists (train() saves at its last
            # step) before the state says so: a crash in between resumes
            # here with nothing left to train.
            record = record.advanced("export",
                                     checkpoint=self.trainer.keeper.latest)
            state = state.with_current(record)
            state.save(self.checkpoint_dir)
        version = self._export(record, manifest)
        record = record.finished(version)
        state = state.with_done(record)
        state.save(self.checkpoint_dir)
        self._report(record, len(state.done))
        self._publish(state)
        return state, None

    # -- the phases --------------------------------------------------------

    def _test(self, partition: Partition, state: FollowState) -> FollowState:
        """Evaluates the current model on every row of ``partition``, then
        records it in phase ``train`` (before its first step)."""
        began = time.time()
        manifest = self._manifest(partition.name, verify=True)
        trainer = self.trainer
        trainer.breakdown = self.config.loop.breakdown()
        trainer.eval_beat = lambda: self.beat("eval")
        self.beat("eval")
        with self.errors(manifest):
            result = trainer.evaluate(manifest, split=("train", "eval"))
        step = self._step()
        steps = steps_for_epochs(self.config.epochs or 1.0, steps_per_epoch(
            manifest.rows("train"), self.config.input.batch_size
            * self.config.strategy.grad_accum_steps))
        record = PartitionRecord(
            partition=partition.name, phase="train",
            rows=manifest.rows("train") + manifest.rows("eval"),
            test=test_metrics(result), eval_step=step, start_step=step,
            end_step=step + steps, began=began)
        state = state.with_current(record)
        state.save(self.checkpoint_dir)
        self.log(f"follow: partition {partition.name}: test before train on "
                 f"{result.count:,} rows at step {step}: "
                 + _metrics_text(record.test)
                 + f"; training {steps} steps ({step} -> {step + steps})")
        if self.reporter is not None:
            self.reporter.boundary(step, result, None)
        return state

    def _train(self, record: PartitionRecord, manifest: Manifest,
               stop) -> int | None:
        """Trains from the current step to ``record.end_step`` on the
        partition's train split (checkpoints at ``--checkpoint-every`` and
        at the end); returns the step a stop interrupted it at, or None."""
        trainer, config = self.trainer, self.config
        loop = dataclasses.replace(
            config.loop, steps=record.end_step, eval_every=0,
            keep_best="none", early_stop_patience=0)
        if self.reporter is not None:  # the bar of this partition
            self.reporter.total = record.end_step
            self.reporter.start_step = self._step()
        with self.errors(manifest):
            result = trainer.train(
                trainer.dataset_fn(manifest, **input_options(
                    config, trainer, manifest)), loop,
                on_progress=(self.reporter.update if self.reporter
                             else None),
                on_boundary=(self.reporter.boundary if self.reporter
                             else None),
                heartbeat=self.beat, should_stop=stop.requested,
                save_on_stop=stop.save_fits)
        self._examples += result.examples
        self._loss = result.final_loss
        return result.interrupted_at

    def _export(self, record: PartitionRecord, manifest: Manifest
                ) -> int | None:
        """Publishes the checkpoint at ``record.end_step`` as the next
        export version, or finds the version a previous session published
        from it (a crash between the export and the state write); None
        with ``--no-export``."""
        if not self.config.export:
            return None
        from psrec.launch.job.export import export_checkpoint
        root = self.workdir / "export"
        name = f"ckpt-{record.end_step}"
        found = published_from(root, name)
        if found is not None:
            return found
        self.beat("checkpoint")
        report = export_checkpoint(self.checkpoint_dir, root, name,
                                   manifest=manifest)
        self.log(f"follow: partition {record.partition}: exported {name} to "
                 f"{shown_path(report.path)}")
        return report.version

    # -- helpers -----------------------------------------------------------

    def _step(self) -> int:
        return int(self.trainer.progress.step.numpy())

    def _manifest(self, name: str, verify: bool = False) -> Manifest:
        """The partition's manifest, checked against the run's spec (every
        shard's presence and size; with ``verify`` and checksums on, also
        its sha256, once, before its test) and the worker count."""
        path = as_path(self.follow.dir) / name
        manifest = Manifest.load(path)
        manifest.verify(self.config.spec.fingerprint(),
                        checksums=verify and self.config.verify_checksums)
        manifest.require_rows("train")
        check_enough_shards(self.config, manifest, f"partition {path}: ")
        return manifest

    def _check_until(self, state: FollowState) -> None:
        until = self.follow.until
        if until is None or until in state.done_names:
            return
        later = [r.partition for r in state.done if r.partition > until]
        if later and not (as_path(self.follow.dir) / until).is_dir():
            raise ConfigError(
                f"--follow-until {until}: partitions after it were trained "
                f"already ({later[-1]}) and {self.follow.dir} has no folder "
                f"{until}: give a partition still to come.")

    def _say_waiting(self, waiting: Partition | None,
                     final: bool = False) -> None:
        """One line per partition awaited (not one per poll)."""
        key = waiting.name if waiting else ""
        if key == self._announced_wait and not final:
            return
        self._announced_wait = key
        what = (waiting.describe_waiting() if waiting is not None
                else f"no new partition in {self.follow.dir}")
        self.log(f"follow: {'stopping (--once)' if final else 'waiting'}: "
                 + what)

    def _warn_late(self, partition: Partition, state: FollowState) -> None:
        later = [r.partition for r in state.done
                 if r.partition > partition.name]
        if later:
            self.log(f"psrec: warning: partition {partition.name} arrived "
                     f"after {later[-1]} was trained: trained now, out of "
                     "order")

    def _report(self, record: PartitionRecord, index: int) -> None:
        """The partition's line, its TensorBoard scalars (step: its index,
        1 for the first partition the run trained) and the heartbeat's
        fields (``/metrics``)."""
        version = ("no export" if record.export_version is None
                   else f"export version {record.export_version}")
        self.log(f"follow: partition {record.partition} done: "
                 f"{record.steps} steps ({record.start_step} -> "
                 f"{record.end_step}) in {record.seconds:.1f} s; {version}")
        if self.trainer.chief:
            write_scalars(self.workdir / "tensorboard" / "follow", record,
                          index)

    def _publish(self, state: FollowState) -> None:
        if self.heartbeat is None:
            return
        data: dict = {"partitions_done": len(state.done)}
        if state.done:
            last = state.done[-1]
            data.update(partition=last.partition, rows=last.rows,
                        steps=last.steps, seconds=last.seconds,
                        export_version=last.export_version,
                        **{f"test_{k}": v for k, v in last.test.items()})
        self.heartbeat.publish(self.heartbeat.phase or "training",
                               follow=data)


def _metrics_text(test: dict) -> str:
    parts = [f"AUC {test['auc']:.4f}" if "auc" in test else "AUC n/a",
             f"logloss {test['logloss']:.4f}" if "logloss" in test
             else "logloss n/a",
             f"calibration {test['calibration']:.2f}"
             if "calibration" in test else "calibration n/a"]
    if "gauc" in test:
        parts.append(f"GAUC {test['gauc']:.4f}")
    return ", ".join(parts)


def published_from(root: Path, checkpoint: str) -> int | None:
    """The export version of ``root`` published from checkpoint
    ``checkpoint`` (``ckpt-N``, per its ``psrec_export.json``), if any."""
    from psrec.launch.job.export import EXPORT_INFO
    from psrec.models.serving.versions import versions
    for version in versions(str(root)):
        info = as_path(root) / str(version) / EXPORT_INFO
        try:
            source = json.loads(info.read_text()).get("checkpoint", "")
        except (OSError, ValueError):
            continue
        if str(source).rstrip("/").rsplit("/", 1)[-1] == checkpoint:
            return version
    return None


#: TensorBoard scalars of each partition (under tensorboard/follow/).
SCALARS = {"auc": "follow/test_auc", "logloss": "follow/test_logloss",
           "calibration": "follow/test_calibration",
           "gauc": "follow/test_gauc"}


def write_scalars(folder: Path, record: PartitionRecord, index: int) -> None:
    """One partition's scalars at step ``index``: its test-before-train
    metrics, rows, train steps, seconds and export version."""
    import tensorflow as tf
    writer = tf.summary.create_file_writer(str(folder))
    with writer.as_default():
        for name, tag in SCALARS.items():
            if name in record.test:
                tf.summary.scalar(tag, record.test[name], step=index)
        tf.summary.scalar("follow/rows", record.rows, step=index)
        tf.summary.scalar("follow/train_steps", record.steps, step=index)
        tf.summary.scalar("follow/seconds", record.seconds, step=index)
        if record.export_version is not None:
            tf.summary.scalar("follow/export_version",
                              record.export_version, step=index)
        tf.summary.text("follow/partition", record.partition, step=index)
    writer.close()
