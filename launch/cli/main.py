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
import textwrap
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
from psrec.errors import did_you_mean
from psrec.launch.cli import data
from psrec.launch.cli import embeddings
from psrec.launch.cli import k8s
from psrec.launch.cli import model
from psrec.launch.cli import plan
from psrec.launch.cli import retrieval_flags
from psrec.launch.cli import runs
from psrec.launch.cli import train as train_commands
from psrec.launch.monitor.progress_bar import progress_for
from psrec.progress import SILENT
from psrec.progress import set_default_progress
from psrec.runtime import configure_environment
from psrec.runtime import quiet_tensorflow_start_up

# -- argparse: one-line errors, defaults in --help ---------------------------


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to every option that has a default worth
    showing (not None, not the False of a switch, not a required option);
    an ``example:`` epilog stays one line; lines break at spaces only."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("example: "):  # one line, to copy as it is
            return indent + text
        return super()._fill_text(text, width, indent)

    def _split_lines(self, text: str, width: int) -> list[str]:
        """Wrapped at spaces only: a value such as ``shared-bottom`` (a
        choice, a default) stays whole on one line."""
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.wrap(text, width, break_on_hyphens=False)

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

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """argparse's check of a value against ``choices``, its error
        ending with the closest choice (``did you mean 'deepfm'?``)."""
        choices = action.choices
        if choices is not None and value not in choices:
            raise argparse.ArgumentError(action, (
                f"invalid choice: {value!r} (choose from "
                f"{', '.join(map(repr, choices))})"
                f"{did_you_mean(value, choices)}"))
        super()._check_value(action, value)

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        """argparse's, except that a missing required option is reported
        with the flag given instead, when one was misspelt (``the following
        arguments are required: --name; --nmae is not an option; did you
        mean '--name'?``): argparse stops at the missing one before it
        looks at unknown flags."""
        words = list(sys.argv[1:] if args is None else args)
        try:
            return super().parse_known_args(args, namespace)
        except _MissingRequired as missing:
            given = words[:words.index("--")] if "--" in words else words
            unknown = [word.split("=", 1)[0] for word in given
                       if word.startswith("--") and word.split("=", 1)[0]
                       not in self._option_string_actions]
            hint = "" if not unknown else (
                f"; {unknown[0]} is not an option"
                f"{did_you_mean(unknown[0], self._option_string_actions)}")
            self._exit_with(f"{missing}{hint}")

    def error(self, message: str) -> None:  # type: ignore[override]
        line = " ".join(message.split())
        if line.startswith("the following arguments are required"):
            raise _MissingRequired(line)
        self._exit_with(line)

    def _exit_with(self, line: str) -> None:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {line} (see "
                  f"`{self.prog} --help`)\n")


class _MissingRequired(Exception):
    """argparse's "the following arguments are required" error, on its way
    to :meth:`Parser.parse_known_args`."""


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
    Command("apply-delta", model.add_apply_delta,
            f"{_CLI}.bundle_run:run_apply_delta"),
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
    Command("runs", runs.add_runs, f"{_CLI}.runs_run:run_runs"),
    Command("show", runs.add_show, f"{_CLI}.runs_run:run_show"),
)

#: How ``psrec --help`` groups the commands (each top-level command in one
#: group), in this order.
COMMAND_GROUPS: dict[str, tuple[str, ...]] = {
    "data": ("ingest", "convert", "audit-shards", "spec", "synth"),
    "train": ("train", "advise", "plan", "bench", "server", "data-server",
              "tf-config", "k8s"),
    "serve": ("export", "apply-delta", "predict", "score"),
    "inspect": ("runs", "show", "eval", "embeddings"),
}

#: One example per command, shown at the end of its ``--help``
#: (``example: psrec ...``); every one parses (tests/test_cli.py).
EXAMPLES: dict[str, str] = {
    "ingest": "psrec ingest criteo train.txt --out raw/",
    "convert": "psrec convert raw/ --spec spec.yaml --out data/ --shards 8 "
               "--eval-fraction 0.1",
    "audit-shards": "psrec audit-shards data/manifest.json --pipelines 2",
    "spec": "psrec spec infer raw/ --label label --out spec.yaml",
    "synth": "psrec synth --spec criteo --rows 10000 --out raw/",
    "tf-config": "psrec tf-config --ps-hosts ps0:2222 --worker-hosts "
                 "w0:2222,w1:2222 --out tf-config/",
    "train": "psrec train --data data/ --model dcn --steps 2000 --workdir "
             "runs/dcn",
    "advise": "psrec advise --spec criteo --model dcn",
    "server": "psrec server --cluster cluster.json --role ps --index 0",
    "data-server": "psrec data-server --role dispatcher --port 5050",
    "export": "psrec export runs/dcn/checkpoints --out model/",
    "apply-delta": "psrec apply-delta kv/3 kv/4 kv/5 --out kv-full/",
    "eval": "psrec eval runs/dcn/checkpoints --data data/",
    "predict": "psrec predict --model model/ --data raw/ --out "
               "scores.parquet",
    "score": "psrec score model/ raw/ --out scores.parquet",
    "bench": "psrec bench --model dlrm --workers 2 --ps 1",
    "k8s": "psrec k8s render --backend tfjob --name ctr --image "
           "psrec:latest --workdir gs://bucket/runs/ctr --out job.yaml",
    "k8s render": "psrec k8s render --backend tfjob --name ctr --image "
                  "psrec:latest --workdir gs://bucket/runs/ctr --out job.yaml",
    "k8s simulate": "psrec k8s simulate job.yaml",
    "plan": "psrec plan --data data/ --ps 2 --ps-memory 8GiB",
    "embeddings": "psrec embeddings stats runs/dcn/checkpoints",
    "embeddings stats": "psrec embeddings stats runs/dcn/checkpoints",
    "runs": "psrec runs runs/",
    "show": "psrec show runs/dcn",
}

