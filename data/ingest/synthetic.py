"""Seeded synthetic data for any feature spec, with a learnable ground truth.

Rows look like real click logs in the ways that matter to training:
categorical values follow a power law (a few values are very frequent, most
are rare), dense counts are heavy-tailed with ~10% missing, and the label is
drawn from a fixed hidden logistic model (per-value weights of every
categorical feature, weights on the transformed dense features and one
pairwise interaction), so AUC and logloss mean something: a model that learns
the hidden weights beats the base rate. The same seed gives the same rows.

The output has exactly the Parquet schema ``psrec convert`` expects for the
spec, so it is the embedded default data of ``psrec train`` and the demo.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from psrec.data.format.files import atomic_output
from psrec.data.format.files import parquet_sink
from psrec.errors import check
from psrec.features.spec.columns import CategoricalFeature
from psrec.features.spec.columns import DenseFeature
from psrec.features.spec.derived import EPOCH_MS
from psrec.features.spec.spec import FeatureSpec
from psrec.options import Codec
from psrec.options import option
from psrec.options import qualified
from psrec.uri_path import as_path

_CHUNK_ROWS = 50_000
_ZIPF_EXPONENT = 1.15
_MISSING_DENSE = 0.1


def _feature_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


@dataclasses.dataclass(frozen=True)
class Drift(Codec, where="drift"):
    """A drifting stream: the hidden click model of day ``day`` turns by
    ``rate`` radians per day away from day 0's (the seed's model). Each
    categorical feature's weights are ``cos(t) w0 + sin(t) w1`` at
    ``t = rate * day``, with ``w1`` an independent draw of the same scale,
    so day ``d``'s weights correlate ``cos(rate * d)`` with day 0's and
    every day is as learnable as the first."""

    day: int = option(
        0, flag="--day",
        help="the day of a drifting stream to write (with --drift; each "
        "day also draws its own rows)")
    rate: float = option(
        0.0, flag="--drift",
        help="radians per day the hidden click model turns: day d's "
        "categorical weights correlate cos(drift x d) with day 0's; 0: no "
        "drift (every day the seed's model)")

    def __post_init__(self) -> None:
        check(self.day >= 0, qualified(self, "day"), self.day, "must be >= 0")
        check(self.rate >= 0, qualified(self, "rate"), self.rate,
              "must be >= 0")

    @property
    def angle(self) -> float:
        return self.rate * self.day


@dataclasses.dataclass(frozen=True)
class _Truth:
    """The hidden model: per-value weights and dense weights."""

    cardinality: dict[str, int]
    weights: dict[str, np.ndarray]
    dense_weights: np.ndarray
    bias: float


def _cardinality(feature: CategoricalFeature) -> int:
    if feature.vocabulary_file is not None:
        return len(feature.vocabulary())
    return max(2, min((feature.hash_buckets or 100_000) * 2, 200_000))


def _truth(spec: FeatureSpec, seed: int, drift: Drift = Drift()) -> _Truth:
    cardinality, weights = {}, {}
    scale = 1.6 / max(1, len(spec.categorical)) ** 0.5
    for feature in spec.categorical:
        rng = np.random.default_rng(_feature_seed(seed, feature.name))
        cardinality[feature.name] = _cardinality(feature)
        first = rng.normal(0.0, scale, cardinality[feature.name])
        if drift.angle:
            other = np.random.default_rng(_feature_seed(
                seed, f"{feature.name}:drift")).normal(0.0, scale,
                                                       first.shape)
            first = (np.cos(drift.angle) * first
                     + np.sin(drift.angle) * other)
        weights[feature.name] = first.astype(np.float32)
    rng = np.random.default_rng(_feature_seed(seed, "__dense__"))
    dense_weights = rng.normal(0.0, 0.8 / max(1, len(spec.dense)) ** 0.5,
                               len(spec.dense))
    return _Truth(cardinality, weights, dense_weights, bias=-1.3)


def _zipf_index(rng: np.random.Generator, size: int | tuple,
                cardinality: int) -> np.ndarray:
    """Power-law ranks in [0, cardinality)."""
    ranks = rng.zipf(_ZIPF_EXPONENT, size) - 1
    # Fold the long tail back uniformly so every value can occur.
    tail = ranks >= cardinality
    ranks[tail] = rng.integers(0, cardinality, int(tail.sum()))
    return ranks


def _raw_values(feature: CategoricalFeature, ranks: np.ndarray) -> np.ndarray:
    """The raw value of each rank: a string token or an int id."""
    if feature.vocabulary_file is not None:
        vocabulary = np.array(feature.vocabulary(), dtype=object)
        return vocabulary[ranks]
    salt = _feature_seed(0, feature.name) % (1 << 20)
    if feature.dtype == "int64":
        return ranks.astype(np.int64) + 1 + salt
    return np.char.mod("%08x", (ranks.astype(np.int64) * 2654435761 + salt)
                       % (1 << 32)).astype(object)


def _dense_values(feature: DenseFeature, rng: np.random.Generator,
                  rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Raw values and their transformed form (what the hidden model sees)."""
    if feature.transform == "log1p":
        raw = np.floor(np.exp(rng.normal(1.0, 1.5, rows))).astype(np.float64)
        return raw, np.log1p(raw)
    if feature.transform == "standardize":
        raw = rng.normal(feature.mean, feature.std, rows)
        return raw, (raw - feature.mean) / feature.std
    raw = rng.uniform(0.0, 1.0, rows)
    return raw, raw - 0.5


