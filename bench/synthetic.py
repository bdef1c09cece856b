"""A synthetic GGUF with the KV shape of Llama-3-8B and tiny everything else, written at bench time.

32 layers, 32 query heads, 8 KV heads of 128 (``llama.attention.key_length`` / ``value_length`` set
explicitly, so the head size does not follow from a small ``n_embd``): its KV cache per token is
Llama-3-8B's (128 KiB in f16) while the weights take a few MiB. Random f16 weights; the vocabulary
is llama.cpp's "none" type, so the bench feeds token ids. Written into the user's cache directory,
never committed; rewritten when the writer's shape changes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs
from tests.support.synthetic_gguf import SyntheticShape, write_llama_gguf


@dataclass(frozen=True)
class KvShape:
    n_layer: int = 32
    n_head: int = 32
    n_head_kv: int = 8
    head_dim: int = 128
    n_embd: int = 256  # small: only the KV shape is Llama-3-8B's
    n_ff: int = 256
    n_vocab: int = 256
    n_ctx_train: int = 131072

    @property
    def file_name(self) -> str:
        return (f"llama3-8b-kv-shape-l{self.n_layer}-h{self.n_head}-kv{self.n_head_kv}x{self.head_dim}"
                f"-e{self.n_embd}-f{self.n_ff}-v{self.n_vocab}.gguf")

    def kv_bytes_per_cell(self, bytes_per_value: float) -> float:
        """K and V of every layer for one token."""
        return 2 * self.n_layer * self.n_head_kv * self.head_dim * bytes_per_value


LLAMA3_8B_KV = KvShape()


def cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("lazykv", appauthor=False)) / "bench"


def synthetic_model(shape: KvShape = LLAMA3_8B_KV, directory: Path | None = None) -> Path:
    """The model file of ``shape`` in the cache directory, written first if missing."""
    path = (directory or cache_dir()) / shape.file_name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        _write(partial, shape)
        partial.replace(path)
    return path


def _write(path: Path, shape: KvShape) -> None:
    write_llama_gguf(path, SyntheticShape(
        n_layer=shape.n_layer, n_head=shape.n_head, n_head_kv=shape.n_head_kv, head_dim=shape.head_dim,
        n_ff=shape.n_ff, n_vocab=shape.n_vocab, n_ctx_train=shape.n_ctx_train, embd=shape.n_embd,
        rope_freq_base=500000.0, name="synthetic Llama-3-8B KV shape",
    ))
