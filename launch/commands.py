"""Training-side ``psrec`` commands (train, server, eval, export, bench)."""

from __future__ import annotations

import argparse


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Registers the training-side sub-commands."""
