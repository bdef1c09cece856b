"""A model file's sha256, computed once and cached by the file's identity.

The identity is what a replacement cannot keep: size, mtime, ctime, inode and device (writing
the file or renaming another over it changes ctime or inode, even when mtime is set back), plus a
sampled hash (SAMPLES pieces spread over the file, for filesystems with coarse or missing ctime).
Reading that costs a stat and about 1 MiB; when anything differs, the whole file is hashed again
before its sha256 is trusted (e.g. before a snapshot is restored into it).

A split model (``-00001-of-00003.gguf``) is all its shards: its sha256 is that of their bytes in
order (as if joined), and its identity holds each shard's, so replacing any shard is noticed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from lazykv.core.engine.shards import shard_paths
from lazykv.core.files import write_text_atomic

CHUNK = 4 * 1024 * 1024
SAMPLES = 16
SAMPLE_BYTES = 64 * 1024


def model_sha256(path: Path, cache_file: Path | None = None) -> str:
    """The sha256 of the model ``path`` opens (every shard of a split model); a cache entry whose identity
    still matches avoids re-reading it."""
    path = path.resolve()
    shards = shard_paths(path)
    identity = file_identity(path) if len(shards) == 1 else {"shards": [file_identity(p) for p in shards]}
    cache = _read_cache(cache_file) if cache_file else {}
    entry = cache.get(str(path))
    if entry is not None and entry.get("identity") == identity:
        return str(entry["sha256"])
    sha = _full_sha256(shards)
    if cache_file is not None:
        cache[str(path)] = {"identity": identity, "sha256": sha}
        _write_cache(cache_file, cache)
    return sha


def file_identity(path: Path) -> dict[str, int | str]:
    """What changes when the file is rewritten or replaced, cheaply: its stat and a sampled hash."""
    info = path.stat()
    return {
        "size": info.st_size,
        "mtime_ns": info.st_mtime_ns,
        "ctime_ns": info.st_ctime_ns,
        "inode": info.st_ino,
        "device": info.st_dev,
        "sample": _sampled_sha256(path, info.st_size),
    }


def _sampled_sha256(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    step = max(size - SAMPLE_BYTES, 0) / max(SAMPLES - 1, 1)
    with path.open("rb") as f:
        for offset in sorted({int(i * step) for i in range(SAMPLES)}):
            f.seek(offset)
            digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()


def _full_sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with path.open("rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def _read_cache(cache_file: Path) -> dict[str, dict]:
    """The cache's entries (path -> identity and sha256); anything else, e.g. the older format, is
    dropped: it only costs a re-hash."""
    try:
        data = json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        k: v for k, v in data.items()
        if isinstance(v, dict) and isinstance(v.get("identity"), dict) and isinstance(v.get("sha256"), str)
    }  # fmt: skip


def _write_cache(cache_file: Path, cache: dict[str, dict]) -> None:
    """Best effort: a cache that cannot be written only costs a re-hash next time."""
    try:
        write_text_atomic(cache_file, json.dumps(cache))
    except OSError:
        pass

