"""The public API: every exported name resolves, and importing the packages
does not import TensorFlow (it must first see TF_USE_LEGACY_KERAS=1)."""

import importlib
import subprocess
import sys

import pytest

from tests._proc import REPO

PACKAGES = ("features", "data", "models", "ps_cluster", "launch")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_resolves(package):
    module = importlib.import_module(package)
    assert module.__all__, package
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name}"


def test_importing_the_packages_does_not_import_tensorflow():
    code = ("import sys; " + "; ".join(f"import {p}" for p in PACKAGES)
            + "; import launch.cli, ps_cluster.tf_config, models.config"
            + "; print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
