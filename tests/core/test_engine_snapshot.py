"""EngineSession.capture_kv / restore_kv / rebuild_kv: resume where an uninterrupted session would be."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.types import KvRestoreError, SamplingSettings

GREEDY = SamplingSettings(temperature=0.0, seed=1)
N_CTX = 1024
SHORT = "Hello! Who are you?"
MEDIUM = "Here is a list: " + ", ".join(f"item {i}" for i in range(60)) + ". Which item comes first?"  # ~330
LONG = "Here is a list: " + ", ".join(f"item {i}" for i in range(120)) + ". Which item comes first?"  # ~650
CASES = {  # kv mode, first message: the lazy cache before and after its conversion, the ladder on each step
    "f16": ("f16", SHORT),
    "q8_0": ("q8_0", SHORT),
    "lazy-before": ("lazy", SHORT),
    "lazy-after": ("lazy", LONG),
    "ladder-f16": ("ladder", SHORT),
    "ladder-q8_0": ("ladder", MEDIUM),
    "ladder-q4_0": ("ladder", LONG),
}
PHASES = {"lazy-before": "f16", "lazy-after": "q8_0", "ladder-f16": "f16", "ladder-q8_0": "q8_0",
          "ladder-q4_0": "q4_0"}


def reply(session: EngineSession, messages: list[dict[str, str]], n: int = 12) -> tuple[str, int]:
    stream = session.stream_reply(messages, GREEDY, threading.Event(), max_tokens=n)
    while True:
        try:
            next(stream)
        except StopIteration as end:
            return end.value.text, end.value.n_reused


def first_turn(session: EngineSession, message: str) -> list[dict[str, str]]:
    user = [{"role": "user", "content": message}]
    text, _ = reply(session, user)
    return [*user, {"role": "assistant", "content": text}, {"role": "user", "content": "Say that again."}]


# on Gemma-3 (iSWA, head size 256) the cases whose cells are quantized when saved; the f16 ones are
# SmolLM2's here and both models' in tests/native (test_state_restore, test_lazy_restore)
GEMMA3_CASES = ("q8_0", "lazy-after", "ladder-q4_0")


@pytest.mark.parametrize(
    ("model", "case"),
    [("smollm2", case) for case in CASES] + [("gemma3", case) for case in GEMMA3_CASES],
)
def test_restored_cache_continues_exactly_like_the_uninterrupted_session(
    model: str, case: str, smollm2_path: Path, gemma3_path: Path
) -> None:
    model_path = smollm2_path if model == "smollm2" else gemma3_path
    kv_mode, message = CASES[case]
    a = EngineSession()
    a.load(LoadSpec(model_path, n_ctx=N_CTX, kv_mode=kv_mode, kv_recent=0))
    conversation = first_turn(a, message)
    saved = a.capture_kv()
    expected, _ = reply(a, conversation)
    a.close()
    assert saved.layout.lazy_phase == PHASES.get(case, "disabled")

    b = EngineSession()
    try:
        b.load(LoadSpec(model_path, n_ctx=N_CTX, kv_mode=kv_mode, kv_recent=0))
        b.restore_kv(saved.tokens, saved.state)
        got, reused = reply(b, conversation)
        assert got == expected
        assert reused >= len(saved.tokens) - 1  # the conversation came from the cache, not re-read
    finally:
        b.close()


def test_refused_restore_leaves_an_empty_cache_and_rebuild_reads_the_transcript(smollm2_path: Path) -> None:
    a = EngineSession()
    a.load(LoadSpec(smollm2_path, n_ctx=N_CTX, kv_mode="lazy", kv_recent=0))
    conversation = first_turn(a, LONG)  # converted: q8_0 cells cannot go into an f16 cache
    saved = a.capture_kv()
    expected, _ = reply(a, conversation)
    a.close()

    b = EngineSession()
    try:
        b.load(LoadSpec(smollm2_path, n_ctx=N_CTX, kv_mode="f16"))
        with pytest.raises(KvRestoreError, match="K/V type mismatch: the state stores K/V as q8_0"):
            b.restore_kv(saved.tokens, saved.state)
        assert b.kv_status().n_cells_used == 0
        progress: list[tuple[int, int]] = []
        n = b.rebuild_kv(conversation[:-1], lambda done, total: progress.append((done, total)))
        assert progress[0] == (0, n) and progress[-1] == (n, n) and len(progress) >= 3
        got, reused = reply(b, conversation)
        assert reused >= n - 1
        assert got.strip()  # an f16 cache may word it differently from the q8_0 one
    finally:
        b.close()


def test_damaged_state_bytes_are_refused(smollm2_path: Path) -> None:
    s = EngineSession()
    try:
        s.load(LoadSpec(smollm2_path, n_ctx=N_CTX, kv_recent=0))
        first_turn(s, SHORT)
        saved = s.capture_kv()
        with pytest.raises(KvRestoreError, match="damaged"):
            s.restore_kv(saved.tokens, b"\xff\xff\xff\xff{")
        with pytest.raises(KvRestoreError):
            s.restore_kv(saved.tokens, saved.state[: len(saved.state) // 2])
        assert s.kv_status().n_cells_used == 0
    finally:
        s.close()
