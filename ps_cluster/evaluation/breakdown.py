"""What an evaluation breaks its metrics down by (plain Python: the
configuration's part; the TensorFlow side is
:mod:`psrec.ps_cluster.evaluation.groups`)."""

from __future__ import annotations

import dataclasses

from psrec.errors import ConfigError
from psrec.errors import did_you_mean

#: ``--gauc-weighting``: a group's AUC weighs by its examples, or 1.
GAUC_WEIGHTINGS = ("impressions", "uniform")


@dataclasses.dataclass(frozen=True)
class Breakdown:
    """What an evaluation breaks its metrics down by: GAUC over the groups
    of ``group_by`` (None: none), weighted by ``weighting``; metrics per
    value of ``slice_by`` (None: none), the ``top`` most frequent values and
    ``other``."""

    group_by: str | None = None
    weighting: str = "impressions"
    slice_by: str | None = None
    top: int = 10

    @property
    def active(self) -> bool:
        return self.group_by is not None or self.slice_by is not None

    def columns(self) -> dict[str, str]:
        """``{statistics prefix: column}`` of what is asked."""
        return {prefix: column for prefix, column in (
            ("group", self.group_by), ("slice", self.slice_by))
            if column is not None}

    def check(self, spec) -> None:
        """Refuses a column that is not a single-valued categorical feature
        of ``spec`` (one line naming the option and the choices; exit 2)."""
        features = {f.name: f for f in spec.categorical}
        for flag, column in (("--group-by", self.group_by),
                             ("--slice-by", self.slice_by)):
            if column is None:
                continue
            feature = features.get(column)
            if feature is None or feature.multi_hot:
                names = sorted(n for n, f in features.items()
                               if not f.multi_hot)
                what = ("is multi-hot (a list): give a single-valued one"
                        if feature is not None else
                        "is not a categorical feature of the spec")
                hint = did_you_mean(column, names) if feature is None else ""
                raise ConfigError(f"{flag} {column}: {what}; choose one of: "
                                  f"{', '.join(names)}{hint or '.'}")


