"""The lazy ladder f16 -> q8_0 -> q4_0 (patch 0015) on the real test models.

A q4_0 cache of 2048 cells holds 512 cells as f16 (floor(2048 * 18/64) = 576, rounded down to
the 256-cell padding), 1024 as q8_0 (floor(2048 * 18/34) = 1084) and 2048 as q4_0. A lazy q8_0
cache of 1024 cells has the same two first rungs (f16 512, q8_0 1024), so up to 1024 tokens the
ladder must compute exactly what it does. A cache of 1024 cells climbs at 256 and 512, the rungs of
a lazy q8_0 cache of 512 cells (the pair the exactness test reads, with half the tokens).
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from llama_cpp import KvLazyInfo, Llama

from .helpers import make_llama
from .test_lazy_cache import corpus, kld

N_CTX = 2048
N_F16, N_Q8 = 512, 1024
N_SMALL = 1024  # rungs 256 / 512 / 1024
N_SMALL_F16, N_SMALL_Q8 = 256, 512


def next_logits(llm: Llama, token: int) -> np.ndarray:
    """The logits after token, on top of what the context holds."""
    llm.eval([token])
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()


def feed(llm: Llama, tokens: list[int], step: int = 128) -> None:
    for i in range(0, len(tokens), step):
        llm.eval(tokens[i : i + step])


# ---------------------------------------------------------------- configuration


def test_rungs_and_memory(smollm2_path: Path) -> None:
    ladder = make_llama(smollm2_path, "ladder", n_ctx=N_CTX).kv_lazy_info()
    assert ladder.rungs == ("f16", "q8_0", "q4_0") and ladder.is_ladder
    assert (ladder.phase, ladder.final, ladder.target) == ("f16", "q4_0", "")
    assert (ladder.n_cells_f16, ladder.n_cells_q8, ladder.n_cells_total) == (N_F16, N_Q8, N_CTX)
    assert (ladder.n_cells_capacity, ladder.n_cells_next) == (N_F16, N_Q8)

    # the memory of a plain q4_0 cache: 3.56x the tokens of an f16 cache, 1.89x those of q8_0
    plain = {kv: make_llama(smollm2_path, kv, n_ctx=N_CTX) for kv in ("f16", "q8_0", "q4_0")}
    kv_bytes = {kv: llm.kv_lazy_info().kv_bytes for kv, llm in plain.items()}
    assert ladder.kv_bytes == kv_bytes["q4_0"]
    assert kv_bytes["f16"] / ladder.kv_bytes == pytest.approx(64 / 18)
    assert kv_bytes["q8_0"] / ladder.kv_bytes == pytest.approx(34 / 18)

    q5 = make_llama(smollm2_path, "ladder-q5", n_ctx=N_CTX).kv_lazy_info()
    assert q5.rungs == ("f16", "q8_0", "q5_0")
    assert (q5.n_cells_f16, q5.n_cells_q8, q5.n_cells_total) == (512, 1280, N_CTX)  # 704, 1325 rounded down

    lazy = make_llama(smollm2_path, "lazy", n_ctx=N_Q8).kv_lazy_info()
    assert lazy.rungs == ("f16", "q8_0") and not lazy.is_ladder
    assert (lazy.n_cells_f16, lazy.n_cells_q8, lazy.n_cells_total) == (N_F16, N_Q8, N_Q8)
    assert lazy.n_cells_next == N_Q8


def test_env_var_with_q4_0_gives_the_ladder(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As llama.cpp's own tools run it: LLAMA_KV_CACHE_LAZY_QUANT=1 with -ctk q4_0 -ctv q4_0."""
    monkeypatch.setenv("LLAMA_KV_CACHE_LAZY_QUANT", "1")
    info = make_llama(smollm2_path, "q4_0", n_ctx=N_CTX).kv_lazy_info()
    assert (info.rungs, info.n_cells_f16, info.n_cells_q8) == (("f16", "q8_0", "q4_0"), N_F16, N_Q8)


def test_f16_beside_a_quantized_type_refused(smollm2_path: Path) -> None:
    with pytest.raises(ValueError, match="each GGML_TYPE_Q8_0, GGML_TYPE_Q4_0 or GGML_TYPE_Q5_0"):
        Llama(str(smollm2_path), n_ctx=256, type_k=llama_cpp.GGML_TYPE_F16, type_v=llama_cpp.GGML_TYPE_Q4_0,
              flash_attn=True, kv_lazy_quant=True, verbose=False)


