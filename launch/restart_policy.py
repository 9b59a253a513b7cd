"""Restart budgets per role, refilled after a period of health.

The supervisor spends from the budget of the role that failed: a worker
that dies repeatedly uses up the worker budget only, so a later PS loss is
still restarted. A budget refills (its count goes back to 0) once its role
has run ``refill_after`` seconds without a failure, so a long job survives
failures spread over days, while a crash loop still ends.
"""

from __future__ import annotations

import dataclasses
import time

from psrec.errors import check_at_least

ROLES = ("worker", "ps", "coordinator")


@dataclasses.dataclass(frozen=True)
class RestartLimits:
    """Restarts allowed per role.

    Attributes:
      worker: restarts of worker tasks (``--max-worker-restarts``).
      ps: restarts of the PS tasks (with the coordinator, from the latest
        checkpoint; ``--max-ps-restarts``).
      coordinator: restarts of the coordinator alone, when it failed or
        stalled and every role is healthy (``--max-restarts``).
      refill_after: seconds without a failure of a role after which its
        budget is full again (0: never refills).
    """

    worker: int = 3
    ps: int = 3
    coordinator: int = 3
    refill_after: float = 600.0

    def __post_init__(self) -> None:
        check_at_least(self, 0, "worker", "ps", "coordinator",
                       "refill_after")


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
