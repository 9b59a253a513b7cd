"""``manifest.json``: the commit marker and table of contents of a conversion.

It is written last, under a temporary name and renamed, so its presence
means every shard it lists was complete. It records the spec hash, rows,
bytes and sha256 of every shard, the split, the bad-row count and the
sources.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from psrec.data.files import write_json_atomic
from psrec.errors import ConfigError

MANIFEST_NAME = "manifest.json"
FORMAT = "psrec-blocks-v1"
SPLITS = ("train", "eval")


class ManifestError(ConfigError):
    """A manifest is missing, malformed or does not match its files/spec."""


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One TFRecord shard: file name (relative to the manifest), rows,
    bytes and sha256."""

    file: str
    rows: int
    bytes: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A completed conversion.

    Attributes:
      root: folder holding the manifest and its shards.
      spec_name: the spec's name.
      spec_hash: ``FeatureSpec.fingerprint()`` of the spec used.
      block_rows: rows per block record.
      shards: split name -> shards.
      split: how rows were split (mode, eval_fraction).
      bad_rows: rows quarantined.
      quarantine: file name of the quarantine Parquet, if any.
      sources: input files and their row counts.
    """

    root: Path
    spec_name: str
    spec_hash: str
    block_rows: int
    shards: dict[str, tuple[ShardInfo, ...]]
    split: dict[str, Any]
    bad_rows: int
    quarantine: str | None
    sources: tuple[dict[str, Any], ...]

    def files(self, split: str = "train") -> list[str]:
        """Absolute paths of a split's shards, in order."""
        if split not in SPLITS:
            raise ManifestError(
                f"split {split!r} is not one of {', '.join(SPLITS)}.")
        return [str(self.root / s.file) for s in self.shards[split]]

    def rows(self, split: str = "train") -> int:
        return sum(s.rows for s in self.shards[split])

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "spec_name": self.spec_name,
            "spec_hash": self.spec_hash,
            "block_rows": self.block_rows,
            "shards": {k: [dataclasses.asdict(s) for s in v]
                       for k, v in self.shards.items()},
            "split": self.split,
            "bad_rows": self.bad_rows,
            "quarantine": self.quarantine,
            "sources": list(self.sources),
        }

    def write(self) -> Path:
        """Writes ``manifest.json`` atomically (temp file + rename)."""
        return write_json_atomic(self.root / MANIFEST_NAME, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "Manifest":
        """Reads a manifest file, or the manifest inside a folder."""
        path = Path(path)
        if path.is_dir():
            path = path / MANIFEST_NAME
        if not path.is_file():
            raise ManifestError(
                f"no manifest at {path}: the conversion did not complete (the "
                "manifest is written last); run `psrec convert` again.")
        try:
            data = json.loads(path.read_text())
            if data.get("format") != FORMAT:
                raise ManifestError(
                    f"{path}: format {data.get('format')!r} is not {FORMAT!r}.")
            return cls(
                root=path.parent,
                spec_name=data["spec_name"],
                spec_hash=data["spec_hash"],
                block_rows=int(data["block_rows"]),
                shards={k: tuple(ShardInfo(**s) for s in data["shards"][k])
                        for k in SPLITS},
                split=dict(data["split"]),
                bad_rows=int(data["bad_rows"]),
                quarantine=data.get("quarantine"),
                sources=tuple(data["sources"]),
            )
        except (KeyError, TypeError, json.JSONDecodeError) as error:
            raise ManifestError(f"{path} is malformed: {error!r}") from None

    def verify(self, spec_hash: str | None = None, *,
               checksums: bool = True) -> None:
        """Checks every shard is present with the recorded size and sha256.

        Args:
          spec_hash: when given, must equal the manifest's spec hash.
          checksums: also recompute sha256 (reads every byte).

        Raises:
          ManifestError: naming the first mismatch.
        """
        if spec_hash is not None:
            self.check_spec(spec_hash)
        problems = self.mismatches(checksums=checksums, first_only=True)
        if problems:
            raise ManifestError(problems[0][2])

    def check_spec(self, spec_hash: str) -> None:
        """Raises unless the data was converted with this spec."""
        if spec_hash != self.spec_hash:
            raise ManifestError(
                f"{self.root / MANIFEST_NAME}: the data was converted with "
                f"spec hash {self.spec_hash[:12]}… but the given spec hashes "
                f"to {spec_hash[:12]}…; pass the spec used for `psrec "
                "convert` or convert again with this spec.")

    def mismatches(self, *, checksums: bool = True, first_only: bool = False
                   ) -> list[tuple[str, ShardInfo, str]]:
        """``(split, shard, message)`` for every shard that is missing, has
        another size or another sha256 than recorded."""
        found = []
        for split in SPLITS:
            for shard in self.shards[split]:
                path = self.root / shard.file
                if not path.is_file():
                    message = (f"shard {path} listed in the manifest is "
                               "missing.")
                elif path.stat().st_size != shard.bytes:
                    message = (
                        f"shard {path} has {path.stat().st_size} bytes, the "
                        f"manifest records {shard.bytes}: the file was "
                        "changed or truncated.")
                elif checksums and sha256_file(path) != shard.sha256:
                    message = (
                        f"shard {path}: sha256 differs from the manifest: the "
                        "file is corrupted or was replaced; convert again.")
                else:
                    continue
                found.append((split, shard, message))
                if first_only:
                    return found
        return found

    def with_files(self, replaced: dict[str, str]) -> "Manifest":
        """A copy whose shards named in ``replaced`` point to other files
        (absolute paths), e.g. repaired copies."""
        shards = {
            split: tuple(dataclasses.replace(s, file=replaced.get(s.file,
                                                                  s.file))
                         for s in infos)
            for split, infos in self.shards.items()}
        return dataclasses.replace(self, shards=shards)


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()
