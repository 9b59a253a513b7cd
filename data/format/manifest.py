"""``manifest.json``: the commit marker and table of contents of a conversion.

It is written last, under a temporary name and renamed, so its presence
means every shard it lists was complete (:class:`Manifest` lists what it
records). :func:`spec_for` picks the spec a job reads the data with: the
data's own, unless overridden.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from psrec.data.format.files import write_json_atomic
from psrec.errors import ConfigError
from psrec.errors import DataError
from psrec.features.spec.presets import PRESETS
from psrec.features.spec.presets import resolve_spec
from psrec.features.spec.presets import with_absolute_vocabularies
from psrec.features.spec.spec import FeatureSpec
from psrec.uri import is_uri
from psrec.uri_path import UriPath
from psrec.uri_path import as_path

MANIFEST_NAME = "manifest.json"
SPEC_FILE_NAME = "spec.yaml"
FORMAT = "psrec-blocks-v1"
SPLITS = ("train", "eval")


class ManifestError(ConfigError):
    """A manifest is missing, malformed or does not match its files/spec."""


class EmptyDataError(DataError):
    """A split to train on holds no row (bad data, exit 1)."""


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
      spec_hash: ``FeatureSpec.fingerprint()`` of the spec used.
      split: how rows were split (``data.convert.split``).
      positives: split name -> rows with a positive label; None for a
        manifest written before psrec recorded it.
      spec_file: the spec's file (relative to ``root``); None for a
        manifest written before psrec saved the spec beside the data.
      neg_sample_rate: share of train negatives kept at conversion (1.0:
        all, and for manifests written before psrec sampled); a model
        trained on the data corrects its logits by ``log(rate)``.
      label_means: label -> its mean over the train rows that hold it, for
        each ``loss: mse`` label (the value its output starts at); None
        for a manifest written before psrec recorded it.
    """

    root: Path | UriPath
    spec_name: str
    spec_hash: str
    block_rows: int
    shards: dict[str, tuple[ShardInfo, ...]]
    split: dict[str, Any]
    bad_rows: int
    quarantine: str | None
    sources: tuple[dict[str, Any], ...]
    positives: dict[str, int] | None = None
    spec_file: str | None = None
    neg_sample_rate: float = 1.0
    label_means: dict[str, float] | None = None

    def files(self, split: str = "train") -> list[str]:
        """Absolute paths of a split's shards, in order."""
        _check_split(split)
        return [str(self.path_of(s.file)) for s in self.shards[split]]

    def path_of(self, file: str) -> Path | UriPath:
        """A shard's location: ``file`` under ``root``, or ``file`` itself
        when it is absolute or a URI (a repaired copy, see
        :meth:`with_files`)."""
        return as_path(file) if is_uri(file) else self.root / file

    def rows(self, split: str = "train") -> int:
        _check_split(split)
        return sum(s.rows for s in self.shards[split])

    def require_rows(self, split: str = "train") -> None:
        """Raises :class:`EmptyDataError` when ``split`` holds no row (a
        job would wait at step 0 for a batch that never comes)."""
        if not self.rows(split):
            raise EmptyDataError(
                f"{self.root}: the {split} split holds 0 rows, nothing to "
                "train on; convert inputs that hold rows into it (psrec "
                "convert ... --out FOLDER --overwrite) or give another "
                "--data.")

    def positive_rate(self, split: str = "train") -> float | None:
        """The share of positive labels in a split (the base rate an output
        bias starts at); None when the manifest does not record positives
        (written by an older psrec) or the split has no rows."""
        rows = self.rows(split)
        if self.positives is None or not rows:
            return None
        return self.positives[split] / rows

    @property
    def negatives_dropped(self) -> int:
        """Train negatives the sampling dropped: the rows read that are in
        no split and not quarantined (0 without sampling)."""
        if self.neg_sample_rate >= 1.0:
            return 0
        read = sum(int(source["rows"]) for source in self.sources)
        return read - self.bad_rows - self.rows("train") - self.rows("eval")

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "spec_name": self.spec_name,
            "spec_hash": self.spec_hash,
            "spec_file": self.spec_file,
            "block_rows": self.block_rows,
            "shards": {k: [dataclasses.asdict(s) for s in v]
                       for k, v in self.shards.items()},
            "split": self.split,
            "bad_rows": self.bad_rows,
            "quarantine": self.quarantine,
            "sources": list(self.sources),
            "positives": self.positives,
            "neg_sample_rate": self.neg_sample_rate,
            "negatives_dropped": self.negatives_dropped,
            "label_means": self.label_means,
        }

    def write(self) -> Path | UriPath:
        """Writes ``manifest.json`` atomically (temp file + rename)."""
        return write_json_atomic(self.root / MANIFEST_NAME, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "Manifest":
        """Reads a manifest file, or the manifest inside a folder (a local
        path or a URI)."""
        path = as_path(path)
        if not path.exists():
            raise ManifestError(
                f"{path} does not exist; give the folder `psrec convert "
                "--out` wrote (or its manifest.json).")
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
                positives=_positives(data.get("positives")),
                spec_file=data.get("spec_file"),
                neg_sample_rate=_rate(data.get("neg_sample_rate", 1.0)),
                label_means=_means(data.get("label_means")),
            )
        except (KeyError, TypeError, json.JSONDecodeError) as error:
            raise ManifestError(f"{path} is malformed: {error!r}") from None

    def verify(self, spec_hash: str | None = None, *,
               checksums: bool = True) -> None:
        """Checks every shard is present with the recorded size and sha256
        (``checksums``: recomputed, reading every byte) and, when given, that
        ``spec_hash`` is the manifest's; a ManifestError names the first
        mismatch."""
        if spec_hash is not None:
            self.check_spec(spec_hash)
        problems = self.mismatches(checksums=checksums, first_only=True)
        if problems:
            raise ManifestError(problems[0][2])

    def load_spec(self) -> FeatureSpec | None:
        """The spec saved beside the data; None when the manifest names no
        spec file (written by an older psrec).

        Raises:
          ManifestError: the file is missing or was changed since the
            conversion (its fingerprint is not the recorded spec hash).
        """
        if self.spec_file is None:
            return None
        path = self.root / self.spec_file
        if not path.is_file():
            raise ManifestError(
                f"{path}, the spec file {self.root / MANIFEST_NAME} names, "
                "is missing; convert again or pass the spec with --spec.")
        spec = FeatureSpec.load(path)
        if spec.fingerprint() != self.spec_hash:
            raise ManifestError(
                f"{path} hashes to {spec.fingerprint()[:12]}, not to the "
                f"spec hash {self.spec_hash[:12]} recorded in "
                f"{MANIFEST_NAME}: it (or a vocabulary it names) was changed "
                "after the conversion; restore it or convert again.")
        return spec

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
                path = self.path_of(shard.file)
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


