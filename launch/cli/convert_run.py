"""What runs ``psrec convert`` and ``psrec audit-shards``: Parquet to
sharded TFRecords, and the per-pipeline sharding audit -- both TensorFlow
(their parsers: :mod:`psrec.launch.cli.data`)."""

from __future__ import annotations

import argparse
import sys

from psrec.data.convert.config import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.format.manifest import Manifest
from psrec.data.format.manifest import spec_for
from psrec.data.input.audit import audit_shards
from psrec.errors import EXIT_FAILURE
from psrec.errors import EXIT_OK
from psrec.features.spec.presets import resolve_spec
from psrec.launch.cli.support import existing_files
from psrec.launch.cli.support import print_result
from psrec.launch.monitor.progress_bar import progress_for
from psrec.options import option_values


def run_convert(args: argparse.Namespace) -> int:
    options = option_values(args, ConversionOptions)
    report = convert(existing_files(args.inputs, "input Parquet"),
                     resolve_spec(args.spec), args.out, options,
                     progress=progress_for(args))
    print_result(args, report)
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    return EXIT_OK


def run_audit_shards(args: argparse.Namespace) -> int:
    manifest = Manifest.load(args.manifest)
    spec = spec_for(manifest, args.spec)
    report = audit_shards(manifest, spec, args.pipelines, split=args.split)
    print_result(args, report)
    return EXIT_OK if report.ok else EXIT_FAILURE
