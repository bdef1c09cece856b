"""Writing small text files so that a reader or a crash sees the old content or the new, never half."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from lazykv.core.paths import private_dir


def fsync_dir(directory: Path) -> None:
    """Make a rename or a new file in ``directory`` durable (a no-op where directories cannot be synced)."""
    if not hasattr(os, "O_DIRECTORY"):  # Windows: directories cannot be opened or synced
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to a temp file in the same directory, fsync it, then rename over ``path``.

    Any error removes the temp file and leaves an existing ``path`` untouched. A new file is the
    owner's only (0600), and so is a folder made for it (0700).
    """
    private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
