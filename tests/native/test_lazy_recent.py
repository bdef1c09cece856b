"""The lazy cache's recent window (kv_lazy_recent, patches 0019, 0024): the K/V of the last W tokens also kept
in f16 on the quantized rungs, and attended there instead of their quantized copies; and its attention sinks
(kv_lazy_sinks, patch 0030): the first S tokens' K/V kept in the same way.

The window is a derived copy: the cache still holds every token at its rung, so a token leaving the window
costs nothing, and a slot whose cell was removed, reused or shifted is dropped. The tests check what that
promises: nothing changes on the f16 rung, decoding on the last rung comes closer to f16, a removed
token's slot never answers for the token that takes its cell, and saved states carry the window (a
restore continues exactly, or is refused when the window differs).

Decoding runs on one thread where bit-exactness is asserted: one query row then reads the KV rows in one
pass, in column order, so masked (dropped) columns are skipped exactly.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from llama_cpp import Llama

from .helpers import KV_TYPES
from .rawctx import RawContext, RawModel
from .state_blob import f16_values, hadamard, parse_context_state
from .test_lazy_cache import corpus, kld
from .test_lazy_seq_ops import text_tokens

N_CTX = 1024  # q4_0 ladder rungs: f16 256 cells, q8_0 512, q4_0 1024
W = 64


def ladder(path: Path, recent: int = 0, n_ctx: int = N_CTX, kv: str = "q4_0", sinks: int = 0) -> Llama:
    t = KV_TYPES[kv]
    return Llama(
        str(path),
        n_ctx=n_ctx,
        n_batch=512,
        n_threads=1,  # see the module's docstring (and pytest-xdist runs two workers on two cores)
        n_threads_batch=1,
        flash_attn=True,
        type_k=t,
        type_v=t,
        kv_lazy_quant=t != llama_cpp.GGML_TYPE_F16,
        kv_lazy_recent=recent,
        kv_lazy_sinks=sinks,
        seed=1234,
        verbose=False,
    )


def decode(llm: Llama, tokens: list[int]) -> np.ndarray:
    """Each token on its own (a chat's decode); the logits after each, [n, n_vocab]."""
    out = []
    for tok in tokens:
        llm.eval([tok])
        out.append(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).copy())
    return np.stack(out)


def prefill(llm: Llama, tokens: list[int], step: int = 128) -> None:
    for i in range(0, len(tokens), step):
        llm.eval(tokens[i : i + step])


@pytest.fixture(scope="module")
def tokens(smollm2_path: Path) -> list[int]:
    return corpus(ladder(smollm2_path, n_ctx=256, kv="f16"), 760)


# ---------------------------------------------------------------- configuration and memory


def test_window_memory_is_counted(smollm2_path: Path) -> None:
    """The window's f16 rows are part of the cache's bytes: W rows of K and V per layer and sequence, and
    the row that takes a ubatch's tokens no ring keeps."""
    plain = ladder(smollm2_path).kv_lazy_info()
    windowed = ladder(smollm2_path, recent=W).kv_lazy_info()
    f16_per_token = ladder(smollm2_path, kv="f16").kv_lazy_info().kv_bytes // N_CTX
    assert windowed.kv_bytes - plain.kv_bytes == (W + 1) * f16_per_token
    # the rungs are those of the cache without a window
    assert (windowed.n_cells_f16, windowed.n_cells_q8, windowed.n_cells_total) == (256, 512, N_CTX)


WINDOW_CHILD = """
import sys
import llama_cpp
from llama_cpp import Llama
from tests.native.test_lazy_recent import prefill
llm = Llama(sys.argv[1], n_ctx=1024, n_batch=512, n_threads=1, n_threads_batch=1, flash_attn=True,
            type_k=llama_cpp.GGML_TYPE_Q4_0, type_v=llama_cpp.GGML_TYPE_Q4_0, kv_lazy_quant=True,
            kv_lazy_recent=64, verbose=True)
prefill(llm, list(range(100, 100 + 700)))  # past the f16 and the q8_0 rungs: two steps in the memory update
assert llm.kv_lazy_info().phase == "q4_0", llm.kv_lazy_info().phase
llm.close()
"""


