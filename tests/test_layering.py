"""The layers of the library, checked on the source (no TensorFlow import).

features, data, models  <  ps_cluster  <  launch: a module never imports a
layer above its own, every import of psrec code is ``psrec.``-prefixed, no
import cycle (function-level imports count), and modules stay small enough to
read.
"""

import ast
import graphlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("psrec", "features", "data", "models", "ps_cluster", "launch")
BARE = {"data", "features", "models", "ps_cluster", "launch"}
MAX_LINES = 420
# ``python -m psrec`` runs the CLI.
_ENTRY_POINTS = {"psrec/__main__.py"}

MODULES = sorted(p.relative_to(REPO).as_posix() for folder in FOLDERS
                 for p in (REPO / folder).rglob("*.py"))


def _imports(module: str) -> list[str]:
    """Every module name ``module`` imports (absolute imports only); for
    ``from a import b`` both ``a`` and ``a.b`` (``b`` may be a module)."""
    tree = ast.parse((REPO / module).read_text(encoding="utf-8"), module)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names += [node.module] + [f"{node.module}.{alias.name}"
                                      for alias in node.names]
    return names


def _module_name(module: str) -> str:
    """``launch/cli.py`` -> ``psrec.launch.cli``, ``launch/__init__.py`` ->
    ``psrec.launch``."""
    parts = module.removesuffix(".py").removesuffix("/__init__").split("/")
    return ".".join(parts if parts[0] == "psrec" else ["psrec", *parts])


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_library_modules_found():
    assert "ps_cluster/tf_config.py" in MODULES
    assert "models/embedding.py" in MODULES


def test_no_import_of_a_higher_layer():
    bad = []
    for module in MODULES:
        folder = module.split("/")[0]
        for name in _imports(module):
            if folder in ("features", "data", "models") and _under(
                    name, "psrec.ps_cluster"):
                bad.append(f"{module}: {name}")
            if (folder != "launch" and module not in _ENTRY_POINTS
                    and _under(name, "psrec.launch")):
                bad.append(f"{module}: {name}")
    assert not bad, bad


def test_imports_are_psrec_prefixed():
    bad = [f"{module}: {name}" for module in MODULES
           for name in _imports(module) if name.split(".")[0] in BARE]
    assert not bad, bad


def test_modules_are_small():
    sizes = {module: len((REPO / module).read_text(
        encoding="utf-8").splitlines()) for module in MODULES}
    big = {m: n for m, n in sizes.items() if n > MAX_LINES}
    assert not big, big


def test_no_import_cycle():
    """Every import statement counts, inside functions too: a lazy import
    cycle still ties two modules into one."""
    names = {_module_name(module): module for module in MODULES}
    graph = {name: {i for i in _imports(module) if i in names and i != name}
             for name, module in names.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        raise AssertionError(" -> ".join(error.args[1])) from None
