"""Restart budgets per role, refilled after a period of health.

The supervisor spends from the budget of the role that failed: a worker
that dies repeatedly uses up the worker budget only, so a later PS loss is
still restarted. A budget refills (its count goes back to 0) once its role
has run ``refill_after`` seconds without a failure, so a long job survives
failures spread over days, while a crash loop still ends.
:class:`SupervisorConfig` is the whole policy the supervisor runs by.
"""

from __future__ import annotations

import dataclasses
import time

from psrec.errors import check_at_least
from psrec.launch.monitor.heartbeat import ROLES
from psrec.options import option
from psrec.options import options


@dataclasses.dataclass(frozen=True)
class RestartLimits:
    """Restarts allowed per role; a role's None: the coordinator's."""

    worker: int | None = option(
        None, flag="--max-worker-restarts",
        help="restarts of worker tasks (default: --max-restarts)")
    ps: int | None = option(
        None, flag="--max-ps-restarts",
        help="restarts of PS tasks, each with the coordinator from the "
        "latest checkpoint (default: --max-restarts)")
    coordinator: int = option(
        3, flag="--max-restarts",
        help="restarts of the coordinator alone (it failed or stalled while "
        "every role was healthy); also the default of --max-worker-restarts "
        "and --max-ps-restarts (local cluster)")
    data_service: int | None = option(
        None, flag="--max-data-service-restarts",
        help="restarts of the local tf.data service process (--input-mode "
        "data-service), on its port; the training workers reconnect "
        "(default: --max-restarts)")
    refill_after: float = option(
        600.0, flag="--restart-budget-refill",
        help="seconds a role runs without failing after which its restart "
        "budget is full again; 0: never")

    def __post_init__(self) -> None:
        for role in ROLES:
            if getattr(self, role) is None:
                object.__setattr__(self, role, self.coordinator)
        check_at_least(self, 0, *ROLES, "refill_after")


#: The flag that sets each role's budget, for messages.
BUDGET_FLAGS = {field.name: meta.flag for field, meta in options(RestartLimits)
                if field.name in ROLES}


class RestartBudget:
    """Counts restarts per role against :class:`RestartLimits`."""

    def __init__(self, limits: RestartLimits, clock=time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self.used = {role: 0 for role in ROLES}
        self.total = {role: 0 for role in ROLES}  # never refilled: metrics
        self._last_failure: dict[str, float] = {}

    def limit(self, role: str) -> int:
        return getattr(self.limits, role)

    def spend(self, role: str) -> bool:
        """Takes one restart of ``role``; False when its budget is spent."""
        now = self._clock()
        last = self._last_failure.get(role)
        if (self.limits.refill_after and last is not None
                and now - last >= self.limits.refill_after):
            self.used[role] = 0  # healthy long enough: the budget refills
        self._last_failure[role] = now
        if self.used[role] >= self.limit(role):
            return False
        self.used[role] += 1
        self.total[role] += 1
        return True

    def describe(self, role: str) -> str:
        return f"{role} restart {self.used[role]}/{self.limit(role)}"

    def backoff(self, role: str, first: float) -> float:
        """Seconds to wait before restarting ``role``: ``first`` doubled
        per restart already spent on it, capped at 60."""
        return min(60.0, first * 2 ** max(0, self.used[role] - 1))


@dataclasses.dataclass(frozen=True)
class SupervisorConfig:
    """Restart policy."""

    limits: RestartLimits = option(
        RestartLimits(),
        help="restarts allowed per role, and when a budget refills")
    restart_workers: bool = option(
        True, flag="--no-restart-workers",
        help="keep training on the remaining workers instead of restarting "
        "a lost one")
    backoff: float = option(
        1.0, help="first backoff in seconds, doubled per restart of a role, "
        "capped at 60")
    stall_timeout: float | None = option(
        None, help="seconds without a new heartbeat before the coordinator "
        "is declared stalled (None: not watched)")
    grace_period: float = option(
        30.0, help="seconds the coordinator gets after SIGTERM/SIGINT to "
        "save a checkpoint and exit before it is killed")

    def stall_deadline(self) -> float | None:
        """The supervisor's stall limit: the timeout plus a margin."""
        if not self.stall_timeout:
            return None
        return self.stall_timeout + max(3.0, min(10.0,
                                                 0.1 * self.stall_timeout))
