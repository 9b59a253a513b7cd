"""Options of ``psrec export`` (plain Python, no TensorFlow)."""

from __future__ import annotations

import dataclasses

from psrec.errors import ConfigError
from psrec.options import check_choices
from psrec.options import option

#: How an export stores its embedding tables (``models.embedding.quantize``).
TABLE_DTYPES = ("float32", "float16", "int8")


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """How a checkpoint is written as a serving SavedModel."""

    table_dtype: str = option(
        "float32", flag="--table-dtype", choices=TABLE_DTYPES,
        help="storage of the embedding tables in the SavedModel: float32 "
        "(as trained), float16 (cast back on lookup) or int8 (per-row "
        "scale and bias, dequantized on lookup; rows narrower than 3 "
        "values: float16); ranking runs only")

    split: bool = option(
        False, flag="--split",
        help="write a split bundle instead of the all-in-one SavedModel: a "
        "dense SavedModel (signatures `keys`: raw features -> table keys, "
        "and `serving_default`: looked-up rows + dense features -> scores) "
        "and the embedding tables as Parquet (table, key, vector) for a "
        "key-value store, with a manifest.json of checksums")
    delta_since: int | None = option(
        None, flag="--delta-since",
        help="with --split: publish only the table rows changed since this "
        "split version of OUT (and a dynamic table's evicted ids), plus the "
        "whole dense SavedModel; `psrec apply-delta` turns base + deltas "
        "into a full version")

    def __post_init__(self) -> None:
        check_choices(self)
        if self.delta_since is not None and not self.split:
            raise ConfigError(
                f"`ExportConfig.delta_since` = {self.delta_since}: a delta is "
                "a split bundle; add `ExportConfig.split`.")
        if self.delta_since is not None and self.delta_since < 1:
            raise ConfigError(
                f"`ExportConfig.delta_since` = {self.delta_since}: give a "
                "published version number (>= 1).")
        if self.split and self.table_dtype != TABLE_DTYPES[0]:
            raise ConfigError(
                f"`ExportConfig.table_dtype` = {self.table_dtype}: a split "
                "export writes its tables as float32 Parquet for the "
                "key-value store; drop `ExportConfig.table_dtype`.")

    def check_task(self, retrieval: bool, where: str, *,
                   labels: tuple[str, ...] = ()) -> None:
        """A retrieval run (``where``: its checkpoint folder) exports its
        tables as float32 only, and no split bundle; nor does a run of
        several ``labels`` (its dense model serves one score per task)."""
        if len(labels) > 1 and self.split:
            raise ConfigError(
                f"`ExportConfig.split`: {where} is a multi-task run "
                f"({', '.join(labels)}); a split export serves one score "
                "(probability, logit) per row: export it whole (drop "
                "`ExportConfig.split`), which serves every task's score.")
        if retrieval and self.split:
            raise ConfigError(
                f"`ExportConfig.split`: {where} is a retrieval run, whose "
                "export is a top-K model over its candidates; a split export "
                "is for ranking runs: drop `ExportConfig.split`.")
        if retrieval and self.table_dtype != TABLE_DTYPES[0]:
            raise ConfigError(
                f"`ExportConfig.table_dtype` = {self.table_dtype}: {where} "
                "is a retrieval run, whose export (top-K model over float32 "
                "catalogue embeddings, and its query tower) keeps float32 "
                "tables: drop `ExportConfig.table_dtype`.")
