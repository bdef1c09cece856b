"""EngineSession against the real engine and the real SmolLM2 model."""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.model_load import check_model_file
from lazykv.core.engine.types import (
    CancelledError,
    KvModeError,
    ModelNotFoundError,
    NoModelError,
    NotGGUFError,
    ReplyResult,
    SamplingSettings,
    StepEvent,
)
from lazykv.core.errors import ContextFullError, EngineError
from lazykv.core.kinds import KvMode

N_CTX = 1024
GREEDY = SamplingSettings(temperature=0.0, seed=1)
HELLO = [{"role": "user", "content": "Hello! Who are you?"}]
LONG_ASK = [{"role": "user", "content": "Write a very long story about a dragon and a knight."}]


@pytest.fixture(scope="module")
def session(smollm2_path: Path) -> Iterator[EngineSession]:
    s = EngineSession()
    s.load(LoadSpec(smollm2_path, n_ctx=N_CTX, kv_mode=KvMode.F16))
    yield s
    s.close()


@pytest.fixture
def not_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "notes.gguf"
    path.write_bytes(b"PK\x03\x04 this is a zip file, not a model")
    return path


def test_model_info_describes_the_loaded_model(session: EngineSession, smollm2_path: Path) -> None:
    info = session.model_info()
    assert info.path == smollm2_path
    assert info.name == "SmolLM2-135M-Instruct.Q4_1"
    assert info.architecture == "llama"
    assert 100e6 < info.n_params < 200e6
    assert info.n_ctx_train >= N_CTX
    assert info.n_ctx == N_CTX
    assert info.file_size == smollm2_path.stat().st_size
    assert info.kv_mode == "f16"
    assert info.meta.head_k == 64 and info.n_threads >= 1


def test_stream_reply_streams_text_pieces(session: EngineSession) -> None:
    pieces = list(session.stream_reply(HELLO, GREEDY, threading.Event(), max_tokens=24))
    assert len(pieces) > 1
    text = "".join(pieces)
    assert text.strip()
    assert "<|im_end|>" not in text and "<|im_start|>" not in text


def test_same_seed_same_reply(session: EngineSession) -> None:
    sampling = SamplingSettings(temperature=0.8, seed=1234)
    first = "".join(session.stream_reply(HELLO, sampling, threading.Event(), max_tokens=16))
    second = "".join(session.stream_reply(HELLO, sampling, threading.Event(), max_tokens=16))
    assert first == second


def test_cancel_stops_within_one_token(session: EngineSession) -> None:
    cancel = threading.Event()
    pieces = []
    for piece in session.stream_reply(LONG_ASK, GREEDY, cancel, max_tokens=200):
        pieces.append(piece)
        if len(pieces) == 3:
            cancel.set()
    assert len(pieces) == 3


def test_session_still_replies_after_a_cancel(session: EngineSession) -> None:
    cancel = threading.Event()
    cancel.set()
    assert list(session.stream_reply(HELLO, GREEDY, cancel, max_tokens=24)) == []
    assert "".join(session.stream_reply(HELLO, GREEDY, threading.Event(), max_tokens=24)).strip()


def test_q8_0_kv_cache_replies(smollm2_path: Path) -> None:
    s = EngineSession()
    try:
        assert s.load(LoadSpec(smollm2_path, n_ctx=N_CTX, kv_mode="q8_0")).kv_mode == "q8_0"
        assert "".join(s.stream_reply(HELLO, GREEDY, threading.Event(), max_tokens=24)).strip()
    finally:
        s.close()


def test_not_gguf_file_is_rejected(not_gguf: Path) -> None:
    with pytest.raises(NotGGUFError, match="not a GGUF model file") as refused:
        EngineSession().load(LoadSpec(not_gguf))
    assert "magic" not in str(refused.value) and "magic" in refused.value.details


def test_missing_file_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="model file not found"):
        EngineSession().load(LoadSpec(tmp_path / "absent.gguf"))
    with pytest.raises(ModelNotFoundError):
        check_model_file(tmp_path)  # a directory is not a model file either


def test_failed_load_keeps_the_previous_model(session: EngineSession, not_gguf: Path) -> None:
    before = session.model_info()
    with pytest.raises(NotGGUFError):
        session.load(LoadSpec(not_gguf))
    assert session.model_info() == before
    assert "".join(session.stream_reply(HELLO, GREEDY, threading.Event(), max_tokens=8)).strip()


def test_unknown_kv_mode_is_rejected(smollm2_path: Path) -> None:
    with pytest.raises(EngineError, match="unknown KV cache mode 'q4'"):
        EngineSession().load(LoadSpec(smollm2_path, kv_mode="q4"))


