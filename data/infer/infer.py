"""``psrec spec infer``: a feature spec written from the data.

One pass of statistics (``data.infer.stats``) decides each column by the
rules of ``docs/data.md`` ("Specs written by psrec"); the details it leaves
out: ``label`` is 0/1 (ints, floats or bools) unless a threshold is given;
heavy-tailed is max > 100 x median, or 100 x mean when the median is 0;
few distinct values is at most ``CODE_MAX_DISTINCT``; a multi-hot
``max_length`` is at least 2; an id-like column has at least 20 distinct
values and is not floats.

An int column is a code (categorical), not a number, when its name looks
like an id, it has few distinct values, its distinct values fill the range
from 0 or 1 (``CODE_FILL``: what a label encoder writes), or neighbouring
values have unrelated frequencies (``_roughness`` above ``CODE_ROUGHNESS``:
a count or a measure changes smoothly from one value to the next; codes in
a label encoder's order do not). Each categorical feature gets the width
``6 x distinct ** 0.25`` rounded to the nearest multiple of 8 and clamped to
[8, 64] (``embedding_dim``); features of one width share a table
(``categorical_<dim>``), each in its own rows. A column filled (non-null,
non-empty) in more than 99% of one class's rows and fewer than 1% of the
other's is a label leak: left out with a warning. The spec is written as
commented YAML and checked by loading it back.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any
from typing import Sequence

import numpy as np
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

TABLE_PREFIX = "categorical"
CODE_MAX_DISTINCT = 16
CODE_FILL = 0.95
CODE_ROUGHNESS = 0.5
CODE_SIGNAL = 4.0
DIM_RANGE = (8, 64)
LEAK_SHARE = 0.99
LEAK_MIN_ROWS = 20
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
    time_columns: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        lines = [f"wrote {self.file}: {len(self.dense)} dense, "
                 f"{len(self.categorical)} categorical features from "
                 f"{self.rows} rows in {self.files} file(s)"]
        lines += [f"  left out {name}: {why}"
                  for name, why in self.skipped.items()
                  if not why.startswith("label leak")]  # warned below
        lines += [f"  time column {name}: for a time-ordered eval split, "
                  f"psrec convert ... --order-by {name}"
                  for name in self.time_columns]
        lines += [f"warning: {line}" for line in self.warnings]
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


def _roughness(sample: np.ndarray) -> float | None:
    """How unrelated the frequencies of neighbouring values are: the
    squared steps between the sample counts of consecutive distinct values
    over twice their squared deviations, each less its Poisson sampling
    noise (about 0: a smooth curve, a count or measure; about 1: unrelated,
    codes). None: too few values, or counts too even to tell from noise
    (deviations within ``CODE_SIGNAL`` x the noise)."""
    _, counts = np.unique(sample, return_counts=True)
    if len(counts) < 3:
        return None
    counts = counts.astype(np.float64)
    noise = counts.sum()
    deviations = float(((counts - counts.mean()) ** 2).sum())
    if deviations <= CODE_SIGNAL * noise:
        return None
    steps = float((np.diff(counts) ** 2).sum())
    return (steps - 2 * noise) / (2 * (deviations - noise))


def _code_reason(stats: ColumnStats) -> str | None:
    """Why an int column is a code (categorical), or None (a number)."""
    distinct = stats.distinct.count
    if _ID_NAME.search(stats.name):
        return "the name looks like an id: a code"
    if distinct <= CODE_MAX_DISTINCT:
        return f"<= {CODE_MAX_DISTINCT} distinct values: a code"
    low, high = stats.minimum, stats.maximum
    if stats.count == 0 or low < 0:
        return None
    if (stats.distinct.is_exact and low in (0, 1)
            and distinct >= CODE_FILL * (high - low + 1)):
        return (f"its {distinct} distinct values fill {low:g}..{high:g}: "
                "label-encoded codes, whose order means nothing -> "
                "categorical, not a number")
    rough = _roughness(stats.sample)
    if rough is not None and rough > CODE_ROUGHNESS:
        return (f"neighbouring values have unrelated frequencies (roughness "
                f"{rough:.2f} > {CODE_ROUGHNESS:g}; a count or measure "
                "changes smoothly): ids or codes without a meaningful order "
                "-> categorical, not a number")
    return None


def _leak_reason(stats: ColumnStats) -> str | None:
    """Why a column is a label leak (filled for one class only), or None."""
    if min(stats.positives, stats.negatives) < LEAK_MIN_ROWS:
        return None
    pos = stats.filled_positives / stats.positives
    neg = stats.filled_negatives / stats.negatives
    low = 1 - LEAK_SHARE
    if not ((pos > LEAK_SHARE and neg < low)
            or (neg > LEAK_SHARE and pos < low)):
        return None
    return (f"label leak: filled in {pos:.1%} of positive rows and "
            f"{neg:.1%} of negative rows (a value recorded only after the "
            "outcome?)")


def _put_back(stats: ColumnStats, table: str | None, max_buckets: int
              ) -> str:
    """How to use a left-out leak column anyway."""
    if stats.kind in ("int", "float"):
        entry, where = f"{{name: {stats.name}}}", "dense"
    else:
        dtype = ", dtype: int64" if stats.kind.endswith("int") else ""
        entry = (f"{{name: {stats.name}, table: {table}, hash_buckets: "
                 f"{_buckets(stats.distinct.count, max_buckets)}{dtype}}}")
        where = "categorical"
    return (f"if it is known when you predict, put it back by adding "
            f"`- {entry}` under `{where}:`")


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
    schema, stats = collect_stats(files, exact_cap=exact_cap, label=label,
                                  threshold=options.label_threshold,
                                  progress=progress)
    check(label in schema.names, "--label", label,
          f"is not a column{did_you_mean(label, schema.names)} (columns: "
          f"{', '.join(schema.names)})")
    unknown = [name for name in exclude if name not in schema.names]
    check(not unknown, qualified(options, "exclude"), ",".join(unknown),
          f"names no column; columns: {', '.join(schema.names)}"
          f"{did_you_mean(unknown[0], schema.names) if unknown else ''}")
    label_config, label_note = _label(stats[label], options.label_threshold)
    dense: list[tuple[DenseFeature, str]] = []
    categorical: list[tuple[dict[str, Any], str, list[str] | None]] = []
    skipped: dict[str, str] = {}
    derived: list[tuple[DerivedFeature, str]] = []
    times: dict[str, str] = {}
    leaks: list[str] = []
    for name in schema.names:
        column = stats[name]
        if name == label:
            continue
        reason = _skip_reason(column, exclude)
        leak = _leak_reason(column) if name not in exclude else None
        time = (time_features(column)
                if name not in exclude and leak is None else None)
        code = _code_reason(column) if column.kind == "int" else None
        if leak is not None:
            skipped[name] = leak
            leaks.append(name)
        elif time is not None:
            derived += [(feature, time[2]) for feature in time[0]]
            categorical += time[1]
            times[name] = time[2]
            if not time[0]:
                skipped[name] = time[2]
        elif reason is not None:
            skipped[name] = reason
        elif column.kind == "float" or (column.kind == "int"
                                        and code is None):
            dense.append(_dense(column))
        else:
            categorical.append(_categorical(column, options.max_buckets,
                                            options.vocab_max, code))
    check(dense or categorical, "--label", label,
          "leaves no usable feature column (see the notes of the skipped "
          f"columns: {skipped})", error=ConfigError)
    spec, vocabularies = _assemble(out, label_config, dense, categorical,
                                   [feature for feature, _ in derived])
    first_table = spec.tables[0].name if spec.tables else TABLE_PREFIX
    warnings = []
    for name in leaks:
        back = _put_back(stats[name], first_table, options.max_buckets)
        skipped[name] += f"; left out: {back}"
        warnings.append(f"column {name!r}: {skipped[name]}")
    time_columns = [name for name in times if not stats[name].nulls]
    rows = stats[label].rows
    header = [f"Feature spec inferred by psrec from {rows} rows in "
              f"{len(files)} Parquet file(s); edit freely.",
              f"Command: {command}" if command else None,
              "Check it with: psrec convert ... --spec THIS_FILE"]
    text = _render(spec, [h for h in header if h], label_note,
                   [note for _, note in dense],
                   [note for _, note, _ in categorical], skipped,
                   [note for _, note in derived], time_columns)
    with atomic_output(out) as tmp:
        tmp.write_text(text, encoding="utf-8")
    FeatureSpec.load(out).check_vocabularies()
    return InferReport(
        file=str(out), rows=rows, files=len(files),
        dense={f.name: f.transform for f, _ in dense},
        categorical={c["name"]: ("vocabulary" if v is not None else "hash")
                     for c, _, v in categorical},
        skipped=skipped, vocabularies=vocabularies,
        time_columns=time_columns, warnings=warnings)


def _categorical(stats: ColumnStats, max_buckets: int, vocab_max: int,
                 code: str | None = None
                 ) -> tuple[dict[str, Any], str, list[str] | None]:
    """The feature's keys (without table and offset), its note and its
    vocabulary (None: hashed); ``code``: why an int column is one."""
    distinct = stats.distinct.count
    counted = "" if stats.distinct.is_exact else " (estimated)"
    note = (f"{stats.arrow_type}, {distinct}{counted} distinct, "
            f"{stats.null_share:.1%} null")
    if code is not None:
        note += f"; {code}"
    keys: dict[str, Any] = {"name": stats.name, "_distinct": distinct}
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


def embedding_dim(distinct: int) -> int:
    """A feature's embedding width: ``6 x distinct ** 0.25`` rounded to the
    nearest multiple of 8, clamped to ``DIM_RANGE``."""
    low, high = DIM_RANGE
    width = 8 * math.floor(6 * max(distinct, 1) ** 0.25 / 8 + 0.5)
    return min(high, max(low, width))


def _assemble(out: Path, label: LabelConfig,
              dense: list[tuple[DenseFeature, str]],
              categorical: list[tuple[dict[str, Any], str, list[str] | None]],
              derived: list[DerivedFeature]
              ) -> tuple[FeatureSpec, list[str]]:
    """The spec: each categorical feature in the table of its width
    (``embedding_dim``), features of a table laid out one after the other;
    writes the vocabularies."""
    features, used = [], set()
    offsets: dict[int, int] = {}
    for keys, _, vocabulary in categorical:
        keys = dict(keys)
        distinct = keys.pop("_distinct", None)
        if distinct is None:
            distinct = len(vocabulary) if vocabulary is not None else (
                keys["hash_buckets"])
        dim = embedding_dim(distinct)
        offset = offsets.setdefault(dim, 0)
        keys.update(table=f"{TABLE_PREFIX}_{dim}", row_offset=offset)
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
        offsets[dim] += ids
    tables = tuple(TableConfig(f"{TABLE_PREFIX}_{dim}", rows=rows, dim=dim)
                   for dim, rows in sorted(offsets.items()))
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
            skipped: dict[str, str], derived_notes: list[str],
            time_columns: Sequence[str] = ()) -> str:
    data = spec.to_dict()
    parts = [f"# {line}\n" for line in header]
    parts.append(yaml.safe_dump({"name": data["name"]}, sort_keys=False))
    parts.append(f"# {label_note}\n")
    label = {k: v for k, v in data["label"].items()
             if k == "name" or v is not None}
    parts.append(yaml.safe_dump({"label": label}, sort_keys=False,
                                default_flow_style=False))
    tables_note = ("the categorical features of width {dim} (6 x distinct "
                   "** 0.25, rounded to a multiple of 8, in [8, 64]), "
                   "each in its own rows (laid out automatically: edit "
                   "buckets freely; `share: OTHER` shares a feature's rows);"
                   " rows = their sum; every model takes tables of "
                   "different widths (dot/fm project them to the widest)")
    tables_notes = [tables_note.format(dim=t["dim"]) for t in data["tables"]]
    for key, notes in (("tables", tables_notes),
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
    if time_columns:
        parts.append("# Time columns (for a time-ordered eval split):\n")
        parts += [f"#   {name}: psrec convert ... --order-by {name}\n"
                  for name in time_columns]
    return "".join(parts)