def _describe(spec: FeatureSpec | None, name: str, spec_hash: str) -> str:
    return f"{spec.name if spec else name!r} ({spec_hash[:12]})"


def spec_for(manifest: Manifest | None,
             override: str | Path | FeatureSpec | None = None, *,
             default: str = "criteo", flag: str = "--spec") -> FeatureSpec:
    """The spec to read data with, in the form convert fingerprints (see
    :func:`~psrec.features.spec.presets.with_absolute_vocabularies`).

    ``manifest`` is None for data the job generates; ``override`` is a
    preset name, spec file or spec given explicitly (by ``flag``, named in
    errors). Without a manifest: ``override``, else ``default``. With a
    manifest naming its spec file: that spec, or ``override`` when it is the
    same spec. With an older manifest: ``override``, else the preset whose
    fingerprint is the recorded spec hash.

    Raises:
      ConfigError: ``override`` is another spec than the data's (naming
        both), or an older manifest's spec is no preset and no override is
        given.
      ManifestError: the saved spec file is missing or was changed.
    """
    if manifest is None:
        return with_absolute_vocabularies(
            resolve_spec(default if override is None else override))
    saved = manifest.load_spec()
    if override is None:
        if saved is not None:
            return saved
        for build in PRESETS.values():
            spec = build()
            if spec.fingerprint() == manifest.spec_hash:
                return spec
        raise ConfigError(
            f"the data in {manifest.root} was converted with spec "
            f"{_describe(None, manifest.spec_name, manifest.spec_hash)}, "
            f"which is no preset, and its manifest names no spec file; pass "
            f"the spec file it was converted with as {flag} FILE.")
    given = resolve_spec(override)
    for spec in (with_absolute_vocabularies(given), given):
        if spec.fingerprint() == manifest.spec_hash:
            return spec
    given = with_absolute_vocabularies(given)
    value = override.name if isinstance(override, FeatureSpec) else str(
        override)
    data_spec = _describe(saved, manifest.spec_name, manifest.spec_hash)
    advice = (f"drop {flag} to use the data's own spec "
              f"({manifest.root / manifest.spec_file})" if saved is not None
              else "pass the spec the data was converted with")
    raise ConfigError(
        f"`{flag}` = {value!r} is spec "
        f"{_describe(given, '', given.fingerprint())}, but the data in "
        f"{manifest.root} was converted with spec {data_spec}; {advice}, or "
        "convert the data again with this spec.")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ManifestError(
            f"split {split!r} is not one of {', '.join(SPLITS)}.")


def _positives(data: Any) -> dict[str, int] | None:
    """The recorded positives; None (older manifests) when absent."""
    if data is None:
        return None
    return {split: int(data[split]) for split in SPLITS}


def _means(data: Any) -> dict[str, float] | None:
    """The recorded label means; None (older manifests) when absent."""
    if data is None:
        return None
    return {name: float(value) for name, value in data.items()}


def _rate(value: Any) -> float:
    """The recorded ``neg_sample_rate``, a number in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            not 0.0 < value <= 1.0):
        raise TypeError(f"neg_sample_rate {value!r} is not in (0, 1]")
    return float(value)


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with as_path(path).open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()
