"""Small helpers for tests that drive the patched engine directly."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
from llama_cpp import Llama

KV_TYPES = {
    "f16": llama_cpp.GGML_TYPE_F16,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "lazy": llama_cpp.GGML_TYPE_Q8_0,
}

PROMPT = (
    b"The old lighthouse keeper climbed the stairs every evening at dusk. "
    b"He counted the steps, checked the lamp, and wrote one line in his log. "
    b"One night the log read:"
)


def make_llama(path: Path, kv: str = "q8_0", n_ctx: int = 512, **kwargs) -> Llama:
    """A small real context; K and V of the same type, flash attention on; kv "lazy" is the
    lazy q8_0 cache."""
    t = KV_TYPES[kv]
    if kv == "lazy":
        kwargs["kv_lazy_quant"] = True
    return Llama(
        str(path),
        n_ctx=n_ctx,
        n_batch=512,
        n_threads=2,
        flash_attn=True,
        type_k=t,
        type_v=t,
        seed=1234,
        verbose=False,
        **kwargs,
    )


def greedy(llm: Llama, tokens: list[int], n: int, reset: bool = True) -> list[int]:
    """n greedy tokens after `tokens` (reusing whatever prefix is cached)."""
    out: list[int] = []
    for tok in llm.generate(tokens, temp=0.0, top_k=1, reset=reset):
        out.append(tok)
        if len(out) == n:
            break
    return out


def prompt_tokens(llm: Llama) -> list[int]:
    return llm.tokenize(PROMPT)
