"""Versioned export folders, as TF Serving expects them: ``EXPORT_DIR/<n>/``,
one complete SavedModel per positive integer version.

TF Serving picks up a new version when its folder appears, so a version is
published whole or not at all and never changed: it is written into a
hidden sibling ``EXPORT_DIR/.tmp-<version>-<pid>`` (no integer: not a
version) and renamed into place or, on a store without a directory rename
(``gs://``, ``s3://``, ``ram://``), copied with ``saved_model.pb`` last (a
folder is complete only once it holds it, for :func:`resolve` and TF
Serving alike). An existing version is never overwritten; on any failure
the temporary folder is removed. Numbering: ``docs/checkpoints-and-export.md``.
All file access is through ``tf.io.gfile``, so every path may be a URI.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

import tensorflow as tf

from psrec.errors import ConfigError
from psrec.models.serving.bundle import MANIFEST

SAVED_MODEL = "saved_model.pb"
_gfile = tf.io.gfile


@dataclasses.dataclass(frozen=True)
class ExportVersion:
    """One SavedModel of an export folder.

    Attributes:
      version: its version number (None: an unversioned SavedModel,
        ``saved_model.pb`` directly in the folder given).
      root: the versioned root it was chosen from (None: given directly).
    """

    path: str
    version: int | None
    root: str | None = None

    def describe(self) -> str:
        """``"ROOT/N (version N, the highest of ROOT)"`` or the path."""
        if self.root is not None:
            return (f"{self.path} (version {self.version}, the highest of "
                    f"{self.root})")
        return self.path


def _join(root: str, name: str) -> str:
    return os.path.join(root, name)


def versions(root: str) -> list[int]:
    """The version numbers of the folders in ``root``, ascending, complete
    or not (temporary folders are not versions); [] when it is absent."""
    root = str(root)
    if not _gfile.isdir(root):
        return []
    found = []
    for name in _gfile.listdir(root):
        name = name.rstrip("/")
        if name.isdigit() and _gfile.isdir(_join(root, name)):
            found.append(int(name))
    return sorted(found)


def next_version(root: str) -> int:
    """One more than the largest version in ``root`` (1 for none)."""
    return max(versions(root), default=0) + 1


def resolve(path: str) -> ExportVersion:
    """The SavedModel a path names: the folder itself when it holds
    ``saved_model.pb`` (a version folder, or an unversioned export), else
    the highest complete version in it.

    Raises:
      ConfigError: neither (naming the path and how to write an export).
    """
    path = str(path)
    if _gfile.exists(_join(path, SAVED_MODEL)):
        name = os.path.basename(path.rstrip("/"))
        return ExportVersion(path, int(name) if name.isdigit() else None)
    complete = [v for v in versions(path)
                if _gfile.exists(_join(_join(path, str(v)), SAVED_MODEL))]
    split = [folder for folder in [path] + [_join(path, str(v)) for v in
                                            versions(path)]
             if _gfile.exists(_join(folder, MANIFEST))]
    if not complete and split:
        raise ConfigError(
            f"{split[-1]} is a split export (`psrec export --split`): its "
            "tables are for a key-value store beside model/; scoring files "
            "needs an all-in-one export: `psrec export CHECKPOINT_DIR --out "
            "DIR` without --split.")
    if not complete:
        raise ConfigError(
            f"{path} is not an exported model (no saved_model.pb, no version "
            "folder 1/, 2/ ... holding one); write one with `psrec export "
            "CHECKPOINT_DIR --out DIR` (`psrec train` exports to "
            "WORKDIR/export).")
    return ExportVersion(_join(path, str(complete[-1])), complete[-1], path)


def _renames_folders(path: str) -> bool:
    """Whether ``path`` is on a filesystem with an atomic folder rename
    (a local path); object stores copy object by object."""
    return "://" not in path or path.startswith("file://")


def _copy_tree(source: str, target: str) -> None:
    """Copies every file of ``source`` under ``target``, ``saved_model.pb``
    last (a version is complete once that file exists)."""
    files = []
    for folder, _, names in _gfile.walk(source):
        relative = os.path.relpath(folder, source)
        for name in names:
            # A prefix-matching listing (ram://) shows "assets/.extra/..."
            # for "assets.extra/...": only entries that exist are files.
            if _gfile.exists(_join(folder, name)):
                files.append(os.path.normpath(os.path.join(relative, name)))
    files.sort(key=lambda name: name == SAVED_MODEL)
    for name in files:
        _gfile.makedirs(os.path.dirname(_join(target, name)))
        _gfile.copy(_join(source, name), _join(target, name))


def _remove_tree(path: str) -> None:
    """Removes a folder and everything in it; file by file where the
    store's recursive delete trips on its own listing (ram://)."""
    try:
        _gfile.rmtree(path)
    except tf.errors.NotFoundError:
        walked = list(_gfile.walk(path))
        for folder, _, names in walked:
            for name in names:
                if _gfile.exists(_join(folder, name)):
                    _gfile.remove(_join(folder, name))
        for folder, _, _ in reversed(walked):
            if _gfile.exists(folder):
                _gfile.remove(folder)


def _refuse_existing(root: str, version: int) -> None:
    final = _join(root, str(version))
    if _gfile.exists(final):
        raise ConfigError(
            f"export version {final} exists: versions are never overwritten; "
            f"give another --version, or none to write version "
            f"{next_version(root)}.")


def check_root(root: str) -> None:
    """Refuses an export folder that is itself a SavedModel (the layout of
    psrec before versions): versions cannot go inside it.

    Raises:
      ConfigError: naming the folder and the fix (exit 2).
    """
    if _gfile.exists(_join(str(root), SAVED_MODEL)):
        raise ConfigError(
            f"{root} holds an unversioned SavedModel (saved_model.pb: a "
            "version folder, or an export of an older psrec); give its "
            "parent or another export folder (exports are written as "
            f"<folder>/<version>/), or move it to a version folder ({root}/1).")


def publish(root: str, write: Callable[[str], None],
            version: int | None = None) -> ExportVersion:
    """Publishes a new version of ``root``: ``write(folder)`` fills a
    temporary folder, which then becomes ``root/<version>`` (``version``
    None: :func:`next_version`).

    Raises:
      ConfigError: ``version`` exists already, is < 1, or ``root`` is an
        unversioned SavedModel (exit 2).
    """
    root = str(root)
    check_root(root)
    if version is None:
        version = next_version(root)
    if version < 1:
        raise ConfigError(f"--version {version}: give an integer >= 1.")
    _refuse_existing(root, version)
    final = _join(root, str(version))
    tmp = _join(root, f".tmp-{version}-{os.getpid()}")
    _gfile.makedirs(root)
    if _gfile.exists(tmp):
        _remove_tree(tmp)
    copying = False
    try:
        write(tmp)
        _refuse_existing(root, version)  # another export may have taken it
        if _renames_folders(root):
            _gfile.rename(tmp, final)
        else:
            copying = True
            _copy_tree(tmp, final)
            copying = False  # published: only the temporary folder goes
            _remove_tree(tmp)
    except BaseException:
        for folder in (tmp, final) if copying else (tmp,):
            if _gfile.exists(folder):
                _remove_tree(folder)
        raise
    return ExportVersion(final, version, root)
