"""What the ``psrec`` command modules share: the usage error, ``--json``
output, a renamed-flag action and the flags several commands take."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from typing import Any
from typing import Sequence

from psrec.errors import ConfigError
from psrec.launch.cli.options import add_option
from psrec.launch.job.config import JobConfig
from psrec.launch.job.config import StrategyConfig
from psrec.uri_path import UriPath
from psrec.uri_path import as_path


class UsageError(ConfigError):
    """A command-line argument is invalid; exits with EXIT_USAGE."""


class RenamedFlag(argparse.Action):
    """A flag that was renamed: using it exits 2 naming the new flag."""

    def __init__(self, option_strings: Sequence[str], dest: str, *,
                 new: str, why: str, **kwargs: Any) -> None:
        kwargs.update(default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.new, self.why = new, why

    def __call__(self, parser: argparse.ArgumentParser,
                 namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(f"argument {option_string}: {option_string} {values} "
                     f"is not allowed here: {self.why}; use {self.new} "
                     f"{values}")


def existing_files(paths: Sequence[str], what: str) -> list[str]:
    """``paths`` (local paths or URIs), each of which exists; else a usage
    error naming the missing ones (``what``: the kind of input)."""
    missing = [p for p in paths if not as_path(p).exists()]
    if missing:
        raise UsageError(f"{what} not found: {', '.join(missing)}")
    return list(paths)


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print the result as one JSON object on stdout "
                        "(progress and errors go to stderr)")


def print_result(args: argparse.Namespace, result: Any,
                 text: str | None = None) -> None:
    """A command's result: with ``--json`` one JSON object (``result``, a
    dataclass through its ``to_dict()``); else ``text``, by default
    ``result.summary()``."""
    if args.json:
        print_json(result)
    else:
        print(result.summary() if text is None else text, flush=True)


def print_json(data: Any) -> None:
    """One JSON object on one line; NaN/inf become null, paths strings."""
    print(json.dumps(_json_safe(data), allow_nan=False), flush=True)


def _json_safe(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = (value.to_dict() if hasattr(value, "to_dict")
                 else dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, UriPath):
        return str(value)
    return value


def add_spec_and_data_flags(group: argparse._ActionsContainer, *,
                            spec_beside_data: str, data: str) -> None:
    """``--spec`` (a preset or file; by default the spec saved beside
    ``--data``, ``spec_beside_data`` says what else it may do) and
    ``--data`` (``data``: what happens without it)."""
    group.add_argument("--spec", default=None,
                       help="preset (criteo, movielens) or spec file "
                       "(default: with --data, the spec saved beside the "
                       f"data{spec_beside_data}; without, criteo)")
    group.add_argument("--data", default=None,
                       help=f"manifest of converted data ({data})")


def add_model_flag(group: argparse._ActionsContainer) -> None:
    add_option(group, JobConfig, "model_name")


def add_cluster_flags(p: argparse._ActionsContainer) -> None:
    add_option(p, StrategyConfig, "allow_remote")
