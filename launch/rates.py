"""Instantaneous rates of growing counts (examples trained), for the
progress line and TensorBoard: the rate over the last few seconds, not the
average since the start (which hides a slowdown for as long as the run has
lasted)."""

from __future__ import annotations

import collections


class RateWindow:
    """The rate of a growing total over (at least) the last ``seconds``.

    Args:
      seconds: the window.
      began: when the count was 0 (the first rate is measured from it).
    """

    def __init__(self, seconds: float, began: float) -> None:
        self.seconds = seconds
        self._points: collections.deque = collections.deque([(began, 0)])

    def add(self, now: float, total: float) -> float:
        """Records ``total`` at ``now``; returns the rate per second from
        the last point at or before ``now - seconds`` (the first point while
        the run is younger than the window) to now."""
        points = self._points
        points.append((now, total))
        while len(points) > 2 and points[1][0] <= now - self.seconds:
            points.popleft()
        then, before = points[0]
        return (total - before) / (now - then) if now > then else 0.0
