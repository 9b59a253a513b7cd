"""One import namespace: psrec installs ``psrec.*`` and nothing generic at
the top level, its public API resolves without importing TensorFlow, and no
file of the user's can shadow one of its modules."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import psrec
from tests._shared import write_shadowing_modules

GENERIC = ("data", "models", "features", "launch", "ps_cluster")
PACKAGES = ("psrec", "psrec.features", "psrec.data", "psrec.models",
            "psrec.ps_cluster", "psrec.launch")
PSREC = str(Path(sys.executable).with_name("psrec"))


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd,
                          capture_output=True, text=True, timeout=180)


def test_nothing_generic_is_installed_at_top_level(tmp_path):
    # From an empty folder: the repository checkout is not on sys.path.
    out = _python("import importlib.util, json; print(json.dumps({n: "
                  "importlib.util.find_spec(n) is None for n in "
                  f"{GENERIC!r}}}))", tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {name: True for name in GENERIC}


def test_version_is_one_value_everywhere():
    from importlib.metadata import version
    assert psrec.__version__ == version("psrec")
    out = subprocess.run([PSREC, "--version"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"psrec {psrec.__version__}"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_resolves(package):
    module = importlib.import_module(package)
    assert module.__all__, package
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name}"


def test_importing_the_packages_does_not_import_tensorflow(tmp_path):
    code = ("import sys; " + "; ".join(f"import {p}" for p in PACKAGES)
            + "; import psrec.launch.cli.main, psrec.ps_cluster.cluster.tf_config"
            + "; print('tensorflow' in sys.modules)")
    out = _python(code, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.fixture()
def shadowed(tmp_path: Path) -> Path:
    """A working directory whose generic module names all raise (the
    cluster commands -- train, eval, export, predict -- run beside such
    files in ``tests/test_docs.py``'s quick-start test)."""
    write_shadowing_modules(tmp_path)
    return tmp_path


def _run(cwd: Path, *args: object) -> subprocess.CompletedProcess:
    out = subprocess.run([PSREC, *map(str, args)], cwd=cwd,
                         capture_output=True, text=True, timeout=600)
    assert "was imported" not in out.stderr, out.stderr[-2000:]
    assert out.returncode == 0, out.stderr[-2000:]
    return out


@pytest.mark.slow
def test_data_commands_work_beside_shadowing_modules(shadowed):
    _run(shadowed, "--version")
    _run(shadowed, "spec", "criteo", "--out", "spec.yaml")
    _run(shadowed, "synth", "--spec", "spec.yaml", "--rows", 4000,
         "--files", 1, "--out", "pq")
    _run(shadowed, "convert", "pq", "--spec", "spec.yaml", "--out", "tfr",
         "--shards", 2, "--eval-fraction", 0.25)
    _run(shadowed, "audit-shards", "tfr", "--pipelines", 2,
         "--spec", "spec.yaml")
    _run(shadowed, "tf-config", "--ps-hosts", "127.0.0.1:2222",
         "--worker-hosts", "127.0.0.1:2223")
