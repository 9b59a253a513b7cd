"""What runs ``psrec apply-delta`` (its parser:
:mod:`psrec.launch.cli.model`), and the lines that describe a split bundle
(``psrec export --split``). pyarrow only: no TensorFlow."""

from __future__ import annotations

import argparse

from psrec.errors import EXIT_OK
from psrec.launch.cli.support import print_result
from psrec.models.serving.bundle import apply_deltas


def bundle_lines(summary: dict) -> str:
    """A split bundle's kind and base, then one line per table."""
    base = summary["base"]
    lines = [f"split bundle ({summary['kind']}, step {summary['step']}"
             + (f", on version {base['version']} (step {base['step']})"
                if base else "") + "):"]
    for name, counts in summary["tables"].items():
        line = f"  {name}: {counts['rows']} rows"
        if "delta_rows" in counts:
            line += (f"; delta {counts['delta_rows']} rows ("
                     f"{counts['changed']} changed, {counts['admitted']} "
                     f"admitted), {counts['deleted']} deleted")
        lines.append(line)
    return "\n".join(lines)


def run_apply_delta(args: argparse.Namespace) -> int:
    bundle = apply_deltas(args.base_dir, args.delta_dirs, args.out)
    summary = bundle.summary()
    print_result(args, {"path": bundle.path, "version": bundle.version,
                        "applied": bundle.manifest["applied"], **summary},
                 f"{bundle.path} (full split version {bundle.version}, "
                 f"step {summary['step']}): versions "
                 f"{' + '.join(map(str, bundle.manifest['applied']))}\n"
                 f"{bundle_lines(summary)}")
    return EXIT_OK
