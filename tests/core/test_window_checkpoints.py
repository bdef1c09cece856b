"""Gemma-3 (15 of its 18 layers attend through a 512-token window) with a window-sized cache: the memory it
allocates, and going back (a regenerate, an edit, a branch) through the window checkpoints taken at the ends
of replies, reading only what follows the nearest one."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from lazykv.core.engine import memory
from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.model_meta import read_model_meta
from lazykv.core.engine.types import SamplingSettings
from tests.native.rawctx import engine_threads

GREEDY = SamplingSettings(temperature=0.0, top_p=1.0, top_k=1, min_p=0.0, repeat_penalty=1.0, seed=1)
TEXT = Path("/usr/share/common-licenses/GPL-3")


def reply(s: EngineSession, tokens: list[int], max_tokens: int = 16) -> tuple[str, int]:
    stream = s.stream_tokens(tokens, [], GREEDY, threading.Event(), max_tokens=max_tokens)
    while True:
        try:
            next(stream)
        except StopIteration as end:
            return end.value.text, end.value.n_reused


def test_gemma3s_sliding_layers_hold_their_window(gemma3_path: Path) -> None:
    meta = read_model_meta(gemma3_path)
    assert (meta.swa_layers, meta.n_layer, meta.sliding_window) == (15, 18, 512)
    assert memory.swa_cells(meta, 32768) == 1024 and memory.swa_cells(meta, 512) == 512
    whole = 18 * 32768 * memory._layer_values(meta)
    assert memory.kv_bytes(meta, 32768, "f16") == (3 * 32768 + 15 * 1024) * memory._layer_values(meta) * 2
    assert memory.kv_bytes(meta, 32768, "f16") < whole * 2 / 5  # a fifth of the full-size cache's bytes
    budget = memory.kv_bytes(meta, 32768, "q8_0")
    assert memory.context_for_budget(meta, budget, "q8_0") == 32768
    s = EngineSession()
    info = s.load(LoadSpec(gemma3_path, n_ctx=32768, kv_mode="q8_0", n_threads=engine_threads()))
    try:
        allocated = sum(m.kv for m in info.memory)  # what llama.cpp allocated (its memory breakdown)
        assert abs(allocated - memory.kv_bytes(meta, 32768, "q8_0")) <= 0.05 * allocated, allocated
    finally:
        s.close()


@pytest.mark.parametrize("kv_mode", ["f16", "lazy"])
def test_an_edit_far_past_the_window_goes_back_to_the_last_replys_end(gemma3_path: Path,
                                                                       kv_mode: str) -> None:
    s = EngineSession()
    s.load(LoadSpec(gemma3_path, n_ctx=4096, kv_mode=kv_mode, n_threads=engine_threads()))
    try:
        text = s.tokenize(TEXT.read_text())
        reply(s, text[:1500])  # a first turn and its reply: a checkpoint at the reply's end
        first = s.cached_tokens()
        reply(s, first + text[1500:2300])  # an 800-token turn: the window has moved past the first's end
        edited = first + text[2500:2600]  # that turn edited: back to the first reply's end
        answer, n_reused = reply(s, edited)
        assert n_reused == len(first) and answer.strip()  # only the edited turn is read
        s._checkpoints.keep = 0  # without checkpoints: everything again
        s._checkpoints.clear()
        reply(s, first + text[1500:2300])
        assert reply(s, edited)[1] == 0
    finally:
        s.close()


def test_a_branch_from_the_live_parent_far_back_reads_from_the_nearest_checkpoint(gemma3_path: Path) -> None:
    s = EngineSession()
    s.load(LoadSpec(gemma3_path, n_ctx=4096, kv_mode="f16", n_threads=engine_threads()))
    try:
        text = s.tokenize(TEXT.read_text())
        reply(s, text[:1200])
        point = len(s.cached_tokens())
        reply(s, s.cached_tokens() + text[1200:2000])
        assert s.keep_kv_prefix(point)  # 800 tokens back: the checkpoint at the first reply's end
        assert s.cached_tokens() == (text[:1200] + s.cached_tokens()[1200:])[:point]
        assert len(s.cached_tokens()) == point
    finally:
        s.close()


def test_a_snapshot_carries_its_checkpoints_so_a_restored_chat_goes_back_without_a_re_read(
        gemma3_path: Path) -> None:
    s, other = EngineSession(), EngineSession()
    spec = LoadSpec(gemma3_path, n_ctx=4096, kv_mode="lazy", n_threads=engine_threads())
    s.load(spec)
    other.load(spec)
    try:
        text = s.tokenize(TEXT.read_text())
        reply(s, text[:1500])
        first = s.cached_tokens()
        reply(s, first + text[1500:2300])
        snapshot = s.capture_kv()
        other.restore_kv(snapshot.tokens, snapshot.state)
        assert other.cached_tokens() == snapshot.tokens
        assert len(first) in other._checkpoints.positions
        edited = first + text[2500:2600]
        answer, n_reused = reply(other, edited)
        assert n_reused == len(first) and answer.strip()  # back to the first reply's end, not from 0
        assert not other.keep_kv_prefix(len(first) - 10)  # before the first checkpoint: none fits
        damaged = bytearray(snapshot.state)[:-100]  # a checkpoint cut short: restored without it
        other.restore_kv(snapshot.tokens, bytes(damaged))
        assert other._checkpoints.positions == [] and other.cached_tokens() == snapshot.tokens
    finally:
        s.close()
        other.close()


def test_a_re_read_leaves_checkpoints_at_its_last_messages_ends(gemma3_path: Path) -> None:
    s = EngineSession()
    s.load(LoadSpec(gemma3_path, n_ctx=4096, kv_mode="lazy", n_threads=engine_threads()))
    try:
        words = TEXT.read_text().split()
        messages = [{"role": "user" if i % 2 == 0 else "assistant",
                     "content": " ".join(words[i * 300:(i + 1) * 300])} for i in range(6)]
        n = s.rebuild_kv(messages, lambda done, total: None)
        ends = [len(s.transcript_tokens(messages[:i])) for i in range(4, 6)]
        assert s._checkpoints.positions == [*ends, n]  # the last messages' ends, the last the whole
        assert s.keep_kv_prefix(ends[0])  # a branch at the fourth message from the open chat: its checkpoint
        assert len(s.cached_tokens()) == ends[0]
    finally:
        s.close()
