"""Tests for data.synthetic: seeded, power-law, learnable synthetic data."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from psrec.data.convert.checks import check_schema
from psrec.data.ingest.synthetic import synthetic_table
from psrec.data.ingest.synthetic import write_synthetic_parquet
from psrec.features import criteo
from psrec.features import movielens

SPEC = criteo(buckets=1000)
ROWS = 20_000


@pytest.fixture(scope="module")
def table():
    return synthetic_table(SPEC, ROWS, seed=0)


def _sorted_counts(column) -> np.ndarray:
    counts = pc.value_counts(column).field("counts").to_numpy()
    return np.sort(counts)[::-1]


def test_same_seed_gives_identical_table_and_other_seed_differs(table):
    assert synthetic_table(SPEC, ROWS, seed=0).equals(table)
    other = synthetic_table(SPEC, ROWS, seed=1)
    assert other.schema == table.schema
    assert not other.equals(table)
    for name in ("label", "I1", "C1", "C26"):
        assert not other.column(name).equals(table.column(name)), name


def test_write_synthetic_parquet_is_deterministic(tmp_path):
    first = write_synthetic_parquet(SPEC, tmp_path / "a", 3001, files=4, seed=3)
    second = write_synthetic_parquet(SPEC, tmp_path / "b", 3001, files=4,
                                     seed=3)
    assert [pq.read_metadata(p).num_rows for p in first] == [751, 751, 751,
                                                             748]
    for a, b in zip(first, second):
        assert pq.read_table(a).equals(pq.read_table(b))
    third = write_synthetic_parquet(SPEC, tmp_path / "c", 3001, files=4,
                                    seed=4)
    assert not pq.read_table(third[0]).equals(pq.read_table(first[0]))


@pytest.mark.parametrize("preset", [criteo, movielens],
                         ids=["criteo", "movielens"])
def test_synthetic_schema_is_what_convert_expects(preset):
    spec = preset()
    small = synthetic_table(spec, 50, seed=0)
    assert check_schema("synthetic", small.schema, spec) == ()
    assert small.column_names == list(spec.columns)


def test_label_positive_rate_is_click_like(table):
    labels = table.column("label").to_numpy()
    assert set(np.unique(labels)) == {0, 1}
    assert 0.1 < labels.mean() < 0.5
    ratings = synthetic_table(movielens(), 5000, seed=0).column(
        "rating").to_numpy()
    assert 0.1 < (ratings >= 4).mean() < 0.5


def test_dense_counts_have_about_ten_percent_missing(table):
    for i in (1, 7, 13):
        column = table.column(f"I{i}")
        assert 0.07 < column.null_count / ROWS < 0.13
        values = column.drop_null().to_numpy()
        assert values.min() >= 0
        # Heavy-tailed: the max is far above the median.
        assert values.max() > 20 * max(1, np.median(values))


def test_categorical_frequencies_follow_a_power_law(table):
    for name in ("C1", "C13", "C26"):
        counts = _sorted_counts(table.column(name))
        assert counts[0] > 50 * np.median(counts), name
        assert 0.05 < counts[0] / ROWS < 0.3, name
        # log(count) against log(rank) over the head is a line of slope
        # about -1.15 (the Zipf exponent).
        ranks = np.arange(1, 21)
        slope = np.polyfit(np.log(ranks), np.log(counts[:20]), 1)[0]
        assert -1.6 < slope < -0.8, (name, slope)
        # ... and the tail is long: many values occur once.
        assert (counts == 1).sum() > 100, name


def _chi_square_of_top_values(values: np.ndarray, labels: np.ndarray,
                              top: int = 20) -> float:
    """Chi-square of the click rates of the ``top`` most frequent values
    against the overall rate (about ``top`` when labels ignore the value)."""
    uniques, inverse, counts = np.unique(values, return_inverse=True,
                                         return_counts=True)
    rate = labels.mean()
    clicks = np.bincount(inverse, weights=labels, minlength=len(uniques))
    chosen = np.argsort(counts)[::-1][:top]
    expected = counts[chosen] * rate
    return float(np.sum((clicks[chosen] - expected) ** 2
                        / (expected * (1 - rate))))


def test_label_depends_on_categorical_values(table):
    """The hidden logistic model leaves a signal a model can learn: click
    rates differ between values far more than chance allows."""
    labels = table.column("label").to_numpy().astype(np.float64)
    permuted = np.random.default_rng(0).permutation(labels)
    signal = noise = 0.0
    for i in range(1, 27):
        values = np.asarray(table.column(f"C{i}").to_pylist(), object)
        signal += _chi_square_of_top_values(values, labels)
        noise += _chi_square_of_top_values(values, permuted)
    degrees = 26 * 20
    assert noise < 1.5 * degrees  # the statistic itself is calibrated
    assert signal > 2.5 * degrees


def test_drift_turns_the_click_model_day_by_day(tmp_path):
    """Day 0 (any drift) is the seed's own data; day d's hidden weights
    correlate cos(drift x d) with day 0's, and its rows are its own."""
    from psrec.data.ingest.synthetic import Drift
    from psrec.data.ingest.synthetic import _truth
    spec = criteo()
    plain = write_synthetic_parquet(spec, tmp_path / "a", 300, files=1)
    day0 = write_synthetic_parquet(spec, tmp_path / "b", 300, files=1,
                                   drift=Drift(day=0, rate=0.5))
    assert pq.read_table(plain[0]).equals(pq.read_table(day0[0]))
    day3 = write_synthetic_parquet(spec, tmp_path / "c", 300, files=1,
                                   drift=Drift(day=3, rate=0.5))
    assert not pq.read_table(day3[0]).equals(pq.read_table(day0[0]))
    name = spec.categorical[0].name
    for day in (1, 3):
        turned = _truth(spec, 0, Drift(day=day, rate=0.5)).weights[name]
        corr = np.corrcoef(_truth(spec, 0).weights[name], turned)[0, 1]
        assert corr == pytest.approx(np.cos(0.5 * day), abs=0.02)
