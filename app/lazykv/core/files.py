"""Writing small text files so that a reader or a crash sees the old content or the new, never half."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a rename or a new file in ``directory`` durable (a no-op where directories cannot be synced)."""
    if not hasattr(os, "O_DIRECTORY"):  # Windows: directories cannot be opened or synced
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def private_dir(path: Path, own: bool = False) -> Path:
    """``path``, made if need be with each missing folder above it owner-only (0700, whatever the
    umask); ``own``: the folder is the app's own, so an existing one is made owner-only too (a
    shared folder, e.g. the one an export goes to, is left as it is)."""
    missing = []
    folder = Path(path)
    while not folder.exists() and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    for made in reversed(missing):
        made.mkdir(mode=PRIVATE_DIR, exist_ok=True)
        restrict(made, PRIVATE_DIR)
    if own:
        restrict(Path(path), PRIVATE_DIR)
    return Path(path)


def restrict(path: Path, mode: int = PRIVATE_FILE) -> None:
    """Owner-only permissions on one of the app's own files or folders (best effort: e.g. not on
    Windows, where the folder's ACL decides)."""
    try:
        if path.stat().st_mode & 0o777 != mode:
            path.chmod(mode)
    except OSError:
        pass


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
