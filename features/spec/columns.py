"""The parts of a feature spec: the label, dense and categorical features,
and the embedding tables the categorical features look up. A feature's (and
the label's) ``name`` is its column in the Parquet input. Each part checks
its own values on construction; :class:`features.spec.spec.FeatureSpec`
checks how they fit together."""

from __future__ import annotations

import dataclasses
import math
from typing import Any
from typing import Sequence

from psrec.errors import ConfigError
from psrec.errors import did_you_mean
from psrec.features.spec.dynamic import dynamic_problems
from psrec.features.spec.dynamic import table_dict
from psrec.features.spec.history import ATTENTION_COMBINERS
from psrec.features.spec.history import History
from psrec.uri_path import as_path

DENSE_TRANSFORMS = ("none", "log1p", "standardize")
COMBINERS = ("sum", "mean", *ATTENTION_COMBINERS)
CATEGORICAL_DTYPES = ("string", "int64")
INITIALIZERS = ("uniform", "truncated_normal", "zeros")
LOSSES = ("logloss", "bce", "mse")
#: How a table's values are stored while it trains (``TableConfig.dtype``):
#: float32, or bfloat16 with the update computed in float32 and rounded
#: back (``models.optim.rounding``); the bytes of one value.
TABLE_DTYPES = {"float32": 4, "bfloat16": 2}
#: Table dtypes refused, and why (said in the error line).
REFUSED_TABLE_DTYPES = {"float16": (
    "TensorFlow's checkpoint reader cannot read part of a float16 tensor "
    "(RestoreV2: 'Dtype half not supported'), and every restore on PS and "
    "of any table over 64 MiB reads parts; 'bfloat16' stores the same 2 "
    "bytes a value")}
#: The optimizers a table may name (``TableConfig.optimizer``); each is an
#: entry of the optimizer registry, ``models.optim.config.OPTIMIZERS``.
TABLE_OPTIMIZERS = ("adagrad", "rowwise_adagrad", "ftrl", "sgd")
#: A table's keys that are left out of its saved form while unset (specs
#: written before them keep their form and fingerprint).
_TABLE_OPTIONAL = ("optimizer", "lr", "dtype")

class SpecError(ConfigError):
    """A feature spec is malformed; the message names the key and the value.

    ``problems`` lists every problem found (one sentence each); the message
    is the single problem, or all of them numbered one per line.
    """

    def __init__(self, message: str,
                 problems: Sequence[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems) if problems else [message]

    @classmethod
    def of(cls, problems: Sequence[str], prefix: str = "") -> SpecError:
        """One error listing ``problems``, each message starting with
        ``prefix`` (e.g. the spec file's path)."""
        problems = list(problems)
        if len(problems) == 1:
            return cls(prefix + problems[0], problems)
        lines = [f"{prefix}{len(problems)} problems in the spec:"]
        lines += [f"({i}) {text}" for i, text in enumerate(problems, 1)]
        return cls("\n".join(lines), problems)


def raise_problems(problems: Sequence[str], prefix: str = "") -> None:
    """Raises one :class:`SpecError` listing ``problems``, if any."""
    if problems:
        raise SpecError.of(problems, prefix)


# The checks below return the list of problems they find (empty: none), so
# a part reports all of its mistakes at once.

def _check_choice(where: str, key: str, value: Any,
                  allowed: tuple) -> list[str]:
    if value in allowed:
        return []
    return [f"{where}: `{key}` = {value!r} is not allowed; use one of "
            f"{', '.join(map(repr, allowed))}"
            f"{did_you_mean(value, allowed) or '.'}"]


def _check_table_dtype(where: str, value: Any) -> list[str]:
    if value in REFUSED_TABLE_DTYPES:
        return [f"{where}: `dtype` = {value!r} is not allowed: "
                f"{REFUSED_TABLE_DTYPES[value]}."]
    return _check_choice(where, "dtype", value, tuple(TABLE_DTYPES))


def _check_int(where: str, key: str, value: Any,
               minimum: int = 1) -> list[str]:
    if (not isinstance(value, bool) and isinstance(value, int)
            and value >= minimum):
        return []
    return [f"{where}: `{key}` = {value!r} must be "
            + ("a positive integer." if minimum == 1 else
               f"an integer >= {minimum}.")]


def _check_number(where: str, key: str, value: Any, *,
                  positive: bool = False, optional: bool = False) -> list[str]:
    """A finite number (> 0 if ``positive``; None allowed if ``optional``)."""
    if value is None and optional:
        return []
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or (positive and value <= 0)):
        want = "> 0" if positive else "a finite number"
        return [f"{where}: `{key}` = {value!r} must be {want}"
                + (" or null." if optional else ".")]
    return []