def test_window_compute_buffers_fit_every_rung(smollm2_path: Path) -> None:
    """The compute buffers are reserved with the window's graph nodes at the last rung, so the steps (and the
    worst-case graph the memory update reserves after each) never grow them: llama.cpp says so when a context
    is freed ("does not match expectation")."""
    run = subprocess.run([sys.executable, "-c", WINDOW_CHILD, str(smollm2_path)], capture_output=True,
                         text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stderr[-3000:]
    assert "compute buffer size" in run.stderr  # the engine's log is read
    assert "does not match expectation" not in run.stderr, run.stderr[-3000:]


def test_window_needs_the_lazy_cache(smollm2_path: Path) -> None:
    with pytest.raises(ValueError, match="kv_lazy_recent needs kv_lazy_quant"):
        Llama(str(smollm2_path), n_ctx=256, flash_attn=True, kv_lazy_recent=32, verbose=False)
    with pytest.raises(ValueError, match="kv_lazy_sinks needs kv_lazy_quant"):
        Llama(str(smollm2_path), n_ctx=256, flash_attn=True, kv_lazy_sinks=4, verbose=False)
    with pytest.raises(ValueError, match="0 or more"):
        ladder(smollm2_path, recent=-1)
    with pytest.raises(ValueError, match="0 or more"):
        ladder(smollm2_path, sinks=-1)


def test_sinks_memory_is_counted(smollm2_path: Path) -> None:
    """The sinks (kv_lazy_sinks, patch 0030) are S more slots of each ring: S rows of K and V per layer."""
    windowed = ladder(smollm2_path, recent=W).kv_lazy_info()
    sinks = ladder(smollm2_path, recent=W, sinks=4).kv_lazy_info()
    f16_per_token = ladder(smollm2_path, kv="f16").kv_lazy_info().kv_bytes // N_CTX
    assert sinks.kv_bytes - windowed.kv_bytes == 4 * f16_per_token


# ---------------------------------------------------------------- exactness and quality


@pytest.mark.parametrize("sinks", [0, 4])
def test_f16_rung_is_bit_exact(smollm2_path: Path, tokens: list[int], sinks: int) -> None:
    """Below the first conversion the window and the sinks are unused: the graphs are those of the cache
    without them."""
    ref = ladder(smollm2_path)
    win = ladder(smollm2_path, recent=W, sinks=sinks)
    prefill(ref, tokens[:128])
    prefill(win, tokens[:128])
    a, b = decode(ref, tokens[128:200]), decode(win, tokens[128:200])
    assert ref.kv_lazy_info().phase == win.kv_lazy_info().phase == "f16"
    assert np.array_equal(a, b)


def test_window_brings_the_last_rung_closer_to_f16(model_path: Path) -> None:
    """On the q4_0 rung, decoding with the window is closer to an f16 cache than without it."""
    f16 = ladder(model_path, kv="f16")
    toks = corpus(f16, 760)
    runs = {}
    for name, llm in (("f16", f16), ("ladder", ladder(model_path)),
                      ("window", ladder(model_path, recent=128))):
        prefill(llm, toks[:600])
        runs[name] = decode(llm, toks[600:760])
        assert llm.kv_lazy_info().phase == ("disabled" if name == "f16" else "q4_0")
    plain = kld(runs["f16"], runs["ladder"]).mean()
    window = kld(runs["f16"], runs["window"]).mean()
    assert window < 0.9 * plain, (window, plain)


def test_sinks_bring_the_last_rung_closer_to_f16(smollm2_path: Path, tokens: list[int]) -> None:
    """On the q4_0 rung with the window, decoding with 4 sinks (each sequence's first tokens in f16, copied
    at the step from the f16 rung) is closer to an f16 cache than without them (measured here: KLD 0.0132
    against 0.0136; on llama-perplexity's 6,144 positions of each model, bench/results/frontier.md, 14 % and
    12 % lower). Gemma-3 is left to that report: over 160 decoded tokens its KLD moves by a fifth with the
    window's size alone (W=132 without sinks reads as W=128 with them)."""
    f16 = ladder(smollm2_path, kv="f16")
    runs = {}
    for name, llm in (("f16", f16), ("window", ladder(smollm2_path, recent=128)),
                      ("sinks", ladder(smollm2_path, recent=128, sinks=4))):
        prefill(llm, tokens[:600])
        runs[name] = decode(llm, tokens[600:760])
    window = kld(runs["f16"], runs["window"]).mean()
    sinks = kld(runs["f16"], runs["sinks"]).mean()
    assert sinks < window, (sinks, window)


def state_bytes(llm: Llama) -> bytes:
    size = llama_cpp.llama_state_get_size(llm.ctx)
    buf = (ctypes.c_uint8 * size)()
    n = llama_cpp.llama_state_get_data(llm.ctx, buf, size)
    return bytes(buf[:n])


def test_window_rows_are_the_rotated_f16_rows(smollm2_path: Path, tokens: list[int]) -> None:
    """The window holds each of the last W tokens' K and V rows rotated as the rung rotates them, in f16: read
    from a saved state (tests/native/state_blob.py, an independent reader) and compared, slot by slot, with
    the first layer's rows of an f16 cache that read the same tokens, rotated in NumPy. (The first layer's
    K and V depend on the tokens only; f16 rounding apart, they are the same numbers.)"""
    win, f16 = ladder(smollm2_path, recent=W), ladder(smollm2_path, kv="f16")
    for llm in (win, f16):
        prefill(llm, tokens[:600])
        decode(llm, tokens[600:620])
    _, (ws,) = parse_context_state(state_bytes(win))
    _, (fs,) = parse_context_state(state_bytes(f16))
    assert ws.recent == (W, W) and ws.window is not None and ws.n_rot_k and ws.n_rot_v
    positions = [ws.positions[c] for c in ws.window.cells]
    assert sorted(positions) == list(range(620 - W, 620))  # the last W tokens, one slot each
    rows = [fs.positions.index(p) for p in positions]
    for got, stored, n_rot in ((ws.window.k[0], fs.k[0], ws.n_rot_k), (ws.window.v[0], fs.v[0], ws.n_rot_v)):
        values = f16_values(stored)[rows].astype(np.float64)
        want = (values.reshape(len(rows), -1, n_rot) @ hadamard(n_rot)).reshape(values.shape)
        have = got.view(np.float16).astype(np.float64)
        assert np.abs(have - want).max() <= 4e-3 * np.abs(want).max()


def test_sink_rows_are_the_rotated_f16_rows(smollm2_path: Path, tokens: list[int]) -> None:
    """The sinks' slots (the first S of the ring) hold the first S positions' K and V rows, copied from the
    f16 rung at the first step and rotated on the host as the step rotates the cells: compared, as the
    window's rows above, with the first layer's rows of an f16 cache rotated in NumPy."""
    sinks = 4
    win, f16 = ladder(smollm2_path, recent=W, sinks=sinks), ladder(smollm2_path, kv="f16")
    for llm in (win, f16):
        prefill(llm, tokens[:600])
    _, (ws,) = parse_context_state(state_bytes(win))
    _, (fs,) = parse_context_state(state_bytes(f16))
    assert ws.recent == (W, W + sinks) and ws.sinks == sinks and ws.window is not None
    first = [i for i, j in enumerate(ws.window.slots) if j < sinks]
    assert [ws.positions[ws.window.cells[i]] for i in first] == [ws.window.slots[i] for i in first] == [
        0, 1, 2, 3]
    rows = [fs.positions.index(p) for p in range(sinks)]
    for got, stored, n_rot in ((ws.window.k[0], fs.k[0], ws.n_rot_k), (ws.window.v[0], fs.v[0], ws.n_rot_v)):
        values = f16_values(stored)[rows].astype(np.float64)
        want = (values.reshape(sinks, -1, n_rot) @ hadamard(n_rot)).reshape(values.shape)
        have = got[first].view(np.float16).astype(np.float64)
        assert np.abs(have - want).max() <= 4e-3 * np.abs(want).max()


# ---------------------------------------------------------------- sequence operations


def test_removed_tokens_never_answer_from_the_window(smollm2_path: Path, tokens: list[int]) -> None:
    """Remove the last tokens (inside the window) and decode the same ones again: the logits are those of the
    first pass, bit for bit - the removed tokens' slots were dropped, the new ones written (a stale slot
    would be attended beside the new one and change them)."""
    llm = ladder(smollm2_path, recent=512)  # nothing is evicted: the slots differ only by those dropped
    prefill(llm, tokens[:600])
    assert llm.kv_lazy_info().phase == "q4_0"
    first = decode(llm, tokens[600:640])
    llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(llm.ctx), 0, 620, -1)
    llm.n_tokens = 620
    again = decode(llm, tokens[620:640])
    assert np.array_equal(first[20:], again)


