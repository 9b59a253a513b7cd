"""The read-only shared data folder next to the checkout
(``<repo>/../shared/data``): real samples that must never be copied into
the repository."""

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
CRITEO_SAMPLE = "criteo/criteo_combined_10390.txt"
MOVIELENS_DIR = "movielens-100k"


def shared_data(relative: str) -> Path:
    """A path under the shared data folder. Missing data is a broken test
    setup, so the test fails (it is not skipped)."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.fail(
            f"Shared test data {str(path)!r} is missing; these tests need the "
            "read-only shared data folder next to the repository "
            "(<repo>/../shared/data).")
    return path