def _check_name(where: str, value: Any) -> list[str]:
    if isinstance(value, str) and value.strip():
        return []
    return [f"{where}: `name` = {value!r} must be a non-empty string."]


def _standardize_problems(feature: DenseFeature, where: str) -> list[str]:
    """``standardize`` needs both statistics; other transforms take none."""
    given = [key for key in ("mean", "std")
             if getattr(feature, key) is not None]
    if feature.transform == "standardize":
        missing = [f"`{key}`" for key in ("mean", "std") if key not in given]
        if missing:
            return [f"{where}: `transform` = 'standardize' needs "
                    f"{' and '.join(missing)} (the column's statistics, "
                    "std > 0); give them or use transform 'none' or "
                    "'log1p'."]
    elif given and feature.transform in DENSE_TRANSFORMS:
        values = ", ".join(f"{key}={getattr(feature, key)!r}"
                           for key in given)
        return [f"{where}: {values} would be ignored: `mean`/`std` apply "
                f"only to transform 'standardize', not "
                f"{feature.transform!r}; remove them or use transform "
                "'standardize'."]
    return []


@dataclasses.dataclass(frozen=True)
class DenseFeature:
    """A numeric input column.

    Attributes:
        transform: ``none``; ``log1p`` (``log(1 + max(x, 0))``: Criteo's
            counts have a few negatives, which are clipped to 0); or
            ``standardize`` (``(x - mean) / std`` with the stored statistics).
        mean, std: the statistics of ``standardize``, required by it (``std``
            > 0) and refused with any other transform (they would be
            ignored).
        default: value used where the input is missing (null in Parquet, NaN
            at serving time).
        required: when true, a null is a bad row (quarantined) instead of
            being replaced by ``default``.
    """

    name: str
    transform: str = "none"
    mean: float | None = None
    std: float | None = None
    default: float = 0.0
    required: bool = False

    def __post_init__(self) -> None:
        where = f"dense feature {self.name!r}"
        raise_problems(
            _check_name(where, self.name)
            + _check_choice(where, "transform", self.transform,
                            DENSE_TRANSFORMS)
            + _check_number(where, "mean", self.mean, optional=True)
            + _check_number(where, "std", self.std, positive=True,
                            optional=True)
            + _check_number(where, "default", self.default)
            + _standardize_problems(self, where))


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """One embedding table; several categorical features may share it.

    Attributes:
        name: table name (also the variable name).
        rows: number of rows (ids ``0..rows-1``); None (left out of a spec
            file): the end of the last feature range in it
            (``features.spec.layout``).
        dim: embedding width.
        initializer: ``uniform`` (``U(-scale, scale)``), ``truncated_normal``
            (stddev ``scale``) or ``zeros``.
        scale: scale of the initializer; default ``1/sqrt(dim)``.
        mode: ``hashed`` (ids are rows) or ``dynamic`` (raw ids admitted to
            rows; ``features.spec.dynamic``), with ``capacity``,
            ``admit_threshold``, ``evict``, ``ttl_steps`` and
            ``maintenance_every`` (dynamic only).
        optimizer: the table's sparse optimizer (one of
            :data:`TABLE_OPTIMIZERS`); None: ``--sparse-optimizer``.
        lr: its learning rate at ``--base-batch-size``; None:
            ``--sparse-lr``.
        dtype: how its values are stored while it trains (``float32`` or
            ``bfloat16``: :data:`TABLE_DTYPES`; ``float16`` is refused,
            :data:`REFUSED_TABLE_DTYPES`); None (left
            out of a spec file): the run's ``--table-dtype``
            (:meth:`FeatureSpec.with_table_dtype`), float32 by default. Not
            part of the spec's fingerprint: it does not change the data.
    """

    name: str
    rows: int | None = dataclasses.field(default=None, kw_only=True)
    dim: int
    initializer: str = "uniform"
    scale: float | None = None
    mode: str = "hashed"
    capacity: int | None = None
    admit_threshold: int = 1
    evict: str = "lfu"
    ttl_steps: int | None = None
    maintenance_every: int = 100
    optimizer: str | None = None
    lr: float | None = None
    dtype: str | None = None

    def __post_init__(self) -> None:
        where = f"table {self.name!r}"
        raise_problems(
            _check_name(where, self.name)
            + ([] if self.rows is None else _check_int(where, "rows",
                                                       self.rows))
            + _check_int(where, "dim", self.dim)
            + _check_choice(where, "initializer", self.initializer,
                            INITIALIZERS)
            + _check_number(where, "scale", self.scale, positive=True,
                            optional=True)
            + dynamic_problems(where, self)
            + ([] if self.optimizer is None else _check_choice(
                where, "optimizer", self.optimizer, TABLE_OPTIMIZERS))
            + _check_number(where, "lr", self.lr, positive=True,
                            optional=True)
            + ([] if self.dtype is None else _check_table_dtype(
                where, self.dtype)))

    def to_dict(self) -> dict[str, Any]:
        """The table's saved form: without the dynamic keys when it is
        hashed (``features.spec.dynamic.table_dict``) and without an unset
        ``optimizer``, ``lr`` or ``dtype``."""
        return {key: value for key, value in table_dict(
            dataclasses.asdict(self)).items()
            if value is not None or key not in _TABLE_OPTIONAL}

    @property
    def dynamic(self) -> bool:
        return self.mode == "dynamic"

    @property
    def storage(self) -> str:
        """The dtype its values are stored in (``dtype``, float32 unset)."""
        return self.dtype or "float32"

    @property
    def value_bytes(self) -> int:
        """Bytes of one stored value (4 float32, 2 for 16 bits)."""
        return TABLE_DTYPES[self.storage]

    @property
    def bytes(self) -> int:
        """Size of the stored table in bytes (a table of a spec always has
        its ``rows``)."""
        return (self.rows or 0) * self.dim * self.value_bytes


