"""Raw public dataset files -> Parquet: what the ingest steps share.

Ingest only *parses*: each raw file is read with :mod:`pyarrow.csv` under an
explicit schema and written to Parquet; nothing is filtered or range-checked
(conversion quarantines bad values). A row that cannot be parsed stops the
run with :class:`IngestError`; rows are never skipped silently. Every file is
written with ``data.files.atomic_output`` (under a hidden temporary name,
renamed into place when complete). No TensorFlow, and no Python loop per
row. The datasets: ``data.criteo`` (Kaggle Criteo TSV) and ``data.movielens``
(MovieLens 100k).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from psrec.errors import ConfigError


class IngestError(ConfigError):
    """A raw input file cannot be converted; the message names file and fix."""


@dataclasses.dataclass(frozen=True)
class IngestReport:
    """What one ingest call wrote.

    Attributes:
      files: Paths of the Parquet files written, in input order.
      rows: Total number of rows written over all files.
      positives: Number of positive examples (Criteo: sum of the ``label``
        column; MovieLens: ratings >= 4), or ``None`` when the inputs carry
        no label.
    """

    files: tuple[str, ...]
    rows: int
    positives: int | None

    def to_dict(self) -> dict[str, object]:
        """The report as JSON-able data."""
        return {"files": list(self.files), "rows": self.rows,
                "positives": self.positives}

    def summary(self) -> str:
        """Returns a one-line human-readable summary of the ingest."""
        n = len(self.files)
        text = f"{self.rows:,} rows in {n} parquet file{'s' if n != 1 else ''}"
        if self.positives is None:
            text += " (unlabelled)"
        else:
            rate = self.positives / self.rows if self.rows else 0.0
            text += f", {self.positives:,} positives ({rate:.2%})"
        if self.files:
            text += ": " + ", ".join(self.files)
        return text


def prepare_out_dir(out_dir: str | Path) -> Path:
    """``out_dir`` as a :class:`Path`, created if needed."""
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise IngestError(
            f"Output path {str(path)!r} exists and is not a folder; pass a "
            "folder (it is created if missing).")
    path.mkdir(parents=True, exist_ok=True)
    return path


def require_file(path: Path, what: str) -> None:
    """Raises :class:`IngestError` unless ``path`` is an existing file."""
    if not path.is_file():
        raise IngestError(f"{what} {str(path)!r} does not exist or is not a "
                          "file; check the path.")