def _format_times(seconds: np.ndarray, pattern: str) -> list[str]:
    """Epoch seconds written in a fixed-width time pattern (UTC)."""
    stamps = seconds.astype("datetime64[s]").astype(datetime.datetime)
    codes = (("YYYY", "%Y"), ("YY", "%y"), ("MM", "%m"), ("DD", "%d"),
             ("HH", "%H"), ("mm", "%M"), ("ss", "%S"))
    text = pattern.replace("%", "%%")
    for token, code in codes:
        text = text.replace(token, code)
    return [stamp.strftime(text) for stamp in stamps]


def _derived_sources(spec: FeatureSpec, rng: np.random.Generator,
                     rows: int) -> dict[str, pa.Array]:
    """Raw source columns of derived features that are no feature
    themselves: times in 2024 (UTC) and log-normal numbers."""
    columns = {}
    for name, (dtype, _) in spec.raw_inputs.items():
        users = [d for d in spec.derived if name in d.sources]
        if not users:
            continue
        feature = users[0]
        if feature.kind == "bucketize":
            columns[name] = pa.array(rng.lognormal(1.0, 1.5, rows))
            continue
        seconds = rng.integers(1_704_067_200, 1_735_689_600, rows)
        if feature.pattern is None:
            values = pa.array(seconds)
        elif feature.pattern == EPOCH_MS:
            values = pa.array(seconds * 1000)
        else:
            values = pa.array(_format_times(seconds, feature.pattern))
            if dtype == "int64":
                values = values.cast(pa.int64())
        columns[name] = values
    return columns


