"""The CLI's progress display: :class:`psrec.progress.Progress` drawn as
plain text on stderr (:class:`psrec.progress_text.TextProgress`: no
TensorFlow, so ``psrec ingest`` and ``psrec spec infer`` never import it
to show a bar), and the ``--no-progress`` flag.

Bars go to stderr, so ``--json`` output on stdout stays one JSON object.
On a terminal the bar is redrawn in place; when stderr is not a terminal
(a log file, a pipe) a line is printed at most every ``NON_TTY_INTERVAL``
seconds, plus the final line. Each pass first prints its label with the
unit (``convert (rows)``); byte counts are shown in MiB. The
training-step bar is a different one (``launch.monitor.progress``).
"""

from __future__ import annotations

import argparse

from psrec.progress import SILENT
from psrec.progress import Progress
from psrec.progress_text import NON_TTY_INTERVAL
from psrec.progress_text import TextProgress


class ProgressBar(TextProgress):
    """Progress bars on ``stream`` (default: ``sys.stderr`` at the time a
    pass starts); see :class:`psrec.progress_text.TextProgress`."""


def add_progress_flag(parser: argparse.ArgumentParser) -> None:
    """``--no-progress``: no progress bars on stderr."""
    parser.add_argument("--no-progress", action="store_true",
                        help="draw no progress bars (they go to stderr; "
                        "without a terminal, a line every "
                        f"{NON_TTY_INTERVAL:.0f} s)")


def progress_for(args: argparse.Namespace) -> Progress:
    """The command's progress display: bars on stderr unless
    ``--no-progress``."""
    return SILENT if getattr(args, "no_progress", False) else ProgressBar()
