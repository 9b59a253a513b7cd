"""What ``psrec train`` prints at its end and writes to ``summary.json``:
:class:`JobSummary` (the exported model's figures first, then the last
evaluation, the run's shape and where its files are), and
:class:`FollowSummary`, what a ``--follow`` session did."""

from __future__ import annotations

import dataclasses
from typing import Any

from psrec.launch.job.follow_state import partition_table
from psrec.launch.job.reporting import coverage_lines
from psrec.ps_cluster.checkpoint.best import BestRecord
from psrec.ps_cluster.evaluation.metrics import EvalResult
from psrec.ps_cluster.evaluation.metrics import task_line
from psrec.ps_cluster.retrieval.metrics import RetrievalEvalResult
from psrec.ps_cluster.retrieval.metrics import eval_result_from_dict
from psrec.uri_path import shown_path


@dataclasses.dataclass(frozen=True)
class FollowSummary:
    """What a ``--follow`` session did: the followed folder, the
    partitions it finished, the partition it stopped before (None: none
    awaited)."""

    dir: str
    processed: list
    waiting_for: str | None = None


@dataclasses.dataclass(frozen=True)
class JobSummary:
    """What ``psrec train`` prints (and writes to ``summary.json``)."""

    strategy: str
    manifest: str
    checkpoint: str | None
    export: str | None
    tensorboard: str
    start_step: int
    step: int
    executed_steps: int
    examples_per_sec: float
    final_loss: float
    eval: EvalResult | None
    seconds: float
    workers: int
    ps: int
    replicas: int
    batch_size: int
    micro_batches: int
    precision: str
    closures_per_worker: dict[int, int]
    epochs: float = 0.0
    steps_per_epoch: int = 0
    best: BestRecord | None = None
    exported_checkpoint: str | None = None
    exported_auc: float | None = None
    stopped_early_at: int | None = None
    input_mode: str = "static"
    coverage: list = dataclasses.field(default_factory=list)  # per epoch
    coverage_warning: str | None = None
    plots: str | None = None  # the folder of --plots
    # --follow: one record per partition done (follow_state.PartitionRecord
    # .to_dict), in the order trained, and what this session did
    partitions: list = dataclasses.field(default_factory=list)
    follow: FollowSummary | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["eval"] = dataclasses.asdict(self.eval) if self.eval else None
        data["best"] = self.best.to_dict() if self.best else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSummary:
        """Inverse of :meth:`to_dict` (the local launcher reads the chief's
        ``summary.json``)."""
        data = dict(data)
        if data.get("eval") is not None:
            data["eval"] = eval_result_from_dict(data["eval"])
        if data.get("best") is not None:
            data["best"] = BestRecord.from_dict(data["best"])
        if data.get("follow") is not None:
            data["follow"] = FollowSummary(**data["follow"])
        data["closures_per_worker"] = {
            int(k): v for k, v in data["closures_per_worker"].items()}
        return cls(**data)

    def summary(self) -> str:
        """The exported model's figures first (where it went, the best
        checkpoint's metrics), then the last step's, the run's shape and
        where its files are."""
        if self.follow is not None:
            return self._follow_summary()
        lines = [f"psrec train summary ({self.strategy}):",
                 f"  export:      {shown_path(self.export)}"]
        if self.export is not None:  # AUC: ranking on a 0/1 label only
            auc = ("" if self.exported_auc is None
                   else f", eval AUC {self.exported_auc:.4f}")
            lines[-1] += f" (from checkpoint {self.exported_checkpoint}{auc})"
        lines += self._best_lines()
        if getattr(self.eval, "tasks", None):  # several labels
            lines.append(f"  last eval:   step {self.step}, per task:")
            lines += [f"               {task_line(task)}"
                      for task in self.eval.tasks]
            lines += [f"               {self.eval.tasks[0]['name']}: {line}"
                      for line in self.eval.breakdown_lines()]
        elif isinstance(self.eval, RetrievalEvalResult) or getattr(
                self.eval, "rmse", None) is not None:  # retrieval, mse
            lines.append(f"  last eval:   step {self.step}: "
                         f"{self.eval.summary()}")
            shown = self.eval  # the note is of the export: the best's
            if self.best is not None and self.best.metrics:  # retrieval
                shown = dataclasses.replace(self.eval, recall={
                    int(name.split("@")[1]): value for name, value
                    in self.best.metrics.items() if "@" in name},
                    mrr=self.best.metrics["mrr"])
            note = getattr(shown, "popularity_note", lambda: None)()
            if note:  # retrieval below the popularity baseline
                lines.append(f"  note:        {note}")
        elif self.eval is not None:
            lines.append(f"  last eval:   step {self.step}: AUC "
                         f"{self.eval.auc:.4f}  logloss "
                         f"{self.eval.logloss:.4f}  calibration "
                         f"{self.eval.calibration:.2f}  on {self.eval.count} "
                         "eval examples")
            lines += [f"               {line}"
                      for line in self.eval.breakdown_lines()]
        cluster = (f"{self.workers} workers + {self.ps} PS"
                   if self.strategy == "ps" else
                   f"{self.replicas} replica(s) on {self.workers} worker(s)")
        trained = (
            f"  steps {self.start_step} -> {self.step} (optimizer updates "
            f"executed: {self.executed_steps}), final train loss "
            f"{self.final_loss:.4f}, {self.examples_per_sec:,.0f} examples/s"
            if self.step > self.start_step else
            f"  steps {self.step} -> {self.step}: nothing left to train (the "
            "run had reached its last step; --steps N trains on to N)")
        lines += [
            trained,
            f"  {self.epochs:.2f} epochs ({self.steps_per_epoch} steps "
            "each)",
            f"  batch {self.batch_size} x {self.micro_batches} "
            f"micro-batch(es), {self.precision}; total time "
            f"{self.seconds:.1f} s on {cluster}"] + coverage_lines(self)
        if self.stopped_early_at is not None:
            lines.append(f"  stopped early at step {self.stopped_early_at}: "
                         "no improvement of the eval "
                         f"{self.best.metric if self.best else 'metric'} "
                         "within --early-stop-patience evaluations")
        lines += [
            f"  data:        {shown_path(self.manifest)}",
            f"  checkpoint:  {shown_path(self.checkpoint)}",
            f"  tensorboard: {shown_path(self.tensorboard)}"]
        if self.plots is not None:
            lines.append(f"  plots:       {shown_path(self.plots)}")
        return "\n".join(lines)

    def _follow_summary(self) -> str:
        """``--follow``: the partitions' table (every partition done so
        far, this session's and earlier ones), then where things are."""
        follow = self.follow
        lines = [f"psrec train summary ({self.strategy}, --follow "
                 f"{shown_path(follow.dir)}):",
                 f"  export:      {shown_path(self.export)}"
                 + (f" (from checkpoint {self.exported_checkpoint})"
                    if self.export else ""),
                 f"  partitions:  {len(self.partitions)} done, "
                 f"{len(follow.processed)} by this session"
                 + (f"; next awaited: {follow.waiting_for}"
                    if follow.waiting_for else "")]
        lines += [f"  {line}" for line in partition_table(self.partitions)]
        lines += [
            f"  steps {self.start_step} -> {self.step} this session; total "
            f"time {self.seconds:.1f} s",
            f"  checkpoint:  {shown_path(self.checkpoint)}",
            f"  tensorboard: {shown_path(self.tensorboard)} (per partition: "
            "follow/)"]
        return "\n".join(lines)

    def _best_lines(self) -> list[str]:
        """The best checkpoint, or why there is none; and the hint when the
        best is the last evaluation (the model was still improving)."""
        if self.eval is None:
            return ["  best:        none: no evaluation ran (the data has no "
                    "eval split), so there are no eval metrics and the "
                    "export is the last checkpoint; hold out eval rows with "
                    "`psrec convert --eval-fraction 0.1`"]
        if self.best is None:
            return ["  best:        not tracked (--keep-best none): the "
                    "export is the last checkpoint"]
        lines = [f"  best:        {self.best.summary()}"]
        if self.best.step == self.step:
            lines.append(
                f"  note:        the best checkpoint is the last one (step "
                f"{self.step}): the model was still improving; more steps "
                "(--steps, --epochs) may help")
        return lines
