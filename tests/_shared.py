"""What several test modules share: the read-only shared data folder next
to the checkout (``<repo>/../shared/data``: real samples that must never be
copied into the repository) and a user's files that would shadow psrec's
modules if psrec imported from the working directory."""

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


#: Generic module names a user's working directory may hold.
GENERIC_MODULES = ("data", "models", "features", "launch", "ps_cluster",
                   "tests")


def write_shadowing_modules(folder: Path) -> tuple[str, ...]:
    """Writes ``NAME.py`` for each generic module name into ``folder``, each
    raising ``user module NAME.py was imported``; returns the file names."""
    names = tuple(f"{name}.py" for name in GENERIC_MODULES)
    for name in names:
        (folder / name).write_text(
            f"raise RuntimeError('user module {name} was imported')\n")
    return names


def refused_spec(data: dict, folder: Path, capsys) -> tuple[str, Path]:
    """Writes the spec ``data`` to ``folder/spec.json`` and runs ``psrec
    plan`` on it, which must refuse it: exit 2 and one line on stderr.
    Returns that line and the spec's path."""
    import json

    from psrec.launch.cli.main import main
    path = folder / "spec.json"
    path.write_text(json.dumps(data))
    assert main(["plan", "--spec", str(path), "--ps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err, path