@dataclasses.dataclass(frozen=True)
class CategoricalFeature:
    """A categorical input column mapped to rows of an embedding table.

    Ids are ``row_offset + bucket`` where ``bucket`` is either a stable hash
    of the value's string form into ``hash_buckets`` buckets (FarmHash
    fingerprint64, the same TensorFlow op at conversion and at serving time)
    or the value's line in ``vocabulary_file`` (``0`` is reserved for
    out-of-vocabulary values, so a vocabulary of V lines uses V + 1 ids).

    Attributes:
        dtype: ``string`` or ``int64`` -- the raw type at serving time; ints
            are hashed through their decimal string form.
        hash_buckets: exclusive with ``vocabulary_file`` (one value a line).
        row_offset: first table row used by this feature; None (the usual):
            laid out automatically after the table's other ranges
            (``features.spec.layout``). Ranges of one table must not overlap
            unless one feature shares the other's.
        share: name of another categorical feature whose rows this one
            uses (same value, same embedding); ``table``, ``hash_buckets``
            and ``vocabulary_file`` are inherited from it when left out.
        max_length: 1 for a single value; > 1 for a multi-hot list column,
            of which the first ``max_length`` non-padding values are kept
            (null, ``""`` and ``-1`` elements are padding).
        combiner: ``sum`` or ``mean`` of a multi-hot list; ``din``: a
            history's target attention, ``bst``: a transformer layer over
            the target and the history (``models.embedding.attention``).
        required: when true, a null is a bad row; otherwise null is hashed as
            the empty string (its own "missing" bucket).
        raw_ids: the feature's ids are raw 64-bit fingerprints of the value
            (no ``hash_buckets``, vocabulary or ``row_offset``): set for
            the features of a ``mode: dynamic`` table (a spec file leaves it
            out; loading sets it).
        history: the feature is a user history (``features.spec.history``):
            at conversion the ``max_length`` (> 1) most recent earlier
            values of ``history.of`` of the same ``history.by``, at serving
            the request's list; it shares ``of``'s rows (``share`` is set to
            ``of``).
    """

    name: str
    table: str | None = None
    dtype: str = "string"
    hash_buckets: int | None = None
    vocabulary_file: str | None = None
    row_offset: int | None = None
    max_length: int = 1
    combiner: str = "mean"
    required: bool = False
    share: str | None = None
    raw_ids: bool = False
    history: History | None = None

    def __post_init__(self) -> None:
        where = f"categorical feature {self.name!r}"
        problems = self._history_problems(where)
        problems += (_check_name(where, self.name)
                    + _check_choice(where, "dtype", self.dtype,
                                    CATEGORICAL_DTYPES)
                    + _check_choice(where, "combiner", self.combiner,
                                    COMBINERS)
                    + _check_int(where, "max_length", self.max_length))
        if self.share is not None:
            if not isinstance(self.share, str) or not self.share.strip():
                problems.append(f"{where}: `share` = {self.share!r} must be "
                                "the name of another categorical feature.")
            elif self.share == self.name:
                problems.append(f"{where}: `share` names the feature itself; "
                                "name the feature whose rows it uses.")
        elif self.table is None:
            problems.append(f"{where}: missing required key `table` (or "
                            "`share` another feature's rows).")
        both_unset = self.hash_buckets is None and self.vocabulary_file is None
        if self.raw_ids:
            if not both_unset or self.row_offset is not None:
                problems.append(
                    f"{where}: its table is dynamic (raw ids), which takes no "
                    "`hash_buckets`, `vocabulary_file` or `row_offset`; "
                    "remove them.")
        elif ((self.hash_buckets is None) == (self.vocabulary_file is None)
              and (not both_unset or self.share is None)):
            problems.append(
                f"{where}: give exactly one of `hash_buckets` and "
                f"`vocabulary_file` (got hash_buckets={self.hash_buckets!r}, "
                f"vocabulary_file={self.vocabulary_file!r}).")
        if self.hash_buckets is not None:
            problems += _check_int(where, "hash_buckets", self.hash_buckets)
        if self.vocabulary_file is not None and (
                not isinstance(self.vocabulary_file, str)
                or not self.vocabulary_file.strip()):
            problems.append(
                f"{where}: `vocabulary_file` = {self.vocabulary_file!r} must "
                "be a path (a non-empty string).")
        if self.row_offset is not None:
            problems += _check_int(where, "row_offset", self.row_offset,
                                   minimum=0)
        raise_problems(problems)

    def _history_problems(self, where: str) -> list[str]:
        """Parses ``history`` and shares its item's rows."""
        if self.history is None:
            return ([] if self.combiner not in ATTENTION_COMBINERS else [
                f"{where}: `combiner` = {self.combiner!r} attends a user "
                "history by its target item; only a feature with `history` "
                "takes it."])
        history, problems = History.parse(where, self.history)
        object.__setattr__(self, "history", history)
        if history is None:
            return problems
        if self.share is None:
            object.__setattr__(self, "share", history.of)
        elif self.share != history.of:
            problems.append(f"{where}: `share` = {self.share!r} but a history "
                            f"shares the rows of `history.of` = "
                            f"{history.of!r}; remove `share`.")
        if isinstance(self.max_length, int) and self.max_length < 2:
            problems.append(f"{where}: a history is a list: give `max_length`"
                            " > 1 (how many earlier events it keeps).")
        return problems

    @property
    def multi_hot(self) -> bool:
        return self.max_length > 1

    def vocabulary(self) -> list[str]:
        """Reads the vocabulary file (one value per line, blank lines
        ignored)."""
        if self.vocabulary_file is None:
            raise SpecError(f"feature {self.name!r} has no vocabulary_file.")
        path = as_path(self.vocabulary_file)
        if not path.is_file():
            raise SpecError(
                f"categorical feature {self.name!r}: `vocabulary_file` = "
                f"{str(path)!r} does not exist; give an existing file "
                "(relative paths are resolved against the spec file's "
                "folder).")
        lines = path.read_text(encoding="utf-8").splitlines()
        return [line for line in lines if line]

    @property
    def num_ids(self) -> int:
        """Number of distinct ids this feature can produce."""
        if self.hash_buckets is not None:
            return self.hash_buckets
        if self.vocabulary_file is None:
            raise SpecError(f"categorical feature {self.name!r} takes its "
                            f"ids from {self.share!r} (`share`); resolve the "
                            "spec's layout first.")
        return len(self.vocabulary()) + 1


