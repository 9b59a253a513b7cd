"""Lazy package attributes: names whose modules need TensorFlow are imported
on first use, so importing a psrec package never imports TensorFlow (which
must first see the environment of :func:`psrec.runtime.configure_environment`).
"""

from __future__ import annotations

import importlib
from typing import Any
from typing import Callable

from psrec.runtime import configure_environment


def lazy_getattr(package: str, names: dict[str, str]
                 ) -> Callable[[str], Any]:
    """A module ``__getattr__`` resolving ``names`` (name -> module) on first
    use, after configuring the environment for TensorFlow."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(
                f"module {package!r} has no attribute {name!r}")
        configure_environment()
        return getattr(importlib.import_module(names[name]), name)

    return __getattr__
