"""Checks of conversion input against a feature spec: every file's schema
before any row is read, then each row (its first failed check is the reason
it is quarantined)."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from psrec.errors import DataError
from psrec.errors import did_you_mean
from psrec.features.spec.columns import LabelConfig
from psrec.features.spec.derived import EPOCH_MS
from psrec.features.spec.derived import DerivedFeature
from psrec.features.spec.derived import parse_pattern
from psrec.features.spec.spec import FeatureSpec
from psrec.features.transforms.ops import MISSING_INT
from psrec.features.transforms.ops import MISSING_TOKEN


class SchemaError(DataError):
    """A Parquet file's schema does not match the spec: bad data (exit 1)."""


def _type_ok(arrow_type: pa.DataType, kind: str) -> bool:
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    if kind == "number":
        return pa.types.is_integer(arrow_type) or pa.types.is_floating(
            arrow_type)
    if kind == "label":
        return _type_ok(arrow_type, "number") or pa.types.is_boolean(arrow_type)
    if kind == "string":
        return pa.types.is_string(arrow_type) or pa.types.is_large_string(
            arrow_type)
    if kind == "int64":  # a timestamp column reads as epoch seconds
        return pa.types.is_integer(arrow_type) or pa.types.is_timestamp(
            arrow_type)
    raise AssertionError(kind)


def _expected_kinds(spec: FeatureSpec) -> dict[str, tuple[str, bool]]:
    """column -> (value kind, is a list): the label and the raw inputs
    (a derived feature's sources, not the derived column)."""
    kinds = {name: ("label", False) for name in spec.label_names}
    kinds.update({name: ("number" if dtype == "float32" else dtype, is_list)
                  for name, (dtype, is_list) in spec.log_inputs.items()})
    return kinds


_KIND_TEXT = {"number": "an integer or floating column",
              "label": "an integer, boolean or floating column",
              "string": "a string column", "int64": "an integer column"}


def check_schema(path: str, schema: pa.Schema,
                 spec: FeatureSpec) -> tuple[str, ...]:
    """Checks a file's schema against the spec before any row is read;
    returns the extra columns, which are ignored."""
    for column, (kind, is_list) in _expected_kinds(spec).items():
        index = schema.get_field_index(column)
        if index < 0:
            raise SchemaError(
                f"{path}: column {column!r} required by spec "
                f"{spec.name!r} is missing (found: {', '.join(schema.names)})"
                f"{did_you_mean(column, schema.names)}; "
                "fix the input or the spec -- psrec does not fill missing "
                "columns with nulls.")
        arrow_type = schema.field(index).type
        if is_list:
            ok = (pa.types.is_list(arrow_type)
                  or pa.types.is_large_list(arrow_type)) and _type_ok(
                      arrow_type.value_type, kind)
            want = f"a list of {_KIND_TEXT[kind].replace(' column', '')}s"
        else:
            ok = _type_ok(arrow_type, kind)
            want = _KIND_TEXT[kind]
        if not ok:
            raise SchemaError(
                f"{path}: column {column!r} has type {arrow_type}, spec "
                f"{spec.name!r} needs {want}; fix the input's type or the "
                "spec.")
    wanted = set(spec.columns)
    return tuple(name for name in schema.names if name not in wanted)


