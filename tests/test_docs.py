"""The README and docs/ cannot go stale: every command they show is checked.

* Every ``psrec ...`` command line in a fenced ``console``/``sh``/``bash``
  block of README.md and docs/**/*.md is parsed by the real ``psrec``
  argument parser (built in-process), so a renamed or removed flag, command
  or choice fails here. Every fenced block names its language, so no
  command hides in an untagged block.
* Every ``--flag`` of an inline ``psrec <command> ...`` span in the prose
  is an option of that command.
* The README's command table lists exactly the CLI's commands.
* A block that includes a script (``<!-- include: FILE -->`` right above
  it) equals that file, and the README's quick start, which is the Criteo
  walkthrough's script (docs/tutorials/criteo.sh), runs end to end on the
  real sample as written, from an empty folder standing for the clone's
  root; so does the retrieval walkthrough's (docs/tutorials/retrieval.sh),
  on the first ratings of the real MovieLens sample.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import inspect
import io
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from psrec.launch.cli.main import build_parser
from tests._proc import WatchedProcess
from tests._proc import kill_pids
from tests._proc import processes_matching
from tests._shared import MOVIELENS_DIR
from tests._shared import shared_data
from tests._shared import write_shadowing_modules

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", REPO / "benchmarks" / "README.md",
                *(REPO / "docs").rglob("*.md")])
SHELL_LANGUAGES = {"console", "sh", "bash", "shell"}
_FENCE = re.compile(r"^(```+)\s*(\S*)\s*$")
_INCLUDE = re.compile(r"^<!--\s*include:\s*(\S+)\s*-->\s*$")
# `psrec`, `.venv/bin/psrec` or `python -m psrec` starts a psrec command.
_PSREC = re.compile(r"^(?:\S*/)?psrec$")
_PYTHON = re.compile(r"^(?:\S*/)?python[0-9.]*$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SEPARATORS = {"|", "||", "&", "&&", ";", ">", ">>", "2>", "2>&1"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    include: str | None  # the file an include marker names

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def fenced_blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, language, start = match.group(1), match.group(2), i
        include = None
        if start > 0 and _INCLUDE.match(lines[start - 1]):
            include = _INCLUDE.match(lines[start - 1]).group(1)
        i += 1
        body = []
        while i < len(lines) and lines[i].rstrip() != fence:
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"{page}:{start + 1}: unclosed code fence"
        blocks.append(Block(page, start + 1, language,
                            "\n".join(body) + "\n", include))
        i += 1
    return blocks


def _logical_lines(text: str) -> list[str]:
    """Shell lines with ``\\`` continuations joined and a ``$ `` prompt
    dropped."""
    out, pending = [], ""
    for raw in text.splitlines():
        line = pending + raw
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line.startswith("$ "):
            line = line[2:]
        out.append(line)
    return out


def _strip_comment(line: str) -> str:
    """``line`` without a shell comment (a ``#`` starting a word outside
    quotes)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def psrec_commands(text: str) -> list[list[str]]:
    """The argv of every psrec command in a shell block (leading variable
    assignments skipped; pipes, ``&``, ``;`` and redirections end a
    command; comments dropped)."""
    commands = []
    for line in _logical_lines(text):
        lexer = shlex.shlex(_strip_comment(line), posix=True,
                            punctuation_chars=";&|>")
        lexer.whitespace_split = True
        lexer.commenters = ""
        words, segment = list(lexer), []
        for word in [*words, ";"]:
            if word in _SEPARATORS or set(word) <= set(";&|>"):
                argv = _psrec_argv(segment)
                if argv is not None:
                    commands.append(argv)
                segment = []
            else:
                segment.append(word)
    return commands


def _psrec_argv(words: list[str]) -> list[str] | None:
    while words and _ASSIGNMENT.match(words[0]):
        words = words[1:]
    if words and _PSREC.match(words[0]):
        return words[1:]
    if (len(words) >= 3 and _PYTHON.match(words[0])
            and words[1:3] == ["-m", "psrec"]):
        return words[3:]
    return None


def documented_commands() -> list[tuple[str, list[str]]]:
    found = []
    for page in PAGES:
        for block in fenced_blocks(page):
            if block.language in SHELL_LANGUAGES:
                found += [(block.where, argv)
                          for argv in psrec_commands(block.text)]
    return found