def test_k_and_v_step_apart(smollm2_path: Path) -> None:
    """K q5_0 with V q4_0 (patch 0031): f16 and q8_0 as every ladder, then V alone to q4_0 (V's q8_0 rows
    hold 1024 cells, K's 1280: floor(2048 * 22/34) rounded down), then K to q5_0; the memory of a plain
    K q5_0, V q4_0 cache. The bindings name a rung of two types "K's/V's"; a step by that name, the
    metadata of a state on it, and a compact state of f16 cells written at the last rung, which resumes
    as the cache converted at that point does (the engine's test-kv-lazy checks each step bit for bit
    against a restore)."""
    llm = make_llama(smollm2_path, "ladder-k5v4", n_ctx=N_CTX)
    info = llm.kv_lazy_info()
    assert info.rungs == ("f16", "q8_0", "q8_0/q4_0", "q5_0/q4_0") and info.is_ladder
    assert (info.n_cells_f16, info.n_cells_q8, info.n_cells_total) == (512, 1024, N_CTX)
    assert info.final == "q5_0/q4_0"
    q5, q4 = llama_cpp.GGML_TYPE_Q5_0, llama_cpp.GGML_TYPE_Q4_0
    plain = Llama(str(smollm2_path), n_ctx=N_CTX, type_k=q5, type_v=q4, flash_attn=True, verbose=False)
    assert info.kv_bytes == plain.kv_lazy_info().kv_bytes

    tokens = corpus(llm, 301)
    llm.eval(tokens[:300])
    compact = llm.save_state(seq_id=0, rung="q5_0/q4_0")
    assert (compact.metadata["type_k"], compact.metadata["type_v"]) == (q5, q4)
    assert llm.kv_lazy_convert() is True and llm.kv_lazy_info().phase == "q8_0"
    assert llm.kv_lazy_convert("q8_0/q4_0") is True
    info = llm.kv_lazy_info()
    assert (info.phase, info.n_cells_capacity, info.n_cells_next) == ("q8_0/q4_0", 1280, N_CTX)
    assert info.n_conversions == 2
    state = llm.save_state(seq_id=0)
    assert (state.metadata["type_k"], state.metadata["type_v"]) == (llama_cpp.GGML_TYPE_Q8_0, q4)
    with pytest.raises(ValueError, match="no rung 'q4_0'"):
        llm.kv_lazy_convert("q4_0")  # no rung of that name here

    # that state: a fresh ladder of the same types steps to its rung and goes on exactly; a lazy q8_0 cache
    # cannot read V's 4-bit rows back into 8-bit ones, and says so before anything changes
    token = tokens[300]
    same_types = make_llama(smollm2_path, "ladder-k5v4", n_ctx=N_CTX)
    same_types.load_state(state, seq_id=0)
    assert same_types.kv_lazy_info().phase == "q8_0/q4_0"
    np.testing.assert_array_equal(next_logits(same_types, token), next_logits(llm, token))
    lazy_q8 = make_llama(smollm2_path, "lazy", n_ctx=N_CTX)
    with pytest.raises(llama_cpp.StateMismatchError, match="q8_0/q4_0"):
        lazy_q8.load_state(state, seq_id=0)

    direct = make_llama(smollm2_path, "ladder-k5v4", n_ctx=N_CTX)
    direct.eval(tokens[:300])
    assert direct.kv_lazy_convert("q5_0/q4_0") is True and direct.kv_lazy_info().n_conversions == 1
    resumed = make_llama(smollm2_path, "ladder-k5v4", n_ctx=N_CTX)
    resumed.load_state(compact, seq_id=0)
    assert resumed.kv_lazy_info().phase == "q5_0/q4_0"
    np.testing.assert_array_equal(next_logits(resumed, token), next_logits(direct, token))


def test_k_and_v_step_apart_on_a_sliding_window_model(gemma3_path: Path) -> None:
    """Gemma-3's two caches, the global layers' (4096 cells) and the sliding window's (1024), climb the
    same rungs: the order of K's and V's steps follows from their types alone. (Compared by each cache's
    rounded capacities, the window's 1024 cells hold 512 at q8_0 for K and for V alike: it stepped both at
    once, one rung fewer than the global cache, and the context failed to load.)"""
    llm = make_llama(gemma3_path, "ladder-k5v4", n_ctx=4096, swa_full=False)
    assert llm.kv_lazy_info().rungs == ("f16", "q8_0", "q8_0/q4_0", "q5_0/q4_0")
    tokens = corpus(llm, 201)
    llm.eval(tokens[:200])  # within the window cache's f16 rung (256 cells)
    for rung in ("q8_0", "q8_0/q4_0", "q5_0/q4_0"):
        assert llm.kv_lazy_convert() is True and llm.kv_lazy_info().phase == rung
        assert np.isfinite(next_logits(llm, tokens[200])).all()
        llm.n_tokens -= 1  # the same next token again on the next rung
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(llm.ctx), 0, 200, -1)


