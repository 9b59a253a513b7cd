"""The images' recipes (no container engine runs here): ``Dockerfile`` and
``Dockerfile.gpu`` pin their base image and every runtime dependency of
``pyproject.toml`` at one exact version inside its range there, install
psrec without resolving again, run as a non-root numeric uid and have
``psrec`` as their entrypoint."""

import json
import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests._proc import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
#: Extras each image needs beyond pyproject's (the GPU build of TF).
EXTRAS = {"Dockerfile": {}, "Dockerfile.gpu": {"tensorflow": {"and-cuda"}}}


def _instructions(text):
    """(INSTRUCTION, arguments) with continuation lines joined, comments
    dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(
        line for line in text.splitlines()
        if not line.lstrip().startswith("#")))
    return [tuple(line.strip().split(None, 1)) for line in text.splitlines()
            if line.strip()]


def _pins(instructions):
    pins = {}
    for kind, args in instructions:
        if kind == "RUN" and args.startswith("pip install"):
            for quoted in re.findall(r'"([^"]+)"', args):
                requirement = Requirement(quoted)
                name = canonicalize_name(requirement.name)
                assert name not in pins, f"{name} pinned twice"
                pins[name] = requirement
    return pins


@pytest.mark.parametrize("dockerfile", sorted(EXTRAS))
def test_dockerfile_pins_match_pyproject(dockerfile):
    instructions = _instructions((REPO / dockerfile).read_text())
    pins = _pins(instructions)
    wanted = {canonicalize_name(Requirement(r).name): Requirement(r)
              for r in PYPROJECT["project"]["dependencies"]}
    assert sorted(pins) == sorted(wanted), (
        f"{dockerfile} pins {sorted(pins)}; pyproject.toml's dependencies "
        f"are {sorted(wanted)}")
    for name, pin in pins.items():
        [spec] = list(pin.specifier)
        assert spec.operator == "==" and "*" not in spec.version, (
            f"{dockerfile}: {pin} is not one exact version")
        assert wanted[name].specifier.contains(spec.version), (
            f"{dockerfile}: {pin} is outside pyproject.toml's {wanted[name]}")
        assert pin.extras == EXTRAS[dockerfile].get(name, set()), pin
    # psrec itself: from the source, with nothing resolved again.
    runs = [args for kind, args in instructions if kind == "RUN"]
    assert any("pip install --no-deps ." in args and "pip check" in args
               for args in runs), runs


@pytest.mark.parametrize("dockerfile", sorted(EXTRAS))
def test_dockerfile_base_user_and_entrypoint(dockerfile):
    instructions = _instructions((REPO / dockerfile).read_text())
    [base] = [args for kind, args in instructions if kind == "FROM"]
    match = re.fullmatch(r"python:(\d+\.\d+\.\d+)-slim-\w+(@sha256:[0-9a-f]{64})?",
                         base)
    assert match, f"{dockerfile}: base image {base!r} is not pinned"
    python = SpecifierSet(PYPROJECT["project"]["requires-python"])
    assert python.contains(Version(match.group(1))), (base, python)
    [user] = [args for kind, args in instructions if kind == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) > 0, user
    [entrypoint] = [args for kind, args in instructions
                    if kind == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["psrec"]


def test_dockerignore_keeps_the_context_small():
    ignored = (REPO / ".dockerignore").read_text().split()
    for name in (".git", ".venv", "runs", "tests"):
        assert name in ignored
