"""Scheduling of a training run: :class:`LoopConfig` (plain Python, each
field an option; ``psrec.options``)."""

from __future__ import annotations

import dataclasses
import math

from psrec.errors import ConfigError
from psrec.errors import check
from psrec.errors import check_at_least
from psrec.errors import did_you_mean
from psrec.models.retrieval.config import RETRIEVAL_KEEP_BEST
from psrec.options import Codec
from psrec.options import check_choices
from psrec.options import option
from psrec.options import qualified
from psrec.ps_cluster.evaluation.breakdown import GAUC_WEIGHTINGS
from psrec.ps_cluster.evaluation.breakdown import Breakdown
from psrec.ps_cluster.evaluation.watched import KEEP_BEST
from psrec.ps_cluster.evaluation.watched import TASK_BEST_METRICS
from psrec.ps_cluster.evaluation.watched import split_keep_best

#: Evaluations per run when ``eval_every`` is None.
AUTO_EVALS = 5
#: A run sized from the data (``steps`` None, :meth:`LoopConfig.sized`):
#: whole epochs, at least this many steps ...
AUTO_MIN_STEPS = 300
#: ... and at most this many epochs ...
AUTO_MAX_EPOCHS = 20
#: ... stopping after this many evaluations in a row without improvement.
AUTO_PATIENCE = 3


def can_stop_early(is_ps: bool, workers: int) -> bool:
    """Early stopping needs every worker to learn the evaluation's verdict:
    under ``ps`` the coordinator decides for all; a replicated strategy
    evaluates on its chief only, so only with one worker."""
    return is_ps or workers == 1


