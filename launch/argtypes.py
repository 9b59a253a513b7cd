"""argparse value types shared by the ``psrec`` sub-commands."""

from __future__ import annotations

import argparse
from typing import Callable


def _bounded_int(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(
                f"{text!r} must be an integer >= {low}")
        return value
    return parse


positive = _bounded_int(1)
non_negative = _bounded_int(0)


def fraction(text: str) -> float:
    """A share in [0, 1]."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be in [0, 1]")
    return value


def positive_fraction(text: str) -> float:
    """A share in (0, 1]."""
    value = fraction(text)
    if value == 0.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be in (0, 1]")
    return value