@dataclasses.dataclass(frozen=True)
class LabelConfig:
    """A training target (a task: a spec may list several, ``labels``).

    Attributes:
        threshold: when given, label = ``value >= threshold`` (e.g. rating
            >= 4); otherwise the column must hold 0/1 and anything else is a
            bad row.
        loss: ``logloss`` (``bce`` is the same: a 0/1 label, click-through
            models) or ``mse`` (regression on the raw value, e.g. a rating;
            evaluated by RMSE; any finite value is a label, no threshold).
        weight: the task's weight in the one training loss (the weighted sum
            of the tasks' losses); 0 evaluates a task without training it.
        given: another label this one is conditioned on (a funnel, ESMM:
            ``{name: conversion, given: click}``): the task is trained and
            evaluated on ``given x label`` over every row, its probability
            the product of the two tasks' (``P(click) x P(conversion |
            click)``); None: an independent task.
    """

    name: str = "label"
    threshold: float | None = None
    loss: str = "logloss"
    weight: float = 1.0
    given: str | None = None

    def __post_init__(self) -> None:
        if self.loss == "bce":  # one name per loss: ``bce`` is logloss
            object.__setattr__(self, "loss", "logloss")
        where = f"label {self.name!r}"
        raise_problems(_check_name("label", self.name)
                       + _check_number(where, "threshold", self.threshold,
                                       optional=True)
                       + _check_choice(where, "loss", self.loss, LOSSES)
                       + _check_number(where, "weight", self.weight)
                       + ([f"{where}: `weight` = {self.weight!r} must be >= "
                           "0."] if not isinstance(self.weight, bool)
                          and isinstance(self.weight, (int, float))
                          and self.weight < 0 else [])
                       + ([f"{where}: `threshold` makes a 0/1 label, which "
                           "`loss` = 'mse' does not take: drop one of them."]
                          if self.loss == "mse" and self.threshold is not None
                          else [])
                       + ([f"{where}: `given` = {self.given!r} conditions a "
                           "0/1 label on another (a funnel); `loss` = 'mse' "
                           "does not take it: drop one of them."]
                          if self.loss == "mse" and self.given is not None
                          else []))

    @property
    def regression(self) -> bool:
        """True for ``loss: mse`` (evaluated by RMSE, not AUC)."""
        return self.loss == "mse"
