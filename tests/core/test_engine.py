"""EngineSession against the real engine and the real SmolLM2 model."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lazykv.core.engine import (
    EngineError,
    EngineSession,
    ModelNotFoundError,
    NoModelError,
    NotGGUFError,
    SamplingSettings,
    check_model_file,
)

N_CTX = 1024
GREEDY = SamplingSettings(temperature=0.0, seed=1)
HELLO = [{"role": "user", "content": "Hello! Who are you?"}]
LONG_ASK = [{"role": "user", "content": "Write a very long story about a dragon and a knight."}]


@pytest.fixture(scope="module")
def session(smollm2_path: Path) -> Iterator[EngineSession]:
    s = EngineSession()
    s.load(smollm2_path, n_ctx=N_CTX)
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
        assert s.load(smollm2_path, n_ctx=N_CTX, kv_mode="q8_0").kv_mode == "q8_0"
        assert "".join(s.stream_reply(HELLO, GREEDY, threading.Event(), max_tokens=24)).strip()
    finally:
        s.close()


def test_not_gguf_file_is_rejected(not_gguf: Path) -> None:
    with pytest.raises(NotGGUFError, match="not a GGUF model file"):
        EngineSession().load(not_gguf)


def test_missing_file_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="model file not found"):
        EngineSession().load(tmp_path / "absent.gguf")
    with pytest.raises(ModelNotFoundError):
        check_model_file(tmp_path)  # a directory is not a model file either


def test_failed_load_keeps_the_previous_model(session: EngineSession, not_gguf: Path) -> None:
    before = session.model_info()
    with pytest.raises(NotGGUFError):
        session.load(not_gguf)
    assert session.model_info() == before
    assert "".join(session.stream_reply(HELLO, GREEDY, threading.Event(), max_tokens=8)).strip()


def test_unknown_kv_mode_is_rejected(smollm2_path: Path) -> None:
    with pytest.raises(EngineError, match="unknown KV cache mode 'q4'"):
        EngineSession().load(smollm2_path, kv_mode="q4")


def test_lazy_kv_mode_loads_a_lazy_q8_0_cache(smollm2_path: Path) -> None:
    session = EngineSession()
    info = session.load(smollm2_path, n_ctx=1024, kv_mode="lazy")
    assert info.kv_mode == "lazy"
    assert "".join(session.stream_reply(HELLO, GREEDY, threading.Event(), max_tokens=8)).strip()


def test_reply_without_a_model_is_an_error() -> None:
    with pytest.raises(NoModelError):
        list(EngineSession().stream_reply(HELLO, GREEDY, threading.Event()))


def test_conversation_too_long_for_the_context_is_an_engine_error(session: EngineSession) -> None:
    huge = [{"role": "user", "content": "word " * (2 * N_CTX)}]
    with pytest.raises(EngineError, match="exceed context window"):
        list(session.stream_reply(huge, GREEDY, threading.Event(), max_tokens=8))
