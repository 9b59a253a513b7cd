"""Time columns in ``psrec spec infer``: a column of times is not a number
to standardize (with a time-ordered split every eval value lies past the
training range) but a source of derived ``hour_of_day`` and
``day_of_week`` features (``features.spec.derived``).

Recognised, from one pass of statistics (``data.infer.stats``):

* ints whose values all lie in 1980-01-01 .. 2100-01-01 as epoch seconds,
  or as epoch milliseconds, when the name looks like a time (``time``,
  ``timestamp``, ``ts``, ``date``, ``created_at``, ...);
* ints (or digit strings) of 8 digits that are all valid ``YYMMDDHH``
  times, when the column's distinct values are known exactly (Avazu's
  ``hour``);
* strings (whatever the name) whose non-empty values all match one
  fixed-width ISO-8601-like pattern (``stats.TEXT_TIME_PATTERNS``, e.g.
  ``YYYY-MM-DD HH:mm:ss``): a date-only pattern gives the weekday only;
  other ISO-8601 date-times (fractions of a second, UTC offsets) are times
  that no pattern reads: they are left out of the features (never a
  high-cardinality categorical) and only suggested as ``--order-by``.
"""

from __future__ import annotations

import re
from typing import Any

from psrec.data.infer.stats import ColumnStats
from psrec.features.spec.derived import EPOCH_MS
from psrec.features.spec.derived import DerivedFeature

_TIME_NAME = re.compile(r"(^|_)(time|timestamp|ts|date|datetime|hour|day)$"
                        r"|_at$|Time$|Timestamp$|Date$", re.IGNORECASE)
_EPOCH_S = (315_532_800, 4_102_444_800)  # 1980-01-01 .. 2100-01-01 UTC
_YYMMDDHH = re.compile(r"[0-9]{2}(0[1-9]|1[0-2])(0[1-9]|[12][0-9]|3[01])"
                       r"([01][0-9]|2[0-3])")
PARTS = {"hour": ("hour_of_day", 24), "weekday": ("day_of_week", 7)}


def _pattern(stats: ColumnStats) -> str | None | bool:
    """``None`` (epoch seconds), ``epoch_ms``, a pattern, ``ISO`` (a time
    no pattern reads), or False."""
    if (stats.kind == "string" and stats.time_pattern is not None
            and not stats.time_misses):
        return stats.time_pattern
    if not _TIME_NAME.search(stats.name) or stats.kind not in ("int",
                                                               "string"):
        return False
    values = stats.distinct.exact
    if values is not None and values and all(
            _YYMMDDHH.fullmatch(str(v)) for v in values):
        return "YYMMDDHH"
    if stats.kind != "int" or stats.count == 0:
        return False
    low, high = stats.minimum, stats.maximum
    if _EPOCH_S[0] <= low and high < _EPOCH_S[1]:
        return None
    if _EPOCH_S[0] * 1000 <= low and high < _EPOCH_S[1] * 1000:
        return EPOCH_MS
    return False


def time_features(stats: ColumnStats
                  ) -> tuple[list[DerivedFeature],
                             list[tuple[dict[str, Any], str, list[str]]],
                             str] | None:
    """The derived features of a time column, the categorical features
    that use them (keys, note, vocabulary) and the column's note; None
    when the column is no time."""
    pattern = _pattern(stats)
    if pattern is False:
        return None
    form = {None: "epoch seconds", EPOCH_MS: "epoch milliseconds"}.get(
        pattern, f"{pattern} times")
    if pattern == "ISO":
        return [], [], ("ISO-8601 text times in a form no fixed-width "
                        "pattern reads (fractions of a second or UTC "
                        "offsets): left out of the features (a time is no "
                        "category); reformat it as YYYY-MM-DD HH:mm:ss to "
                        "derive its hour and weekday")
    source_dtype = "int64" if stats.kind == "int" else "string"
    derived, categorical = [], []
    parts = {suffix: part for suffix, part in PARTS.items()
             if suffix != "hour" or pattern is None or pattern == EPOCH_MS
             or "HH" in pattern}
    for suffix, (kind, values) in parts.items():
        name = f"{stats.name}_{suffix}"
        derived.append(DerivedFeature(
            name, kind, (stats.name,), pattern=pattern,
            source_dtype=source_dtype if pattern else None))
        categorical.append((
            {"name": name},
            f"derived: {kind} of {stats.name} ({form}, UTC) -> vocabulary "
            f"of its {values} values", [str(v) for v in range(values)]))
    made = " and ".join(f"{stats.name}_{suffix}" for suffix in parts)
    note = (f"{form} -> derived {made} "
            "(a time is no number to standardize: with a time-ordered "
            "split every eval value would lie past the training range)")
    return derived, categorical, note
