"""The ``psrec`` command line: a thin, typed shell over library functions.

Each sub-command validates its arguments, calls one library function and
maps known failures to exit codes (see ``EXIT_*``). TensorFlow is imported
lazily, after :func:`psrec.runtime.configure_environment`, so ``psrec
--help`` is instant and the Keras setting always applies.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
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
from psrec.launch.argtypes import positive
from psrec.runtime import configure_environment


class UsageError(ConfigError):
    """A command-line argument is invalid; exits with EXIT_USAGE."""


# -- helpers -----------------------------------------------------------------


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
    from psrec.data.ingest import ingest_criteo
    from psrec.data.ingest import ingest_movielens
    if args.dataset == "criteo":
        report = ingest_criteo(_existing_files(args.inputs, "input TSV"),
                               args.out)
    else:
        if len(args.inputs) != 1:
            raise UsageError("movielens ingest takes one folder (ml-100k).")
        report = ingest_movielens(_existing_files(args.inputs, "folder")[0],
                                  args.out)
    print(report.summary())
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
    print(report.summary())
    return EXIT_OK


def _cmd_audit(args: argparse.Namespace) -> int:
    from psrec.data.audit import audit_shards
    from psrec.data.manifest import Manifest
    manifest = Manifest.load(args.manifest)
    spec = _load_spec(args.spec) if args.spec else _spec_of(manifest)
    report = audit_shards(manifest, spec, args.pipelines, split=args.split)
    print(report.summary())
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
        print(spec.save(args.out))
    else:
        import yaml
        print(yaml.safe_dump(spec.to_dict(), sort_keys=False), end="")
    return EXIT_OK


def _cmd_synth(args: argparse.Namespace) -> int:
    from psrec.data.synthetic import write_synthetic_parquet
    paths = write_synthetic_parquet(_load_spec(args.spec), args.out,
                                    args.rows, files=args.files,
                                    seed=args.seed)
    print("\n".join(paths))
    return EXIT_OK


# -- cluster commands --------------------------------------------------------


def _cmd_tf_config(args: argparse.Namespace) -> int:
    from psrec.ps_cluster.spec import REMOTE_WARNING
    from psrec.ps_cluster.spec import ClusterSpec
    from psrec.ps_cluster.spec import tf_configs_for_all_tasks
    from psrec.ps_cluster.spec import write_tf_config_files
    spec = ClusterSpec.build(ps=args.ps, workers=args.workers,
                             chief=args.chief)
    spec.validate(allow_remote=args.allow_remote)
    if not spec.is_loopback():
        print(REMOTE_WARNING, file=sys.stderr)
    if args.out:
        for path in write_tf_config_files(spec, args.out):
            print(path)
    else:
        for config in tf_configs_for_all_tasks(spec):
            print(config.to_json())
    return EXIT_OK


# -- parser ----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="psrec",
        description="Parameter-server recommender (CTR) training on "
        "TensorFlow.")
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="COMMAND")

    p = sub.add_parser("ingest", help="raw Criteo TSV / MovieLens -> Parquet")
    p.add_argument("dataset", choices=("criteo", "movielens"))
    p.add_argument("inputs", nargs="+", help="TSV files, or the ml-100k folder")
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(run=_cmd_ingest)

    p = sub.add_parser("convert", help="Parquet -> sharded TFRecord + manifest")
    p.add_argument("inputs", nargs="+", metavar="PARQUET")
    p.add_argument("--spec", required=True,
                   help="preset name (criteo, movielens) or YAML/JSON file")
    p.add_argument("--out", required=True)
    p.add_argument("--shards", type=positive, default=4)
    p.add_argument("--eval-fraction", type=fraction, default=0.0)
    p.add_argument("--eval-shards", type=positive, default=None)
    p.add_argument("--split", choices=("tail", "hash"), default="tail",
                   help="eval rows: the last rows (tail, default: time-ordered "
                   "logs) or a stable hash of the row id")
    p.add_argument("--block-rows", type=positive, default=256)
    p.add_argument("--max-bad-fraction", type=fraction, default=0.001)
    p.set_defaults(run=_cmd_convert)

    p = sub.add_parser("audit-shards",
                       help="check per-pipeline input: overlap and coverage")
    p.add_argument("manifest", help="manifest.json or its folder")
    p.add_argument("--pipelines", type=positive, required=True)
    p.add_argument("--split", choices=("train", "eval"), default="train")
    p.add_argument("--spec", default=None)
    p.set_defaults(run=_cmd_audit)

    p = sub.add_parser("spec", help="print or save a feature spec")
    p.add_argument("spec", help="preset name or spec file")
    p.add_argument("--out", default=None, help=".yaml or .json file to write")
    p.set_defaults(run=_cmd_spec)

    p = sub.add_parser("synth", help="write seeded synthetic Parquet for a spec")
    p.add_argument("--spec", default="criteo")
    p.add_argument("--rows", type=positive, default=100_000)
    p.add_argument("--files", type=positive, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.set_defaults(run=_cmd_synth)

    p = sub.add_parser("tf-config", help="print the TF_CONFIG of every task")
    p.add_argument("--ps", required=True, help="H:P,H:P,...")
    p.add_argument("--workers", required=True, help="H:P,H:P,...")
    p.add_argument("--chief", default=None, help="H:P of the coordinator")
    p.add_argument("--out", default=None, help="write <type>-<index>.json here")
    p.add_argument("--allow-remote", action="store_true",
                   help="permit non-loopback hosts (unauthenticated gRPC!)")
    p.set_defaults(run=_cmd_tf_config)

    _add_training_commands(sub)
    return parser


def _add_training_commands(sub: argparse._SubParsersAction) -> None:
    """Training-side commands live in ``launch.commands``."""
    from psrec.launch.commands import add_commands
    add_commands(sub)


def exit_code_for(error: BaseException) -> int | None:
    """The exit code of a known error, None for an unexpected one.

    Every psrec error carries its own (:class:`psrec.errors.PsrecError`); a
    missing input file is a usage error, and a failed import is a broken
    installation or a shadowing module: permanent, never retried.
    """
    if isinstance(error, PsrecError):
        return error.exit_code
    if isinstance(error, (FileNotFoundError, ImportError)):
        return EXIT_USAGE
    return None


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
        print("psrec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:  # noqa: BLE001 -- mapped to exit codes below
        code = exit_code_for(error)
        if code is None:
            raise
        kind = {EXIT_USAGE: "error", EXIT_FAILURE: "failed"}.get(
            code, f"failed (retryable, exit {code})")
        print(f"psrec {args.command}: {kind}: {error}", file=sys.stderr,
              flush=True)
        if code == EXIT_RETRYABLE:
            # TF's coordinator threads may wait on the lost task forever.
            sys.stdout.flush()
            os._exit(code)
        return code


if __name__ == "__main__":
    sys.exit(main())
