"""How long-running library calls report progress, with no display code.

A function that reads a lot takes ``progress: Progress = SILENT`` (keyword)
and opens one :class:`Task` per pass over the data: ``progress.task(label,
total, unit)``, ``task.advance(n)`` as work completes, ``task.close()`` at
the end (or ``with progress.task(...) as task:``). Library code never
prints; the CLI passes a :class:`Progress` that draws a bar on stderr
(``psrec.launch.monitor.progress_bar``), tests pass one that records the calls.

Units: ``rows``, ``bytes`` (a display may show MiB) or ``shards``; ``total``
is in the same unit, or None when unknown.

Operations deep inside a job whose callers cannot pass a ``progress`` (the
initialisation of a giant table while a model is built, a checkpoint save
or restore of many GiB) report to the process's *default* progress,
:func:`default_progress`: :data:`SILENT` unless a command set another with
:func:`set_default_progress` (the CLI does: bars on stderr). They report
only when large, so a small job prints nothing new.
"""

from __future__ import annotations

from types import TracebackType


class Task:
    """One pass of known (or unknown) size; this base class shows nothing.

    Subclasses override :meth:`advance` and :meth:`close`; :meth:`close`
    may be called more than once (later calls do nothing).
    """

    def advance(self, n: int = 1) -> None:
        """Another ``n`` units are done."""

    def close(self) -> None:
        """The pass is over (finished or abandoned on an error)."""

    def __enter__(self) -> Task:
        return self

    def __exit__(self, kind: type[BaseException] | None,
                 error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


class Progress:
    """Where a library call reports its passes; this base class (and
    :data:`SILENT`) reports nowhere."""

    def task(self, label: str, total: int | None, unit: str = "rows"
             ) -> Task:
        """A new pass: ``label`` says what is done (``convert``), ``total``
        how many ``unit`` there are (None: unknown)."""
        return _SILENT_TASK


_SILENT_TASK = Task()
SILENT = Progress()


_DEFAULT: list[Progress] = [SILENT]


def set_default_progress(progress: Progress) -> None:
    """Makes ``progress`` the process's default (see the module text)."""
    _DEFAULT[0] = progress


def default_progress() -> Progress:
    """The process's default progress (:data:`SILENT` unless set)."""
    return _DEFAULT[0]