def test_other_tokens_in_removed_cells(smollm2_path: Path, tokens: list[int]) -> None:
    """New tokens where removed ones were (same positions, the same cells) answer as themselves: the same as
    in a cache that decoded them in the first place, with the same window contents."""
    a = ladder(smollm2_path, recent=512)
    b = ladder(smollm2_path, recent=512)
    prefill(a, tokens[:600])
    prefill(b, tokens[:600])
    decode(a, tokens[600:610])
    llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(a.ctx), 0, 600, -1)
    a.n_tokens = 600
    other = tokens[700:720]
    # a's window held 10 slots that were dropped: it has written 10 more slots than b, and with 512 slots
    # nothing was evicted from either, so both attend the same tokens in f16, in the same order
    assert np.array_equal(decode(a, other), decode(b, other))


@pytest.mark.parametrize("where", ["inside", "across"])
def test_seq_ops_around_the_window_stay_close_to_f16(smollm2_path: Path, tokens: list[int],
                                                     where: str) -> None:
    """Copy, keep, remove and shift inside the window and across its boundary: what is attended stays the
    cache's tokens (close to an f16 cache that went through the same operations)."""
    cut = 700 if where == "inside" else 560  # the window holds positions 636..699 after the prefill
    runs = {}
    for name, llm in (("f16", ladder(smollm2_path, kv="f16")), ("window", ladder(smollm2_path, recent=W))):
        mem = llama_cpp.llama_get_memory(llm.ctx)
        prefill(llm, tokens[:700])
        llama_cpp.llama_memory_seq_cp(mem, 0, 1, -1, -1)
        llama_cpp.llama_memory_seq_rm(mem, 0, cut - 20, cut)
        llama_cpp.llama_memory_seq_add(mem, 0, cut, -1, -20)
        llama_cpp.llama_memory_seq_keep(mem, 0)
        llm.n_tokens = 680
        runs[name] = decode(llm, tokens[700:740])
    assert kld(runs["f16"], runs["window"]).mean() < 0.05


