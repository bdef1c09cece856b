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

import gguf
import numpy as np
import platformdirs


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


def _write(path: Path, shape: KvShape, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("synthetic Llama-3-8B KV shape")
    w.add_context_length(shape.n_ctx_train)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    w.add_vocab_size(shape.n_vocab)
    w.add_tokenizer_model("none")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    def mat(rows: int, cols: int) -> np.ndarray:  # numpy (rows, cols) is a GGUF tensor of ne [cols, rows]
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)

    n_q, n_kv = shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim
    w.add_tensor("token_embd.weight", mat(shape.n_vocab, shape.n_embd))
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(shape.n_embd, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", mat(n_q, shape.n_embd))
        w.add_tensor(p + "attn_k.weight", mat(n_kv, shape.n_embd))
        w.add_tensor(p + "attn_v.weight", mat(n_kv, shape.n_embd))
        w.add_tensor(p + "attn_output.weight", mat(shape.n_embd, n_q))
        w.add_tensor(p + "ffn_norm.weight", np.ones(shape.n_embd, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", mat(shape.n_ff, shape.n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(shape.n_ff, shape.n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(shape.n_embd, shape.n_ff))
    w.add_tensor("output_norm.weight", np.ones(shape.n_embd, dtype=np.float32))
    w.add_tensor("output.weight", mat(shape.n_vocab, shape.n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
