"""Test-suite setup: the TensorFlow environment is configured once, here,
through the same function every psrec entry point uses."""

from psrec.runtime import configure_environment

configure_environment()

import pytest  # noqa: E402  (after configure_environment, like every import)

# The spec, data and cluster shared by the in-process cluster tests
# (test_ps_training.py, test_export.py): tiny, so a run takes seconds. Their
# sizes live in tests/_ps_helpers.py, imported lazily (it imports TensorFlow).


@pytest.fixture(scope="session")
def ps_cluster():
    """One in-process cluster of 2 workers + 2 PS for the whole session.

    In-process servers cannot be stopped, so there is exactly one cluster
    shape per process; tests needing another shape run in a subprocess.
    """
    from psrec.ps_cluster.cluster.in_process import in_process_cluster
    from tests._ps_helpers import CLUSTER_PS
    from tests._ps_helpers import CLUSTER_WORKERS
    return in_process_cluster(CLUSTER_WORKERS, CLUSTER_PS)


@pytest.fixture(scope="session")
def small_criteo_spec():
    from psrec.features.spec.presets import criteo
    from tests._ps_helpers import SMALL_CRITEO
    return criteo(**SMALL_CRITEO)


@pytest.fixture(scope="session")
def criteo_data(tmp_path_factory, small_criteo_spec):
    """20,000 synthetic Criteo-like rows (2 Parquet files) converted into 4
    train shards (16,000 rows) and 4 eval shards (the last 4,000 rows).

    Returns ``(manifest, parquet paths)``.
    """
    from psrec.data.convert.convert import ConversionOptions
    from psrec.data.convert.convert import convert
    from psrec.data.ingest.synthetic import write_synthetic_parquet
    from tests._ps_helpers import SYNTHETIC_ROWS
    root = tmp_path_factory.mktemp("criteo-data")
    paths = write_synthetic_parquet(small_criteo_spec, root / "parquet",
                                    SYNTHETIC_ROWS, files=2, seed=0)
    report = convert(paths, small_criteo_spec, root / "tfrecord",
                     ConversionOptions(shards=4, eval_fraction=0.2))
    assert report.rows_written == {"train": 16_000, "eval": 4_000}
    return report.manifest, paths


def pytest_collection_modifyitems(items):
    """The modules with the most ``slow`` tests first, each module's tests
    in their order: ``make test`` hands whole files to two workers
    (``--dist loadfile --no-loadscope-reorder``), and a long file handed
    out last would leave one worker idle while the other runs it alone."""
    from collections import Counter
    slow = Counter(item.module.__name__ for item in items
                   if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.module.__name__])


def pytest_terminal_summary(terminalreporter):
    """Module sizes, as information (no cap: a module is as long as its
    concept; see docs/architecture.md)."""
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    sizes = sorted(((len(p.read_text(encoding="utf-8").splitlines()),
                     p.relative_to(repo).as_posix())
                    for folder in ("psrec", "features", "data", "models",
                                   "ps_cluster", "launch")
                    for p in (repo / folder).rglob("*.py")), reverse=True)
    terminalreporter.write_line(
        f"library: {sum(n for n, _ in sizes)} lines in {len(sizes)} modules;"
        " longest: " + ", ".join(f"{m} {n}" for n, m in sizes[:5]))
