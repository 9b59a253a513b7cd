"""Raw rows as a serving client sends them, built without psrec's encoder:
NaN for a null number, "" / -1 for a null string / int, lists padded to the
longest with "" / -1 (a null element is padding, a null list is empty)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from psrec.features.spec.columns import CategoricalFeature
from psrec.features.spec.columns import DenseFeature
from psrec.features.spec.columns import LabelConfig
from psrec.features.spec.columns import TableConfig
from psrec.features.spec.spec import FeatureSpec

_MISSING = {"float32": np.nan, "string": "", "int64": -1}
_NUMPY = {"float32": np.float32, "string": object, "int64": np.int64}


def client_inputs(table: pa.Table, spec: FeatureSpec) -> dict[str, np.ndarray]:
    """``{column: values}`` for every raw input of ``spec``."""
    raw = {}
    for name, (dtype, is_list) in spec.raw_inputs.items():
        pad = _MISSING[dtype]
        values = table.column(name).to_pylist()
        if is_list:
            lists = [[pad if v is None else v for v in (row or [])]
                     for row in values]
            width = max(len(row) for row in lists)
            values = [row + [pad] * (width - len(row)) for row in lists]
        else:
            values = [pad if v is None else v for v in values]
        raw[name] = np.array(values, _NUMPY[dtype])
    return raw


def mixed_spec(name: str) -> FeatureSpec:
    """A dense feature and string/int, single/multi-hot categoricals in one
    table: every kind of raw value (and its missing form) at once."""
    return FeatureSpec(
        name=name,
        label=LabelConfig("label"),
        dense=(DenseFeature("price", transform="log1p", default=1.0),),
        categorical=(
            CategoricalFeature("city", table="ids", hash_buckets=50),
            CategoricalFeature("user", table="ids", dtype="int64",
                               hash_buckets=50, row_offset=50),
            CategoricalFeature("tags", table="ids", hash_buckets=50,
                               row_offset=100, max_length=3, combiner="mean"),
            CategoricalFeature("codes", table="ids", dtype="int64",
                               hash_buckets=50, row_offset=150, max_length=3,
                               combiner="sum"),
        ),
        tables=(TableConfig("ids", rows=200, dim=4),),
    )
