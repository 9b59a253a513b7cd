"""User-history features: a categorical list feature whose values, at
conversion, are the ids of the same user's earlier events, built from the
log itself (``history: {of: item_id, by: user_id, order: timestamp}``); at
serving the request gives the list, as for any multi-hot feature.

The feature shares the embedding rows of ``of`` (one lookup per table,
de-duplicated) and holds ``max_length`` ids, most recent first; only events
strictly earlier in ``order`` count (rows of the same time never see each
other). How conversion builds it: ``data.convert.history``; the spec form:
``docs/feature-spec.md``, "User history".
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Mapping
from typing import Sequence

HISTORY_KEYS = ("of", "by", "order")
#: The combiners that pool a history by its target item (the ``of``
#: feature): ``din`` target attention, ``bst`` a transformer layer over the
#: target and the history (``models.embedding.attention``).
ATTENTION_COMBINERS = ("din", "bst")


@dataclasses.dataclass(frozen=True)
class History:
    """Where a history feature's values come from.

    Attributes:
        of: the single-valued categorical feature whose values the history
            lists (the item); the history shares its rows.
        by: the single-valued categorical feature that groups events (the
            user).
        order: the integer or timestamp column that orders events (the
            event time); conversion requires it non-decreasing over the
            inputs in the order they are given.
    """

    of: str
    by: str
    order: str

    @classmethod
    def parse(cls, where: str, value: Any) -> tuple[History | None,
                                                    list[str]]:
        """The history of a spec's ``history`` value (a mapping or a
        :class:`History`) and the problems found."""
        if isinstance(value, History):
            return value, []
        if not isinstance(value, Mapping):
            return None, [f"{where}: `history` = {value!r} must be a mapping "
                          "such as {of: item_id, by: user_id, order: "
                          "timestamp}."]
        problems = []
        extra = sorted(set(value) - set(HISTORY_KEYS))
        if "max_length" in extra:
            problems.append(f"{where}: `history` takes no `max_length`; give "
                            "`max_length` on the feature itself (the "
                            "length of its list).")
        elif extra:
            problems.append(f"{where}: `history` has unknown key(s) "
                            f"{', '.join(extra)}; it takes "
                            f"{', '.join(HISTORY_KEYS)}.")
        for key in HISTORY_KEYS:
            if not isinstance(value.get(key), str) or not value.get(key):
                problems.append(f"{where}: `history.{key}` = "
                                f"{value.get(key)!r} must be a column name.")
        if problems:
            return None, problems
        return cls(**{k: value[k] for k in HISTORY_KEYS}), []


def history_problems(categorical: Sequence[Any],
                     derived_names: frozenset[str] | set[str]) -> list[str]:
    """How the history features fit the rest of a spec: ``of`` and ``by``
    are plain single-valued categorical features, the list has the item's
    type and rows."""
    by_name = {f.name: f for f in categorical}
    problems = []
    for feature in categorical:
        history = feature.history
        if history is None:
            continue
        where = f"categorical feature {feature.name!r}"
        for key in ("of", "by"):
            name = getattr(history, key)
            source = by_name.get(name)
            if (source is None or source.multi_hot or name in derived_names
                    or source.history is not None):
                problems.append(
                    f"{where}: `history.{key}` = {name!r} must be a "
                    "single-valued categorical feature of the spec read "
                    "from the input (not derived, not a list).")
        item = by_name.get(history.of)
        if item is not None and feature.dtype != item.dtype:
            problems.append(f"{where}: its values are {history.of!r} values "
                            f"({item.dtype}); give `dtype: {item.dtype}`.")
        if history.order in by_name or history.order in (history.of,
                                                         history.by):
            problems.append(f"{where}: `history.order` = {history.order!r} "
                            "must be an integer or timestamp column that "
                            "is no categorical feature (the event time).")
    return problems


def log_columns(categorical: Sequence[Any]) -> tuple[str, ...]:
    """The order columns of the history features, in spec order (read at
    conversion only: the serving function takes the history lists)."""
    found: dict[str, None] = {}
    for feature in categorical:
        if feature.history is not None:
            found[feature.history.order] = None
    return tuple(found)
