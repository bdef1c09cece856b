"""Small helpers for tests that drive the patched engine directly."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from llama_cpp import Llama

from tests.support.synthetic_gguf import SyntheticShape, write_llama_gguf

from .rawctx import RawModel, engine_threads

KV_TYPES = {
    "f16": llama_cpp.GGML_TYPE_F16,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
    "q5_0": llama_cpp.GGML_TYPE_Q5_0,
    "lazy": llama_cpp.GGML_TYPE_Q8_0,
    "ladder": llama_cpp.GGML_TYPE_Q4_0,
    "ladder-q5": llama_cpp.GGML_TYPE_Q5_0,
    "ladder-k5v4": (llama_cpp.GGML_TYPE_Q5_0, llama_cpp.GGML_TYPE_Q4_0),  # K and V apart
}
# lazy caches: q8_0, the ladders to q4_0 and q5_0, and K to q5_0 with V to q4_0
LAZY_KINDS = ("lazy", "ladder", "ladder-q5", "ladder-k5v4")

PROMPT = (
    b"The old lighthouse keeper climbed the stairs every evening at dusk. "
    b"He counted the steps, checked the lamp, and wrote one line in his log. "
    b"One night the log read:"
)


def make_llama(path: Path, kv: str = "q8_0", n_ctx: int = 512, **kwargs) -> Llama:
    """A small real context, flash attention on; kv "lazy" is the lazy q8_0 cache, "ladder" the lazy
    ladder f16 -> q8_0 -> q4_0 ("ladder-q5": to q5_0; "ladder-k5v4": K to q5_0, V to q4_0)."""
    t = KV_TYPES[kv]
    type_k, type_v = t if isinstance(t, tuple) else (t, t)
    if kv in LAZY_KINDS:
        kwargs["kv_lazy_quant"] = True
    return Llama(
        str(path),
        n_ctx=n_ctx,
        n_batch=512,
        n_threads=engine_threads(),
        flash_attn=True,
        type_k=type_k,
        type_v=type_v,
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


@contextlib.contextmanager
def rot_disabled(disabled: bool) -> Iterator[None]:
    """Contexts created inside are built with/without LLAMA_ATTN_ROT_DISABLE=1."""
    old = os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
    if disabled:
        os.environ["LLAMA_ATTN_ROT_DISABLE"] = "1"
    try:
        yield
    finally:
        os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
        if old is not None:
            os.environ["LLAMA_ATTN_ROT_DISABLE"] = old


def q8_llama(path: Path, rot_off: bool = False, **kwargs) -> Llama:
    with rot_disabled(rot_off):
        return make_llama(path, "q8_0", **kwargs)


@functools.lru_cache(maxsize=8)
def filled(path: Path, rot_off: bool, n_drop: int) -> Llama:
    """A q8_0 context holding the prompt but its last ``n_drop`` tokens, memoised: saving from it
    (through any API) reads it and changes nothing."""
    llm = q8_llama(path, rot_off=rot_off)
    prompt = prompt_tokens(llm)
    llm.eval(prompt[: len(prompt) - n_drop])
    return llm


@functools.lru_cache(maxsize=8)
def continuation(path: Path, rot_off: bool, n_drop: int, n: int) -> tuple[int, ...]:
    """The ``n`` greedy tokens after the prompt of a fresh q8_0 context that first held all of it
    but its last ``n_drop`` tokens (memoised: it depends only on these)."""
    llm = q8_llama(path, rot_off=rot_off)
    prompt = prompt_tokens(llm)
    llm.eval(prompt[: len(prompt) - n_drop])
    return tuple(greedy(llm, prompt, n))


def synthetic_model(tmp_path_factory: pytest.TempPathFactory, head_dim: int) -> RawModel:
    """A random-weight llama GGUF with this head size (4 query heads, 2 KV heads), loaded."""
    path = tmp_path_factory.mktemp("gguf") / f"synthetic-hd{head_dim}.gguf"
    return RawModel(write_llama_gguf(path, SyntheticShape(head_dim=head_dim, n_head=4, n_head_kv=2)))


def random_tokens(seed: int, n: int) -> list[int]:
    """``n`` token ids below 512 (every synthetic vocabulary has them), the same for the same seed."""
    return np.random.default_rng(seed).integers(0, 512, n).tolist()
