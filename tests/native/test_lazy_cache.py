"""The lazy q8_0 KV cache (patches 0006-0008, 0033) on the real test models.

Small contexts prove the same as large ones here: n_ctx 1024 gives an f16 view of
512 cells, so a conversation crosses the breakpoint after 512 tokens.
"""

from __future__ import annotations

import threading
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from llama_cpp import KvLazyInfo

from .helpers import PROMPT, greedy, make_llama
from .rawctx import DecodeError, RawContext, RawModel
from .state_blob import conversion_mismatches, parse_context_state

N_CTX = 1024
N_F16 = 512  # floor(1024 * 34/64) = 544, rounded down to the 256-cell padding
N_ONE_AT_A_TIME = 32  # the f16 phase's last cells, decoded token by token


def corpus(llm: llama_cpp.Llama, n: int) -> list[int]:
    """n tokens of varied text (deterministic)."""
    words = PROMPT.decode().split()
    rng = np.random.default_rng(7)
    text = " ".join(rng.permutation(words * (2 + n // len(words))).tolist())
    tokens = llm.tokenize(text.encode())
    assert len(tokens) >= n
    return tokens[:n]


def kld(p_logits: np.ndarray, q_logits: np.ndarray, rows: int = 16) -> np.ndarray:
    """KL(softmax(p) || softmax(q)) per row, in float64, a few rows at a time (Gemma-3's rows hold 262k
    logits): sum_i P_i (p_i - q_i) - lse(p) + lse(q), two exponentials per row instead of three."""
    one_row = np.ndim(p_logits) == 1
    p_logits, q_logits = np.atleast_2d(p_logits), np.atleast_2d(q_logits)
    out = np.empty(len(p_logits))
    for a in range(0, len(p_logits), rows):
        p = p_logits[a : a + rows].astype(np.float64)
        q = q_logits[a : a + rows].astype(np.float64)
        p -= p.max(axis=-1, keepdims=True)
        q -= q.max(axis=-1, keepdims=True)
        e = np.exp(p)
        z = e.sum(axis=-1)
        lse_q = np.log(np.exp(q).sum(axis=-1))
        out[a : a + rows] = np.einsum("ij,ij->i", e, p - q) / z - np.log(z) + lse_q
    return out[0] if one_row else out


def assert_kld_no_worse_than_q8_0(runs: dict[str, llama_cpp.Llama], n: int, n_f16: int) -> None:
    """`runs` (f16, q8_0, lazy) read the same n tokens: the lazy cache has converted, matches f16 exactly
    in its f16 view and is no worse than q8_0 after it (mean KLD within 1.10x)."""
    assert runs["lazy"].kv_lazy_info().phase == "q8_0"
    ref = runs["f16"].scores[:n]
    kld_lazy = kld(ref, runs["lazy"].scores[:n])
    kld_q8 = kld(ref, runs["q8_0"].scores[:n])
    assert kld_lazy[:n_f16].max() == 0.0
    assert kld_lazy[n_f16:].mean() <= 1.10 * kld_q8[n_f16:].mean()


# ---------------------------------------------------------------- configuration


def test_lazy_needs_q8_0_and_flash_attention(smollm2_path: Path) -> None:
    with pytest.raises(ValueError, match="type_k and type_v each GGML_TYPE_Q8_0"):
        make_llama(smollm2_path, "f16", kv_lazy_quant=True)
    with pytest.raises(ValueError, match="flash_attn"):
        llama_cpp.Llama(str(smollm2_path), n_ctx=256, type_k=8, type_v=8, flash_attn=False,
                        kv_lazy_quant=True, verbose=False)


def test_multi_stream_cache_refused_clearly(smollm2_path: Path) -> None:
    model = RawModel(smollm2_path)
    ctx = RawContext(model, llama_cpp.GGML_TYPE_Q8_0, n_ctx=512, n_seq=2, unified=False, lazy=True)
    assert ctx.lazy_info().phase == "disabled"  # a plain q8_0 cache, as asked
    ctx.decode([1, 2, 3], seq_id=1)


def test_env_var_enables_lazy_mode(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_KV_CACHE_LAZY_QUANT", "1")
    llm = make_llama(smollm2_path, "q8_0", n_ctx=N_CTX)
    info = llm.kv_lazy_info()
    assert (info.phase, info.n_cells_f16, info.n_cells_total) == ("f16", N_F16, N_CTX)


def test_memory_is_that_of_a_q8_0_cache(smollm2_path: Path) -> None:
    lazy = make_llama(smollm2_path, "lazy", n_ctx=8192).kv_lazy_info()
    plain = make_llama(smollm2_path, "q8_0", n_ctx=8192).kv_lazy_info()
    assert plain.phase == "disabled"
    assert lazy.kv_bytes == plain.kv_bytes
    assert lazy.n_cells_f16 == 4352  # floor(8192 * 34/64)


# ---------------------------------------------------------------- f16 phase


# both have f16 views of 256 cells (the smallest views: the property does not depend on the view's size,
# and 256 cells still take two batches and then 32 tokens one at a time up to the view's end)
@pytest.mark.parametrize(("kind", "n_ctx"), [("lazy", 512), ("ladder", 1024)])
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_f16_phase_is_bit_identical_to_an_f16_cache(
    model: str, kind: str, n_ctx: int, smollm2_path: Path, gemma3_path: Path
) -> None:
    path = smollm2_path if model == "smollm2" else gemma3_path
    n_f16 = 256
    lazy = make_llama(path, kind, n_ctx=n_ctx, logits_all=True)
    assert lazy.kv_lazy_info().n_cells_f16 == n_f16
    f16 = make_llama(path, "f16", n_ctx=n_ctx, logits_all=True)
    tokens = corpus(f16, n_f16)
    batched = tokens[: n_f16 - N_ONE_AT_A_TIME]
    pieces = [batched[i : i + 128] for i in range(0, len(batched), 128)]  # batches, then the last cells
    for piece in pieces + [[t] for t in tokens[len(batched) :]]:  # one at a time, up to the view's end
        lazy.eval(piece)
        f16.eval(piece)
    assert lazy.kv_lazy_info().phase == "f16"
    assert lazy.kv_lazy_info().n_cells_used == n_f16
    np.testing.assert_array_equal(lazy.scores[:n_f16], f16.scores[:n_f16])


# ---------------------------------------------------------------- the conversion


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_conversion_matches_an_independent_rotate_then_quantize(
    model: str, smollm2_path: Path, gemma3_path: Path
) -> None:
    path = smollm2_path if model == "smollm2" else gemma3_path
    n_caches = 2 if model == "gemma3" else 1
    llm = make_llama(path, "lazy", n_ctx=N_CTX)
    llm.eval(corpus(llm, 300))
    _, before = parse_context_state(llm.save_state().llama_state, n_caches)
    assert llm.kv_lazy_convert()
    _, after = parse_context_state(llm.save_state().llama_state, n_caches)

    total = off = 0
    for b, a in zip(before, after, strict=True):
        assert (b.n_rot_k, b.n_rot_v) == (0, 0)
        assert (a.n_rot_k, a.n_rot_v) == (llm.kv_lazy_info().n_rot_k, llm.kv_lazy_info().n_rot_v)
        assert b.positions == a.positions
        off_one, total_one = conversion_mismatches(b, a)
        off += off_one
        total += total_one
    assert off / total < 1e-3, f"{off} of {total} codes differ by one"


def test_kld_after_the_breakpoint_no_worse_than_q8_0(smollm2_path: Path) -> None:
    n_ctx, n_f16 = 512, 256
    runs = {kv: make_llama(smollm2_path, kv, n_ctx=n_ctx, logits_all=True) for kv in ("f16", "q8_0", "lazy")}
    tokens = corpus(runs["f16"], n_ctx - 24)  # about twice the f16 capacity
    for llm in runs.values():
        for i in range(0, len(tokens), 128):  # the breakpoint falls between batches
            llm.eval(tokens[i : i + 128])
    assert_kld_no_worse_than_q8_0(runs, len(tokens), n_f16)

    # and greedy generation after the conversion stays coherent: it starts as f16's does
    question = list(runs["f16"].tokenize(b". The capital of France is", add_bos=False))
    continuations = {kv: greedy(runs[kv], question, 12, reset=False) for kv in ("f16", "lazy")}
    assert continuations["lazy"][:3] == continuations["f16"][:3]
    words = runs["lazy"].detokenize(continuations["lazy"]).decode().split()
    assert words and all(any(c.isalpha() for c in w) for w in words)


def test_progress_callback_and_counters(smollm2_path: Path) -> None:
    llm = make_llama(smollm2_path, "lazy", n_ctx=N_CTX)
    events: list[tuple[KvLazyInfo, int]] = []
    llm.set_kv_lazy_progress_callback(lambda info: events.append((info, threading.get_ident())))
    tokens = corpus(llm, 700)
    llm.eval(tokens[:500])
    assert events == []
    llm.eval(tokens[500:])

    infos = [info for info, _ in events]
    assert {tid for _, tid in events} == {threading.get_ident()}  # on the decoding thread
    assert infos[0].phase == "converting" and infos[0].progress_done == 0
    assert infos[-1].phase == "q8_0"
    total = infos[0].progress_total
    assert total == 2 * 30  # K and V of SmolLM2's 30 layers
    done = [i.progress_done for i in infos]
    assert done == sorted(done) and done[-1] == total
    final = llm.kv_lazy_info()
    assert (final.phase, final.n_conversions, final.n_cells_used) == ("q8_0", 1, 700)
    assert final.last_conversion_s > 0

    llm.set_kv_lazy_progress_callback(None)
    llm.reset()
    llm.eval(tokens)
    assert len(events) == len(infos)  # removed: no more calls


def test_polling_from_another_thread_during_decoding(smollm2_path: Path) -> None:
    llm = make_llama(smollm2_path, "lazy", n_ctx=N_CTX)
    seen: set[str] = set()
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            seen.add(llm.kv_lazy_info().phase)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        tokens = corpus(llm, 700)  # the batch that crosses 512 converts; one more after it
        for i in range(0, len(tokens), 100):
            llm.eval(tokens[i : i + 100])
    finally:
        stop.set()
        poller.join()
    assert {"f16", "q8_0"} <= seen
    assert llm.kv_lazy_info().n_cells_used == 700


def test_convert_while_idle(smollm2_path: Path) -> None:
    llm = make_llama(smollm2_path, "lazy", n_ctx=N_CTX)
    prompt = corpus(llm, 200)
    llm.eval(prompt)
    assert llm.kv_lazy_convert() is True
    assert llm.kv_lazy_convert() is False  # already q8_0
    info = llm.kv_lazy_info()
    assert (info.phase, info.n_conversions, info.n_cells_used) == ("q8_0", 1, 200)
    # decoding goes on in the q8_0 layout, up to the whole cache, without another conversion
    llm.eval(corpus(llm, 700)[200:])
    assert llm.kv_lazy_info().n_conversions == 1
    with pytest.raises(ValueError, match="no lazy KV cache"):
        make_llama(smollm2_path, "q8_0").kv_lazy_convert()


def test_empty_cache_returns_to_full_precision(smollm2_path: Path) -> None:
    lazy = make_llama(smollm2_path, "lazy", n_ctx=N_CTX)  # greedy compares tokens: no logits_all
    lazy.eval(corpus(lazy, 700))
    assert lazy.kv_lazy_info().phase == "q8_0"

    # a new conversation (generate() without a common prefix removes every cell)
    f16 = make_llama(smollm2_path, "f16", n_ctx=N_CTX)
    prompt = list(lazy.tokenize(PROMPT))
    assert greedy(lazy, prompt, 12) == greedy(f16, prompt, 12)
    assert lazy.kv_lazy_info().phase == "f16"

    # and an explicit clear (of a cache converted while idle: reading 650 more tokens to convert
    # it again would prove nothing more)
    assert lazy.kv_lazy_convert()
    assert lazy.kv_lazy_info().phase == "q8_0"
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(lazy.ctx), True)
    assert lazy.kv_lazy_info().phase == "f16"
    assert lazy.kv_lazy_info().n_cells_used == 0


def test_batch_too_large_for_the_whole_cache_fails_without_converting(smollm2_path: Path) -> None:
    model = RawModel(smollm2_path)
    ctx = RawContext(model, llama_cpp.GGML_TYPE_Q8_0, n_ctx=N_CTX, lazy=True)
    ctx.decode(list(range(100, 400)))
    with pytest.raises(DecodeError) as failed:
        ctx.decode(list(range(1000, 1000 + N_CTX - 100)))
    assert failed.value.rc == 1  # no KV slot, as for a plain cache
    info = ctx.lazy_info()
    assert (info.phase, info.n_conversions, info.n_cells_used) == ("f16", 0, 300)
    ctx.decode(list(range(400, 700)))  # a batch that fits converts
    assert ctx.lazy_info().phase == "q8_0"


def test_graph_reuse_across_the_conversion(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Token-by-token decoding reuses graphs; none built for the f16 view may survive the conversion."""
    model = RawModel(smollm2_path)
    tokens = list(range(2000, 2000 + N_F16 + 40))
    reused = RawContext(model, llama_cpp.GGML_TYPE_Q8_0, n_ctx=N_CTX, lazy=True)
    monkeypatch.setenv("LLAMA_GRAPH_REUSE_DISABLE", "1")
    fresh = RawContext(model, llama_cpp.GGML_TYPE_Q8_0, n_ctx=N_CTX, lazy=True)
    reused.decode(tokens[: N_F16 - 20])
    fresh.decode(tokens[: N_F16 - 20])
    for tok in tokens[N_F16 - 20 :]:
        np.testing.assert_array_equal(reused.decode([tok]), fresh.decode([tok]))
    assert reused.lazy_info().phase == "q8_0"
