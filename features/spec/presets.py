"""Named feature specs shipped with psrec: ``criteo``, ``movielens``,
``movielens-retrieval`` and ``movielens-rating``.

Presets are built in code from one pattern each (no copied variants),
``resolve_spec`` turns a preset name or a spec file path into a spec and
``with_absolute_vocabularies`` gives a spec the form that reads the same
files from any folder (the form ``psrec convert`` saves beside its data).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from psrec.errors import did_you_mean
from psrec.features.spec.columns import CategoricalFeature
from psrec.features.spec.columns import DenseFeature
from psrec.features.spec.columns import LabelConfig
from psrec.features.spec.columns import SpecError
from psrec.features.spec.columns import TableConfig
from psrec.features.spec.spec import FeatureSpec
from psrec.features.spec.towers import TowersConfig
from psrec.uri_path import as_path

CRITEO_DENSE = tuple(f"I{i}" for i in range(1, 14))
CRITEO_CATEGORICAL = tuple(f"C{i}" for i in range(1, 27))


def criteo(buckets: int = 10_000, dim: int = 16) -> FeatureSpec:
    """The Kaggle Criteo display-ads schema.

    label; I1..I13 counts (log1p); C1..C26 hashed strings, each into its own
    ``buckets`` rows of one shared table (row offsets keep them apart), which
    is the layout of a single giant PS-sharded table.
    """
    return FeatureSpec(
        name="criteo",
        label=LabelConfig("label"),
        dense=tuple(DenseFeature(name, transform="log1p")
                    for name in CRITEO_DENSE),
        categorical=tuple(
            CategoricalFeature(name, table="categorical", hash_buckets=buckets,
                               row_offset=i * buckets)
            for i, name in enumerate(CRITEO_CATEGORICAL)),
        tables=(TableConfig("categorical",
                            rows=buckets * len(CRITEO_CATEGORICAL), dim=dim),),
    )


def movielens(dim: int = 16) -> FeatureSpec:
    """MovieLens-100k as a click-style task: label = rating >= 4.

    user and item ids (int64, hashed), genres as multi-hot (mean), user
    gender/occupation/zip categoricals and age standardised with the
    statistics of ml-100k's u.user (mean 34.05, std 12.19).
    """
    def table(name: str, rows: int) -> TableConfig:
        return TableConfig(name, rows=rows, dim=dim)

    return FeatureSpec(
        name="movielens",
        label=LabelConfig("rating", threshold=4),
        dense=(DenseFeature("age", transform="standardize", mean=34.05,
                            std=12.19, default=34.05),),
        categorical=(
            CategoricalFeature("user_id", table="user", dtype="int64",
                               hash_buckets=2000, required=True),
            CategoricalFeature("item_id", table="item", dtype="int64",
                               hash_buckets=4000, required=True),
            CategoricalFeature("genres", table="genre", hash_buckets=64,
                               max_length=6, combiner="mean"),
            CategoricalFeature("gender", table="user_attr", hash_buckets=8),
            CategoricalFeature("occupation", table="user_attr",
                               hash_buckets=64, row_offset=8),
            CategoricalFeature("zip", table="user_attr", hash_buckets=1000,
                               row_offset=72),
        ),
        tables=(table("user", 2000), table("item", 4000), table("genre", 64),
                table("user_attr", 1072)),
    )


def movielens_retrieval(dim: int = 32) -> FeatureSpec:
    """MovieLens-100k for two-tower retrieval: every rating is a positive
    (user, movie) pair (label = rating >= 1).

    Query tower: the user id (the ``query_id``: a user's train movies are
    left out of the ranking of the user's held-out pairs) and demographics
    (age standardised as in :func:`movielens`); candidate tower: the movie
    id and its genres.
    The id tables are hashed ~50x wider than the ids they hold, so few
    users or movies share a row (a shared row makes two movies one).
    """
    base = movielens(dim)
    wide_ids = {"user_id": 50_000, "item_id": 100_000}
    categorical = tuple(
        dataclasses.replace(f, hash_buckets=wide_ids.get(f.name,
                                                         f.hash_buckets))
        for f in base.categorical)
    tables = tuple(
        dataclasses.replace(t, rows=wide_ids[f"{t.name}_id"])
        if f"{t.name}_id" in wide_ids else t for t in base.tables)
    return dataclasses.replace(
        base, name="movielens-retrieval",
        label=LabelConfig("rating", threshold=1),
        categorical=categorical, tables=tables,
        towers=TowersConfig(
            query=("user_id", "age", "gender", "occupation", "zip"),
            candidate=("item_id", "genres"), candidate_id="item_id",
            query_id="user_id"))


def movielens_rating(dim: int = 16) -> FeatureSpec:
    """MovieLens-100k rating regression: :func:`movielens`'s features,
    the rating itself as the label (``loss: mse``, evaluated by RMSE)."""
    return dataclasses.replace(movielens(dim), name="movielens-rating",
                               label=LabelConfig("rating", loss="mse"))


PRESETS: dict[str, Callable[[], FeatureSpec]] = {
    "criteo": criteo,
    "movielens": movielens,
    "movielens-retrieval": movielens_retrieval,
    "movielens-rating": movielens_rating,
}


def resolve_spec(spec: str | Path | FeatureSpec) -> FeatureSpec:
    """Returns a spec from a preset name, a spec file path or a spec; a
    SpecError when ``spec`` is neither a preset nor an existing file."""
    if isinstance(spec, FeatureSpec):
        return spec
    text = str(spec)
    if text in PRESETS:
        return PRESETS[text]()
    if as_path(text).is_file():
        return FeatureSpec.load(text)
    raise SpecError(
        f"`--spec` = {text!r} is neither a preset ({', '.join(PRESETS)}) "
        f"nor an existing YAML/JSON file{did_you_mean(text, PRESETS)}"
    )


def with_absolute_vocabularies(spec: FeatureSpec) -> FeatureSpec:
    """``spec`` with every relative ``vocabulary_file`` made absolute
    (against the current folder, which relative paths already mean), so a
    copy of the spec saved anywhere reads the same vocabularies and keeps
    its fingerprint; a spec without relative vocabulary paths is returned
    as is."""
    categorical = tuple(
        dataclasses.replace(
            feature, vocabulary_file=str(
                as_path(feature.vocabulary_file).absolute()))
        if feature.vocabulary_file is not None
        and not as_path(feature.vocabulary_file).is_absolute() else feature
        for feature in spec.categorical)
    if categorical == spec.categorical:
        return spec
    return dataclasses.replace(spec, categorical=categorical)
