"""Scheduling of a training run: :class:`LoopConfig` (plain Python, each
field an option; ``psrec.options``)."""

from __future__ import annotations

import dataclasses
import math

from psrec.errors import check
from psrec.errors import check_at_least
from psrec.options import Codec
from psrec.options import check_choices
from psrec.options import option
from psrec.options import qualified

#: Evaluations per run when ``eval_every`` is None.
AUTO_EVALS = 5
KEEP_BEST = ("auc", "logloss", "none")


@dataclasses.dataclass(frozen=True)
class LoopConfig(Codec, where="loop"):
    """Scheduling of a training run."""

    steps: int = option(
        1000, flag="--steps",
        help="training steps: the run ends at this global step (unless "
        "--epochs is given)")
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
    keep_best: str = option(
        "auc", flag="--keep-best", choices=KEEP_BEST,
        help="keep the checkpoint with the best eval metric in "
        "checkpoints/best/ (recorded in checkpoints/best.json); the final "
        "export is that checkpoint")
    early_stop_patience: int = option(
        0, flag="--early-stop-patience",
        strategies=("ps", "mirrored", "one-device"),
        help="stop after N evaluations in a row without improvement of "
        "--keep-best's metric; 0: never")

    def __post_init__(self) -> None:
        check_at_least(self, 1, "steps", "steps_per_closure",
                       "in_flight_per_worker", "log_every")
        check_at_least(self, 0, "checkpoint_every", "early_stop_patience")
        if self.eval_every is not None:
            check_at_least(self, 0, "eval_every")
        check_choices(self)
        check(not (self.early_stop_patience and self.keep_best == "none"),
              qualified(self, "early_stop_patience"),
              self.early_stop_patience,
              "needs a metric to watch: set "
              f"`{qualified(self, 'keep_best')}` to auc or logloss")

    def resolved(self) -> LoopConfig:
        """This configuration with ``eval_every`` None replaced by a step
        count: about :data:`AUTO_EVALS` evaluations per run, a multiple of
        ``steps_per_closure`` (0 = only at the end stays 0)."""
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

    def next_boundary(self, step: int) -> int:
        """The next step at which to join: eval, checkpoint or the end."""
        candidates = [self.steps]
        for every in (self.resolved().eval_every, self.checkpoint_every):
            if every:
                candidates.append((step // every + 1) * every)
        return min(c for c in candidates if c > step)
