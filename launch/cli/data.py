"""Data-side ``psrec`` commands, none of which needs a cluster: ingest,
convert, audit-shards, spec, synth and tf-config."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Sequence

from psrec.errors import EXIT_FAILURE
from psrec.errors import EXIT_OK
from psrec.features.spec.presets import resolve_spec
from psrec.launch.cli.argtypes import fraction
from psrec.launch.cli.argtypes import integer
from psrec.launch.cli.argtypes import positive
from psrec.launch.cli.argtypes import positive_fraction
from psrec.launch.cli.argtypes import proper_fraction
from psrec.launch.cli.support import RenamedFlag
from psrec.launch.cli.support import UsageError
from psrec.launch.cli.support import add_json_flag
from psrec.launch.cli.support import print_json
from psrec.launch.cli.support import print_result
from psrec.launch.monitor.progress_bar import add_progress_flag
from psrec.launch.monitor.progress_bar import progress_for
from psrec.uri_path import as_path


def _existing_files(paths: Sequence[str], what: str) -> list[str]:
    missing = [p for p in paths if not as_path(p).exists()]  # or a URI
    if missing:
        raise UsageError(f"{what} not found: {', '.join(missing)}")
    return list(paths)


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
    inputs = _existing_files(args.inputs, "input file")
    if args.dataset == "csv":
        from psrec.data.ingest.tabular import ingest_csv
        return ingest_csv(
            inputs, args.out, delimiter=_delimiter(args.delimiter or ","),
            header=args.header is not False,
            columns=_names(args.columns, "--columns") if args.columns
            else None, column_types=_types(args.types),
            progress=progress_for(args))
    if args.dataset == "libfm":
        from psrec.data.ingest.libfm import ingest_libfm
        return ingest_libfm(
            inputs, args.out, progress=progress_for(args),
            fields=_names(args.fields, "--fields") if args.fields else None)
    from psrec.data.ingest.jsonl import ingest_jsonl
    return ingest_jsonl(inputs, args.out, column_types=_types(args.types),
                        progress=progress_for(args))


def _cmd_ingest(args: argparse.Namespace) -> int:
    from psrec.data.ingest.criteo import ingest_criteo
    from psrec.data.ingest.movielens import ingest_movielens
    for flag, formats in _FORMAT_FLAGS.items():
        if getattr(args, flag) is not None and args.dataset not in formats:
            raise UsageError(f"--{flag} applies to ingest "
                             f"{' / '.join(formats)}, not {args.dataset}")
    if args.dataset in ("csv", "libfm", "jsonl"):
        report = _ingest_generic(args)
    elif args.dataset == "criteo":
        report = ingest_criteo(_existing_files(args.inputs, "input TSV"),
                               args.out, progress=progress_for(args))
    else:
        if len(args.inputs) != 1:
            raise UsageError(
                f"movielens ingest takes one folder (ml-100k), got "
                f"{len(args.inputs)} inputs: {' '.join(args.inputs)}")
        report = ingest_movielens(_existing_files(args.inputs, "folder")[0],
                                  args.out)
    print_result(args, report)
    return EXIT_OK


def _cmd_convert(args: argparse.Namespace) -> int:
    from psrec.data.convert.convert import ConversionOptions
    from psrec.data.convert.convert import convert
    options = ConversionOptions(
        shards=args.shards, eval_fraction=args.eval_fraction,
        split_mode=args.split, eval_shards=args.eval_shards,
        block_rows=args.block_rows, max_bad_fraction=args.max_bad_fraction,
        order_by=args.order_by, eval_files=args.eval_files,
        neg_sample_rate=args.neg_sample_rate)
    report = convert(_existing_files(args.inputs, "input Parquet"),
                     resolve_spec(args.spec), args.out, options,
                     progress=progress_for(args))
    print_result(args, report)
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    return EXIT_OK


def _cmd_audit(args: argparse.Namespace) -> int:
    from psrec.data.format.manifest import Manifest
    from psrec.data.format.manifest import spec_for
    from psrec.data.input.audit import audit_shards
    manifest = Manifest.load(args.manifest)
    spec = spec_for(manifest, args.spec)
    report = audit_shards(manifest, spec, args.pipelines, split=args.split)
    print_result(args, report)
    return EXIT_OK if report.ok else EXIT_FAILURE


_INFER_FLAGS = ("label", "label_threshold", "max_buckets", "vocab_max",
                "exclude")


def _cmd_spec_infer(args: argparse.Namespace) -> int:
    from psrec.data.infer.infer import infer_spec
    if not args.inputs:
        raise UsageError("spec infer: give the Parquet files or folders to "
                         "read (psrec spec infer PARQUET... --label COL --out "
                         "spec.yaml)")
    for flag in ("label", "out"):
        if getattr(args, flag) is None:
            raise UsageError(f"spec infer: --{flag} is required")
    report = infer_spec(
        _existing_files(args.inputs, "input Parquet"), args.label, args.out,
        label_threshold=args.label_threshold,
        max_buckets=2 ** 20 if args.max_buckets is None else args.max_buckets,
        vocab_max=1000 if args.vocab_max is None else args.vocab_max,
        exclude=_names(args.exclude, "--exclude") if args.exclude else (),
        command=shlex.join(["psrec", *getattr(args, "argv", ())]),
        progress=progress_for(args))
    print_result(args, report)
    return EXIT_OK


def _cmd_spec(args: argparse.Namespace) -> int:
    if args.spec == "infer":
        return _cmd_spec_infer(args)
    given = [f"--{f.replace('_', '-')}" for f in _INFER_FLAGS
             if getattr(args, f) is not None]
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
        import yaml
        print(yaml.safe_dump(spec.to_dict(), sort_keys=False), end="")
    return EXIT_OK


def _cmd_synth(args: argparse.Namespace) -> int:
    from psrec.data.ingest.synthetic import write_synthetic_parquet
    paths = write_synthetic_parquet(resolve_spec(args.spec), args.out,
                                    args.rows, files=args.files,
                                    seed=args.seed)
    print_result(args, {"files": list(paths), "rows": args.rows},
                 "\n".join(str(p) for p in paths))
    return EXIT_OK


def _cmd_tf_config(args: argparse.Namespace) -> int:
    from psrec.ps_cluster.cluster.tf_config import REMOTE_WARNING
    from psrec.ps_cluster.cluster.tf_config import ClusterSpec
    from psrec.ps_cluster.cluster.tf_config import tf_configs_for_all_tasks
    from psrec.ps_cluster.cluster.tf_config import write_tf_config_files
    spec = ClusterSpec.build(ps=args.ps_hosts, workers=args.worker_hosts,
                             chief=args.chief_host)
    spec.validate(allow_remote=args.allow_remote)
    if not spec.is_loopback():
        print(REMOTE_WARNING, file=sys.stderr)
    if args.out:
        paths = write_tf_config_files(spec, args.out)
        print_result(args, {"files": paths}, "\n".join(map(str, paths)))
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


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Registers the data-side sub-commands."""

    p = sub.add_parser(
        "ingest", help="raw logs (Criteo, MovieLens, CSV, libFM, JSON "
        "lines) -> Parquet",
        description="Raw files -> Parquet, one file per input (MovieLens: "
        "one table), streamed block by block; .gz/.bz2/.zst/.lz4 inputs are "
        "read directly. A row that does not parse stops the run naming file "
        "and line; no row is skipped.")
    p.add_argument("dataset", choices=("criteo", "movielens", "csv", "libfm",
                                       "jsonl"),
                   help="the raw format: criteo (Kaggle TSV), movielens "
                   "(ml-100k folder), csv (any delimited text), libfm "
                   "(libFM/libSVM lines) or jsonl (one JSON object a line)")
    add_progress_flag(p)
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="input files (paths or s3://, gs:// URIs), or the "
                   "ml-100k folder")
    p.add_argument("--out", required=True, help="output folder (or URI)")
    p.add_argument("--delimiter", default=None,
                   help="csv: one-character field separator; 'tab' or "
                   "'\\t' for a tab (default: ,)")
    p.add_argument("--header", action=argparse.BooleanOptionalAction,
                   default=None, help="csv: line 1 holds the column names "
                   "(default: --header)")
    p.add_argument("--columns", default=None, metavar="A,B,...",
                   help="csv: column names; replace the header line, or name "
                   "the fields of a --no-header file (default: the header, "
                   "or f0,f1,...)")
    p.add_argument("--types", default=None, metavar="COL=TYPE,...",
                   help="csv, jsonl: column types (int64, int32, float64, "
                   "float32, string, bool, timestamp); csv columns not named "
                   "are strings, jsonl ones keep their JSON type")
    p.add_argument("--fields", default=None, metavar="F0,F1,...",
                   help="libfm: names of fields 0, 1, ... (libFM field "
                   "numbers, or feature positions in libSVM lines; default "
                   "f0, f1, ...)")
    add_json_flag(p)
    p.set_defaults(run=_cmd_ingest)

    p = sub.add_parser("convert", help="Parquet -> sharded TFRecord + manifest",
                       description="Parquet -> sharded block TFRecords plus "
                       "manifest.json.")
    p.add_argument("inputs", nargs="+", metavar="PARQUET",
                   help="Parquet files, or folders of them (every *.parquet "
                   "below, sorted, as pyarrow's dataset discovery finds "
                   "them); paths or s3://, gs:// URIs")
    p.add_argument("--spec", required=True,
                   help="preset name (criteo, movielens) or YAML/JSON file")
    p.add_argument("--out", required=True,
                   help="output folder: a path or gs:// URI")
    p.add_argument("--shards", type=positive, default=4,
                   help="train shards (>= the input pipelines that read them)")
    p.add_argument("--eval-fraction", type=proper_fraction, default=0.0,
                   help="share of rows in the eval split, in [0, 1)")
    p.add_argument("--eval-shards", type=positive, default=None,
                   help="eval shards (default: --shards)")
    p.add_argument("--split", choices=("tail", "hash"), default="tail",
                   help="eval rows: the last rows (tail: time-ordered logs) "
                   "or a stable hash of the row id")
    p.add_argument("--order-by", default=None, metavar="COLUMN",
                   help="tail split by this column: eval = the rows with the "
                   "last values (ties: input order), e.g. a timestamp; the "
                   "column may be outside the spec, must not be null")
    p.add_argument("--eval-files", default=None, metavar="GLOB",
                   help="eval = every row of the inputs whose file name "
                   "matches GLOB, train = the others (instead of "
                   "--eval-fraction)")
    p.add_argument("--block-rows", type=positive, default=256,
                   help="rows packed per TFRecord record")
    p.add_argument("--max-bad-fraction", type=fraction, default=0.001,
                   help="fail above this share of bad rows (they go to "
                   "quarantine.parquet)")
    add_progress_flag(p)
    p.add_argument("--neg-sample-rate", type=positive_fraction, default=1.0,
                   metavar="R",
                   help="keep every positive and this share of the train "
                   "negatives (stable hash of the row id; the eval split is "
                   "not sampled); training, eval and the export correct the "
                   "logits by log(R) (default 1: keep all)")
    add_json_flag(p)
    p.set_defaults(run=_cmd_convert)

    p = sub.add_parser("audit-shards",
                       help="check per-pipeline input: overlap and coverage",
                       description="Reads one epoch through each input "
                       "pipeline and checks overlap (must be 0) and coverage "
                       "(must be 100%); exits 1 when either fails.")
    p.add_argument("manifest", help="manifest.json or its folder")
    p.add_argument("--pipelines", type=positive, required=True,
                   help="input pipelines (PS workers) to split the data over")
    p.add_argument("--split", choices=("train", "eval"), default="train",
                   help="the split to audit")
    p.add_argument("--spec", default=None,
                   help="preset or spec file the data was converted with "
                   "(default: the spec saved beside the data; older data: "
                   "the preset whose hash the manifest records)")
    add_json_flag(p)
    p.set_defaults(run=_cmd_audit)

    p = sub.add_parser(
        "spec", help="print or save a feature spec, or infer one from Parquet",
        description="psrec spec NAME [--out F]: print or save a preset or "
        "spec file. psrec spec infer PARQUET... --label COL --out spec.yaml: "
        "write a commented spec (and vocab/*.txt beside it) from one pass of "
        "statistics over the Parquet files (give them before the flags).")
    p.add_argument("spec", help="preset name (criteo, movielens), spec file, "
                   "or `infer`")
    p.add_argument("inputs", nargs="*", metavar="PARQUET",
                   help="infer: Parquet files, or folders of them")
    p.add_argument("--out", default=None,
                   help=".yaml or .json file to write (default: print YAML); "
                   "infer: the .yaml spec to write (required)")
    g = p.add_argument_group("infer")
    g.add_argument("--label", default=None, metavar="COL",
                   help="the label column (0/1, or see --label-threshold); "
                   "required")
    g.add_argument("--label-threshold", type=float, default=None,
                   metavar="T", help="label = value >= T (for a label that "
                   "is not 0/1, e.g. a rating)")
    g.add_argument("--max-buckets", type=positive, default=None,
                   help="most hash buckets per feature (default 2**20)")
    g.add_argument("--vocab-max", type=integer, default=None,
                   help="string columns with at most this many distinct "
                   "values get a vocabulary file (default 1000; 0: hash "
                   "all)")
    g.add_argument("--exclude", default=None, metavar="COL,...",
                   help="columns to leave out")
    add_progress_flag(g)
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
