"""Negative down-sampling of the train split (``psrec convert
--neg-sample-rate R``).

Every positive is kept; each train negative is kept with probability ``R``,
decided by a stable hash of its row id -- salted so it is independent of the
``hash`` eval split -- so a re-run keeps the same rows. A model trained on
such data predicts odds ``1/R`` times too high; ``logit + log(R)`` is the
calibrated logit (see :func:`logit_shift`), which evaluation and the serving
export apply.
"""

from __future__ import annotations

import math

import numpy as np

from psrec.data.convert.config import check_neg_sample_rate
from psrec.data.convert.split import splitmix64

_SALT = 0xD1B54A32D192ED03  # independent of the hash eval split
_UNIT = 2.0 ** -53


def uniform_of_ids(ids: np.ndarray) -> np.ndarray:
    """A stable, well-mixed number in [0, 1) per row id (salted
    splitmix64)."""
    return (splitmix64(ids, _SALT) >> np.uint64(11)).astype(
        np.float64) * _UNIT


def kept_rows(ids: np.ndarray, labels: np.ndarray, rate: float) -> np.ndarray:
    """Whether each row is kept: every positive (label != 0), and the
    negatives whose id hashes below ``rate``."""
    keep = np.asarray(labels) != 0
    if rate >= 1.0:
        return np.ones(len(keep), bool)
    return keep | (uniform_of_ids(np.asarray(ids)) < rate)


def logit_shift(neg_sample_rate: float) -> float:
    """What to add to the logit of a model trained on negatives kept at
    ``neg_sample_rate`` so its probabilities are calibrated: ``log(R)``
    (0.0 when nothing was sampled)."""
    check_neg_sample_rate(neg_sample_rate)
    return math.log(neg_sample_rate) if neg_sample_rate < 1.0 else 0.0


def sampling_summary(manifest) -> list[str]:
    """The conversion summary's line about the sampling ([] without)."""
    if manifest is None or manifest.neg_sample_rate >= 1.0:
        return []
    return [f"negative sampling: kept train negatives at rate "
            f"{manifest.neg_sample_rate:g}, dropped "
            f"{manifest.negatives_dropped} (the eval split is not sampled)"]
