"""Data-side ``psrec`` commands, none of which needs a cluster: ingest,
convert, audit-shards, spec, synth and tf-config."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from psrec.errors import EXIT_FAILURE
from psrec.errors import EXIT_OK
from psrec.features.presets import resolve_spec
from psrec.launch.argtypes import fraction
from psrec.launch.argtypes import integer
from psrec.launch.argtypes import positive
from psrec.launch.argtypes import proper_fraction
from psrec.launch.cli_support import RenamedFlag
from psrec.launch.cli_support import UsageError
from psrec.launch.cli_support import add_json_flag
from psrec.launch.cli_support import print_json
from psrec.launch.cli_support import print_result


def _existing_files(paths: Sequence[str], what: str) -> list[str]:
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise UsageError(f"{what} not found: {', '.join(missing)}")
    return list(paths)


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
    print_result(args, report)
    return EXIT_OK


def _cmd_convert(args: argparse.Namespace) -> int:
    from psrec.data.convert import ConversionOptions
    from psrec.data.convert import convert
    options = ConversionOptions(
        shards=args.shards, eval_fraction=args.eval_fraction,
        split_mode=args.split, eval_shards=args.eval_shards,
        block_rows=args.block_rows, max_bad_fraction=args.max_bad_fraction)
    report = convert(_existing_files(args.inputs, "input Parquet"),
                     resolve_spec(args.spec), args.out, options)
    print_result(args, report)
    return EXIT_OK


def _cmd_audit(args: argparse.Namespace) -> int:
    from psrec.data.audit import audit_shards
    from psrec.data.manifest import Manifest
    manifest = Manifest.load(args.manifest)
    spec = resolve_spec(args.spec) if args.spec else _spec_of(manifest)
    report = audit_shards(manifest, spec, args.pipelines, split=args.split)
    print_result(args, report)
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
    from psrec.data.synthetic import write_synthetic_parquet
    paths = write_synthetic_parquet(resolve_spec(args.spec), args.out,
                                    args.rows, files=args.files,
                                    seed=args.seed)
    print_result(args, {"files": list(paths), "rows": args.rows},
                 "\n".join(str(p) for p in paths))
    return EXIT_OK


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
                       "(must be 100%); exits 1 when either fails.")
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
