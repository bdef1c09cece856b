"""A synthetic GGUF with the KV shape of Llama-3-8B and tiny everything else, written at bench time.

32 layers, 32 query heads, 8 KV heads of 128 (``llama.attention.key_length`` / ``value_length`` set
explicitly, so the head size does not follow from a small ``n_embd``): its KV cache per token is
Llama-3-8B's (128 KiB in f16) while the weights take a few MiB. Random f16 weights; the vocabulary
is llama.cpp's "none" type, so the bench feeds token ids. Written into the user's cache directory,
never committed; rewritten when the writer's shape changes.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs
from tests.support.synthetic_gguf import SyntheticShape, write_llama_gguf

KvShape = SyntheticShape  # the test suite's writer and its shape

LLAMA3_8B_KV = KvShape(
    n_layer=32, n_head=32, n_head_kv=8, head_dim=128,
    embd=256,  # small: only the KV shape is Llama-3-8B's
    n_ff=256, n_vocab=256, n_ctx_train=131072, rope_freq_base=500000.0, name="synthetic Llama-3-8B KV shape",
)


def file_name(shape: KvShape) -> str:
    return (f"llama3-8b-kv-shape-l{shape.n_layer}-h{shape.n_head}-kv{shape.n_head_kv}x{shape.head_dim}"
            f"-e{shape.n_embd}-f{shape.n_ff}-v{shape.n_vocab}.gguf")


def kv_bytes_per_cell(shape: KvShape, bytes_per_value: float) -> float:
    """K and V of every layer for one token."""
    return 2 * shape.n_layer * shape.n_head_kv * shape.head_dim * bytes_per_value


def cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("lazykv", appauthor=False)) / "bench"


def synthetic_model(shape: KvShape = LLAMA3_8B_KV, directory: Path | None = None) -> Path:
    """The model file of ``shape`` in the cache directory, written first if missing."""
    path = (directory or cache_dir()) / file_name(shape)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        write_llama_gguf(partial, shape)
        partial.replace(path)
    return path
