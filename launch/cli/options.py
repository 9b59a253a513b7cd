"""Command-line flags made from configuration fields (``psrec.options``).

:func:`add_option` registers one field's flag with the field's default,
help and choices (the argparse ``type``, how the flag's text is parsed, is
the command line's and is given here). Every flag registered this way
records on the namespace that the user gave it, so that a flag typed under
a strategy it does not apply to is refused even when its value is the
default (:func:`refuse_given_out_of_scope`). :func:`translate` turns the
field names of a library error (``StrategyConfig.grad_accum_steps``) into
the flags (``--grad-accum-steps``), by the one mapping of
:func:`field_flags`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from typing import Any
from typing import Callable

from psrec.data.convert.config import ConversionOptions
from psrec.data.infer.infer import InferOptions
from psrec.errors import ConfigError
from psrec.launch.job.config import JobConfig
from psrec.launch.supervise.restart_policy import SupervisorConfig
from psrec.models.retrieval.config import RetrievalConfig
from psrec.models.serving.config import ExportConfig
from psrec.options import field_default
from psrec.options import field_named
from psrec.options import has_default
from psrec.options import option_of
from psrec.options import options
from psrec.options import qualified
from psrec.options import scope_error

_GIVEN = "psrec_given_options"
#: The configurations whose fields :func:`translate` turns into flags.
_CONFIGS = (JobConfig, RetrievalConfig, ConversionOptions, InferOptions,
            SupervisorConfig, ExportConfig)
_MISSING = object()


class _OptionAction(argparse.Action):
    """Stores a flag's value (or its constant, for a switch) and records
    that the user gave it."""

    def __init__(self, option_strings, dest, *, strategies=None, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.strategies = strategies

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, self.const if self.nargs == 0
                else values)
        given = dict(getattr(namespace, _GIVEN, {}))
        given[self.dest] = (self.option_strings[0], self.strategies)
        setattr(namespace, _GIVEN, given)


def add_option(group: argparse._ActionsContainer, cls: Any, name: str, *,
               type: Callable[[str], Any] | None = None,
               default: Any = _MISSING, help: str | None = None,
               strategies: tuple[str, ...] | None = None,
               **kwargs: Any) -> argparse.Action:
    """Registers the flag of field ``name`` of ``cls``.

    Args:
      default: the flag's default (default: the field's); a job's nested
        configuration passes its job default (``JobConfig().loop.steps``).
      help: another phrasing of the field's help for this command.
      strategies: the scope when the field's is its parent's (a
        ``PartitionConfig`` field under ``JobConfig.partition``).
    """
    field = field_named(cls, name)
    meta = option_of(field)
    if meta is None or meta.flag is None:
        raise ConfigError(f"{qualified(cls, name)} has no flag.")
    if default is _MISSING and has_default(field):
        default = field_default(field)
    text = meta.help if help is None else help
    if isinstance(default, bool):  # a switch
        kwargs.update(nargs=0, const=True, default=False)
    else:
        kwargs.update({"required": True} if default is _MISSING
                      else {"default": default})
        if type is not None:
            kwargs["type"] = type
        if meta.choices is not None:
            kwargs["choices"] = meta.choices
    return group.add_argument(meta.flag, action=_OptionAction, help=text,
                              strategies=strategies or meta.strategies,
                              **kwargs)


def given(args: argparse.Namespace, dest: str) -> bool:
    """The user typed the flag of ``dest`` (a flag of :func:`add_option`)."""
    return dest in getattr(args, _GIVEN, {})


def refuse_given_out_of_scope(args: argparse.Namespace,
                              strategy: str) -> None:
    """A flag the user gave under a strategy it does not apply to is
    refused, whatever its value (the default too): a ConfigError naming
    the flag and the strategies it applies to."""
    for flag, strategies in getattr(args, _GIVEN, {}).values():
        if strategies is not None and strategy not in strategies:
            raise scope_error(flag, strategy, strategies, "--strategy")


@functools.cache
def field_flags() -> dict[str, str]:
    """``Class.field`` -> its flag, for every option with one of the
    configurations of the command line (nested ones too)."""
    mapping: dict[str, str] = {}

    def walk(cls: Any) -> None:
        for field, meta in options(cls):
            if meta.flag is not None:
                mapping[qualified(cls, field.name)] = meta.flag
            value = field_default(field) if has_default(field) else None
            if dataclasses.is_dataclass(value):
                walk(type(value))
    for cls in _CONFIGS:
        walk(cls)
    return mapping


def translate(message: str) -> str:
    """``message`` with each field named in backquotes replaced by its
    flag."""
    for name, flag in field_flags().items():
        message = message.replace(f"`{name}`", f"`{flag}`")
    return message

