"""The ``psrec`` command line: a thin, typed shell over library functions.

Each sub-command validates its arguments, calls one library function and
maps known failures to exit codes (see ``EXIT_*``). Every command is one
entry of :data:`COMMANDS`: the function that builds its parser (in a module
that imports no TensorFlow) and the function that runs it, in a module
imported only when the command runs -- after
:func:`psrec.runtime.configure_environment` -- so ``psrec --help`` and
``psrec COMMAND --help`` are instant, the Keras setting always applies, and
the command modules import at the top. A command whose run module imports
TensorFlow also names a check, beside its parser (no TensorFlow), that
refuses a missing input path or a bad argument before that import: a
wrong path answers at once.

Every user mistake ends in one line on stderr, ``psrec <command>: error:
<message>``, and a permanent exit code (2 for arguments and configuration,
1 for data); argparse's own errors take the same one-line form. ``--help``
shows every default; ``--json`` prints a command's result as one JSON
object on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
from typing import Any
from typing import Callable
from typing import Sequence

from psrec._version import __version__
from psrec.errors import EXIT_FAILURE
from psrec.errors import EXIT_INTERRUPTED
from psrec.errors import EXIT_RETRYABLE
from psrec.errors import EXIT_USAGE
from psrec.errors import ConfigError
from psrec.errors import PsrecError
from psrec.launch.cli import data
from psrec.launch.cli import embeddings
from psrec.launch.cli import k8s
from psrec.launch.cli import model
from psrec.launch.cli import plan
from psrec.launch.cli import retrieval_flags
from psrec.launch.cli import train as train_commands
from psrec.launch.monitor.progress_bar import progress_for
from psrec.progress import SILENT
from psrec.progress import set_default_progress
from psrec.runtime import configure_environment

# -- argparse: one-line errors, defaults in --help ---------------------------


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to every option that has a default worth
    showing (not None, not the False of a switch, not a required option)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or not shows_default(action):
            return text
        return f"{text} (default: %(default)s)"


def shows_default(action: argparse.Action) -> bool:
    """True when ``--help`` displays the default of ``action``."""
    default = action.default
    return (bool(action.option_strings) and not action.required
            and action.nargs != 0 and default is not None
            and default is not False and default != argparse.SUPPRESS)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (no usage block):
    ``psrec <command>: error: argument --flag: invalid value 'x': must be
    ...``; exits 2 like argparse."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        line = " ".join(message.split())
        self.exit(EXIT_USAGE, f"{self.prog}: error: {line} (see "
                  f"`{self.prog} --help`)\n")


# -- the commands: parsers without TensorFlow, run by modules imported late --


_SubParsers = argparse._SubParsersAction


@dataclasses.dataclass(frozen=True)
class Command:
    """One ``psrec`` command.

    ``words``: as typed after ``psrec`` (``"k8s render"``; a first word
    with sub-commands is a :data:`GROUPS` entry). ``add_parser(sub, name)``
    adds its parser to ``sub`` and returns it; it lives in a module that
    imports no TensorFlow. ``runs``: ``"module:function"``, the function
    that runs it, looked up only when it runs. ``checks(args)``, from a
    module without TensorFlow: the input paths and arguments the run would
    refuse first, refused before its module is imported (None: the run
    module imports no TensorFlow, or nothing to check).
    """

    words: str
    add_parser: Callable[[_SubParsers, str], argparse.ArgumentParser]
    runs: str
    checks: Callable[[argparse.Namespace], None] | None = None

    def __call__(self, args: argparse.Namespace) -> int:
        if self.checks is not None:
            self.checks(args)
        module, function = self.runs.split(":")
        return getattr(importlib.import_module(module), function)(args)


@dataclasses.dataclass(frozen=True)
class SelfRunning:
    """Commands whose parsers set ``run`` themselves, all added by
    ``add(sub)``: cli/train.py's, which import what they run inside the
    function that runs them."""

    add: Callable[[_SubParsers], None]


_CLI = "psrec.launch.cli"

#: Every ``psrec`` command, in the order ``psrec --help`` lists them.
COMMANDS: tuple[Command | SelfRunning, ...] = (
    Command("ingest", data.add_ingest, f"{_CLI}.data_run:run_ingest"),
    Command("convert", data.add_convert, f"{_CLI}.convert_run:run_convert",
            data.check_convert),
    Command("audit-shards", data.add_audit_shards,
            f"{_CLI}.convert_run:run_audit_shards", data.check_audit_shards),
    Command("spec", data.add_spec, f"{_CLI}.data_run:run_spec"),
    Command("synth", data.add_synth, f"{_CLI}.data_run:run_synth"),
    Command("tf-config", data.add_tf_config,
            f"{_CLI}.data_run:run_tf_config"),
    # train, advise, server, data-server; then --task etc. on `psrec train`
    SelfRunning(train_commands.add_commands),
    SelfRunning(retrieval_flags.add_commands),
    Command("export", model.add_export, f"{_CLI}.model_run:run_export",
            model.check_export),
    Command("eval", model.add_eval, f"{_CLI}.model_run:run_eval",
            model.check_eval),
    Command("predict", model.add_predict, f"{_CLI}.model_run:run_predict",
            model.check_predict),
    Command("score", model.add_score, f"{_CLI}.model_run:run_predict",
            model.check_predict),
    Command("bench", model.add_bench, f"{_CLI}.model_run:run_bench"),
    Command("k8s render", k8s.add_render,
            f"{_CLI}.render_run:run_k8s_render"),
    Command("k8s simulate", k8s.add_simulate,
            f"{_CLI}.simulate_run:run_k8s_simulate"),
    Command("plan", plan.add_plan, f"{_CLI}.plan_run:run_plan",
            plan.check_plan_inputs),
    Command("embeddings stats", embeddings.add_stats,
            f"{_CLI}.embeddings_run:run_embeddings_stats",
            embeddings.check_stats),
)

#: The first words of two-word commands: ``add(sub, name)`` adds the
#: group's parser and returns where its commands are added.
GROUPS: dict[str, Callable[[_SubParsers, str], _SubParsers]] = {
    "k8s": k8s.add_k8s, "embeddings": embeddings.add_embeddings}


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command in :data:`COMMANDS` (no TensorFlow)."""
    parser = Parser(
        prog="psrec",
        description="Parameter-server recommender (CTR) training on "
        "TensorFlow.")
    parser.add_argument("--version", action="version",
                        version=f"psrec {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="COMMAND")
    groups: dict[str, _SubParsers] = {}
    for command in COMMANDS:
        if isinstance(command, SelfRunning):
            command.add(sub)
            continue
        *group, name = command.words.split()
        into = sub
        if group:
            [first] = group
            if first not in groups:
                groups[first] = GROUPS[first](sub, first)
            into = groups[first]
        command.add_parser(into, name).set_defaults(run=command)
    return parser


# -- errors -> exit codes ----------------------------------------------------


_USER_OS_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError,
                   NotADirectoryError, PermissionError)