def _subcommands(parser: argparse.ArgumentParser
                 ) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _parse(argv: list[str]) -> str | None:
    """None when the psrec parser accepts ``argv``, else its message."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), \
                contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as stop:
        if stop.code not in (0, None):
            return stderr.getvalue().strip() or f"exit {stop.code}"
    return None


# -- the checks ---------------------------------------------------------------


def test_every_fenced_block_names_its_language():
    # docs/architecture.md is kept by the layering test (its ```layers
    # block); its one untagged block is a picture of the package tree.
    untagged = [block.where for page in PAGES
                if page.name != "architecture.md"
                for block in fenced_blocks(page) if not block.language]
    assert not untagged, (
        "fenced blocks without a language (use ```console/```sh for "
        f"commands, ```text for output): {untagged}")


def test_the_docs_show_many_commands():
    # A broken extractor must not pass by finding nothing.
    commands = documented_commands()
    assert len(commands) >= 40, commands
    names = {argv[0] for _, argv in commands if argv}
    assert {"ingest", "convert", "train", "eval", "export",
            "predict"} <= names


def test_every_documented_command_parses():
    failures = [f"{where}: psrec {shlex.join(argv)}\n    {message}"
                for where, argv in documented_commands()
                if (message := _parse(argv)) is not None]
    assert not failures, "\n".join(failures)


def test_the_parse_check_catches_a_renamed_flag():
    assert _parse(["train", "--steps", "10"]) is None
    assert "--no-such-flag" in _parse(["train", "--no-such-flag", "1"])
    assert _parse(["no-such-command"]) is not None


_INLINE = re.compile(r"`(psrec [^`]+)`")


def _parser_for(words: list[str]) -> tuple[argparse.ArgumentParser, int]:
    """The deepest (sub)parser the leading words name, and how many words
    named it."""
    parser, used = build_parser(), 0
    while used < len(words) and words[used] in _subcommands(parser):
        parser = _subcommands(parser)[words[used]]
        used += 1
    return parser, used


def test_every_flag_of_an_inline_command_exists():
    failures = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in _INLINE.finditer(text):
            words = match.group(1).split()[1:]
            parser, used = _parser_for(words)
            line = text.count("\n", 0, match.start()) + 1
            where = f"{page.relative_to(REPO)}:{line}"
            if used == 0 and re.match(r"[a-z]", words[0] if words else "-"):
                failures.append(f"{where}: no such command: {match.group(1)}")
                continue
            options = set(parser._option_string_actions)
            for word in words[used:]:
                flag = word.split("=")[0].strip("[](),.")
                if flag.startswith("--") and len(flag) > 2 \
                        and flag not in options:
                    failures.append(f"{where}: `{match.group(1)}`: "
                                    f"{flag} is not an option")
    assert not failures, "\n".join(failures)


def test_the_readme_command_table_lists_exactly_the_cli_commands():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `psrec ([a-z0-9-]+)", section, re.MULTILINE)
    cli = list(_subcommands(build_parser()))
    # A command may have a row per form (`ingest criteo`, `ingest csv`).
    assert sorted(set(listed)) == sorted(cli)


def test_included_scripts_are_the_files_they_name():
    includes = [block for page in PAGES for block in fenced_blocks(page)
                if block.include]
    assert {"criteo.sh", "docs/tutorials/criteo.sh"} <= {
        b.include for b in includes}, includes
    for block in includes:
        script = block.page.parent / block.include
        assert script.is_file(), f"{block.where}: {script} is missing"
        assert block.text == script.read_text(encoding="utf-8"), (
            f"{block.where} differs from {script.relative_to(REPO)}: copy "
            "the script into the page again")


def test_python_blocks_compile_and_use_only_the_public_api():
    import psrec
    blocks = [block for page in PAGES for block in fenced_blocks(page)
              if block.language == "python"]
    assert blocks
    for block in blocks:
        tree = ast.parse(block.text, block.where)
        used = set(re.findall(r"\bpsrec\.(\w+)", block.text))
        assert used <= set(psrec.__all__), (
            f"{block.where}: not in psrec.__all__: "
            f"{sorted(used - set(psrec.__all__))}")
        # Each call of a psrec name takes the keywords the page gives it.
        for call in ast.walk(tree):
            if (isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and isinstance(call.func.value, ast.Name)
                    and call.func.value.id == "psrec"):
                target = getattr(psrec, call.func.attr)
                keywords = {k.arg: None for k in call.keywords if k.arg}
                try:
                    inspect.signature(target).bind_partial(
                        *[None] * len(call.args), **keywords)
                except TypeError as error:
                    raise AssertionError(
                        f"{block.where}: psrec.{call.func.attr}"
                        f"({', '.join(keywords)}): {error}") from None


_TEST_REF = re.compile(r"tests/(test_[a-z0-9_]+\.py)::(test_[a-z0-9_]+)")


def test_every_named_test_exists():
    refs = {(m.group(1), m.group(2)) for page in PAGES
            for m in _TEST_REF.finditer(page.read_text(encoding="utf-8"))}
    assert len(refs) >= 20, refs
    missing = [f"tests/{file}::{name}" for file, name in sorted(refs)
               if not (REPO / "tests" / file).is_file()
               or not re.search(rf"^def {name}\(",
                                (REPO / "tests" / file).read_text(
                                    encoding="utf-8"), re.MULTILINE)]
    assert not missing, f"the docs name tests that do not exist: {missing}"


_PATH = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|sh|md|svg|toml|yaml))`")
_DOTTED = re.compile(r"`(psrec(?:\.\w+)+)")
_FOLDERS = {"launch", "features", "data", "ps_cluster", "models"}


def _module_file(parts: list[str]) -> Path | None:
    """The source file of the psrec module ``parts`` (``["psrec",
    "launch", "cli"]``), or None."""
    if len(parts) > 1 and parts[1] in _FOLDERS:
        base = REPO.joinpath(*parts[1:])
    else:
        base = REPO.joinpath("psrec", *parts[1:])
    for file in (base.with_suffix(".py"), base / "__init__.py"):
        if file.is_file():
            return file
    return None


def test_every_named_file_and_module_exists():
    missing = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        where = page.relative_to(REPO)
        for match in _PATH.finditer(text):
            path = match.group(1)
            if not path.startswith(("../", "/")) and not (
                    REPO / path).exists() and not (page.parent / path).exists():
                missing.append(f"{where}: {path}")
        for match in _DOTTED.finditer(text):
            parts = match.group(1).split(".")
            if parts[1:] == ["core"]:
                continue  # docs/architecture.md's name for psrec/ itself
            # The longest prefix that is a module; what follows must be a
            # name defined (or imported) in it.
            for cut in range(len(parts), 0, -1):
                file = _module_file(parts[:cut])
                if file is not None:
                    rest = parts[cut:cut + 1]
                    if rest and not re.search(
                            rf"\b{rest[0]}\b", file.read_text(encoding="utf-8")):
                        missing.append(f"{where}: {match.group(1)}")
                    break
            else:
                missing.append(f"{where}: {match.group(1)}")
    assert not missing, f"the docs name files or modules that do not exist: " \
        f"{missing}"


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            anchors.add(_slug(line.lstrip("#")))
    return anchors


def test_every_relative_link_and_anchor_exists():
    broken = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in _LINK.finditer(text):
            target = match.group(1)
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and file.suffix == ".md" and \
                    anchor not in _anchors(file):
                broken.append(f"{page.relative_to(REPO)}: {target} "
                              "(no such heading)")
    assert not broken, "\n".join(broken)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run_walkthrough(script: Path, root: Path, timeout: int
                     ) -> tuple[WatchedProcess, int, set]:
    """Runs ``script`` with ``bash -e`` (stop at the first failure) as a
    reader does, from ``root`` standing for the clone's root, with the
    ``psrec`` and ``python`` of the interpreter running the tests on
    ``PATH``; returns the watched run, its exit code and the processes it
    left (killed)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # The `psrec` of the editable install this interpreter runs.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    run = WatchedProcess(subprocess.Popen(
        ["bash", "-e", str(script)], cwd=root, env=env, text=True,
        bufsize=1, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=_default_sigint), label=f"{script.name}: ")
    try:
        code = run.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(run.process.pid, signal.SIGKILL)
        run.process.wait()
        raise AssertionError(f"{script.name} did not finish within "
                             f"{timeout} s:\n{run.output[-4000:]}") from None
    finally:
        left = processes_matching([str(root.parent)])
        kill_pids(left)
    # The whole output stays beside the run, for a look after the test.
    (root.parent / "walkthrough.log").write_text(run.output + "\n")
    return run, code, left


