"""What a conversion did (``psrec convert``'s report): rows read, written
and quarantined with their reasons, ignored columns, cut lists."""

from __future__ import annotations

import dataclasses

from psrec.data.convert.sampling import sampling_summary
from psrec.data.format.manifest import MANIFEST_NAME
from psrec.data.format.manifest import Manifest


@dataclasses.dataclass(frozen=True)
class ConversionReport:
    """What a conversion did; ``summary()`` is what the CLI prints."""

    manifest: Manifest | None
    rows_read: int
    rows_written: dict[str, int]
    bad_rows: int
    bad_reasons: dict[str, int]
    extra_columns: dict[str, tuple[str, ...]]
    truncated_lists: dict[str, int]
    quarantine: str | None
    seconds: float
    warnings: tuple[str, ...] = ()

    @property
    def rows_per_second(self) -> float:
        return self.rows_read / self.seconds if self.seconds else float("inf")

    def to_dict(self) -> dict[str, object]:
        """The report as JSON-able data; ``manifest`` is the path of the
        written ``manifest.json`` (None when nothing was published)."""
        return {
            "manifest": (str(self.manifest.root / MANIFEST_NAME)
                         if self.manifest is not None else None),
            "rows_read": self.rows_read,
            "rows_written": dict(self.rows_written),
            "bad_rows": self.bad_rows,
            "bad_reasons": dict(self.bad_reasons),
            "extra_columns": {k: list(v)
                              for k, v in self.extra_columns.items()},
            "truncated_lists": dict(self.truncated_lists),
            "quarantine": self.quarantine, "seconds": self.seconds,
            "warnings": list(self.warnings),
        }

    def summary(self) -> str:
        lines = [
            f"read {self.rows_read} rows in {self.seconds:.2f} s "
            f"({self.rows_per_second:,.0f} rows/s); wrote "
            + ", ".join(f"{k} {v}" for k, v in self.rows_written.items()),
            f"bad rows: {self.bad_rows}"
            + (f" -> {self.quarantine}" if self.quarantine else ""),
        ]
        lines += [f"  {count} x {reason}"
                  for reason, count in sorted(self.bad_reasons.items())]
        lines += sampling_summary(self.manifest)
        for path, extras in self.extra_columns.items():
            lines.append(f"ignored extra columns in {path}: {', '.join(extras)}")
        for name, count in self.truncated_lists.items():
            lines.append(f"multi-hot {name}: {count} lists cut to max_length")
        if self.manifest is not None:
            lines.append(f"manifest: {self.manifest.root / MANIFEST_NAME}")
        return "\n".join(lines)
