"""``job.json``: what a checkpoint directory was trained with.

Written by the coordinator next to its checkpoints, so ``psrec export`` and
``psrec eval`` can rebuild the exact model from the directory alone.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from psrec.data.files import write_json_atomic
from psrec.features.spec import FeatureSpec
from psrec.models.config import ModelConfig

JOB_FILE = "job.json"


@dataclasses.dataclass(frozen=True)
class JobRecord:
    """The model-defining parts of a training job.

    Attributes:
      spec: the feature spec.
      model_name: the named configuration (dlrm, dcn, deepfm, wide_deep).
      model: the architecture.
      batch_size: the training batch size.
      manifest: the manifest trained on, when known.
    """

    spec: FeatureSpec
    model_name: str
    model: ModelConfig
    batch_size: int
    manifest: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec.to_dict(), "model_name": self.model_name,
                "model": dataclasses.asdict(self.model),
                "batch_size": self.batch_size, "manifest": self.manifest}

    def write(self, directory: str | Path) -> Path:
        return write_json_atomic(Path(directory) / JOB_FILE, self.to_dict())

    @classmethod
    def read(cls, directory: str | Path) -> "JobRecord":
        path = Path(directory) / JOB_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: {directory} is not a psrec checkpoint "
                "directory (psrec train writes job.json beside its "
                "checkpoints).")
        data = json.loads(path.read_text())
        return cls(spec=FeatureSpec.from_dict(data["spec"]),
                   model_name=data["model_name"],
                   model=ModelConfig(**data["model"]),
                   batch_size=int(data["batch_size"]),
                   manifest=data.get("manifest"))
