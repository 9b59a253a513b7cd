"""How training data is read: :class:`InputConfig` (plain Python, each
field an option; ``psrec.options``)."""

from __future__ import annotations

import dataclasses

from psrec.errors import check_at_least
from psrec.options import Codec
from psrec.options import check_choices
from psrec.options import option

INPUT_MODES = ("static", "data-service")


@dataclasses.dataclass(frozen=True)
class InputConfig(Codec, where="input"):
    """How training data is read."""

    batch_size: int = option(
        1024, flag="--batch-size",
        help="rows of one step: of one worker's step under --strategy ps, "
        "of the global step (split over the replicas) otherwise")
    shuffle_records: int = option(
        64, help="shuffle buffer, in block records")
    cycle_length: int = option(
        4, help="files read in parallel by one pipeline")
    seed: int = option(0, flag="--seed",
                       help="shuffle and synthetic-data seed")
    mode: str = option(
        "static", choices=INPUT_MODES,
        help="static: files split by worker index; data-service: files "
        "handed out one at a time by the tf.data service")

    def __post_init__(self) -> None:
        check_at_least(self, 1, "batch_size", "shuffle_records",
                       "cycle_length")
        check_choices(self)
