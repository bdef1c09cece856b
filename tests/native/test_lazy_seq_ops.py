"""Sequence operations and K-shift on a lazy cache, before, across and after the
conversion, with two sequences in one unified cache (SmolLM2)."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from .rawctx import RawContext, RawModel

Q8 = llama_cpp.GGML_TYPE_Q8_0
F16 = llama_cpp.GGML_TYPE_F16
N_CTX = 1024
N_F16 = 512


@pytest.fixture(scope="module")
def model(smollm2_path: Path) -> RawModel:
    return RawModel(smollm2_path)


def text_tokens(model: RawModel, seed: int, n: int) -> list[int]:
    """Ordinary words, so that the logits mean something."""
    vocab = llama_cpp.llama_model_get_vocab(model.ptr)
    words = (b"the a river town market winter light song boat bread stone window road "
             b"morning children old new quiet bright garden letter story").split()
    rng = np.random.default_rng(seed)
    text = b" ".join(rng.choice(words, n))
    buf = (llama_cpp.llama_token * (2 * n))()
    got = llama_cpp.llama_tokenize(vocab, text, len(text), buf, len(buf), False, False)
    assert got >= n
    return list(buf[:n])


def kld(p: np.ndarray, q: np.ndarray) -> float:
    lp = p.astype(np.float64) - np.logaddexp.reduce(p.astype(np.float64))
    lq = q.astype(np.float64) - np.logaddexp.reduce(q.astype(np.float64))
    return float((np.exp(lp) * (lp - lq)).sum())


def script(ctx: RawContext, model: RawModel) -> list[np.ndarray]:
    """Two conversations sharing a prefix, edited with every sequence operation; the logits
    after each step. Stays within the f16 view (300 cells at most)."""
    out = [ctx.decode(text_tokens(model, 1, 120), seq_id=0)]
    ctx.seq_cp(0, 1, 0, 80)  # seq 1 shares the first 80 positions
    out.append(ctx.decode(text_tokens(model, 2, 40), seq_id=1, pos0=80))
    ctx.seq_rm(0, 90, 100)  # cut a span out of seq 0 ...
    ctx.seq_add(0, 100, 120, -10)  # ... and close the gap (K-shift)
    out.append(ctx.decode(text_tokens(model, 3, 30), seq_id=0))
    ctx.seq_div(1, 80, 200, 2)  # compress seq 1's tail positions
    out.append(ctx.decode(text_tokens(model, 4, 20), seq_id=1))
    return out


def test_sequence_operations_in_the_f16_phase_are_bit_identical_to_f16(model: RawModel) -> None:
    lazy = RawContext(model, Q8, n_ctx=N_CTX, n_seq=2, lazy=True)
    plain = RawContext(model, F16, n_ctx=N_CTX, n_seq=2)
    for got, want in zip(script(lazy, model), script(plain, model), strict=True):
        np.testing.assert_array_equal(got, want)
    assert lazy.lazy_info().phase == "f16"


def test_k_shift_pending_across_the_conversion(model: RawModel) -> None:
    """A shift queued in the f16 phase, applied by the decode that converts the cache."""
    lazy = RawContext(model, Q8, n_ctx=N_CTX, n_seq=2, lazy=True)
    plain = RawContext(model, F16, n_ctx=N_CTX, n_seq=2)
    for ctx in (lazy, plain):
        script(ctx, model)
        ctx.seq_add(1, 0, 300, 7)  # queued: applied at the next decode
    tail = text_tokens(model, 5, 340)  # 200 cells in use + 340 > 512
    got, want = lazy.decode(tail, seq_id=0), plain.decode(tail, seq_id=0)
    info = lazy.lazy_info()
    assert (info.phase, info.n_conversions) == ("q8_0", 1)
    assert lazy.pos_max(1) == plain.pos_max(1)
    assert kld(want, got) < 0.05
    # both sequences go on sensibly in the q8_0 layout
    for seq in (0, 1):
        more = text_tokens(model, 6 + seq, 8)
        assert kld(plain.decode(more, seq_id=seq), lazy.decode(more, seq_id=seq)) < 0.05


def test_sequence_operations_after_the_conversion(model: RawModel) -> None:
    lazy = RawContext(model, Q8, n_ctx=N_CTX, n_seq=2, lazy=True)
    plain = RawContext(model, F16, n_ctx=N_CTX, n_seq=2)
    for ctx in (lazy, plain):
        script(ctx, model)
        ctx.decode(text_tokens(model, 8, 350), seq_id=0)  # crosses the breakpoint
    assert lazy.lazy_info().phase == "q8_0"

    for ctx in (lazy, plain):
        ctx.seq_rm(0, 200, 400)
        ctx.seq_add(0, 400, 1000, -200)  # K-shift of quantized, rotated cells
        ctx.seq_cp(0, 1, 0, 50)
        ctx.seq_keep(0)  # drops seq 1: fewer cells than the f16 view holds
    assert lazy.lazy_info().phase == "q8_0"  # not empty: stays q8_0
    assert lazy.lazy_info().n_cells_used < N_F16
    tail = text_tokens(model, 9, 16)
    assert kld(plain.decode(tail, seq_id=0), lazy.decode(tail, seq_id=0)) < 0.05

    lazy.seq_rm(0)  # empty: back to f16, bit-identical to a fresh f16 cache again
    assert lazy.lazy_info().phase == "f16"
    fresh = RawContext(model, F16, n_ctx=N_CTX, n_seq=2)
    np.testing.assert_array_equal(lazy.decode(tail, seq_id=1), fresh.decode(tail, seq_id=1))