@dataclasses.dataclass(frozen=True)
class LoopConfig(Codec, where="loop"):
    """Scheduling of a training run."""

    steps: int | None = option(
        1000, flag="--steps",
        help="training steps: the run ends at this global step; a job "
        "given neither --steps nor --epochs (None) is sized from the train "
        f"split -- whole epochs, at least {AUTO_MIN_STEPS} "
        f"steps and at most {AUTO_MAX_EPOCHS} epochs, evaluated about once "
        f"an epoch, stopping early after {AUTO_PATIENCE} evaluations without "
        "improvement when there is an eval split (a retrieval run then "
        f"trains all {AUTO_MAX_EPOCHS} epochs and exports the best: its MRR "
        "plateaus before it peaks)")
    steps_per_closure: int = option(
        10, flag="--steps-per-closure",
        help="training steps per scheduled closure (K)")
    in_flight_per_worker: int = option(
        4, help="closures queued ahead per worker (ps)")
    log_every: int = option(100, flag="--log-every",
                            help="steps between progress lines")
    eval_every: int | None = option(
        0, flag="--eval-every",
        help="steps between evaluations, each also a checkpoint (default: "
        "about 5 per run, a multiple of --steps-per-closure); 0: only at the "
        "end")
    checkpoint_every: int = option(
        500, flag="--checkpoint-every",
        help="steps between checkpoints; 0: only at the end")
    delta_every: int = option(
        0, flag="--delta-every", strategies=("ps", "one-device"),
        help="steps between delta checkpoints: each PS writes only the "
        "rows changed since the previous save (with their optimizer "
        "slots), plus the dense weights; a resume (a lost PS) restores the "
        "latest full checkpoint and its deltas; 0: no deltas")
    full_every: int = option(
        0, flag="--full-every", strategies=("ps", "one-device"),
        help="with --delta-every: steps between full checkpoints (a "
        "multiple of --delta-every), which compact the deltas before them; "
        "0: --checkpoint-every's")
    keep_best: str = option(
        "auc", flag="--keep-best",
        help="keep the checkpoint with the best eval metric in "
        "checkpoints/best/ (recorded in checkpoints/best.json); the final "
        "export is that checkpoint: auc or logloss (of the first label) "
        "for ranking, mrr or recall@K for retrieval (the default, auc, "
        f"means {RETRIEVAL_KEEP_BEST} there), none, or TASK:METRIC for any "
        "label of a ranking spec (like:auc, rating:rmse; METRIC: auc, "
        "logloss or rmse)")
    early_stop_patience: int = option(
        0, flag="--early-stop-patience",
        strategies=("ps", "mirrored", "one-device"),
        help="stop after N evaluations in a row without improvement of "
        "--keep-best's metric; 0: never")
    group_by: str | None = option(
        None, flag="--group-by",
        help="also report GAUC: the AUC of each group of examples with the "
        "same value of this single-valued categorical column (e.g. a user "
        "id), averaged; groups with one class only are left out and "
        "counted. Computed in the eval closures from per-group histograms "
        "(exact grouping up to 4096 ids; docs/models.md)")
    gauc_weighting: str = option(
        "impressions", flag="--gauc-weighting", choices=GAUC_WEIGHTINGS,
        help="GAUC's average over groups: weighted by each group's eval "
        "examples, or uniform (one vote per group, uAUC)")
    slice_by: str | None = option(
        None, flag="--slice-by",
        help="also report AUC, logloss and calibration per value of this "
        "single-valued categorical column: the --slice-top values with the "
        "most eval examples, and the rest as `other`")
    slice_top: int = option(
        10, flag="--slice-top",
        help="values of --slice-by reported one by one")

    def __post_init__(self) -> None:
        check_at_least(self, 1, "steps_per_closure", "in_flight_per_worker",
                       "log_every")
        if self.steps is not None:
            check_at_least(self, 1, "steps")
        check_at_least(self, 0, "checkpoint_every", "early_stop_patience",
                       "delta_every", "full_every")
        check(not self.full_every or self.delta_every,
              qualified(self, "full_every"), self.full_every,
              f"needs `{qualified(self, 'delta_every')}` (the full saves "
              "between deltas); without deltas use "
              f"`{qualified(self, 'checkpoint_every')}`")
        if self.delta_every:
            check(self.full_interval > 0 and (
                self.full_interval % self.delta_every == 0),
                qualified(self, "full_every"), self.full_interval,
                "must be a positive multiple of "
                f"`{qualified(self, 'delta_every')}` = {self.delta_every} "
                f"(0 takes `{qualified(self, 'checkpoint_every')}`)")
        check_at_least(self, 1, "slice_top")
        if self.eval_every is not None:
            check_at_least(self, 0, "eval_every")
        check_choices(self)
        task, metric = split_keep_best(str(self.keep_best))
        allowed = TASK_BEST_METRICS if task is not None else KEEP_BEST
        if metric not in allowed or (task is not None and not task.strip()):
            raise ConfigError(
                f"`{qualified(self, 'keep_best')}` = {self.keep_best!r} is "
                f"not one of {', '.join(KEEP_BEST)} or TASK:METRIC (METRIC "
                f"one of {', '.join(TASK_BEST_METRICS)})"
                f"{did_you_mean(metric, allowed) or '.'}")
        check(not (self.early_stop_patience and self.keep_best == "none"),
              qualified(self, "early_stop_patience"),
              self.early_stop_patience,
              "needs a metric to watch: set "
              f"`{qualified(self, 'keep_best')}` to a metric of the task "
              "(auc, logloss; retrieval: mrr, recall@K)")

    def breakdown(self) -> Breakdown:
        """The evaluation breakdown of ``group_by`` and ``slice_by``."""
        return Breakdown(self.group_by, self.gauc_weighting, self.slice_by,
                         self.slice_top)

    def sized(self, epoch_steps: int, *, early_stop: bool,
              workers: int = 1, all_epochs: bool = False) -> LoopConfig:
        """This configuration with ``steps`` None sized from the data: the
        whole epochs (of ``epoch_steps`` each) that reach
        :data:`AUTO_MIN_STEPS`, at most :data:`AUTO_MAX_EPOCHS`; with
        ``eval_every`` None an evaluation about once an epoch (at least
        :data:`AUTO_EVALS` per run, a multiple of ``steps_per_closure``,
        and a closure for each of ``workers`` between two: an evaluation
        joins them);
        with ``early_stop`` (an eval split and a metric to watch) and no
        patience set, :data:`AUTO_PATIENCE` -- but with ``all_epochs``
        (a task whose metric plateaus before it peaks: retrieval's MRR) all
        :data:`AUTO_MAX_EPOCHS` epochs instead, the best kept and no
        patience set (a given one still stops it). A set ``steps`` is
        returned as it is."""
        if self.steps is not None:
            return self
        all_epochs = all_epochs and early_stop
        epochs = (AUTO_MAX_EPOCHS if all_epochs else
                  min(AUTO_MAX_EPOCHS,
                      max(1, math.ceil(AUTO_MIN_STEPS / epoch_steps))))
        sized = dataclasses.replace(self, steps=epochs * epoch_steps)
        if self.eval_every is None:
            k = self.steps_per_closure
            per_epoch = max(k * workers, round(epoch_steps / k) * k)
            sized = dataclasses.replace(sized, eval_every=min(
                sized.resolved().eval_every, per_epoch))
        if early_stop and not all_epochs and not self.early_stop_patience:
            sized = dataclasses.replace(sized,
                                        early_stop_patience=AUTO_PATIENCE)
        return sized

    def resolved(self) -> LoopConfig:
        """This configuration with ``eval_every`` None replaced by a step
        count: about :data:`AUTO_EVALS` evaluations per run, a multiple of
        ``steps_per_closure`` (0 = only at the end stays 0)."""
        check(self.steps is not None, qualified(self, "steps"), self.steps,
              "must be a step count here (None, sized from the data, is "
              "psrec train's: give steps)")
        if self.eval_every is not None:
            return self
        k = self.steps_per_closure
        every = max(k, math.ceil(self.steps / AUTO_EVALS / k) * k)
        return dataclasses.replace(self, eval_every=every)

    def is_eval_step(self, step: int) -> bool:
        """An evaluation (and checkpoint) falls on ``step`` (before the
        end; the end always evaluates)."""
        every = self.resolved().eval_every
        return bool(every) and step % every == 0

    @property
    def full_interval(self) -> int:
        """Steps between full checkpoints (0: only at evaluations and the
        end)."""
        return (self.full_every or self.checkpoint_every
                if self.delta_every else self.checkpoint_every)

    def save_due(self, step: int) -> str | None:
        """The checkpoint a boundary at ``step`` writes between evaluations
        and the end: ``full``, ``delta`` or None."""
        if self.full_interval and step % self.full_interval == 0:
            return "full"
        if self.delta_every and step % self.delta_every == 0:
            return "delta"
        return None

    def next_boundary(self, step: int) -> int:
        """The next step at which to join: eval, checkpoint or the end."""
        candidates = [self.steps]
        for every in (self.resolved().eval_every, self.full_interval,
                      self.delta_every):
            if every:
                candidates.append((step // every + 1) * every)
        return min(c for c in candidates if c > step)
