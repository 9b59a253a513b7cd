"""Options: configuration fields that carry their own default, help,
allowed values and scope.

Every option of a psrec configuration dataclass is one field made with
:func:`option`: the field holds the default, its :class:`Option` the rest.
From that one place the configuration checks itself, naming the field
(``StrategyConfig.collective``), never a flag; ``job.json`` is written and
read (:class:`Codec`); and the command line (``psrec.launch.cli.options``)
registers each flag and translates field names in error lines to flags.

The rule for "set": the Python API cannot tell a value typed by the caller
from the default, so a scoped field is refused when it differs from its
field default; the command line refuses a scoped flag whenever the user
gave it, the default value included.

Plain Python: the command line reads these fields without TensorFlow.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Iterator

from psrec.errors import ConfigError
from psrec.errors import check_choice
from psrec.errors import did_you_mean

#: The metadata key of an option field.
OPTION = "psrec.option"


@dataclasses.dataclass(frozen=True)
class Option:
    """What a configuration field says about itself: one user-facing
    sentence (also its flag's ``--help``); its flag (None: the Python API
    only); its choices (None: any value its checks accept); the
    ``StrategyConfig.kind`` values it means something for (None: every
    strategy); and ``decode``, which rebuilds the value from its
    ``job.json`` form (None: a nested configuration's ``from_dict`` when the
    default is one, else the JSON value itself).
    """

    help: str
    flag: str | None = None
    choices: tuple | None = None
    strategies: tuple[str, ...] | None = None
    decode: Callable[[Any], Any] | None = None


def option(default: Any = dataclasses.MISSING, *, help: str,
           flag: str | None = None, choices: tuple | None = None,
           strategies: tuple[str, ...] | None = None,
           decode: Callable[[Any], Any] | None = None,
           default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field that is an option (see :class:`Option`)."""
    meta = Option(help=help, flag=flag,
                  choices=None if choices is None else tuple(choices),
                  strategies=strategies, decode=decode)
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={OPTION: meta})


def option_of(field: dataclasses.Field) -> Option | None:
    """The :class:`Option` of a field; None for a plain field."""
    return field.metadata.get(OPTION)


def options(cls: Any) -> Iterator[tuple[dataclasses.Field, Option]]:
    """The option fields of a configuration class (or instance)."""
    for field in dataclasses.fields(cls):
        meta = option_of(field)
        if meta is not None:
            yield field, meta


def has_default(field: dataclasses.Field) -> bool:
    """The field has a default (or a default factory)."""
    return (field.default is not dataclasses.MISSING
            or field.default_factory is not dataclasses.MISSING)


def field_default(field: dataclasses.Field) -> Any:
    """A field's default value (built anew from a default factory)."""
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    raise ConfigError(f"`{field.name}` has no default.")


def field_named(cls: Any, name: str) -> dataclasses.Field:
    """Field ``name`` of ``cls``."""
    for field in dataclasses.fields(cls):
        if field.name == name:
            return field
    raise ConfigError(f"{_class_name(cls)} has no field {name!r}.")


def default_of(cls: Any, name: str) -> Any:
    """The default of field ``name`` of ``cls``."""
    return field_default(field_named(cls, name))


def qualified(cls: Any, name: str) -> str:
    """``Class.field``: how errors name an option."""
    return f"{_class_name(cls)}.{name}"


def _class_name(cls: Any) -> str:
    return (cls if isinstance(cls, type) else type(cls)).__name__


def check_choices(config: Any) -> None:
    """Every option with choices of ``config`` holds one of them."""
    for field, meta in options(config):
        if meta.choices is not None:
            check_choice(qualified(config, field.name),
                         getattr(config, field.name), meta.choices)


def scope_error(name: str, strategy: str, strategies: tuple[str, ...],
                strategy_name: str = "`StrategyConfig.kind`") -> ConfigError:
    """The one refusal of an option set under a strategy it does not
    apply to (``name`` a field or a flag)."""
    return ConfigError(
        f"`{name}` has no effect with {strategy_name} {strategy}; it applies "
        f"to {strategy_name} {' / '.join(strategies)} only: drop it or "
        "change the strategy.")


def refuse_out_of_scope(config: Any, strategy: str) -> None:
    """Raises :func:`scope_error` for the first field of ``config`` set
    (differing from its default) under a strategy it does not apply to."""
    for field, meta in options(config):
        if (meta.strategies is not None and strategy not in meta.strategies
                and getattr(config, field.name) != field_default(field)):
            raise scope_error(qualified(config, field.name), strategy,
                              meta.strategies)


def option_values(args: Any, cls: Any, **values: Any) -> Any:
    """``cls`` built from ``values`` and, for its other fields, the values
    their flags parsed to (``args``: an ``argparse`` namespace; a switch
    given means the opposite of its field default)."""
    for field, meta in options(cls):
        dest = (meta.flag or "").lstrip("-").replace("-", "_")
        if field.name in values or not hasattr(args, dest):
            continue
        value = getattr(args, dest)
        if isinstance(field.default, bool):  # a switch: given or not
            value = not field.default if value else field.default
        values[field.name] = value
    return cls(**values)


# -- the codec ---------------------------------------------------------------

def encode(value: Any) -> Any:
    """A field's value as JSON-able data."""
    if hasattr(value, "to_dict") and not isinstance(value, type):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, Path) or type(value).__name__ == "UriPath":
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def to_dict(config: Any) -> dict[str, Any]:
    """Every field of ``config`` encoded (:func:`encode`)."""
    return {field.name: encode(getattr(config, field.name))
            for field in dataclasses.fields(config)}


def from_dict(cls: Any, data: dict[str, Any], where: str = "") -> Any:
    """Rebuilds ``cls`` from :func:`to_dict`'s data: each field through its
    option's ``decode``, a nested configuration through its class's
    ``from_dict``; a missing key takes the field default, an unknown one
    is refused (named with the prefix ``where.``, beside the known ones)."""
    fields = {field.name: field for field in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        named = [f"{where}.{key}" if where else key for key in unknown]
        scope = f" in {where!r}" if where else ""
        raise ConfigError(f"unknown job keys {named}; known{scope}: "
                          f"{', '.join(fields)}"
                          f"{did_you_mean(unknown[0], fields) or '.'}")
    values = {}
    for key, value in data.items():
        field = fields[key]
        meta = option_of(field)
        if meta is not None and meta.decode is not None:
            value = meta.decode(value)
        elif isinstance(value, dict):
            nested = type(field_default(field))
            if hasattr(nested, "from_dict"):
                inner = f"{where}.{key}" if where else key
                value = nested.from_dict(value, inner)
        values[key] = value
    return cls(**values)


class Codec:
    """The codec of an options dataclass, beside its fields:
    ``to_dict``/``from_dict`` derived from them (:func:`to_dict`,
    :func:`from_dict`). ``where`` (a class keyword) names the class's key in
    ``job.json``, for the error of an unknown key."""

    _where: str = ""

    def __init_subclass__(cls, where: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._where = where

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str | None = None):
        return from_dict(cls, data, cls._where if where is None else where)
