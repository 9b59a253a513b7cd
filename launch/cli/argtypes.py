"""argparse value types shared by the ``psrec`` sub-commands.

Each type returns the parsed value or raises ``argparse.ArgumentTypeError``
with a message naming the value given and what is allowed; argparse puts the
flag in front (``argument --sparse-lr: invalid value '0': must be a finite
number > 0``) and exits 2. Floats reject ``nan`` and ``inf``.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable


def _invalid(text: str, allowed: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(
        f"invalid value {text!r}: must be {allowed}")


def _typed(convert: Callable[[str], float], allowed: str,
           ok: Callable[[float], bool], name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = convert(text)
        except ValueError:
            raise _invalid(text, allowed) from None
        if (isinstance(value, float) and not math.isfinite(value)) or not ok(
                value):
            raise _invalid(text, allowed)
        return value

    parse.__name__ = name
    return parse


integer = _typed(int, "an integer", lambda v: True, "integer")

positive = _typed(int, "an integer >= 1", lambda v: v >= 1, "positive")
"""An integer >= 1 (counts, sizes, steps)."""

non_negative = _typed(int, "an integer >= 0", lambda v: v >= 0,
                      "non_negative")
"""An integer >= 0 (0 usually means "off" or "none")."""

positive_float = _typed(float, "a finite number > 0", lambda v: v > 0,
                        "positive_float")
"""A finite float > 0 (learning rates)."""

non_negative_float = _typed(float, "a finite number >= 0",
                            lambda v: v >= 0, "non_negative_float")
"""A finite float >= 0 (timeouts where 0 disables)."""

fraction = _typed(float, "a number in [0, 1]", lambda v: 0.0 <= v <= 1.0,
                  "fraction")

positive_fraction = _typed(float, "a number in (0, 1]",
                           lambda v: 0.0 < v <= 1.0, "positive_fraction")

proper_fraction = _typed(float, "a number in [0, 1)",
                         lambda v: 0.0 <= v < 1.0, "proper_fraction")
"""A share in [0, 1) (a split that leaves rows on the other side)."""

_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6,
               "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
               "tb": 10**12, "ki": 1 << 10, "kib": 1 << 10, "mi": 1 << 20,
               "mib": 1 << 20, "gi": 1 << 30, "gib": 1 << 30,
               "ti": 1 << 40, "tib": 1 << 40}
SIZE_HELP = ("bytes, or a number with a unit: KiB/MiB/GiB/TiB (or Ki, Mi, "
             "Gi, Ti: powers of 1024) or K/M/G/T (KB...: powers of 1000, as "
             "in Kubernetes)")


def parse_size(text: str) -> int:
    """Bytes of ``8GiB``, ``512Mi``, ``2G`` (2e9), ``1.5GiB`` or
    ``1000000``: binary units with an ``i``, decimal ones without (the
    Kubernetes quantities); case-insensitive. Raises ``ValueError``."""
    stripped = text.strip().lower()
    number = stripped.rstrip("bikmgt ")
    unit = stripped[len(number):].strip()
    if unit not in _SIZE_UNITS or not number:
        raise ValueError(f"unknown size {text!r}")
    value = float(number) * _SIZE_UNITS[unit]
    if not math.isfinite(value):
        raise ValueError(f"unknown size {text!r}")
    return int(round(value))


byte_size = _typed(parse_size, "a size >= 1 byte: " + SIZE_HELP,
                   lambda v: v >= 1, "byte_size")
"""A size in bytes >= 1 (``8GiB``, ``512MiB``, ``2G``, ``1000000``)."""


def widths(text: str) -> tuple[int, ...]:
    """``64,32`` -> (64, 32); ``""`` -> () (no hidden layer)."""
    try:
        values = tuple(int(w) for w in text.split(",") if w.strip())
    except ValueError:
        values = (0,)
    if any(w < 1 for w in values):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of positive widths "
            "(e.g. 64,32; '' for none)")
    return values