def exit_code_for(error: BaseException) -> int | None:
    """The exit code of a known error, None for an unexpected one.

    Every psrec error carries its own (:class:`psrec.errors.PsrecError`); a
    missing or unusable input path, or an unreadable JSON file, is a usage
    error; a failed import is a broken installation or a shadowing module:
    permanent (2), never retried -- also when it surfaced as a retryable
    error (its cause decides).
    """
    if isinstance(error, PsrecError):
        if error.exit_code == EXIT_RETRYABLE and _caused_by_config(error):
            return EXIT_USAGE
        return error.exit_code
    if isinstance(error, (ImportError, json.JSONDecodeError)
                  + _USER_OS_ERRORS):
        return EXIT_USAGE
    return None


def _caused_by_config(error: BaseException) -> bool:
    seen: set[int] = set()
    cause = error.__cause__ or error.__context__
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, (ImportError, ConfigError)):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def error_line(error: BaseException) -> str:
    """The message of ``error`` on one line (its lines joined), the
    configuration fields it names turned into their flags."""
    # Only on the error path: the option table loads the job's modules.
    from psrec.launch.cli.options import translate
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return translate(" ".join(lines)) or type(error).__name__


def start_process() -> None:
    """What a psrec process does first: the TensorFlow environment
    (:func:`psrec.runtime.configure_environment`), and line-buffered
    output, so lines reach a pipe (a supervisor, a log collector) as they
    happen."""
    configure_environment()
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``psrec`` console script."""
    start_process()
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    # Giant-table initialisation, checkpoint saves and restores report here.
    set_default_progress(progress_for(args))
    run: Callable[[argparse.Namespace], int] = args.run
    return run_command(args.command, lambda: run(args))


def run_command(command: str, run: Callable[[], int]) -> int:
    """Runs ``psrec COMMAND``'s work: known failures end in one line,
    ``psrec COMMAND: error: ...``, and their exit code (see
    :func:`exit_code_for`); unexpected ones propagate."""
    try:
        return run()
    except KeyboardInterrupt:
        print(f"psrec {command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:  # noqa: BLE001 -- mapped to exit codes below
        code = exit_code_for(error)
        if code is None:
            raise
        retry = ("" if code in (EXIT_USAGE, EXIT_FAILURE)
                 else f" (retryable, exit {code})")
        # A requested stop (SIGTERM/SIGINT, exit 143/130) is not an error.
        kind = "" if code in (EXIT_INTERRUPTED, 143) else "error: "
        print(f"psrec {command}: {kind}{error_line(error)}{retry}",
              file=sys.stderr, flush=True)
        if code == EXIT_RETRYABLE:
            # TF's coordinator threads may wait on the lost task forever.
            sys.stdout.flush()
            os._exit(code)
        return code
    finally:
        set_default_progress(SILENT)  # main() called again in one process


if __name__ == "__main__":
    sys.exit(main())