#: The first words of two-word commands: ``add(sub, name)`` adds the
#: group's parser and returns where its commands are added.
GROUPS: dict[str, Callable[[_SubParsers, str], _SubParsers]] = {
    "k8s": k8s.add_k8s, "embeddings": embeddings.add_embeddings}


class _TopHelpFormatter(HelpFormatter):
    """``psrec --help``: the description (the grouped command list) as
    written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "".join(indent + line for line in text.splitlines(True))


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command in :data:`COMMANDS` (no TensorFlow);
    ``psrec --help`` lists them by :data:`COMMAND_GROUPS`, and each
    command's help ends with its :data:`EXAMPLES` line."""
    parser = Parser(
        prog="psrec", formatter_class=_TopHelpFormatter)
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
    _add_examples(sub, ())
    parser.description = _grouped_commands(sub)
    sub.help = argparse.SUPPRESS  # listed by group in the description
    # Set last: the commands' own prog ("psrec train") is made from it.
    parser.usage = "psrec [-h] [--version] COMMAND ..."
    return parser


def _add_examples(sub: _SubParsers, words: tuple[str, ...]) -> None:
    for name, child in sub.choices.items():
        key = " ".join((*words, name))
        if key in EXAMPLES:
            child.epilog = f"example: {EXAMPLES[key]}"
        for action in child._actions:
            if isinstance(action, _SubParsers):
                _add_examples(action, (*words, name))


def _grouped_commands(sub: _SubParsers) -> str:
    """The description of ``psrec --help``: each group's commands with
    their one-line help."""
    helps = {action.dest: action.help or ""
             for action in sub._choices_actions}
    width = max(map(len, helps)) + 2
    lines = ["Parameter-server recommender (CTR) training on TensorFlow.",
             "", "commands (`psrec COMMAND --help` for each):"]
    for group, names in COMMAND_GROUPS.items():
        lines.append(f"  {group}:")
        lines += [f"    {name.ljust(width)}{helps[name]}" for name in names]
    return "\n".join(lines)


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
    (:func:`psrec.runtime.configure_environment`), TensorFlow's start-up
    lines filtered (:func:`psrec.runtime.quiet_tensorflow_start_up`), and
    line-buffered
    output, so lines reach a pipe (a supervisor, a log collector) as they
    happen."""
    configure_environment()
    quiet_tensorflow_start_up()
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``psrec`` console script."""
    start_process()
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(parser, argv)
    args.argv = argv
    # Giant-table initialisation, checkpoint saves and restores report here.
    set_default_progress(progress_for(args))
    run: Callable[[argparse.Namespace], int] = args.run
    return run_command(args.command, lambda: run(args))


def parse(parser: argparse.ArgumentParser,
          argv: Sequence[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``, except that a command whose parser
    names its ``nargs="*"`` positional in the default ``trailing_inputs``
    (``psrec spec infer``) also takes those arguments after its flags:
    argparse matches such a positional, empty, before the flags and calls
    what follows them unrecognized."""
    args, extra = parser.parse_known_args(argv)
    into = getattr(args, "trailing_inputs", None)
    if extra and into and not any(a.startswith("-") for a in extra):
        setattr(args, into, [*getattr(args, into), *extra])
    elif extra:
        command = command_parser(parser, argv)
        flags = [a.split("=", 1)[0] for a in extra if a.startswith("--")]
        options = [o for o in command._option_string_actions
                   if o.startswith("--")]
        hint = did_you_mean(flags[0], options) if flags else ""
        command.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    return args


def command_parser(parser: argparse.ArgumentParser,
                   argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``argv`` names (``psrec k8s
    render``'s for ``["k8s", "render", ...]``): its error names the
    command, and a misspelt flag is matched against its options."""
    for word in argv:
        subparsers = [a for a in parser._actions
                      if isinstance(a, _SubParsers)]
        if not subparsers or word not in subparsers[0].choices:
            break
        parser = subparsers[0].choices[word]
    return parser


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