# ---------------------------------------------------------------- exactness per rung


def test_q8_0_rung_is_identical_to_the_lazy_q8_0_cache(smollm2_path: Path) -> None:
    """Up to 512 tokens the ladder (1024 cells) and a lazy q8_0 cache of 512 cells share their rungs:
    the same logits, bit for bit, before and after the f16 -> q8_0 step (the smallest pair that shares
    them: as for 2048 and 1024 cells, the rungs of the ladder are those of the lazy cache)."""
    ladder = make_llama(smollm2_path, "ladder", n_ctx=N_SMALL, logits_all=True)
    lazy = make_llama(smollm2_path, "lazy", n_ctx=N_SMALL_Q8, logits_all=True)
    assert ladder.kv_lazy_info().n_cells_f16 == lazy.kv_lazy_info().n_cells_f16 == N_SMALL_F16
    assert ladder.kv_lazy_info().n_cells_q8 == lazy.kv_lazy_info().n_cells_q8 == N_SMALL_Q8
    tokens = corpus(lazy, N_SMALL_Q8 - 24)
    feed(ladder, tokens)
    feed(lazy, tokens)
    assert ladder.kv_lazy_info().phase == lazy.kv_lazy_info().phase == "q8_0"
    assert ladder.kv_lazy_info().n_conversions == 1
    np.testing.assert_array_equal(ladder.scores[: len(tokens)], lazy.scores[: len(tokens)])


def top1(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    return float((p_logits.argmax(axis=-1) == q_logits.argmax(axis=-1)).mean())


def feed_sampled(llm: Llama, tokens: list[int], every: int, step: int = 128) -> np.ndarray:
    """Decode `tokens` in batches of `step`; the logits of every `every`-th position only (the output
    layer of Gemma-3's 262k-token vocabulary at every position would dominate the test)."""
    rows = []
    for i in range(0, len(tokens), step):
        chunk, n_past = tokens[i : i + step], llm.n_tokens
        llm._batch.set_batch(batch=chunk, n_past=n_past, logits_all=False)
        wanted = [j for j in range(len(chunk)) if (n_past + j) % every == 0]
        for j in wanted:
            llm._batch.batch.logits[j] = True
        llm._ctx.decode(llm._batch)
        llm.input_ids[n_past : n_past + len(chunk)] = chunk
        llm.n_tokens += len(chunk)
        for j in wanted:
            logits = llama_cpp.llama_get_logits_ith(llm.ctx, j)
            rows.append(np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),)).copy())
    return np.stack(rows)


