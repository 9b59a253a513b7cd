"""What runs the data-side ``psrec`` commands that need no TensorFlow:
``ingest``, ``spec`` (and ``spec infer``), ``synth`` and ``tf-config``
(their parsers: :mod:`psrec.launch.cli.data`)."""

from __future__ import annotations

import argparse
import shlex
import sys

import yaml

from psrec.data.infer.infer import InferOptions
from psrec.data.infer.infer import infer_spec
from psrec.data.ingest.criteo import ingest_criteo
from psrec.data.ingest.jsonl import ingest_jsonl
from psrec.data.ingest.libfm import ingest_libfm
from psrec.data.ingest.movielens import ingest_movielens
from psrec.data.ingest.synthetic import Drift
from psrec.data.ingest.synthetic import write_synthetic_parquet
from psrec.data.ingest.tabular import ingest_csv
from psrec.errors import EXIT_OK
from psrec.features.spec.presets import resolve_spec
from psrec.launch.cli.options import given as was_given
from psrec.launch.cli.support import UsageError
from psrec.launch.cli.support import existing_files
from psrec.launch.cli.support import print_json
from psrec.launch.cli.support import print_result
from psrec.launch.monitor.progress_bar import progress_for
from psrec.options import option_values
from psrec.options import options
from psrec.ps_cluster.cluster.tf_config import REMOTE_WARNING
from psrec.ps_cluster.cluster.tf_config import ClusterSpec
from psrec.ps_cluster.cluster.tf_config import tf_configs_for_all_tasks
from psrec.ps_cluster.cluster.tf_config import write_tf_config_files

_FORMAT_FLAGS = {"delimiter": ("csv",), "header": ("csv",),
                 "columns": ("csv",), "types": ("csv", "jsonl"),
                 "fields": ("libfm",)}


def _names(text: str, flag: str) -> list[str]:
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise UsageError(f"{flag} {text!r}: give comma-separated names, "
                         "none empty (e.g. a,b,c)")
    return names


def _types(text: str | None) -> dict[str, str]:
    """``COL=TYPE,...`` -> ``{COL: TYPE}`` (type names checked later)."""
    types: dict[str, str] = {}
    for item in text.split(",") if text else []:
        column, sep, name = item.partition("=")
        if not sep or not column.strip() or not name.strip():
            raise UsageError(f"--types {text!r}: give COL=TYPE pairs "
                             "separated by commas (e.g. click=int64,price="
                             "float64)")
        types[column.strip()] = name.strip()
    return types


def _delimiter(text: str) -> str:
    """``\\t`` and ``tab`` name the tab (hard to type in a shell)."""
    return "\t" if text in ("\\t", "tab") else text


def _ingest_generic(args: argparse.Namespace) -> object:
    inputs = existing_files(args.inputs, "input file")
    if args.dataset == "csv":
        return ingest_csv(
            inputs, args.out, delimiter=_delimiter(args.delimiter or ","),
            header=args.header is not False,
            columns=_names(args.columns, "--columns") if args.columns
            else None, column_types=_types(args.types),
            progress=progress_for(args))
    if args.dataset == "libfm":
        return ingest_libfm(
            inputs, args.out, progress=progress_for(args),
            fields=_names(args.fields, "--fields") if args.fields else None)
    return ingest_jsonl(inputs, args.out, column_types=_types(args.types),
                        progress=progress_for(args))


def run_ingest(args: argparse.Namespace) -> int:
    for flag, formats in _FORMAT_FLAGS.items():
        if getattr(args, flag) is not None and args.dataset not in formats:
            raise UsageError(f"--{flag} applies to ingest "
                             f"{' / '.join(formats)}, not {args.dataset}")
    if args.dataset in ("csv", "libfm", "jsonl"):
        report = _ingest_generic(args)
    elif args.dataset == "criteo":
        report = ingest_criteo(existing_files(args.inputs, "input TSV"),
                               args.out, progress=progress_for(args))
    else:
        if len(args.inputs) != 1:
            raise UsageError(
                f"movielens ingest takes one folder (ml-100k), got "
                f"{len(args.inputs)} inputs: {' '.join(args.inputs)}")
        report = ingest_movielens(existing_files(args.inputs, "folder")[0],
                                  args.out)
    print_result(args, report)
    return EXIT_OK


_INFER_FLAGS = ("label", *(field.name for field, _ in options(InferOptions)))


def _spec_infer(args: argparse.Namespace) -> int:
    if not args.inputs:
        raise UsageError("spec infer: give the Parquet files or folders to "
                         "read (psrec spec infer PARQUET... --label COL --out "
                         "spec.yaml)")
    for flag in ("label", "out"):
        if getattr(args, flag) is None:
            raise UsageError(f"spec infer: --{flag} is required")
    options = option_values(args, InferOptions, exclude=_names(
        args.exclude, "--exclude") if args.exclude else ())
    report = infer_spec(
        existing_files(args.inputs, "input Parquet"), args.label, args.out,
        options, command=shlex.join(["psrec", *getattr(args, "argv", ())]),
        progress=progress_for(args))
    print_result(args, report)
    return EXIT_OK


def run_spec(args: argparse.Namespace) -> int:
    if args.spec == "infer":
        return _spec_infer(args)
    given = [f"--{f.replace('_', '-')}" for f in _INFER_FLAGS
             if (getattr(args, f) is not None if f == "label"
                 else was_given(args, f))]
    if args.inputs or given:
        raise UsageError(
            f"spec {args.spec}: {' '.join(args.inputs + given)} apply only "
            "to `psrec spec infer`")
    spec = resolve_spec(args.spec)
    if args.out:
        path = spec.save(args.out)
        print_result(args, {"file": path}, str(path))
    elif args.json:
        print_json(spec.to_dict())
    else:
        print(yaml.safe_dump(spec.to_dict(), sort_keys=False), end="")
    return EXIT_OK


def run_synth(args: argparse.Namespace) -> int:
    paths = write_synthetic_parquet(resolve_spec(args.spec), args.out,
                                    args.rows, files=args.files,
                                    seed=args.seed,
                                    drift=option_values(args, Drift))
    print_result(args, {"files": list(paths), "rows": args.rows},
                 "\n".join(str(p) for p in paths))
    return EXIT_OK


def run_tf_config(args: argparse.Namespace) -> int:
    spec = ClusterSpec.build(ps=args.ps_hosts, workers=args.worker_hosts,
                             chief=args.chief_host)
    spec.validate(allow_remote=args.allow_remote)
    if not spec.is_loopback():
        print(REMOTE_WARNING, file=sys.stderr)
    if args.out:
        paths = write_tf_config_files(spec, args.out)
        print_result(args, {"files": paths}, "\n".join(map(str, paths)))
    elif args.json:
        tasks = [config.to_dict() for config in tf_configs_for_all_tasks(spec)]
        print_json({f"{t['task']['type']}-{t['task']['index']}": t
                    for t in tasks})
    else:
        for config in tf_configs_for_all_tasks(spec):
            print(config.to_json())
    return EXIT_OK
