"""Two-tower retrieval: which features feed the query tower, which the
candidate tower, and the column that identifies a candidate.

In a spec file::

    towers:
      query: [user_id, age, gender]
      candidate: [movie_id, genres]
      candidate_id: movie_id
      query_id: user_id        # optional: whose rows are one user's

Every categorical and dense feature of the spec belongs to exactly one
tower; the candidate tower is categorical only (a candidate is described by
the ids stored in its catalogue, see ``data.convert.catalogue``) and its
``candidate_id`` is a single-valued categorical feature. The optional
``query_id`` (a single-valued categorical query feature read from a raw
column) says which rows are one user's: evaluation leaves each user's train
candidates out of the ranking of the user's held-out pairs
(``data.convert.seen``). A spec without ``towers`` trains ranking models
only, and its fingerprint is unchanged (nor is one without ``query_id``).
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Sequence

from psrec.errors import did_you_mean
from psrec.features.spec.columns import CategoricalFeature
from psrec.features.spec.columns import DenseFeature
from psrec.features.spec.columns import SpecError

TOWER_KEYS = ("query", "candidate", "candidate_id", "query_id")
_REQUIRED_KEYS = TOWER_KEYS[:3]


@dataclasses.dataclass(frozen=True)
class TowersConfig:
    """The split of a spec's features into the two towers.

    Attributes:
      query: features of the query (user, context) tower.
      candidate: categorical features of the candidate (item) tower.
      candidate_id: the candidate tower's id feature: one candidate per
        distinct raw value (the catalogue's key).
      query_id: the query tower's user id feature, or None: the rows of
        one raw value are one user's, whose train candidates the
        evaluation leaves out of the ranking (the user has seen them).
    """

    query: tuple[str, ...]
    candidate: tuple[str, ...]
    candidate_id: str
    query_id: str | None = None

    def __post_init__(self) -> None:
        problems = []
        for key in ("query", "candidate"):
            value = getattr(self, key)
            if isinstance(value, str) or not isinstance(
                    value, (list, tuple)) or not value or not all(
                    isinstance(v, str) and v for v in value):
                problems.append(
                    f"towers: `{key}` = {value!r} must be a non-empty list "
                    "of feature names.")
            else:
                object.__setattr__(self, key, tuple(value))
        if not isinstance(self.candidate_id, str) or not self.candidate_id:
            problems.append(f"towers: `candidate_id` = {self.candidate_id!r}"
                            " must name a candidate feature.")
        if self.query_id is not None and (
                not isinstance(self.query_id, str) or not self.query_id):
            problems.append(f"towers: `query_id` = {self.query_id!r} must "
                            "name a query feature (or be left out).")
        if problems:
            raise SpecError.of(problems)

    def to_dict(self) -> dict[str, Any]:
        data = {"query": list(self.query), "candidate": list(self.candidate),
                "candidate_id": self.candidate_id}
        if self.query_id is not None:  # left out: the fingerprint stays
            data["query_id"] = self.query_id
        return data


def towers_problems(towers: TowersConfig | None,
                    dense: Sequence[DenseFeature],
                    categorical: Sequence[CategoricalFeature]) -> list[str]:
    """How ``towers`` fits the spec's features (empty: it fits, or there
    are no towers)."""
    if towers is None:
        return []
    dense_names = [f.name for f in dense]
    categorical_by_name = {f.name: f for f in categorical}
    known = set(dense_names) | set(categorical_by_name)
    problems = []
    for key in ("query", "candidate"):
        for name in getattr(towers, key):
            if name not in known:
                problems.append(
                    f"towers: `{key}` names {name!r}, which is not a dense "
                    f"or categorical feature of the spec; known: "
                    f"{sorted(known)}"
                    f"{did_you_mean(name, sorted(known)) or '.'}")
    attended = [f.name for f in categorical if f.combiner == "din"]
    if attended:
        problems.append(f"towers: {attended} use `combiner: din`, which "
                        "attends a history by the candidate inside one "
                        "model; a two-tower model scores the towers apart: "
                        "use `combiner: mean` or `sum`.")
    both = sorted(set(towers.query) & set(towers.candidate))
    if both:
        problems.append(f"towers: {both} are in both `query` and "
                        "`candidate`; put each feature in one tower.")
    missing = sorted(known - set(towers.query) - set(towers.candidate))
    if missing:
        problems.append(f"towers: features {missing} are in neither tower; "
                        "add each to `query` or `candidate`.")
    dense_candidates = sorted(set(towers.candidate) & set(dense_names))
    if dense_candidates:
        problems.append(
            f"towers: `candidate` lists dense features {dense_candidates}; "
            "the candidate tower takes categorical features only: move them "
            "to `query` or bucketize them into categorical features.")
    feature = categorical_by_name.get(towers.candidate_id)
    if towers.candidate_id not in towers.candidate:
        problems.append(
            f"towers: `candidate_id` = {towers.candidate_id!r} must be one "
            f"of the `candidate` features {list(towers.candidate)}"
            f"{did_you_mean(towers.candidate_id, towers.candidate) or '.'}")
    elif feature is not None and feature.multi_hot:
        problems.append(
            f"towers: `candidate_id` = {towers.candidate_id!r} is a list "
            "feature (max_length > 1); name a single-valued feature.")
    if towers.query_id is not None:
        user = categorical_by_name.get(towers.query_id)
        if towers.query_id not in towers.query or user is None:
            problems.append(
                f"towers: `query_id` = {towers.query_id!r} must be one of "
                "the categorical `query` features "
                f"{[n for n in towers.query if n in categorical_by_name]}"
                f"{did_you_mean(towers.query_id, towers.query) or '.'}")
        elif user.multi_hot:
            problems.append(
                f"towers: `query_id` = {towers.query_id!r} is a list "
                "feature (max_length > 1); name a single-valued feature.")
    return problems


def towers_from_dict(data: Any, problems: list[str]) -> TowersConfig | None:
    """Builds the ``towers`` part of a spec mapping (None, after adding the
    problems to ``problems``, when it does not build)."""
    if data is None:
        return None
    if not isinstance(data, dict):
        problems.append(f"towers: expected a mapping with keys "
                        f"{', '.join(TOWER_KEYS)}, got {data!r}.")
        return None
    found = [f"towers: unknown key {key!r}{did_you_mean(key, TOWER_KEYS)} "
             f"(allowed keys: {', '.join(TOWER_KEYS)})." for key in data
             if key not in TOWER_KEYS]
    found += [f"towers: missing required key `{key}`." for key in
              _REQUIRED_KEYS if key not in data]
    if found:
        problems += found
        return None
    try:
        return TowersConfig(**data)
    except SpecError as error:
        problems += error.problems
        return None