def test_lazy_kv_mode_loads_a_lazy_q8_0_cache(smollm2_path: Path) -> None:
    session = EngineSession()
    info = session.load(LoadSpec(smollm2_path, n_ctx=1024, kv_mode="lazy", kv_recent=0))
    assert info.kv_mode == "lazy"
    assert "".join(session.stream_reply(HELLO, GREEDY, threading.Event(), max_tokens=8)).strip()


def test_reply_without_a_model_is_an_error() -> None:
    with pytest.raises(NoModelError):
        list(EngineSession().stream_reply(HELLO, GREEDY, threading.Event()))


def test_conversation_too_long_for_the_context_is_an_engine_error(session: EngineSession) -> None:
    huge = [{"role": "user", "content": "word " * (2 * N_CTX)}]
    with pytest.raises(ContextFullError, match=r"no longer fits the context of 1024 tokens"):
        list(session.stream_reply(huge, GREEDY, threading.Event(), max_tokens=8))


def run(stream: Generator[str, None, ReplyResult]) -> tuple[list[str], ReplyResult]:
    pieces = []
    while True:
        try:
            pieces.append(next(stream))
        except StopIteration as end:
            return pieces, end.value


def test_reply_result_reports_the_prompt_and_the_reused_prefix(session: EngineSession) -> None:
    pieces, first = run(session.stream_reply(HELLO, GREEDY, threading.Event(), max_tokens=12))
    assert first.text == "".join(pieces) and first.finish_reason == "length" and not first.cancelled
    follow_up = [*HELLO, {"role": "assistant", "content": first.text}, {"role": "user", "content": "And?"}]
    _, second = run(session.stream_reply(follow_up, GREEDY, threading.Event(), max_tokens=4))
    assert second.n_prompt > first.n_prompt
    # the first prompt is still in the cache: only the new turn is read
    assert second.n_reused >= first.n_prompt
    edited = [{"role": "user", "content": "Hello! Who are you? Be brief."}]
    _, third = run(session.stream_reply(edited, GREEDY, threading.Event(), max_tokens=4))
    assert 0 < third.n_reused < third.n_prompt


def test_cancelled_reply_says_so(session: EngineSession) -> None:
    cancel = threading.Event()
    stream = session.stream_reply(LONG_ASK, GREEDY, cancel, max_tokens=100)
    next(stream)
    cancel.set()
    _, result = run(stream)
    assert result.cancelled


def test_drop_oldest_policy_drops_turns_and_says_which(smollm2_path: Path) -> None:
    s = EngineSession()
    try:
        s.load(LoadSpec(smollm2_path, n_ctx=256, kv_mode=KvMode.F16))
        long_turns = []
        for i in range(6):
            long_turns += [{"role": "user", "content": f"Question {i}: " + "tell me more " * 12},
                           {"role": "assistant", "content": "Here is more. " * 10}]
        system = {"role": "system", "content": "Be brief."}
        messages = [system, *long_turns, {"role": "user", "content": "Hi"}]
        _, result = run(s.stream_reply(messages, GREEDY, threading.Event(), max_tokens=8,
                                       context_full="drop_oldest"))
        assert result.dropped and result.dropped[0] == long_turns[0]
        assert result.n_prompt + 8 <= 256
        with pytest.raises(ContextFullError):
            list(s.stream_reply(messages, GREEDY, threading.Event(), max_tokens=8, context_full="stop"))
    finally:
        s.close()


@pytest.mark.parametrize("kv_mode", ["f16", "q8_0"])
def test_kv_status_of_a_plain_cache(smollm2_path: Path, kv_mode: str) -> None:
    s = EngineSession()
    try:
        s.load(LoadSpec(smollm2_path, n_ctx=512, kv_mode=kv_mode, kv_recent=0))
        empty = s.kv_status()
        assert (empty.phase, empty.n_cells_used, empty.n_cells_total) == (kv_mode, 0, 512)
        assert not s.step_kv_now()
        _, result = run(s.stream_reply(HELLO, GREEDY, threading.Event(), max_tokens=4))
        status = s.kv_status()
        assert status.n_cells_used == result.n_prompt + 3  # the last sampled token is not decoded
        assert 0 < status.kv_bytes_used < status.kv_bytes
    finally:
        s.close()


