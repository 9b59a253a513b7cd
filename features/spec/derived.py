"""Derived features: columns computed from raw columns by the spec, with the
same TensorFlow ops at conversion and inside the exported serving function.

A derived feature is named in the spec's ``derived`` list and used by the
categorical feature of its name (string values, ``""`` is missing); the
kinds (``hour_of_day``, ``day_of_week``, ``bucketize``, ``cross``), their
sources and patterns: ``docs/feature-spec.md``, "Derived features".
``bucketize`` reads the raw value (before a dense transform).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any
from typing import Mapping
from typing import Sequence

from psrec.errors import did_you_mean
from psrec.features.spec.columns import SpecError
from psrec.features.spec.columns import raise_problems

TIME_KINDS = ("hour_of_day", "day_of_week")
DERIVED_KINDS = TIME_KINDS + ("bucketize", "cross")
EPOCH_MS = "epoch_ms"
CROSS_SEPARATOR = "\x1f"  # the ASCII unit separator: not in ordinary ids

_TOKENS = {  # token -> RE2 regex of its valid values, longest first
    "YYYY": r"[0-9]{4}", "YY": r"[0-9]{2}", "MM": r"(?:0[1-9]|1[0-2])",
    "DD": r"(?:0[1-9]|[12][0-9]|3[01])", "HH": r"(?:[01][0-9]|2[0-3])",
    "mm": r"[0-5][0-9]", "ss": r"[0-5][0-9]",
}
_PLACEHOLDER = {"YYYY": "2000", "YY": "00", "MM": "01", "DD": "01",
                "HH": "00", "mm": "00", "ss": "00"}


def parse_pattern(pattern: str) -> tuple[str, dict[str, tuple[int, int]],
                                         str]:
    """The full-match regex of a time pattern, ``{token: (position,
    width)}`` and a placeholder value that matches it."""
    regex, fields, placeholder, i = [], {}, [], 0
    while i < len(pattern):
        token = next((t for t in _TOKENS if pattern.startswith(t, i)), None)
        if token is None:
            regex.append(re.escape(pattern[i]))
            placeholder.append(pattern[i])
            i += 1
            continue
        if token in fields or (token[0] == "Y" and (
                "YYYY" in fields or "YY" in fields)):
            raise SpecError(f"time pattern {pattern!r} gives {token} twice.")
        fields[token] = (i, len(token))
        regex.append(_TOKENS[token])
        placeholder.append(_PLACEHOLDER[token])
        i += len(token)
    return "".join(regex), fields, "".join(placeholder)


def _pattern_problems(where: str, kind: str, pattern: Any) -> list[str]:
    if pattern is None or pattern == EPOCH_MS:
        return []
    if not isinstance(pattern, str) or not pattern:
        return [f"{where}: `pattern` = {pattern!r} must be a string such as "
                f"'YYMMDDHH', {EPOCH_MS!r}, or left out (epoch seconds)."]
    try:
        _, fields, _ = parse_pattern(pattern)
    except SpecError as error:
        return [f"{where}: {error}"]
    need = ["HH"] if kind == "hour_of_day" else ["YY", "MM", "DD"]
    missing = [t for t in need if t not in fields
               and not (t == "YY" and "YYYY" in fields)]
    if missing:
        return [f"{where}: `pattern` = {pattern!r} lacks {', '.join(missing)}"
                f", which {kind} needs (tokens: {', '.join(_TOKENS)})."]
    return []


@dataclasses.dataclass(frozen=True)
class DerivedFeature:
    """A column computed from raw columns (see the module docstring).

    Attributes:
        name: the derived column; a categorical feature of this name uses it.
        kind: one of :data:`DERIVED_KINDS`.
        sources: the columns it reads (one; two or more for ``cross``).
        pattern: time kinds only: None (epoch seconds), ``epoch_ms`` or a
            fixed-width pattern such as ``YYMMDDHH``.
        boundaries: ``bucketize`` only: increasing finite numbers.
        source_dtype: the serving type of a source that is no feature of
            the spec: ``int64`` (default for epoch times) or ``string``
            (default for a pattern); ``bucketize`` reads ``float32``.
    """

    name: str
    kind: str
    sources: tuple[str, ...]
    pattern: str | None = None
    boundaries: tuple[float, ...] | None = None
    source_dtype: str | None = None

    def __post_init__(self) -> None:
        where = f"derived feature {self.name!r}"
        if isinstance(self.sources, str):
            object.__setattr__(self, "sources", (self.sources,))
        elif isinstance(self.sources, list):
            object.__setattr__(self, "sources", tuple(self.sources))
        if isinstance(self.boundaries, list):
            object.__setattr__(self, "boundaries", tuple(self.boundaries))
        problems = []
        if not isinstance(self.name, str) or not self.name.strip():
            problems.append(f"{where}: `name` must be a non-empty string.")
        if self.kind not in DERIVED_KINDS:
            problems.append(f"{where}: `kind` = {self.kind!r} is not allowed;"
                            f" use one of {', '.join(DERIVED_KINDS)}"
                            f"{did_you_mean(self.kind, DERIVED_KINDS) or '.'}")
        want = "two or more" if self.kind == "cross" else "exactly one"
        count_ok = (len(self.sources) >= 2 if self.kind == "cross"
                    else len(self.sources) == 1)
        if not isinstance(self.sources, (tuple, list)) or not count_ok or \
                not all(isinstance(s, str) and s for s in self.sources):
            problems.append(f"{where}: `sources` = {self.sources!r} must be "
                            f"a list of {want} column names for {self.kind}.")
        problems += self._kind_problems(where)
        raise_problems(problems)

    def _kind_problems(self, where: str) -> list[str]:
        problems = []
        if self.kind in TIME_KINDS:
            problems += _pattern_problems(where, self.kind, self.pattern)
        elif self.pattern is not None:
            problems.append(f"{where}: `pattern` applies to "
                            f"{' and '.join(TIME_KINDS)} only; remove it.")
        if self.kind == "bucketize":
            bounds = self.boundaries
            if (not bounds or not all(isinstance(b, (int, float))
                                      and not isinstance(b, bool)
                                      and b == b and abs(b) != float("inf")
                                      for b in bounds)
                    or any(a >= b for a, b in zip(bounds, bounds[1:]))):
                shown = list(bounds) if isinstance(bounds, tuple) else bounds
                problems.append(f"{where}: `boundaries` = {shown!r} must be "
                                "a non-empty list of increasing finite "
                                "numbers.")
        elif self.boundaries is not None:
            problems.append(f"{where}: `boundaries` applies to bucketize "
                            "only; remove it.")
        allowed = {"bucketize": ("float32",), "cross": ()}.get(
            self.kind, ("int64", "string"))
        if self.source_dtype is not None and self.source_dtype not in allowed:
            problems.append(f"{where}: `source_dtype` = {self.source_dtype!r}"
                            f" is not allowed for {self.kind}; use "
                            f"{' or '.join(map(repr, allowed)) or 'none (its sources are features)'}.")
        if (self.kind in TIME_KINDS and self.pattern in (None, EPOCH_MS)
                and self.source_dtype == "string"):
            problems.append(f"{where}: an epoch time is an int64 column; "
                            "give a `pattern` to read strings.")
        return problems

    def default_source_dtype(self) -> str:
        """The serving type of a source that is no feature of the spec."""
        if self.source_dtype is not None:
            return self.source_dtype
        if self.kind == "bucketize":
            return "float32"
        return "int64" if self.pattern in (None, EPOCH_MS) else "string"


def _source_problem(feature: DerivedFeature, source: str,
                    kinds: Mapping[str, Any], earlier: set[str]) -> str | None:
    """Why ``source`` cannot feed ``feature``, or None. ``kinds`` maps the
    spec's columns to ``"label"``, ``"dense"`` or their categorical
    feature."""
    where = f"derived feature {feature.name!r}: source {source!r}"
    if source == feature.name:
        return f"{where} is the feature itself."
    if source in earlier:
        return None
    kind = kinds.get(source)
    if kind == "label":
        return f"{where} is the label; derive features from inputs only."
    if kind == "derived-later":
        return (f"{where} is a derived feature listed after it; list "
                f"{source!r} first.")
    if feature.kind == "cross":
        if kind is None or kind == "dense":
            named = [n for n, k in kinds.items() if not isinstance(k, str)]
            hint = did_you_mean(source, [*named, *sorted(earlier)]) if (
                kind is None) else ""
            return (f"{where} is not a categorical feature; a cross joins "
                    "categorical (or derived) features: add it to "
                    f"`categorical` first{hint or '.'}")
    elif feature.kind == "bucketize":
        if kind is not None and kind != "dense":
            return (f"{where} is a categorical feature; bucketize reads a "
                    "number (a dense feature or a raw column).")
    elif kind == "dense":
        return (f"{where} is a dense (float32) feature, which cannot hold "
                "a time exactly; read the raw column (drop it from `dense`) "
                "or give a categorical feature.")
    if not isinstance(kind, str) and kind is not None:
        if kind.multi_hot:
            return f"{where} is a multi-hot list; use a single-valued column."
        if (feature.kind in TIME_KINDS and feature.pattern in (None, EPOCH_MS)
                and kind.dtype != "int64"):
            return (f"{where} is a string feature; epoch times are int64 "
                    "(or give a `pattern`).")
    return None


def derived_problems(label: str | Sequence[str] | None, dense: Sequence[Any],
                     categorical: Sequence[Any],
                     derived: Sequence[DerivedFeature]) -> list[str]:
    """How the derived features fit the rest of a spec: sources, the
    categorical features that use them, names."""
    problems = []
    names = [d.name for d in derived]
    kinds: dict[str, Any] = {f.name: "dense" for f in dense}
    kinds.update({f.name: f for f in categorical})
    kinds.update({name: "derived-later" for name in names})
    for name in [label] if isinstance(label, str) else label or ():
        kinds[name] = "label"  # the label, or every label of a spec
    users = {f.name: f for f in categorical}
    earlier: set[str] = set()
    for feature in derived:
        where = f"derived feature {feature.name!r}"
        if feature.name in earlier:
            problems.append(f"{where} is defined twice.")
        if kinds.get(feature.name) in ("dense", "label"):
            problems.append(f"{where}: the name is a {kinds[feature.name]} "
                            "column; derived values feed categorical "
                            "features only; rename it.")
        user = users.get(feature.name)
        if user is None:
            problems.append(f"{where} is not used: add a categorical feature "
                            f"named {feature.name!r} (its table and "
                            "buckets), or remove it.")
        elif user.multi_hot or user.required or user.dtype != "string":
            problems.append(
                f"categorical feature {feature.name!r} reads derived values, "
                "which are single strings ('' = missing): remove "
                "`max_length`, `required` and `dtype` from it.")
        for source in feature.sources:
            found = _source_problem(feature, source, kinds, earlier)
            if found:
                problems.append(found)
        earlier.add(feature.name)
    typed: dict[str, tuple[str, str]] = {}
    for feature in derived:
        for source in feature.sources:
            if source in kinds or source in earlier:
                continue
            dtype = feature.default_source_dtype()
            first = typed.setdefault(source, (dtype, feature.name))
            if first[0] != dtype:
                problems.append(
                    f"derived features {first[1]!r} and {feature.name!r} "
                    f"read raw column {source!r} as {first[0]} and {dtype}; "
                    "give both the same `source_dtype`.")
    return problems


def raw_inputs(dense: Sequence[Any], categorical: Sequence[Any],
               derived: Sequence[DerivedFeature]
               ) -> dict[str, tuple[str, bool]]:
    """The raw columns a spec reads besides the label, in order: ``{name:
    (serving dtype, is a list)}`` -- dense features (float32), categorical
    features that are not derived, then raw sources of derived features."""
    names = {d.name for d in derived}
    inputs = {f.name: ("float32", False) for f in dense}
    inputs.update({f.name: (f.dtype, f.multi_hot) for f in categorical
                   if f.name not in names})
    for feature in derived:
        for source in feature.sources:
            if source not in inputs and source not in names:
                inputs[source] = (feature.default_source_dtype(), False)
    return inputs
