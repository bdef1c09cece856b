"""A split GGUF model's shards, named as llama.cpp's gguf-split names them (``-00001-of-00003.gguf``).

llama.cpp opens the first shard and finds the others beside it by name; whatever stands for the model
(its fingerprint, its size, the library's record) covers all of them.
"""

from __future__ import annotations

import re
from pathlib import Path

SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def split_info(name: str) -> tuple[str, int, int] | None:
    """(prefix, shard number, shard count) of a split GGUF's file name, else None."""
    m = SPLIT.match(name)
    if m is None or not 1 <= int(m["no"]) <= int(m["count"]):
        return None
    return m["prefix"], int(m["no"]), int(m["count"])


def shard_names(first: str) -> list[str]:
    """Every shard's file name of a split model, from its first shard's name (itself when not split)."""
    info = split_info(first)
    if info is None:
        return [first]
    prefix, _, count = info
    return [f"{prefix}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def shard_paths(path: Path) -> list[Path]:
    """The files of the model ``path`` opens: every shard beside it for a split model's first shard (the
    one llama.cpp is given), else the file itself."""
    info = split_info(path.name)
    if info is None or info[1] != 1:
        return [path]
    return [path.with_name(name) for name in shard_names(path.name)]
