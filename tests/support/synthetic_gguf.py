"""Write tiny llama-architecture GGUF models with random weights.

For fast tests of shapes the real test models do not cover (head dim 128,
GQA ratios, several sequences).  The vocabulary is llama.cpp's "none" type:
tests feed token ids directly.  Weights are f16/f32 random numbers scaled so
that activations stay in a sane range; the text they produce is noise, but the
engine runs exactly the code paths a real model of that shape runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np


@dataclass(frozen=True)
class SyntheticShape:
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 128
    n_ff: int = 256
    n_vocab: int = 512
    n_ctx_train: int = 4096
    embd: int = 0  # the model width; 0: n_head * head_dim (key/value_length carry the head size anyway)
    rope_freq_base: float = 10000.0
    name: str = ""

    @property
    def n_embd(self) -> int:
        return self.embd or self.n_head * self.head_dim


def write_llama_gguf(path: Path, shape: SyntheticShape = SyntheticShape(), seed: int = 0,
                     split_max_tensors: int = 0) -> Path:
    """Write a random-weight llama model of `shape` to `path` and return it.

    ``split_max_tensors`` > 0: a split model of that many tensors per shard, as gguf-split writes it
    (``<stem>-00001-of-0000N.gguf`` beside ``path``); the first shard is returned."""
    rng = np.random.default_rng(seed)
    arch = "llama"
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    w.add_name(shape.name or f"synthetic-llama-hd{shape.head_dim}")
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
    w.add_rope_freq_base(shape.rope_freq_base)
    w.add_vocab_size(shape.n_vocab)
    w.add_tokenizer_model("none")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    def mat(rows: int, cols: int) -> np.ndarray:
        # numpy shape (rows, cols) is a GGUF tensor of ne = [cols, rows]
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)

    n_embd, n_q, n_kv = shape.n_embd, shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim
    w.add_tensor("token_embd.weight", mat(shape.n_vocab, n_embd))
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", mat(n_q, n_embd))
        w.add_tensor(p + "attn_k.weight", mat(n_kv, n_embd))
        w.add_tensor(p + "attn_v.weight", mat(n_kv, n_embd))
        w.add_tensor(p + "attn_output.weight", mat(n_embd, n_q))
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", mat(shape.n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(shape.n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(n_embd, shape.n_ff))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", mat(shape.n_vocab, n_embd))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if split_max_tensors:
        return next(iter(sorted(path.parent.glob(f"{path.stem}-00001-of-*.gguf"))))
    return path
