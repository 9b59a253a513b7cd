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

    def __post_init__(self) -> None:
        check_choices(self)

    def check_task(self, retrieval: bool, where: str) -> None:
        """A retrieval run (``where``: its checkpoint folder) exports its
        tables as float32 only."""
        if retrieval and self.table_dtype != TABLE_DTYPES[0]:
            raise ConfigError(
                f"`ExportConfig.table_dtype` = {self.table_dtype}: {where} "
                "is a retrieval run, whose export (top-K model over float32 "
                "catalogue embeddings, and its query tower) keeps float32 "
                "tables: drop `ExportConfig.table_dtype`.")
