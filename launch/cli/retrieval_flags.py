"""``psrec train --task retrieval`` and the two-tower flags."""

from __future__ import annotations

import argparse

from psrec.errors import ConfigError
from psrec.launch.cli.argtypes import non_negative
from psrec.launch.cli.argtypes import positive
from psrec.launch.cli.argtypes import positive_float
from psrec.launch.cli.argtypes import widths
from psrec.launch.cli.options import add_option
from psrec.models.retrieval.config import TASKS
from psrec.models.retrieval.config import RetrievalConfig

_DEFAULTS = RetrievalConfig()


def add_commands(sub) -> None:
    """Adds the task choice and the retrieval options to ``psrec train``
    (registered after ``train_commands``)."""
    add_retrieval_flags(sub.choices["train"])


def add_retrieval_flags(parser: argparse.ArgumentParser) -> None:
    """The task choice and the retrieval options (a group of ``parser``)."""
    group = parser.add_argument_group(
        "retrieval", "with `--task retrieval`: a two-tower model (the "
        "spec's `towers`), sampled softmax, exact recall@k against the "
        "catalogue")
    group.add_argument("--task", choices=TASKS, default="ranking",
                       help="ranking: --model scores rows; "
                       "retrieval: query and candidate towers")
    add_option(group, RetrievalConfig, "tower_mlp", type=widths,
               default=",".join(map(str, _DEFAULTS.tower_mlp)))
    add_option(group, RetrievalConfig, "output_dim", type=positive)
    add_option(group, RetrievalConfig, "temperature", type=positive_float)
    add_option(group, RetrievalConfig, "normalize")
    add_option(group, RetrievalConfig, "logq")
    add_option(group, RetrievalConfig, "uniform_negatives",
               type=non_negative)
    add_option(group, RetrievalConfig, "remove_accidental_hits")
    add_option(group, RetrievalConfig, "candidate_bias")
    add_option(group, RetrievalConfig, "exclude_seen")


def retrieval_config(args: argparse.Namespace, spec
                     ) -> RetrievalConfig | None:
    """The :class:`RetrievalConfig` of ``--task retrieval`` (None for
    ranking); a ConfigError on a spec without ``towers`` (``--keep-best``
    is judged with the job: ``launch.job.config.check_keep_best``)."""
    if args.task != "retrieval":
        return None
    if spec.towers is None:
        raise ConfigError(
            f"`--task retrieval` needs a spec with `towers` (query and "
            f"candidate features, candidate_id); spec {spec.name!r} has "
            "none: add them (see --spec movielens-retrieval).")
    return RetrievalConfig(
        tower_mlp=args.tower_mlp, output_dim=args.output_dim,
        temperature=args.temperature, normalize=not args.no_normalize,
        logq=not args.no_logq, uniform_negatives=args.uniform_negatives,
        remove_accidental_hits=not args.keep_accidental_hits,
        candidate_bias=not args.no_candidate_bias,
        exclude_seen=not args.no_exclude_seen)