def _null_mask(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(pc.is_null(column).to_numpy(zero_copy_only=False))


def float_values(column: pa.Array, fill: float) -> np.ndarray:
    """float64 values with nulls replaced by ``fill``."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    return np.asarray(pc.fill_null(pc.cast(column, pa.float64()), fill)
                      .to_numpy(zero_copy_only=False))


def tower_column_dtype(spec: FeatureSpec, key: str, why: str) -> str:
    """The raw input dtype of the column the spec's ``towers.<key>``
    (``candidate_id``, ``query_id``) names; a DataError, ending with
    ``why``, when it names a derived feature."""
    name = getattr(spec.towers, key)
    raw = spec.raw_inputs
    if name not in raw:
        raise DataError(f"towers: `{key}` = {name!r} must be a raw input "
                        f"column (not a derived feature): {why}")
    return raw[name][0]


def serving_values(column: pa.Array, dtype: str, name: str) -> np.ndarray:
    """A raw column as the serving function takes it (``dtype`` of
    ``FeatureSpec.raw_inputs``): strings with null -> ``""``; int64 with null
    -> ``MISSING_INT`` (-1; a timestamp column as epoch seconds); float32
    with null -> NaN."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if dtype == "string":
        return pc.fill_null(column, MISSING_TOKEN).to_numpy(
            zero_copy_only=False)
    if dtype == "float32":
        return np.asarray(pc.cast(column, pa.float32()).to_numpy(
            zero_copy_only=False), np.float32)  # null -> NaN
    try:
        if pa.types.is_timestamp(column.type):
            column = pc.cast(column, pa.timestamp("s"), safe=False)
        column = pc.cast(column, pa.int64())
    except pa.ArrowInvalid as error:
        raise DataError(
            f"column {name!r}: {error}; an int64 input takes values that "
            "fit int64 (as serving does).") from None
    return np.asarray(pc.fill_null(column, MISSING_INT).to_numpy(
        zero_copy_only=False), np.int64)


def _finite_float32(values: np.ndarray) -> np.ndarray:
    """Finite after the cast to the stored type (float32): 1e300 is finite
    as float64 but overflows to inf in the shard."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.isfinite(values.astype(np.float32))


def label_values(column: pa.Array, label: LabelConfig) -> np.ndarray:
    """A label column as stored (float32): 0/1 under a ``threshold``, the
    value otherwise; a missing label (null or NaN, multi-task specs only:
    :func:`row_reasons` refuses them in a single-label spec) is NaN, the
    task's mask."""
    values = float_values(column, np.nan)
    if label.threshold is not None:
        values = np.where(np.isnan(values), np.nan,
                          values >= label.threshold)
    return values.astype("<f4")


def _label_checks(column: pa.Array, label: LabelConfig, masked: bool,
                  reasons: np.ndarray, flag) -> None:
    """Flags the rows whose ``label`` is bad: null or NaN (unless
    ``masked``: a multi-task spec's missing label), infinite, overflowing
    float32, or not 0/1 for a logloss label without a threshold."""
    name = label.name
    values = float_values(column, np.nan)
    missing = np.isnan(values)
    if not masked:
        flag(_null_mask(column), f"null in required field {name!r}")
        flag(missing, f"non-finite label {name!r}")
    flag(np.isinf(values), f"non-finite label {name!r}")
    flag(~missing & ~_finite_float32(np.nan_to_num(values)),
         f"label {name!r} overflows float32")
    if label.threshold is None and not label.regression:
        bad = np.isfinite(values) & (values != 0) & (values != 1)
        for value in np.unique(values[bad & (reasons == None)]):  # noqa: E711
            flag(bad & (values == value),
                 f"label {name!r} = {value:g} is not 0/1")


def row_reasons(batch: pa.RecordBatch, spec: FeatureSpec) -> np.ndarray:
    """The first failed check of each row as a string, None for good rows."""
    reasons = np.full(batch.num_rows, None, dtype=object)

    def flag(mask: np.ndarray, reason: str) -> None:
        mask = mask & (reasons == None)  # noqa: E711 (elementwise)
        reasons[mask] = reason

    for label in spec.labels:
        _label_checks(batch.column(label.name), label, spec.multi_task,
                      reasons, flag)
    for feature in spec.dense:
        column = batch.column(feature.name)
        if feature.required:
            flag(_null_mask(column), f"null in required field {feature.name!r}")
        values = float_values(column, feature.default)
        flag(~np.isfinite(values), f"non-finite value in {feature.name!r}")
        flag(~_finite_float32(values),
             f"value in {feature.name!r} overflows float32")
    for feature in spec.categorical:
        if feature.required:
            flag(_null_mask(batch.column(feature.name)),
                 f"null in required field {feature.name!r}")
    for feature in spec.categorical:
        if feature.history is not None:
            flag(_null_mask(batch.column(feature.history.order)),
                 f"null in {feature.history.order!r}, the time of history "
                 f"{feature.name!r}")
    for feature in spec.derived:
        if feature.pattern not in (None, EPOCH_MS):
            _flag_unmatched(batch, spec, feature, flag)
    return reasons


def _flag_unmatched(batch: pa.RecordBatch, spec: FeatureSpec,
                    feature: DerivedFeature, flag: Callable) -> None:
    """A time that does not match its pattern is a bad row at conversion
    (at serving it is the missing value)."""
    source = feature.sources[0]
    if source not in spec.raw_inputs:
        return  # an earlier derived column
    dtype = spec.raw_inputs[source][0]
    strings = pc.cast(pc.fill_null(pa.array(serving_values(
        batch.column(source), dtype, source)), MISSING_TOKEN
        if dtype == "string" else MISSING_INT), pa.string())
    regex, _, _ = parse_pattern(feature.pattern)
    missing = pc.equal(strings, "" if dtype == "string" else "-1")
    matched = pc.or_(pc.match_substring_regex(strings, f"^(?:{regex})$"),
                     missing)
    bad = ~np.asarray(matched.to_numpy(zero_copy_only=False), bool)
    flag(bad, f"{source!r} does not match pattern {feature.pattern!r} of "
         f"derived feature {feature.name!r}")