def _chunk(spec: FeatureSpec, truth: _Truth, seed: int, index: int,
           rows: int, day: int = 0) -> pa.Table:
    rng = np.random.default_rng([seed, index] if not day
                                else [seed, index, day])
    logit = np.full(rows, truth.bias)
    columns: dict[str, pa.Array] = {}
    for j, feature in enumerate(spec.dense):
        raw, seen = _dense_values(feature, rng, rows)
        logit += truth.dense_weights[j] * (seen - seen.mean())
        missing = rng.random(rows) < _MISSING_DENSE
        values = raw.astype(np.int64) if feature.transform == "log1p" else raw
        columns[feature.name] = pa.array(values, mask=missing)
    first_weights = None
    columns.update(_derived_sources(spec, rng, rows))
    for feature in spec.categorical:
        if feature.name in spec.derived_names():
            continue  # computed from its sources at conversion
        card = truth.cardinality[feature.name]
        weights = truth.weights[feature.name]
        if feature.multi_hot:
            lengths = rng.integers(1, feature.max_length + 1, rows)
            ranks = _zipf_index(rng, int(lengths.sum()), card)
            row = np.repeat(np.arange(rows), lengths)
            logit += np.bincount(row, weights[ranks], rows) / lengths
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            columns[feature.name] = pa.ListArray.from_arrays(
                pa.array(offsets, pa.int32()),
                pa.array(_raw_values(feature, ranks)))
            continue
        ranks = _zipf_index(rng, rows, card)
        logit += weights[ranks]
        if first_weights is None:
            first_weights = weights[ranks]
        elif first_weights is not False:  # one pairwise interaction
            logit += 1.5 * first_weights * weights[ranks] / max(
                1e-6, float(weights.std() * weights.std()) ** 0.5)
            first_weights = False
        columns[feature.name] = pa.array(_raw_values(feature, ranks))
    labels = {label.name: _label_column(label, rng.random(rows) < 1.0 / (
        1.0 + np.exp(-logit))) for label in spec.labels[:1]}
    for label in spec.further_labels:  # further tasks: the same signal
        noisy = logit + rng.normal(0.0, 1.0, rows)
        labels[label.name] = (noisy if label.regression else _label_column(
            label, rng.random(rows) < 1.0 / (1.0 + np.exp(-noisy))))
    return pa.table({**labels, **columns})


def _label_column(label, clicked: np.ndarray) -> np.ndarray:
    """A 0/1 outcome as ``label``'s raw column: 0/1, or a rating-like value
    on either side of its threshold."""
    if label.threshold is None:
        return clicked.astype(np.int64)
    return np.where(clicked, np.ceil(label.threshold),
                    np.ceil(label.threshold) - 1).astype(np.int64)


def synthetic_table(spec: FeatureSpec, rows: int, seed: int = 0,
                    first_chunk: int = 0) -> pa.Table:
    """``rows`` synthetic rows as one Arrow table (for tests and small data)."""
    truth = _truth(spec, seed)
    tables = []
    for i, start in enumerate(range(0, rows, _CHUNK_ROWS)):
        tables.append(_chunk(spec, truth, seed, first_chunk + i,
                             min(_CHUNK_ROWS, rows - start)))
    return pa.concat_tables(tables)


def write_synthetic_parquet(spec: FeatureSpec, out_dir: str | Path,
                            rows: int, *, files: int = 4,
                            seed: int = 0, drift: Drift = Drift()
                            ) -> list[str]:
    """Writes ``rows`` synthetic rows as ``files`` Parquet files, streamed
    chunk by chunk; returns their paths in row order. ``drift``: the day
    of a drifting stream (:class:`Drift`; the default is day 0 without
    drift, the seed's own rows and model)."""
    check(rows >= 1, "rows", rows, "must be >= 1")
    check(files >= 1, "files", files, "must be >= 1")
    out = as_path(out_dir)  # a local path or a URI
    out.mkdir(parents=True, exist_ok=True)
    truth = _truth(spec, seed, drift)
    per_file = -(-rows // files)
    paths, chunk_index = [], 0
    for f in range(files):
        count = min(per_file, rows - f * per_file)
        if count <= 0:
            break
        path = out / f"{spec.name}-synthetic-{f:03d}.parquet"
        with atomic_output(path) as tmp, parquet_sink(tmp) as sink:
            writer = None
            for start in range(0, count, _CHUNK_ROWS):
                table = _chunk(spec, truth, seed, chunk_index,
                               min(_CHUNK_ROWS, count - start), drift.day)
                chunk_index += 1
                if writer is None:
                    writer = pq.ParquetWriter(sink, table.schema)
                writer.write_table(table)
            writer.close()
        paths.append(str(path))
    return paths
