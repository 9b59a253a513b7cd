"""The layers of the library, checked on the source (no TensorFlow import).

The layer order is the one ``docs/architecture.md`` lists (its ``layers``
block, bottom first): a module imports only its own sub-package and those
below it, every import of psrec code is ``psrec.``-prefixed, no import cycle
(function-level imports count), every sub-package says what it owns, and the
package list of ``pyproject.toml`` is the folder tree.
"""

import ast
import graphlib
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOP = ("features", "data", "models", "ps_cluster", "launch")
FOLDERS = ("psrec", *TOP)
# ``python -m psrec`` runs the CLI; ``import psrec`` is the public face.
_FACES = {"psrec/__init__.py", "psrec/__main__.py",
          *(f"{top}/__init__.py" for top in TOP)}

MODULES = sorted(p.relative_to(REPO).as_posix() for folder in FOLDERS
                 for p in (REPO / folder).rglob("*.py"))


def _layers() -> list[str]:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```layers block"
    return block.group(1).split()


LAYERS = _layers()


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
    """``launch/cli/main.py`` -> ``psrec.launch.cli.main``,
    ``launch/__init__.py`` -> ``psrec.launch``."""
    parts = module.removesuffix(".py").removesuffix("/__init__").split("/")
    return ".".join(parts if parts[0] == "psrec" else ["psrec", *parts])


NAMES = {_module_name(module): module for module in MODULES}


def _layer_of(name: str) -> str | None:
    """The layer of a psrec module name: ``psrec.models.ranking.model`` ->
    ``models.ranking``; a ``psrec/`` module -> ``psrec.core``; a face or
    a name that is no psrec module -> None."""
    parts = name.split(".")
    if parts[0] != "psrec" or name not in NAMES:
        return None
    if NAMES[name] in _FACES:
        return None
    if len(parts) == 2 and parts[1] not in TOP:
        return "psrec.core"
    return ".".join(parts[1:3])


def _subpackages() -> set[str]:
    return {p.parent.relative_to(REPO).as_posix().replace("/", ".")
            for top in TOP for p in (REPO / top).glob("*/__init__.py")}


def test_library_modules_found():
    assert "ps_cluster/cluster/tf_config.py" in MODULES
    assert "models/embedding/sparse_arch.py" in MODULES
    assert _layer_of("psrec.launch.cli.main") == "launch.cli"
    assert _layer_of("psrec.errors") == "psrec.core"
    assert _layer_of("psrec.models.build") == "models.build"


def test_every_layer_is_listed_once_and_exists():
    assert len(LAYERS) == len(set(LAYERS)), LAYERS
    singles = {_module_name(m)[len("psrec."):] for m in MODULES
               if m.count("/") == 1 and m.split("/")[0] in TOP
               and not m.endswith("__init__.py")}
    assert set(LAYERS) == {"psrec.core"} | _subpackages() | singles


def test_top_level_folders_hold_concepts_not_modules():
    """A top-level folder is its ``__init__`` face plus concept
    sub-packages; a loose module must be a listed layer of its own."""
    loose = [m for m in MODULES if m.count("/") == 1
             and m.split("/")[0] in TOP and m not in _FACES
             and _module_name(m)[len("psrec."):] not in LAYERS]
    assert not loose, loose


def test_no_import_of_a_higher_layer():
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    bad = []
    for module in MODULES:
        own = _layer_of(_module_name(module))
        for name in _imports(module):
            other = _layer_of(name)
            if module in _FACES:
                # A folder's face imports its own folder and lower layers.
                top = module.split("/")[0]
                if top in TOP and other and not other.startswith(top + "."):
                    if rank[other] >= min(rank[x] for x in LAYERS
                                          if x.startswith(top + ".")):
                        bad.append(f"{module}: {name}")
                continue
            if other is None and name.startswith("psrec.") and name in NAMES:
                bad.append(f"{module}: {name} (a face)")
            elif other is not None and rank[other] > rank[own]:
                bad.append(f"{module} ({own}): {name} ({other})")
    assert not bad, bad


def test_models_know_no_files():
    """Only ``models.serving`` reads or writes files."""
    pattern = re.compile(r"\bgfile\b|\bpyarrow\b|\bPath\(|psrec\.uri_path")
    bad = [m for m in MODULES if m.startswith("models/")
           and not m.startswith("models/serving/")
           and pattern.search((REPO / m).read_text(encoding="utf-8"))]
    assert not bad, bad


def test_imports_are_psrec_prefixed():
    bare = set(TOP)
    bad = [f"{module}: {name}" for module in MODULES
           for name in _imports(module) if name.split(".")[0] in bare]
    assert not bad, bad


def test_no_import_cycle():
    """Every import statement counts, inside functions too: a lazy import
    cycle still ties two modules into one."""
    graph = {name: {i for i in _imports(module) if i in NAMES and i != name}
             for name, module in NAMES.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        raise AssertionError(" -> ".join(error.args[1])) from None


def test_every_subpackage_says_what_it_owns():
    silent = [pkg for pkg in sorted(_subpackages()) if not ast.get_docstring(
        ast.parse((REPO / pkg.replace(".", "/") / "__init__.py").read_text(
            encoding="utf-8")))]
    assert not silent, silent


def test_pyproject_packages_are_the_folder_tree():
    """A sub-package missing from ``pyproject.toml`` works in the editable
    install and is absent from a wheel."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    tree = {"psrec", *(f"psrec.{top}" for top in TOP),
            *(f"psrec.{pkg}" for pkg in _subpackages())}
    assert listed == tree, (listed ^ tree)