@pytest.mark.slow
@pytest.mark.cluster
def test_the_readme_quick_start_runs_end_to_end_as_written(tmp_path):
    """docs/tutorials/criteo.sh -- the README's quick start and the Criteo
    walkthrough, both include it -- as a reader runs it from the clone's
    root: raw sample -> ingest -> spec infer -> convert -> train (local
    cluster) -> eval -> export -> predict, with ``bash -e`` (stop at the
    first failure). The clone's root is an empty folder beside a
    ``shared`` link, so the script's own ``../shared/data`` path is what
    it reads, and it writes under ``runs/`` only (never the source
    tree). The folder also holds a user's ``models.py``, ``data.py``, ...
    that raise when imported: every command, and the cluster's children
    started with that working directory, import psrec's own modules."""
    sample = shared_data("criteo/criteo_combined_10390.txt")
    root = tmp_path / "clone"
    root.mkdir()
    shadows = write_shadowing_modules(root)
    (tmp_path / "shared").symlink_to(sample.parents[2])
    readme = [block for block in fenced_blocks(REPO / "README.md")
              if block.include == "docs/tutorials/criteo.sh"]
    assert len(readme) == 1, "the README's quick start includes criteo.sh"
    script = REPO / "docs" / "tutorials" / "criteo.sh"
    assert readme[0].text == script.read_text(encoding="utf-8")
    run, code, left = _run_walkthrough(script, root, 420)
    assert code == 0, f"criteo.sh exited {code}:\n{run.output[-6000:]}"
    assert not left, f"processes left behind: {sorted(left)}"
    run.wait_for(r"wrote runs/criteo/spec\.yaml: \d+ dense, \d+ categorical",
                 10)
    run.wait_for(r"wrote train 8312, eval 2078", 10)
    run.wait_for(r"step 40: eval: 2078 examples, AUC 0\.\d+", 10)
    run.wait_for(r"scored 10,390 rows of 1 file", 10)
    assert "was imported" not in run.output
    assert sorted(p.name for p in root.iterdir()) == sorted(
        ("runs",) + shadows)
    out = root / "runs" / "criteo"
    assert (out / "model" / "1" / "saved_model.pb").is_file()
    assert (out / "run" / "export" / "1" / "saved_model.pb").is_file()
    import pyarrow.parquet as pq
    scores = pq.read_table(out / "scores.parquet")
    assert scores.num_rows == 10_390
    probability = scores.column("probability").to_numpy()
    assert ((probability > 0) & (probability < 1)).all()


