"""Small file helpers shared by psrec's writers: every file is written under
a hidden temporary name and renamed into place when complete."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_output(final_path: str | Path) -> Iterator[Path]:
    """Yields a hidden temporary path (``.<name>.tmp-<pid>``) beside
    ``final_path`` (its folder created if needed) and renames it into place
    when the body succeeds (an atomic :func:`os.replace`), so readers see the
    old file or the whole new one, never a part; if it raises, the temporary
    file goes."""
    final_path = Path(final_path)
    final_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = final_path.with_name(f".{final_path.name}.tmp-{os.getpid()}")
    try:
        yield tmp_path
        os.replace(tmp_path, final_path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, data: Any) -> Path:
    """Writes ``data`` as indented JSON with :func:`atomic_output`."""
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
    return Path(path)
