"""The ``psrec`` command line: a thin, typed shell over library functions.

Each sub-command validates its arguments, calls one library function and
maps known failures to exit codes (see ``EXIT_*``). TensorFlow is imported
lazily, after :func:`launch.runtime.configure_environment`, so ``psrec
--help`` is instant and the Keras setting always applies.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from launch.runtime import configure_environment

from launch.exit_codes import EXIT_FAILURE
from launch.exit_codes import EXIT_INTERRUPTED
from launch.exit_codes import EXIT_OK
from launch.exit_codes import EXIT_RETRYABLE
from launch.exit_codes import EXIT_USAGE


class UsageError(Exception):
    """A command-line argument is invalid; exits with EXIT_USAGE."""


# -- helpers -----------------------------------------------------------------


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 1")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be in [0, 1]")
    return value


def _existing_files(paths: Sequence[str], what: str) -> list[str]:
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise UsageError(f"{what} not found: {', '.join(missing)}")
    return list(paths)


def _load_spec(text: str):
    from features.presets import resolve_spec
    return resolve_spec(text)


# -- data commands -------------------------------------------------------------


def _cmd_ingest(args: argparse.Namespace) -> int:
    from data.ingest import ingest_criteo
    from data.ingest import ingest_movielens
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
    from data.convert import ConversionOptions
    from data.convert import convert
    options = ConversionOptions(
        shards=args.shards, eval_fraction=args.eval_fraction,
        split_mode=args.split, eval_shards=args.eval_shards,
        block_rows=args.block_rows, max_bad_fraction=args.max_bad_fraction)
    report = convert(_existing_files(args.inputs, "input Parquet"),
                     _load_spec(args.spec), args.out, options)
    print(report.summary())
    return EXIT_OK


def _cmd_audit(args: argparse.Namespace) -> int:
    from data.audit import audit_shards
    from data.manifest import Manifest
    manifest = Manifest.load(args.manifest)
    spec = _load_spec(args.spec) if args.spec else _spec_of(manifest)
    report = audit_shards(manifest, spec, args.pipelines, split=args.split)
    print(report.summary())
    return EXIT_OK if report.ok else EXIT_FAILURE


def _spec_of(manifest) -> object:
    """The preset a manifest was converted with, when it is one."""
    from features.presets import PRESETS
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
    from data.synthetic import write_synthetic_parquet
    paths = write_synthetic_parquet(_load_spec(args.spec), args.out,
                                    args.rows, files=args.files,
                                    seed=args.seed)
    print("\n".join(paths))
    return EXIT_OK


# -- cluster commands --------------------------------------------------------


def _cmd_tf_config(args: argparse.Namespace) -> int:
    from ps_cluster.spec import ClusterSpec
    from ps_cluster.spec import REMOTE_WARNING
    from ps_cluster.spec import tf_configs_for_all_tasks
    from ps_cluster.spec import write_tf_config_files
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
    p.add_argument("--shards", type=_positive, default=4)
    p.add_argument("--eval-fraction", type=_fraction, default=0.0)
    p.add_argument("--eval-shards", type=_positive, default=None)
    p.add_argument("--split", choices=("tail", "hash"), default="tail",
                   help="eval rows: the last rows (tail, default: time-ordered "
                   "logs) or a stable hash of the row id")
    p.add_argument("--block-rows", type=_positive, default=256)
    p.add_argument("--max-bad-fraction", type=_fraction, default=0.001)
    p.set_defaults(run=_cmd_convert)

    p = sub.add_parser("audit-shards",
                       help="check per-pipeline input: overlap and coverage")
    p.add_argument("manifest", help="manifest.json or its folder")
    p.add_argument("--pipelines", type=_positive, required=True)
    p.add_argument("--split", choices=("train", "eval"), default="train")
    p.add_argument("--spec", default=None)
    p.set_defaults(run=_cmd_audit)

    p = sub.add_parser("spec", help="print or save a feature spec")
    p.add_argument("spec", help="preset name or spec file")
    p.add_argument("--out", default=None, help=".yaml or .json file to write")
    p.set_defaults(run=_cmd_spec)

    p = sub.add_parser("synth", help="write seeded synthetic Parquet for a spec")
    p.add_argument("--spec", default="criteo")
    p.add_argument("--rows", type=_positive, default=100_000)
    p.add_argument("--files", type=_positive, default=4)
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
    from launch.commands import add_commands
    add_commands(sub)


def _known_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean bad input: reported in one line, exit 2."""
    from data.ingest import IngestError
    from data.manifest import ManifestError
    from features.spec import SpecError
    from ps_cluster.spec import ClusterSpecError
    from models.config import ModelConfigError
    errors: list[type[BaseException]] = [
        UsageError, IngestError, ManifestError, SpecError, ClusterSpecError,
        ModelConfigError, FileNotFoundError]
    if "data.convert" in sys.modules:
        from data.convert import SchemaError
        errors.append(SchemaError)
    if "data.dataset" in sys.modules:
        from data.dataset import NotEnoughShardsError
        errors.append(NotEnoughShardsError)
    if "data.integrity" in sys.modules:
        from data.integrity import SplitOverlapError
        errors.append(SplitOverlapError)
    if "models.sizing" in sys.modules:
        from models.sizing import ModelTooLargeError
        errors.append(ModelTooLargeError)
    if "ps_cluster.mirrored" in sys.modules:
        from ps_cluster.mirrored import MirroredConfigError
        errors.append(MirroredConfigError)
    return tuple(errors)


def _retryable() -> tuple[type[BaseException], ...]:
    """Errors a restart can fix: exit 138 (see launch.exit_codes)."""
    retryable: list[type[BaseException]] = []
    if "ps_cluster.errors" in sys.modules:
        from ps_cluster.errors import ClusterUnavailableError
        retryable.append(ClusterUnavailableError)
    if "launch.local" in sys.modules:
        from launch.local import RoleStartError
        retryable.append(RoleStartError)
    return tuple(retryable)


def _failures() -> tuple[type[BaseException], ...]:
    """Errors that mean the job failed on its data: exit 1."""
    failures: list[type[BaseException]] = []
    if "data.convert" in sys.modules:
        from data.convert import BadDataError
        failures.append(BadDataError)
    if "data.records" in sys.modules:
        from data.records import CorruptRecordError
        failures.append(CorruptRecordError)
    if "ps_cluster.checkpoint" in sys.modules:
        from ps_cluster.checkpoint import RestoreError
        failures.append(RestoreError)
    if "launch.mirrored_job" in sys.modules:
        from launch.mirrored_job import WorkerFailedError
        failures.append(WorkerFailedError)
    if "ps_cluster.advise" in sys.modules:
        from ps_cluster.advise import AdviseError
        failures.append(AdviseError)
    return tuple(failures)


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
        if isinstance(error, _known_errors()):
            print(f"psrec {args.command}: error: {error}", file=sys.stderr)
            return EXIT_USAGE
        if isinstance(error, _failures()):
            print(f"psrec {args.command}: failed: {error}", file=sys.stderr)
            return EXIT_FAILURE
        if isinstance(error, _retryable()):
            print(f"psrec {args.command}: failed (retryable, exit "
                  f"{EXIT_RETRYABLE}): {error}", file=sys.stderr, flush=True)
            # TF's coordinator threads may wait on the lost task forever.
            sys.stdout.flush()
            os._exit(EXIT_RETRYABLE)
        raise


if __name__ == "__main__":
    sys.exit(main())
