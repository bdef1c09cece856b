"""A model file's sha256, computed once and cached by path, size and modification time."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from lazykv.core.files import write_text_atomic

CHUNK = 4 * 1024 * 1024


def model_sha256(path: Path, cache_file: Path | None = None) -> str:
    """The sha256 of ``path``; a cache entry keyed by (path, size, mtime) avoids re-reading big files."""
    path = path.resolve()
    stat = path.stat()
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}"
    cache = _read_cache(cache_file) if cache_file else {}
    if key in cache:
        return cache[key]
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    sha = digest.hexdigest()
    if cache_file is not None:
        cache = {k: v for k, v in cache.items() if not k.startswith(f"{path}|")}
        cache[key] = sha
        _write_cache(cache_file, cache)
    return sha


def _read_cache(cache_file: Path) -> dict[str, str]:
    try:
        data = json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(
        data, dict) else {}


def _write_cache(cache_file: Path, cache: dict[str, str]) -> None:
    """Best effort: a cache that cannot be written only costs a re-hash next time."""
    try:
        write_text_atomic(cache_file, json.dumps(cache))
    except OSError:
        pass
