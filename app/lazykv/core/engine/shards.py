"""A split GGUF model's shards, named as llama.cpp's gguf-split names them (``-00001-of-00003.gguf``).

llama.cpp opens the first shard and finds the others beside it by name; whatever stands for the model
(its fingerprint, its size, the library's record) covers all of them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from lazykv.core.engine.model_meta import ModelMeta, TensorBytes, TensorGroup

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


def merged_meta(metas: Sequence[ModelMeta]) -> ModelMeta:
    """One model's metadata from its shards' (in shard order): the first shard's hyper-parameters, and every
    shard's parameters, bytes and tensors, their offsets as if the shards were one file (what the memory
    plan reads)."""
    first = metas[0]
    if len(metas) == 1:
        return first
    tensors = None
    if all(m.tensors is not None for m in metas):
        base = 0
        shifted = []
        for m in metas:
            shifted.append((m.tensors, base))
            base += m.file_size
        tensors = _merged_tensors(shifted)  # type: ignore[arg-type]
    return replace(first, file_size=sum(m.file_size for m in metas), n_params=sum(m.n_params for m in metas),
                   tensors=tensors)


def _merged_tensors(parts: list[tuple[TensorBytes, int]]) -> TensorBytes:
    def merge(groups: list[tuple[TensorGroup, int]]) -> TensorGroup:
        present = [(g, at) for g, at in groups if g.nbytes or g.end]
        if not present:
            return TensorGroup()
        return TensorGroup(sum(g.nbytes for g, _ in present), sum(g.repack for g, _ in present),
                           min(g.start + at for g, at in present), max(g.end + at for g, at in present),
                           max(g.largest for g, _ in present))

    n_layers = max(len(t.layers) for t, _ in parts)
    layers = tuple(merge([(t.layers[i], at) for t, at in parts if i < len(t.layers)])
                   for i in range(n_layers))
    return TensorBytes(merge([(t.token_embd, at) for t, at in parts]), layers,
                       merge([(t.output, at) for t, at in parts]), merge([(t.other, at) for t, at in parts]),
                       tied=all(t.tied for t, _ in parts))
