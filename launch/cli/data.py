"""The parsers of the data-side ``psrec`` commands, none of which needs a
cluster: ingest, convert, audit-shards, spec, synth and tf-config. They
import no TensorFlow; what runs them is :mod:`psrec.launch.cli.data_run`
(and :mod:`psrec.launch.cli.convert_run` for convert and audit-shards),
imported only when the command runs (the registry in
:mod:`psrec.launch.cli.main`)."""

from __future__ import annotations

import argparse

from psrec.data.convert.config import ConversionOptions
from psrec.data.format.manifest import SPLITS
from psrec.data.format.manifest import Manifest
from psrec.data.format.manifest import spec_for
from psrec.data.infer.infer import InferOptions
from psrec.data.ingest.synthetic import Drift
from psrec.features.spec.presets import resolve_spec
from psrec.launch.cli.argtypes import fraction
from psrec.launch.cli.argtypes import integer
from psrec.launch.cli.argtypes import non_negative
from psrec.launch.cli.argtypes import non_negative_float
from psrec.launch.cli.argtypes import positive
from psrec.launch.cli.argtypes import positive_fraction
from psrec.launch.cli.argtypes import proper_fraction
from psrec.launch.cli.options import add_option
from psrec.launch.cli.support import RenamedFlag
from psrec.launch.cli.support import add_cluster_flags
from psrec.launch.cli.support import add_json_flag
from psrec.launch.cli.support import existing_files
from psrec.launch.monitor.progress_bar import add_progress_flag
from psrec.options import option_values


def add_ingest(sub: argparse._SubParsersAction, name: str
               ) -> argparse.ArgumentParser:
    """``psrec ingest``: raw logs -> Parquet."""
    p = sub.add_parser(
        name, help="raw logs (Criteo, MovieLens, CSV, libFM, JSON "
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
    return p


def add_convert(sub: argparse._SubParsersAction, name: str
                ) -> argparse.ArgumentParser:
    """``psrec convert``: Parquet -> sharded TFRecords and their manifest."""
    p = sub.add_parser(
        name, help="Parquet -> sharded TFRecord + manifest",
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
    add_option(p, ConversionOptions, "shards", type=positive)
    add_option(p, ConversionOptions, "eval_fraction", type=proper_fraction)
    add_option(p, ConversionOptions, "eval_shards", type=positive)
    add_option(p, ConversionOptions, "split_mode")
    add_option(p, ConversionOptions, "order_by", metavar="COLUMN")
    add_option(p, ConversionOptions, "eval_files", metavar="GLOB")
    add_option(p, ConversionOptions, "block_rows", type=positive)
    add_option(p, ConversionOptions, "max_bad_fraction", type=fraction)
    add_option(p, ConversionOptions, "overwrite")
    add_progress_flag(p)
    add_option(p, ConversionOptions, "neg_sample_rate",
               type=positive_fraction, metavar="R")
    add_json_flag(p)
    return p


def check_convert(args: argparse.Namespace) -> None:
    """What ``psrec convert`` refuses before its run imports TensorFlow
    (in the run's order): a bad option value, a missing input, an unknown
    ``--spec``."""
    option_values(args, ConversionOptions)
    existing_files(args.inputs, "input Parquet")
    resolve_spec(args.spec)


def add_audit_shards(sub: argparse._SubParsersAction, name: str
                     ) -> argparse.ArgumentParser:
    """``psrec audit-shards``: the per-pipeline overlap and coverage check."""
    p = sub.add_parser(
        name, help="check per-pipeline input: overlap and coverage",
                       description="Reads one epoch through each input "
                       "pipeline and checks overlap (must be 0) and coverage "
                       "(must be 100%); exits 1 when either fails.")
    p.add_argument("manifest", help="manifest.json or its folder")
    p.add_argument("--pipelines", type=positive, required=True,
                   help="input pipelines (PS workers) to split the data over")
    p.add_argument("--split", choices=SPLITS, default=SPLITS[0],
                   help="the split to audit")
    p.add_argument("--spec", default=None,
                   help="preset or spec file the data was converted with "
                   "(default: the spec saved beside the data; older data: "
                   "the preset whose hash the manifest records)")
    add_json_flag(p)
    return p


def check_audit_shards(args: argparse.Namespace) -> None:
    """What ``psrec audit-shards`` refuses before its run imports
    TensorFlow: a missing manifest, a spec that is not the data's."""
    spec_for(Manifest.load(args.manifest), args.spec)


def add_spec(sub: argparse._SubParsersAction, name: str
             ) -> argparse.ArgumentParser:
    """``psrec spec``: print, save or infer a feature spec."""
    p = sub.add_parser(
        name, help="print or save a feature spec, or infer one from Parquet",
        description="psrec spec NAME [--out F]: print or save a preset or "
        "spec file. psrec spec infer PARQUET... --label COL --out spec.yaml: "
        "write a commented spec (and vocab/*.txt beside it) from one pass of "
        "statistics over the Parquet files.")
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
    add_option(g, InferOptions, "label_threshold", type=float, metavar="T")
    add_option(g, InferOptions, "max_buckets", type=positive)
    add_option(g, InferOptions, "vocab_max", type=integer)
    add_option(g, InferOptions, "exclude", default=None, metavar="COL,...")
    add_progress_flag(g)
    add_json_flag(p)
    p.set_defaults(trailing_inputs="inputs")  # files after the flags too
    return p


def add_synth(sub: argparse._SubParsersAction, name: str
              ) -> argparse.ArgumentParser:
    """``psrec synth``: seeded synthetic Parquet."""
    p = sub.add_parser(
        name, help="write seeded synthetic Parquet for a spec")
    p.add_argument("--spec", default="criteo",
                   help="preset name (criteo, movielens) or spec file")
    p.add_argument("--rows", type=positive, default=100_000,
                   help="rows in all files together")
    p.add_argument("--files", type=positive, default=4,
                   help="Parquet files to write")
    p.add_argument("--seed", type=integer, default=0, help="random seed")
    p.add_argument("--out", required=True, help="output folder")
    add_option(p, Drift, "day", type=non_negative)
    add_option(p, Drift, "rate", type=non_negative_float)
    add_json_flag(p)
    return p


def add_tf_config(sub: argparse._SubParsersAction, name: str
                  ) -> argparse.ArgumentParser:
    """``psrec tf-config``: the TF_CONFIG of every task."""
    p = sub.add_parser(
        name, help="print the TF_CONFIG of every task",
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
    add_cluster_flags(p)
    add_json_flag(p)
    return p