def test_lazy_cache_status_and_idle_conversion_with_progress(smollm2_path: Path) -> None:
    s = EngineSession()
    events: list[tuple[StepEvent, str]] = []
    s.set_step_listener(lambda e: events.append((e, threading.current_thread().name)))
    try:
        s.load(LoadSpec(smollm2_path, n_ctx=1024, kv_mode="lazy", kv_recent=0))
        run(s.stream_reply(HELLO, GREEDY, threading.Event(), max_tokens=4))
        before = s.kv_status()
        assert (before.phase, before.n_cells_capacity, before.n_cells_total) == ("f16", 512, 1024)
        assert s.step_kv_now()
        after = s.kv_status()
        assert (after.phase, after.n_cells_capacity, after.n_steps) == ("q8_0", 1024, 1)
        assert after.n_cells_used == before.n_cells_used and after.kv_bytes == before.kv_bytes
        stages = [e.stage for e, _ in events]
        assert stages[0] == "start" and stages[-1] == "end" and set(stages[1:-1]) == {"progress"}
        assert [e.done for e, _ in events] == sorted(e.done for e, _ in events)
        assert events[-1][0].fraction == 1.0 and events[-1][0].n_cells == before.n_cells_used
        assert {name for _, name in events} == {threading.current_thread().name}
        assert not s.step_kv_now()
        # the conversation goes on in q8_0
        assert "".join(s.stream_reply(HELLO, GREEDY, threading.Event(), max_tokens=4)).strip()
    finally:
        s.close()


def test_q8_0_without_flash_attention_is_refused_with_the_reason(smollm2_path: Path) -> None:
    with pytest.raises(KvModeError, match="needs flash attention"):
        EngineSession().load(LoadSpec(smollm2_path, n_ctx=256, kv_mode="lazy", flash_attn=False))


class CancelAfterPolls(threading.Event):
    """A cancel token that turns itself on at its ``n``-th look once armed: the context's abort callback
    looks once per graph node, so this cancels in the middle of a decode, deterministically."""

    def __init__(self, n: int, armed: bool = True) -> None:
        super().__init__()
        self.polls, self._n, self.armed = 0, n, armed

    def is_set(self) -> bool:
        if self.armed:
            self.polls += 1
        return self.polls >= self._n or super().is_set()


LONG_PROMPT = [{"role": "user", "content": "Summarise this: " + "the sea is calm tonight " * 150}]


def test_cancel_stops_a_prompt_while_it_is_being_read(session: EngineSession) -> None:
    """The prompt (over 700 tokens: two batches) is aborted inside its first batch's graph."""
    session.clear_kv()
    cancel = CancelAfterPolls(50)
    pieces, result = run(session.stream_reply(LONG_PROMPT, GREEDY, cancel, max_tokens=8))
    assert result.cancelled and pieces == [] and result.n_prompt > 700
    assert session.kv_status().n_cells_used < result.n_prompt  # stopped before the prompt was read
    assert cancel.polls >= 50
    _, reference = run(session.stream_reply(HELLO, GREEDY, threading.Event(), max_tokens=12))
    session.clear_kv()
    _, fresh = run(session.stream_reply(HELLO, GREEDY, threading.Event(), max_tokens=12))
    assert reference.text == fresh.text and not reference.cancelled  # nothing of the aborted read lingers


def test_rebuild_can_be_cancelled_and_keeps_what_it_read(session: EngineSession) -> None:
    progress: list[tuple[int, int]] = []
    cancel = CancelAfterPolls(50, armed=False)

    def on_progress(done: int, total: int) -> None:
        progress.append((done, total))
        cancel.armed = done >= 256  # abort inside the third chunk's graph

    with session.cancellable(cancel), pytest.raises(CancelledError):
        session.rebuild_kv(LONG_PROMPT, on_progress, chunk=128)
    done, total = progress[-1]
    assert done == 256 < total
    assert session.kv_status().n_cells_used == done  # the chunks read stay cached, the aborted one does not
    _, reply = run(session.stream_reply(LONG_PROMPT, GREEDY, threading.Event(), max_tokens=4))
    assert reply.n_reused >= done - 1 and not reply.cancelled


def test_a_request_cancelled_before_it_starts_reads_nothing(session: EngineSession) -> None:
    session.clear_kv()
    cancel = threading.Event()
    cancel.set()
    _, result = run(session.stream_reply(HELLO, GREEDY, cancel, max_tokens=8))
    assert result.cancelled and session.kv_status().n_cells_used == 0



def test_re_reading_a_conversation_longer_than_the_context_formats_only_its_head(
    session: EngineSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17.14: re-reading 4,000 messages tokenized all of them (a second of the engine thread, with
    100,000 minutes nothing could stop) to keep the first n_ctx - 1 tokens."""
    conversation = [{"role": "system", "content": "Be brief."}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Message {i}: a few words here."}
        for i in range(4000)]
    full = session._prompt(conversation, add_generation_prompt=False).tokens
    formatted: list[int] = []
    prompt = session._prompt
    monkeypatch.setattr(session, "_prompt", lambda messages, **kw: (formatted.append(len(messages)),
                                                                     prompt(messages, **kw))[1])
    n = session.rebuild_kv(conversation, lambda done, total: None)
    assert n == N_CTX - 1 and session._llama.input_ids[:n].tolist() == full[:n]  # the same head
    assert max(formatted) < len(conversation) // 10
