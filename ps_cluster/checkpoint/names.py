"""The checkpoint names a user gives (``--checkpoint``: ``latest``,
``best`` or ``ckpt-N``), checked without TensorFlow: ``psrec eval`` and
``psrec export`` refuse a misspelt one before they import it, and
:func:`~psrec.ps_cluster.checkpoint.best.choose_checkpoint` with the same
words."""

from __future__ import annotations

import re
from pathlib import Path

from psrec.errors import ConfigError
from psrec.errors import did_you_mean
from psrec.uri_path import UriPath
from psrec.uri_path import as_path

#: A rotated checkpoint's name, ``ckpt-<step>``.
CHECKPOINT_NAME = re.compile(r"^ckpt-(\d+)$")


def kept_checkpoints(directory: str | Path | UriPath) -> list[str]:
    """The ``ckpt-N`` names kept in ``directory`` (their ``.index``
    files)."""
    return sorted(p.stem for p in as_path(directory).glob("ckpt-*.index"))


def check_checkpoint_name(directory: str | Path | UriPath,
                          which: str | None) -> None:
    """``which`` is None, ``latest``, ``best`` or ``ckpt-N``; else a
    ConfigError naming the closest of those and the kept ``ckpt-N``."""
    if which in (None, "latest", "best") or CHECKPOINT_NAME.match(which):
        return
    raise ConfigError(
        f"`--checkpoint` = {which!r} is not latest, best or ckpt-N"
        + (did_you_mean(which, ("latest", "best",
                                *kept_checkpoints(directory))) or "."))
