"""Opening contexts of the three cache kinds, and decoding with the logits of every position."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import Llama

from bench.settings import Settings

# plain f16 cache, plain q8_0 cache, lazy q8_0 cache (f16 view first)
KINDS = ("f16", "q8_0", "lazy")
# every cache kind the bench opens: K and V type, kv_lazy_quant. "ladder": allocated as q4_0, climbs
# f16 -> q8_0 -> q4_0; "ladder_q5_0": the same with q5_0 as the last rung (bench/ladder.py)
CACHE_KINDS = {
    "f16": (llama_cpp.GGML_TYPE_F16, False),
    "q8_0": (llama_cpp.GGML_TYPE_Q8_0, False),
    "q4_0": (llama_cpp.GGML_TYPE_Q4_0, False),
    "q5_0": (llama_cpp.GGML_TYPE_Q5_0, False),
    "lazy": (llama_cpp.GGML_TYPE_Q8_0, True),
    "ladder": (llama_cpp.GGML_TYPE_Q4_0, True),
    "ladder_q5_0": (llama_cpp.GGML_TYPE_Q5_0, True),
}


def model_path(key: str) -> Path:
    from lazykv.core.models import model_fetch

    path = model_fetch.models_dir() / model_fetch.MODELS[key].filename
    if not path.exists():
        raise SystemExit(f"model {path} is missing: run `make models` first")
    return path


def cache_params(kind: str) -> dict[str, int | bool]:
    """The Llama(...) arguments of a cache kind (see CACHE_KINDS)."""
    ggml_type, lazy = CACHE_KINDS[kind]
    return {"type_k": ggml_type, "type_v": ggml_type, "kv_lazy_quant": lazy}


def open_context(key: str, kind: str, n_ctx: int, settings: Settings) -> Llama:
    """A context over model `key` whose K and V cache is `kind` (see CACHE_KINDS)."""
    return Llama(
        str(model_path(key)),
        n_ctx=n_ctx,
        n_batch=settings.n_batch,
        n_ubatch=settings.n_batch,
        n_threads=settings.n_threads,
        n_threads_batch=settings.n_threads,
        flash_attn=settings.flash_attn,
        **cache_params(kind),
        seed=1234,
        verbose=False,
    )


def open_vocab(key: str) -> Llama:
    """The model's tokenizer only (no weights, no context work)."""
    return Llama(str(model_path(key)), vocab_only=True, verbose=False)


def n_layers(llm: Llama) -> int:
    arch = llm.metadata.get("general.architecture", "")
    return int(llm.metadata[f"{arch}.block_count"])


def eval_with_logits(llm: Llama, tokens: list[int]) -> np.ndarray:
    """Decode `tokens` (at most n_batch) after the cached ones and return the logits of every position.

    This is what ``Llama.eval`` does with ``logits_all=True``, except that the logits are returned as a
    view of the engine's output buffer (valid until this context decodes again) instead of being copied
    into ``llm.scores``: an n_ctx x n_vocab float32 array would take 8.6 GB for Gemma's 262k vocabulary.
    """
    n_past, n = llm.n_tokens, len(tokens)
    if n > llm.n_batch:
        raise ValueError("eval_with_logits: more tokens than n_batch")
    llm._ctx.kv_cache_seq_rm(-1, n_past, -1)
    llm._batch.set_batch(batch=tokens, n_past=n_past, logits_all=True)
    llm._ctx.decode(llm._batch)
    llm.input_ids[n_past : n_past + n] = tokens
    llm.n_tokens += n
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n, llm.n_vocab()))


def truncate(llm: Llama, n_tokens: int) -> None:
    """Forget the cached tokens from position n_tokens on (the cells are removed at the next eval)."""
    llm.n_tokens = n_tokens
    llm._ctx.kv_cache_seq_rm(-1, n_tokens, -1)