# ---------------------------------------------------------------- saved states


@pytest.mark.parametrize("sinks", [0, 4])
def test_restore_continues_exactly(smollm2_path: Path, tokens: list[int], sinks: int) -> None:
    src = ladder(smollm2_path, recent=W, sinks=sinks)
    prefill(src, tokens[:600])
    decode(src, tokens[600:620])
    state = src.save_state()
    expected = decode(src, tokens[620:640])

    dst = ladder(smollm2_path, recent=W, sinks=sinks)
    assert dst.state_refusal(state) is None
    dst.load_state(state)
    assert dst.kv_lazy_info().phase == "q4_0"
    assert np.array_equal(decode(dst, tokens[620:640]), expected)


@pytest.mark.parametrize("saved,into", [(W, 2 * W), (W, 0), (0, W)])
def test_restore_with_another_window_starts_it_empty(smollm2_path: Path, tokens: list[int], saved: int,
                                                     into: int) -> None:
    """The window is a derived copy, optional in a state: a cache with another window, or none, reads the
    cells and passes over the saved window (its own starts empty, and fills again from the next token), so
    changing the window never costs a snapshot. The continuation stays with the source's."""
    src = ladder(smollm2_path, recent=saved)
    prefill(src, tokens[:600])
    state = src.save_state()
    want = decode(src, tokens[600:610])
    dst = ladder(smollm2_path, recent=into)
    assert dst.state_refusal(state) is None
    dst.load_state(state)
    assert dst.kv_lazy_info().phase == "q4_0" and dst.n_tokens == 600
    got = decode(dst, tokens[600:610])
    assert kld(want, got).mean() < 0.05 and (got.argmax(1) == want.argmax(1)).mean() >= 0.8


def test_sequence_restore_with_window(smollm2_path: Path, tokens: list[int]) -> None:
    """A sequence's state with its window slots, restored into the same kind of cache: the continuation
    matches the source's (the restored sequence is alone, its slots in the same order)."""
    src = ladder(smollm2_path, recent=W)
    prefill(src, tokens[:600])
    decode(src, tokens[600:620])
    state = src.save_state(seq_id=0)
    expected = decode(src, tokens[620:630])

    dst = ladder(smollm2_path, recent=W)
    dst.load_state(state)
    assert dst.kv_lazy_info().phase == "q4_0"
    # the same tokens in f16; the slots may be attended in another order (the source's ring had wrapped)
    assert kld(expected, decode(dst, tokens[620:630])).max() < 1e-6


# ---------------------------------------------------------------- one window per sequence


def two_sequences(model: RawModel, busy: int) -> np.ndarray:
    """Sequence 0 reads 600 tokens (the cache steps to 8-bit, then 4-bit); sequence 1 then decodes `busy`
    single tokens; sequence 0's next logits."""
    ctx = RawContext(model, KV_TYPES["q4_0"], n_ctx=N_CTX, n_seq=2, lazy=True, recent=W, n_threads=1)
    words = text_tokens(model, 7, 700)
    for i in range(0, 600, 128):
        ctx.decode(words[i:min(i + 128, 600)], seq_id=0)
    assert ctx.lazy_info().phase == "q4_0"
    other = text_tokens(model, 8, busy + 1)
    ctx.decode(other[:1], seq_id=1, pos0=0)
    for tok in other[1:]:
        ctx.decode([tok], seq_id=1)
    return ctx.decode(words[600:601], seq_id=0)


@pytest.fixture(scope="module")
def raw_model(smollm2_path: Path) -> RawModel:
    return RawModel(smollm2_path)


def test_a_busy_neighbour_leaves_a_sequences_window_as_it_was(raw_model: RawModel) -> None:
    """The window holds the last W tokens of each sequence: 200 tokens of sequence 1 after sequence 0's
    last one leave sequence 0's next logits exactly as with sequence 1 idle (one ring for all sequences let
    them evict sequence 0's rows: its logits then moved as far as having no window at all)."""
    idle = two_sequences(raw_model, busy=1)
    busy = two_sequences(raw_model, busy=200)
    np.testing.assert_array_equal(busy, idle)
