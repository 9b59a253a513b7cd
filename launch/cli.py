"""The ``psrec`` command line: a thin, typed shell over library functions.

Each sub-command validates its arguments, calls one library function and
maps known failures to exit codes (see ``EXIT_*``). TensorFlow is imported
lazily, after :func:`psrec.runtime.configure_environment`, so ``psrec
--help`` is instant and the Keras setting always applies.

Every user mistake ends in one line on stderr, ``psrec <command>: error:
<message>``, and a permanent exit code (2 for arguments and configuration,
1 for data); argparse's own errors take the same one-line form. ``--help``
shows every default; ``--json`` prints a command's result as one JSON
object on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Sequence

from psrec.errors import EXIT_FAILURE
from psrec.errors import EXIT_INTERRUPTED
from psrec.errors import EXIT_OK
from psrec.errors import EXIT_RETRYABLE
from psrec.errors import EXIT_USAGE
from psrec.errors import ConfigError
from psrec.errors import PsrecError
from psrec.launch.argtypes import fraction
from psrec.launch.argtypes import integer
from psrec.launch.argtypes import positive
from psrec.launch.argtypes import proper_fraction
from psrec.runtime import configure_environment


class UsageError(ConfigError):
    """A command-line argument is invalid; exits with EXIT_USAGE."""


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


class RenamedFlag(argparse.Action):
    """A flag that was renamed: using it exits 2 naming the new flag."""

    def __init__(self, option_strings: Sequence[str], dest: str, *,
                 new: str, why: str, **kwargs: Any) -> None:
        kwargs.update(default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.new, self.why = new, why

    def __call__(self, parser: argparse.ArgumentParser,
                 namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(f"argument {option_string}: {option_string} {values} "
                     f"is not allowed here: {self.why}; use {self.new} "
                     f"{values}")


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print the result as one JSON object on stdout "
                        "(progress and errors go to stderr)")


def print_json(data: Any) -> None:
    """One JSON object on one line; NaN/inf become null, paths strings."""
    print(json.dumps(_json_safe(data), allow_nan=False), flush=True)


def _json_safe(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = (value.to_dict() if hasattr(value, "to_dict")
                 else dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


# -- helpers -----------------------------------------------------------------


def _print_report(args: argparse.Namespace, report: Any) -> None:
    """``report.summary()``, or with ``--json`` ``report.to_dict()``."""
    if args.json:
        print_json(report.to_dict())
    else:
        print(report.summary())


def _existing_files(paths: Sequence[str], what: str) -> list[str]:
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise UsageError(f"{what} not found: {', '.join(missing)}")
    return list(paths)


def _load_spec(text: str):
    from psrec.features.presets import resolve_spec
    return resolve_spec(text)


# -- data commands -------------------------------------------------------------


def _cmd_ingest(args: argparse.Namespace) -> int:
    from psrec.data.criteo import ingest_criteo
    from psrec.data.movielens import ingest_movielens
    if args.dataset == "criteo":
        report = ingest_criteo(_existing_files(args.inputs, "input TSV"),
                               args.out)
    else:
        if len(args.inputs) != 1:
            raise UsageError(
                f"movielens ingest takes one folder (ml-100k), got "
                f"{len(args.inputs)} inputs: {' '.join(args.inputs)}")
        report = ingest_movielens(_existing_files(args.inputs, "folder")[0],
                                  args.out)
    _print_report(args, report)
    return EXIT_OK


def _cmd_convert(args: argparse.Namespace) -> int:
    from psrec.data.convert import ConversionOptions
    from psrec.data.convert import convert
    options = ConversionOptions(
        shards=args.shards, eval_fraction=args.eval_fraction,
        split_mode=args.split, eval_shards=args.eval_shards,
        block_rows=args.block_rows, max_bad_fraction=args.max_bad_fraction)
    report = convert(_existing_files(args.inputs, "input Parquet"),
                     _load_spec(args.spec), args.out, options)
    _print_report(args, report)
    return EXIT_OK


def _cmd_audit(args: argparse.Namespace) -> int:
    from psrec.data.audit import audit_shards
    from psrec.data.manifest import Manifest
    manifest = Manifest.load(args.manifest)
    spec = _load_spec(args.spec) if args.spec else _spec_of(manifest)
    report = audit_shards(manifest, spec, args.pipelines, split=args.split)
    _print_report(args, report)
    return EXIT_OK if report.ok else EXIT_FAILURE


def _spec_of(manifest) -> object:
    """The preset a manifest was converted with, when it is one."""
    from psrec.features.presets import PRESETS
    for build in PRESETS.values():
        spec = build()
        if spec.fingerprint() == manifest.spec_hash:
            return spec
    raise UsageError(
        f"the manifest's spec ({manifest.spec_name}) is not a default preset; "
        "pass it with --spec FILE.")


def _cmd_spec(args: argparse.Namespace) -> int:
    spec = _load_spec(args.spec)
    if args.out:
        path = spec.save(args.out)
        if args.json:
            print_json({"file": path})
        else:
            print(path)
    elif args.json:
        print_json(spec.to_dict())
    else:
        import yaml
        print(yaml.safe_dump(spec.to_dict(), sort_keys=False), end="")
    return EXIT_OK


def _cmd_synth(args: argparse.Namespace) -> int:
    from psrec.data.synthetic import write_synthetic_parquet
    paths = write_synthetic_parquet(_load_spec(args.spec), args.out,
                                    args.rows, files=args.files,
                                    seed=args.seed)
    if args.json:
        print_json({"files": list(paths), "rows": args.rows})
    else:
        print("\n".join(str(p) for p in paths))
    return EXIT_OK


# -- cluster commands --------------------------------------------------------


def _cmd_tf_config(args: argparse.Namespace) -> int:
    from psrec.ps_cluster.tf_config import REMOTE_WARNING
    from psrec.ps_cluster.tf_config import ClusterSpec
    from psrec.ps_cluster.tf_config import tf_configs_for_all_tasks
    from psrec.ps_cluster.tf_config import write_tf_config_files
    spec = ClusterSpec.build(ps=args.ps_hosts, workers=args.worker_hosts,
                             chief=args.chief_host)
    spec.validate(allow_remote=args.allow_remote)
    if not spec.is_loopback():
        print(REMOTE_WARNING, file=sys.stderr)
    if args.out:
        paths = write_tf_config_files(spec, args.out)
        if args.json:
            print_json({"files": paths})
        else:
            for path in paths:
                print(path)
    elif args.json:
        tasks = {}
        for config in tf_configs_for_all_tasks(spec):
            data = config.to_dict()
            tasks[f"{data['task']['type']}-{data['task']['index']}"] = data
        print_json(tasks)
    else:
        for config in tf_configs_for_all_tasks(spec):
            print(config.to_json())
    return EXIT_OK


# -- parser ----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="psrec",
        description="Parameter-server recommender (CTR) training on "
        "TensorFlow.")
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="COMMAND")

    p = sub.add_parser("ingest", help="raw Criteo TSV / MovieLens -> Parquet",
                       description="Raw Criteo TSV files or the MovieLens "
                       "ml-100k folder -> Parquet.")
    p.add_argument("dataset", choices=("criteo", "movielens"),
                   help="the raw format: criteo or movielens")
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="Criteo TSV files, or the ml-100k folder")
    p.add_argument("--out", required=True, help="output folder")
    add_json_flag(p)
    p.set_defaults(run=_cmd_ingest)

    p = sub.add_parser("convert", help="Parquet -> sharded TFRecord + manifest",
                       description="Parquet -> sharded block TFRecords plus "
                       "manifest.json.")
    p.add_argument("inputs", nargs="+", metavar="PARQUET",
                   help="Parquet files, or folders of them (every *.parquet "
                   "below, sorted, as pyarrow's dataset discovery finds them)")
    p.add_argument("--spec", required=True,
                   help="preset name (criteo, movielens) or YAML/JSON file")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--shards", type=positive, default=4,
                   help="train shards (>= the input pipelines that read them)")
    p.add_argument("--eval-fraction", type=proper_fraction, default=0.0,
                   help="share of rows in the eval split, in [0, 1)")
    p.add_argument("--eval-shards", type=positive, default=None,
                   help="eval shards (default: --shards)")
    p.add_argument("--split", choices=("tail", "hash"), default="tail",
                   help="eval rows: the last rows (tail: time-ordered logs) "
                   "or a stable hash of the row id")
    p.add_argument("--block-rows", type=positive, default=256,
                   help="rows packed per TFRecord record")
    p.add_argument("--max-bad-fraction", type=fraction, default=0.001,
                   help="fail above this share of bad rows (they go to "
                   "quarantine.parquet)")
    add_json_flag(p)
    p.set_defaults(run=_cmd_convert)

    p = sub.add_parser("audit-shards",
                       help="check per-pipeline input: overlap and coverage",
                       description="Reads one epoch through each input "
                       "pipeline and checks overlap (must be 0) and coverage "
                       "(must be 100%%); exits 1 when either fails.")
    p.add_argument("manifest", help="manifest.json or its folder")
    p.add_argument("--pipelines", type=positive, required=True,
                   help="input pipelines (PS workers) to split the data over")
    p.add_argument("--split", choices=("train", "eval"), default="train",
                   help="the split to audit")
    p.add_argument("--spec", default=None,
                   help="spec file the data was converted with (default: "
                   "the preset the manifest names)")
    add_json_flag(p)
    p.set_defaults(run=_cmd_audit)

    p = sub.add_parser("spec", help="print or save a feature spec")
    p.add_argument("spec", help="preset name (criteo, movielens) or spec file")
    p.add_argument("--out", default=None,
                   help=".yaml or .json file to write (default: print YAML)")
    add_json_flag(p)
    p.set_defaults(run=_cmd_spec)

    p = sub.add_parser("synth", help="write seeded synthetic Parquet for a spec")
    p.add_argument("--spec", default="criteo",
                   help="preset name (criteo, movielens) or spec file")
    p.add_argument("--rows", type=positive, default=100_000,
                   help="rows in all files together")
    p.add_argument("--files", type=positive, default=4,
                   help="Parquet files to write")
    p.add_argument("--seed", type=integer, default=0, help="random seed")
    p.add_argument("--out", required=True, help="output folder")
    add_json_flag(p)
    p.set_defaults(run=_cmd_synth)

    p = sub.add_parser("tf-config", help="print the TF_CONFIG of every task",
                       description="The TF_CONFIG of every task of a cluster "
                       "given by host lists (in train and bench, --ps and "
                       "--workers are task counts).")
    p.add_argument("--ps-hosts", required=True, metavar="H:P,...",
                   help="comma-separated host:port of the PS tasks")
    p.add_argument("--worker-hosts", required=True, metavar="H:P,...",
                   help="comma-separated host:port of the worker tasks")
    p.add_argument("--chief-host", default=None, metavar="H:P",
                   help="host:port of the chief (coordinator) task (default: "
                   "none in the cluster)")
    for old, new in (("--ps", "--ps-hosts"), ("--workers", "--worker-hosts"),
                     ("--chief", "--chief-host")):
        p.add_argument(old, action=RenamedFlag, new=new,
                       why=f"tf-config takes addresses as {new} (--ps and "
                       "--workers are task counts in train and bench)")
    p.add_argument("--out", default=None,
                   help="write <type>-<index>.json files to this folder "
                   "(default: print one TF_CONFIG per line)")
    p.add_argument("--allow-remote", action="store_true",
                   help="permit non-loopback hosts (unauthenticated gRPC!)")
    add_json_flag(p)
    p.set_defaults(run=_cmd_tf_config)

    _add_training_commands(sub)
    return parser


def _add_training_commands(sub: argparse._SubParsersAction) -> None:
    """Training-side commands live in ``launch.commands``."""
    from psrec.launch.commands import add_commands
    add_commands(sub)


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
    """The message of ``error`` on one line (its lines joined)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return " ".join(lines) or type(error).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``psrec`` console script."""
    configure_environment()
    # Lines reach a pipe (a supervisor, a log collector) as they happen.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except KeyboardInterrupt:
        print(f"psrec {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:  # noqa: BLE001 -- mapped to exit codes below
        code = exit_code_for(error)
        if code is None:
            raise
        retry = ("" if code in (EXIT_USAGE, EXIT_FAILURE)
                 else f" (retryable, exit {code})")
        print(f"psrec {args.command}: error: {error_line(error)}{retry}",
              file=sys.stderr, flush=True)
        if code == EXIT_RETRYABLE:
            # TF's coordinator threads may wait on the lost task forever.
            sys.stdout.flush()
            os._exit(code)
        return code


if __name__ == "__main__":
    sys.exit(main())