#: Ratings of the real ml-100k sample the retrieval walkthrough is tested
#: on: the default length (20 epochs of ~3 steps) keeps the run short.
_WALKTHROUGH_RATINGS = 1_500


def _movielens_head(shared: Path, ratings: int) -> None:
    """``shared/data/movielens-100k``: the first ``ratings`` lines of the
    real ``u.data`` and the real movie, user and genre files (written at
    test time: data is never committed)."""
    sample = shared_data(MOVIELENS_DIR)
    folder = shared / "data" / "movielens-100k"
    folder.mkdir(parents=True)
    with (sample / "u.data").open("rb") as source:
        head = b"".join(next(source) for _ in range(ratings))
    (folder / "u.data").write_bytes(head)
    for name in ("u.item", "u.user", "u.genre"):
        (folder / name).write_bytes((sample / name).read_bytes())


@pytest.mark.slow
@pytest.mark.cluster
def test_the_retrieval_walkthrough_runs_end_to_end_as_written(tmp_path):
    """docs/tutorials/retrieval.sh, which docs/tutorials/retrieval.md
    includes, as a reader runs it from the clone's root (as the quick
    start's test does), on the first 1,500 ratings of the real sample:
    ingest -> convert (catalogue and seen lists) -> train --task retrieval
    (local cluster, the sized default length, the best by MRR exported) ->
    plain TensorFlow loads the export and prints the top 10 -> psrec eval
    -> psrec export. It prints the page's figures: every eval line with
    the popularity baseline and the users' train candidates left out."""
    _movielens_head(tmp_path / "shared", _WALKTHROUGH_RATINGS)
    root = tmp_path / "clone"
    root.mkdir()
    page = [block for block in fenced_blocks(
        REPO / "docs" / "tutorials" / "retrieval.md") if block.include]
    assert [b.include for b in page] == ["retrieval.sh"]
    script = REPO / "docs" / "tutorials" / "retrieval.sh"
    run, code, left = _run_walkthrough(script, root, 480)
    assert code == 0, f"retrieval.sh exited {code}:\n{run.output[-6000:]}"
    assert not left, f"processes left behind: {sorted(left)}"
    converted = re.search(r"read 1500 rows in .*; wrote train (\d+), "
                          r"eval (\d+)", run.output)
    assert converted, run.output[-4000:]
    run.wait_for(r"steps sized from the data .*: \d+ steps of 512 rows", 10)
    pairs = f"{converted.group(2)} pairs against \\d+ candidates"
    left_out = r" \(each user's train candidates left out\)"
    metrics = (r", recall@1 0\.\d{4} \(popularity 0\.\d{4}\), .*"
               r"MRR 0\.\d{4} \(popularity 0\.\d{4}\)")
    run.wait_for(rf"step \d+: eval: {pairs}{left_out}{metrics}", 10)
    run.wait_for(r"exported checkpoint best/best-\d+ .* to "
                 r"runs/ml/run/export/1", 10)
    first = run.wait_for(r"^\[\[ *\d+( +\d+){9}\]$", 10)  # the top 10
    assert re.search(r"^ \[ *\d+( +\d+){9}\]\]$", run.output.split(
        first.group(0) + "\n", 1)[1].splitlines()[0])
    run.wait_for(rf"best/best-\d+ \(step \d+\) eval: {pairs}{left_out}"
                 rf"{metrics}", 10)
    run.wait_for(r"runs/ml/export/1 \(version 1\): checkpoint best/best-",
                 10)
    assert [p.name for p in root.iterdir()] == ["runs"]
    out = root / "runs" / "ml"
    assert (out / "run" / "export" / "1" / "saved_model.pb").is_file()
    assert (out / "export" / "1" / "saved_model.pb").is_file()