def test_kld_per_rung(smollm2_path: Path, record_property) -> None:
    """Against f16, on the same text (every 4th position): exact in the f16 rung, no worse than plain q8_0
    in the q8_0 rung, and after the last step no worse than a plain rotated q4_0 cache (mean KLD within
    1.10x). On SmolLM2 only: `python -m bench --only ladder` measures both models over a longer text
    (bench/results/ladder.md); here the bound guards against a regression."""
    every = 4
    runs = {kv: make_llama(smollm2_path, kv, n_ctx=N_SMALL) for kv in ("f16", "q8_0", "q4_0", "ladder")}
    tokens = corpus(runs["f16"], N_SMALL - 24)
    logits = {kv: feed_sampled(llm, tokens, every) for kv, llm in runs.items()}  # steps between batches
    info = runs["ladder"].kv_lazy_info()
    assert (info.phase, info.n_conversions) == ("q4_0", 2)

    ref = logits["f16"]
    klds = {kv: kld(ref, logits[kv]) for kv in ("q8_0", "q4_0", "ladder")}
    f16_rung = slice(0, N_SMALL_F16 // every)
    q8_rung, q4_rung = slice(N_SMALL_F16 // every, N_SMALL_Q8 // every), slice(N_SMALL_Q8 // every, len(ref))
    assert klds["ladder"][f16_rung].max() == 0.0
    assert klds["ladder"][q8_rung].mean() <= 1.10 * klds["q8_0"][q8_rung].mean()
    assert klds["ladder"][q4_rung].mean() <= 1.10 * klds["q4_0"][q4_rung].mean()
    for kv in ("q8_0", "q4_0", "ladder"):
        record_property(f"kld_{kv}_last_rung", float(klds[kv][q4_rung].mean()))
        record_property(f"top1_{kv}_last_rung", top1(ref[q4_rung], logits[kv][q4_rung]))


# ---------------------------------------------------------------- the steps


def test_one_step_at_a_time_with_progress(smollm2_path: Path) -> None:
    llm = make_llama(smollm2_path, "ladder", n_ctx=N_SMALL)
    events: list[KvLazyInfo] = []
    llm.set_kv_lazy_progress_callback(events.append)
    llm.eval(corpus(llm, 100))

    assert llm.kv_lazy_convert() is True
    assert (llm.kv_lazy_info().phase, llm.kv_lazy_info().n_cells_capacity) == ("q8_0", N_SMALL_Q8)
    assert llm.kv_lazy_convert() is True
    assert llm.kv_lazy_convert() is False  # on the last rung
    info = llm.kv_lazy_info()
    assert (info.phase, info.target, info.n_conversions, info.n_cells_used) == ("q4_0", "q4_0", 2, 100)
    assert (info.n_cells_capacity, info.n_cells_next) == (N_SMALL, N_SMALL)

    starts = [e for e in events if e.phase == "converting" and e.progress_done == 0]
    assert [e.target for e in starts] == ["q8_0", "q4_0"]
    assert [e.phase for e in events if e.phase != "converting"] == ["q8_0", "q4_0"]
    assert all(e.progress_total == 2 * 30 for e in starts)  # K and V of SmolLM2's 30 layers per step

    # decoding goes on up to the whole cache without another conversion
    llm.eval(corpus(llm, N_SMALL - 24)[100:])
    assert llm.kv_lazy_info().n_conversions == 2


def test_direct_conversion_to_the_last_rung(smollm2_path: Path) -> None:
    llm = make_llama(smollm2_path, "ladder", n_ctx=N_SMALL)
    llm.eval(corpus(llm, 100))
    assert llm.kv_lazy_convert("q4_0") is True
    info = llm.kv_lazy_info()
    assert (info.phase, info.n_conversions) == ("q4_0", 1)
    assert llm.kv_lazy_convert("q8_0") is False  # already past it
    with pytest.raises(ValueError, match="no rung 'q5_0'"):
        llm.kv_lazy_convert("q5_0")
    with pytest.raises(ValueError, match="no rung"):
        llm.kv_lazy_convert("q3_k")


def test_a_batch_past_the_q8_0_rung_converts_directly(smollm2_path: Path) -> None:
    llm = make_llama(smollm2_path, "ladder", n_ctx=N_SMALL)
    tokens = corpus(llm, 700)
    llm.eval(tokens[:200])
    llm.eval(tokens[200:])  # one batch of 500: 700 cells fit neither the f16 (256) nor the q8_0 rung (512)
    info = llm.kv_lazy_info()
    assert (info.phase, info.target, info.n_conversions, info.n_cells_used) == ("q4_0", "q4_0", 1, 700)


def test_emptied_ladder_returns_to_f16(smollm2_path: Path) -> None:
    llm = make_llama(smollm2_path, "ladder", n_ctx=N_SMALL)
    llm.eval(corpus(llm, 700))
    assert llm.kv_lazy_info().phase == "q4_0"
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
    info = llm.kv_lazy_info()
    assert (info.phase, info.n_cells_used, info.n_cells_capacity) == ("f16", 0, N_SMALL_F16)


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_prompt_after_the_last_step_has_finite_logits(
    model: str, smollm2_path: Path, gemma3_path: Path
) -> None:
    """After q8_0 -> q4_0 the q4_0 cells past the converted ones lie over old q8_0 bytes, where a block's
    scale can read as Inf or NaN; they are masked, but the tiled attention still multiplies their V rows
    by 0. The step zeroes them: a 100-token prompt read with 168 such cells inside n_kv stays finite."""
    path = smollm2_path if model == "smollm2" else gemma3_path
    llm = make_llama(path, "ladder", n_ctx=N_SMALL, logits_all=True)
    tokens = corpus(llm, 600)
    llm.eval(tokens[:500])  # converts f16 -> q8_0 (500 > 256 cells) and fills most of the q8_0 rung
    assert llm.kv_lazy_convert() and llm.kv_lazy_info().phase == "q4_0"
    llm.eval(tokens[500:])  # cells 600-767 are inside n_kv (768) and masked
    assert np.isfinite(llm.scores[:600]).all()
