"""SIGTERM/SIGINT for the supervisor: handlers that unwind its loop, and
a latch for a signal that landed while a child was being forked.

CPython swallows an exception raised by a signal handler while an at-fork
hook runs (``subprocess.Popen`` forking a child: "Exception ignored in ...
_releaseLock"), so a SIGINT or SIGTERM landing in that window would be
lost; :func:`on_signal` remembers it and :func:`raise_signalled`, called by
the watch loop, raises it again.
"""

from __future__ import annotations

import signal


class Terminated(Exception):
    """SIGTERM received: unwind so every child is stopped."""


# The signals received since the last :func:`clear`.
_SIGNALLED: list[int] = []


def clear() -> None:
    """Forgets earlier signals (a new supervised run starts)."""
    _SIGNALLED.clear()


def on_signal(signum, frame) -> None:  # noqa: ARG001
    """The SIGTERM/SIGINT handler: remembers, then raises."""
    _SIGNALLED.append(signum)
    raise_signalled()


def raise_signalled() -> None:
    """Raises :class:`Terminated` (SIGTERM) or ``KeyboardInterrupt``
    (SIGINT) when a signal was received, else nothing."""
    if _SIGNALLED:
        if _SIGNALLED[0] == signal.SIGTERM:
            raise Terminated()
        raise KeyboardInterrupt
