"""``psrec spec infer``: a feature spec written from the data.

One pass of statistics (``data.infer.stats``) decides each column by the
rules of ``docs/data.md`` ("Specs written by psrec"); the details it leaves
out: ``label`` is 0/1 (ints, floats or bools) unless a threshold is given;
heavy-tailed is max > 100 x median, or 100 x mean when the median is 0;
few distinct values is at most ``CODE_MAX_DISTINCT``; a multi-hot
``max_length`` is at least 2; an id-like column has at least 20 distinct
values and is not floats. The shared table (``categorical``, the layout of
the ``criteo`` preset) has the ``dim`` ``min(64, 6 x distinct ** 0.25)`` of
the largest feature, rounded up to a multiple of 4 (at least 8). The spec
is written as commented YAML and checked by loading it back.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any
from typing import Sequence

import yaml

from psrec.data.convert.inputs import parquet_files
from psrec.data.format.files import atomic_output
from psrec.data.infer.stats import EXACT_DISTINCT_CAP
from psrec.data.infer.stats import ColumnStats
from psrec.data.infer.stats import collect_stats
from psrec.data.infer.times import time_features
from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.errors import check
from psrec.errors import did_you_mean
from psrec.features.spec.columns import CategoricalFeature
from psrec.features.spec.columns import DenseFeature
from psrec.features.spec.columns import LabelConfig
from psrec.features.spec.columns import TableConfig
from psrec.features.spec.derived import DerivedFeature
from psrec.features.spec.spec import RESERVED_NAMES
from psrec.features.spec.spec import FeatureSpec
from psrec.options import option
from psrec.options import qualified
from psrec.progress import SILENT
from psrec.progress import Progress

TABLE_NAME = "categorical"
CODE_MAX_DISTINCT = 16
ID_SHARE = 0.9
ID_MIN_ROWS = 20
HEAVY_TAIL = 100.0
_ID_NAME = re.compile(r"(^|_)id$|Id$|ID$")


@dataclasses.dataclass(frozen=True)
class InferReport:
    """What ``infer_spec`` wrote and decided."""

    file: str
    rows: int
    files: int
    dense: dict[str, str]
    categorical: dict[str, str]
    skipped: dict[str, str]
    vocabularies: list[str]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        lines = [f"wrote {self.file}: {len(self.dense)} dense, "
                 f"{len(self.categorical)} categorical features from "
                 f"{self.rows} rows in {self.files} file(s)"]
        lines += [f"  left out {name}: {why}"
                  for name, why in self.skipped.items()]
        return "\n".join(lines)


def _g(value: float) -> float:
    """A readable float (6 significant digits)."""
    return float(f"{value:.6g}")


def _label(stats: ColumnStats, threshold: float | None) -> tuple[LabelConfig,
                                                                 str]:
    fix = (f"; if it holds numbers, ingest it as one: psrec ingest csv ... "
           f"--types {stats.name}=int64 (or float64, bool)"
           if stats.kind == "string" else "")
    check(stats.kind in ("int", "float", "bool"), "--label", stats.name,
          f"must name an integer, floating or boolean column, not "
          f"{stats.arrow_type}{fix}", error=DataError)
    note = f"{stats.null_share:.1%} null" + (
        " (null labels are bad rows at convert)" if stats.nulls else "")
    if threshold is not None:
        return LabelConfig(stats.name, threshold=threshold), (
            f"label = {stats.name} >= {threshold:g}; {note}")
    values = stats.distinct.exact
    ok = values is not None and set(values) <= {0, 1}
    shown = sorted(values)[:5] if values is not None else "many"
    check(ok, "--label", stats.name,
          f"holds values other than 0/1 ({shown}); give --label-threshold T "
          "(label = value >= T)")
    return LabelConfig(stats.name), f"0/1 label; {note}"


def _dense(stats: ColumnStats) -> tuple[DenseFeature, str]:
    median = stats.quantile(0.5)
    scale = median if median > 0 else stats.mean
    heavy = stats.minimum >= 0 and scale > 0 and stats.maximum > (
        HEAVY_TAIL * scale)
    what = "median" if median > 0 else "mean"
    base = (f"{stats.arrow_type}, {stats.distinct.count} distinct, "
            f"{stats.null_share:.1%} null (-> default)")
    if stats.nonfinite:
        base += (f", {stats.nonfinite} NaN/inf values (bad rows at "
                 "convert: fix the data)")
    if heavy:
        return DenseFeature(stats.name, transform="log1p"), (
            f"{base}; non-negative and heavy-tailed (max {stats.maximum:g} > "
            f"{HEAVY_TAIL:g} x {what} {scale:g}) -> log1p")
    mean, std = _g(stats.mean), _g(stats.std)
    return DenseFeature(stats.name, transform="standardize", mean=mean,
                        std=std, default=mean), (
        f"{base}; range [{stats.minimum:g}, {stats.maximum:g}], median "
        f"{median:g} -> standardize (mean {mean:g}, std {std:g})")


def _buckets(distinct: int, max_buckets: int) -> int:
    return min(max_buckets, 1 << max(1, math.ceil(math.log2(
        max(2 * distinct, 2)))))


def _vocabulary(stats: ColumnStats, vocab_max: int) -> list[str] | None:
    """The sorted vocabulary of a low-cardinality string column, or None
    (too many values, or a value a vocabulary line cannot hold)."""
    values = stats.distinct.exact
    if (not stats.kind.endswith("string") or values is None
            or len(values) > vocab_max):
        return None
    words = sorted(v for v in values if v != "")
    if any(v.splitlines() != [v] for v in words):
        return None
    return words


def _skip_reason(stats: ColumnStats, exclude: Sequence[str]) -> str | None:
    kind, distinct = stats.kind, stats.distinct.count
    present = stats.rows - stats.nulls
    if stats.name in exclude:
        return "--exclude"
    if stats.name in RESERVED_NAMES:
        return "the name is reserved by psrec"
    if kind in ("other", "list-other"):
        return (f"type {stats.arrow_type} is not supported (numbers, strings "
                "and lists of ints or strings are)")
    if kind == "bool":
        return ("boolean: psrec convert reads no boolean features; cast it to "
                "int8 to use it")
    if distinct == 0:
        return "no values (all null or empty)"
    if distinct == 1:
        return f"constant ({stats.null_share:.1%} null)"
    if (kind in ("int", "string") and present >= ID_MIN_ROWS
            and distinct >= ID_SHARE * present):
        return (f"id-like: {distinct} distinct of {present} non-null rows "
                "(one embedding row per row learns nothing)")
    return None


def _is_categorical_int(stats: ColumnStats) -> bool:
    return bool(_ID_NAME.search(stats.name)) or (
        stats.distinct.count <= CODE_MAX_DISTINCT)


@dataclasses.dataclass(frozen=True)
class InferOptions:
    """How columns become features when a spec is inferred."""

    label_threshold: float | None = option(
        None, flag="--label-threshold",
        help="label = value >= T (for a label that is not 0/1, e.g. a "
        "rating)")
    max_buckets: int = option(
        2 ** 20, flag="--max-buckets",
        help="most hash buckets per feature")
    vocab_max: int = option(
        1000, flag="--vocab-max",
        help="string columns with at most this many distinct values get a "
        "vocabulary file (0: hash all)")
    exclude: tuple[str, ...] = option((), flag="--exclude",
                                      help="columns to leave out")

    def __post_init__(self) -> None:
        object.__setattr__(self, "exclude", tuple(self.exclude))
        check(self.max_buckets >= 2, qualified(self, "max_buckets"),
              self.max_buckets, "must be >= 2")
        check(self.vocab_max >= 0, qualified(self, "vocab_max"),
              self.vocab_max, "must be >= 0")


def infer_spec(inputs: Sequence[str | Path], label: str, out: str | Path,
               options: InferOptions = InferOptions(), *,
               command: str | None = None,
               exact_cap: int = EXACT_DISTINCT_CAP,
               progress: Progress = SILENT) -> InferReport:
    """Infers a spec from Parquet ``inputs`` and writes it to ``out`` (YAML,
    vocabularies under ``<out folder>/vocab``); ``progress`` is told the
    rows read by the one pass of statistics."""
    out = Path(out)
    check(out.suffix in (".yaml", ".yml"), "--out", str(out),
          "must be a .yaml or .yml file (the spec is written as commented "
          "YAML)")
    exclude = options.exclude
    files = parquet_files([str(p) for p in inputs])
    schema, stats = collect_stats(files, exact_cap=exact_cap,
                                  progress=progress)
    check(label in schema.names, "--label", label,
          f"is not a column{did_you_mean(label, schema.names)} (columns: "
          f"{', '.join(schema.names)})")
    unknown = [name for name in exclude if name not in schema.names]
    check(not unknown, qualified(options, "exclude"), ",".join(unknown),
          f"names no column; columns: {', '.join(schema.names)}")
    label_config, label_note = _label(stats[label], options.label_threshold)
    dense: list[tuple[DenseFeature, str]] = []
    categorical: list[tuple[dict[str, Any], str, list[str] | None]] = []
    skipped: dict[str, str] = {}
    derived: list[tuple[DerivedFeature, str]] = []
    for name in schema.names:
        column = stats[name]
        reason = None if name == label else _skip_reason(column, exclude)
        if name == label:
            continue
        time = time_features(column) if name not in exclude else None
        if time is not None:
            derived += [(feature, time[2]) for feature in time[0]]
            categorical += time[1]
        elif reason is not None:
            skipped[name] = reason
        elif column.kind == "float" or (column.kind == "int"
                                        and not _is_categorical_int(column)):
            dense.append(_dense(column))
        else:
            categorical.append(_categorical(column, options.max_buckets,
                                            options.vocab_max))
    check(dense or categorical, "--label", label,
          "leaves no usable feature column (see the notes of the skipped "
          f"columns: {skipped})", error=ConfigError)
    spec, vocabularies = _assemble(out, label_config, dense, categorical,
                                   [feature for feature, _ in derived])
    rows = stats[label].rows
    header = [f"Feature spec inferred by psrec from {rows} rows in "
              f"{len(files)} Parquet file(s); edit freely.",
              f"Command: {command}" if command else None,
              "Check it with: psrec convert ... --spec THIS_FILE"]
    text = _render(spec, [h for h in header if h], label_note,
                   [note for _, note in dense],
                   [note for _, note, _ in categorical], skipped,
                   [note for _, note in derived])
    with atomic_output(out) as tmp:
        tmp.write_text(text, encoding="utf-8")
    FeatureSpec.load(out).check_vocabularies()
    return InferReport(
        file=str(out), rows=rows, files=len(files),
        dense={f.name: f.transform for f, _ in dense},
        categorical={c["name"]: ("vocabulary" if v is not None else "hash")
                     for c, _, v in categorical},
        skipped=skipped, vocabularies=vocabularies)


def _categorical(stats: ColumnStats, max_buckets: int, vocab_max: int
                 ) -> tuple[dict[str, Any], str, list[str] | None]:
    """The feature's keys (without table and offset), its note and its
    vocabulary (None: hashed)."""
    distinct = stats.distinct.count
    counted = "" if stats.distinct.is_exact else " (estimated)"
    note = (f"{stats.arrow_type}, {distinct}{counted} distinct, "
            f"{stats.null_share:.1%} null")
    keys: dict[str, Any] = {"name": stats.name}
    if stats.kind.endswith("int"):
        keys["dtype"] = "int64"
    if stats.kind.startswith("list"):
        p95 = stats.quantile(0.95)
        keys["max_length"] = max(2, math.ceil(p95))
        note += (f"; list: 95th percentile length {p95:g} -> max_length "
                 f"{keys['max_length']} (longer lists keep their first "
                 f"{keys['max_length']} values; max {stats.maximum:g})")
    vocabulary = _vocabulary(stats, vocab_max)
    if vocabulary is not None:
        note += (f"; <= {vocab_max} distinct strings -> vocabulary "
                 f"({len(vocabulary)} values + 1 out-of-vocabulary id)")
    else:
        keys["hash_buckets"] = _buckets(distinct, max_buckets)
        capped = (" (capped by --max-buckets)"
                  if keys["hash_buckets"] == max_buckets else "")
        note += (f" -> {keys['hash_buckets']} hash buckets (power of two >= "
                 f"2 x distinct){capped}")
    return keys, note, vocabulary


def _vocab_path(name: str, used: set[str]) -> str:
    stem = re.sub(r"[^\w.-]", "_", name) or "column"
    relative, n = f"vocab/{stem}.txt", 1
    while relative in used:
        n += 1
        relative = f"vocab/{stem}-{n}.txt"
    used.add(relative)
    return relative


def _assemble(out: Path, label: LabelConfig,
              dense: list[tuple[DenseFeature, str]],
              categorical: list[tuple[dict[str, Any], str, list[str] | None]],
              derived: list[DerivedFeature]
              ) -> tuple[FeatureSpec, list[str]]:
    """The spec: categorical features laid out one after the other in one
    table; writes the vocabularies."""
    features, offset, used, widest = [], 0, set(), 2
    for keys, _, vocabulary in categorical:
        keys = dict(keys, table=TABLE_NAME, row_offset=offset)
        if vocabulary is not None:
            relative = _vocab_path(keys["name"], used)
            path = out.parent / relative
            with atomic_output(path) as tmp:
                tmp.write_text("".join(f"{v}\n" for v in vocabulary),
                               encoding="utf-8")
            keys["vocabulary_file"] = relative
            ids = len(vocabulary) + 1
        else:
            ids = keys["hash_buckets"]
        features.append(CategoricalFeature(**keys))
        offset += ids
        widest = max(widest, ids)
    tables = ()
    if features:
        dim = min(64, max(8, 4 * math.ceil(6 * widest ** 0.25 / 4)))
        tables = (TableConfig(TABLE_NAME, rows=offset, dim=dim),)
    spec = FeatureSpec(name=out.stem, label=label,
                       dense=tuple(f for f, _ in dense),
                       categorical=tuple(features), tables=tables,
                       derived=tuple(derived))
    return spec, sorted(used)


def _entry(item: dict[str, Any], note: str) -> str:
    defaults = {"required": False, "combiner": "mean", "max_length": 1,
                "row_offset": None, "vocabulary_file": None,
                "hash_buckets": None, "initializer": "uniform",
                "scale": None, "default": 0.0, "mean": None, "std": None,
                "dtype": "string", "threshold": None}
    keep = {k: v for k, v in item.items()  # row ranges and table rows
            if k in ("name", "table", "transform")  # are laid out on load
            or (k not in ("row_offset", "rows")
                and defaults.get(k, object()) != v)}
    body = yaml.safe_dump([keep], sort_keys=False, default_flow_style=False)
    return f"  # {note}\n" + "".join(f"  {line}\n"
                                     for line in body.splitlines())


def _render(spec: FeatureSpec, header: list[str], label_note: str,
            dense_notes: list[str], categorical_notes: list[str],
            skipped: dict[str, str], derived_notes: list[str]) -> str:
    data = spec.to_dict()
    parts = [f"# {line}\n" for line in header]
    parts.append(yaml.safe_dump({"name": data["name"]}, sort_keys=False))
    parts.append(f"# {label_note}\n")
    label = {k: v for k, v in data["label"].items()
             if k == "name" or v is not None}
    parts.append(yaml.safe_dump({"label": label}, sort_keys=False,
                                default_flow_style=False))
    tables_note = ("one table shared by all categorical features, each in "
                   "its own rows (laid out automatically: edit buckets "
                   "freely; `share: OTHER` shares a feature's rows); rows = "
                   "their sum; dim = min(64, 6 x distinct ** 0.25) of the "
                   "largest feature")
    for key, notes in (("tables", [tables_note] * len(data["tables"])),
                       ("dense", dense_notes),
                       ("categorical", categorical_notes)):
        if not data[key]:
            parts.append(f"{key}: []\n")
            continue
        parts.append(f"{key}:\n")
        parts += [_entry(item, note) for item, note in zip(data[key], notes)]
    if derived_notes:
        parts.append("derived:\n")
        parts += [_entry(item, note) for item, note in
                  zip(data["derived"], derived_notes)]
    if skipped:
        parts.append("# Left out:\n")
        parts += [f"#   {name}: {why}\n" for name, why in skipped.items()]
    return "".join(parts)
