"""The API cache across restarts: a conversation's next turn after a restart reads only its new part, and
answers as it would have without the restart; a snapshot of another model setting or key is never used."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.history.keys import load_or_create_key
from lazykv.core.history.persistence import Crypto
from lazykv.core.history.snapshot import Encryption, read_header
from lazykv.server.prefix_cache import API_CONVERSATION_ID, SUFFIX
from lazykv.server.service import Service
from lazykv.server.settings import ServerSettings
from tests.native.rawctx import engine_threads

SYSTEM = ("You are a helpful assistant who answers questions about gardening. Keep answers short, "
          "practical and friendly, and mention the season when it matters. ") * 3
TURN_1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "When do I plant tulips?"}]


@pytest.fixture
def run(smollm2_path: Path, tmp_path: Path) -> Iterator:
    """run(crypto, n_ctx=..., kv=...) -> (service, client): a fresh engine and server ("a restart")."""
    running: list[tuple[Service, EngineSession]] = []

    def _run(crypto: Crypto, n_ctx: int = 1024, kv: str = "f16", budget: int = 2**30):
        for service, session in running:  # one at a time: the previous one stops first
            service.stop()
            session.close()
        running.clear()
        session = EngineSession()
        session.load(LoadSpec(smollm2_path, n_ctx=n_ctx, kv_mode=kv, n_threads=engine_threads(), kv_recent=0))
        settings = ServerSettings(port=0, cache_dir=tmp_path / "api-cache", cache_budget_bytes=budget)
        service = Service(settings, session, crypto, log_level="warning")
        service.start()
        running.append((service, session))
        return service, openai.OpenAI(base_url=service.base_url, api_key="x", max_retries=0, timeout=60)

    yield _run
    for service, session in running:
        service.stop()
        session.close()


def _turn(client: openai.OpenAI, messages: list[dict[str, str]]):
    return client.chat.completions.create(model="m", messages=messages, max_tokens=12, seed=11,
                                          temperature=0.8)


def _idle(service: Service) -> None:
    """Wait for the engine to finish the request (the snapshot is saved after the answer is out)."""
    deadline = time.monotonic() + 30
    while service.access.pending:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_the_next_turn_after_a_restart_reuses_the_snapshot_and_answers_the_same(run) -> None:
    crypto = Crypto(Encryption.KEYRING, key=load_or_create_key())
    service, client = run(crypto)
    first = _turn(client, TURN_1)
    turn_2 = [*TURN_1, {"role": "assistant", "content": first.choices[0].message.content},
              {"role": "user", "content": "And daffodils?"}]
    before = _turn(client, turn_2)
    _idle(service)
    files = list(service.cache.folder.glob(f"*{SUFFIX}"))
    assert files and all(read_header(f).conversation_id == API_CONVERSATION_ID for f in files)
    assert all(read_header(f).encryption == Encryption.KEYRING for f in files)

    service, client = run(crypto)  # a new engine, a new server: only the files are left
    after = _turn(client, turn_2)
    cached = after.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 1, (cached, first.usage)
    assert after.choices[0].message.content == before.choices[0].message.content
    assert service.cache.counters.restored == 1


@pytest.mark.parametrize("other", [{"n_ctx": 2048}, {"kv": "q8_0"}])
def test_a_snapshot_of_another_context_or_kv_mode_is_never_restored(run, other: dict) -> None:
    crypto = Crypto(Encryption.KEYRING, key=load_or_create_key())
    _, client = run(crypto)
    _turn(client, TURN_1)
    service, client = run(crypto, **other)
    again = _turn(client, TURN_1)
    assert again.usage.prompt_tokens_details.cached_tokens == 0
    assert service.cache.counters.restored == 0 and service.cache.counters.refused == 0  # never looked at


def test_a_snapshot_under_another_key_is_refused_and_the_request_still_answered(run) -> None:
    _, client = run(Crypto(Encryption.KEYRING, key=load_or_create_key()))
    first = _turn(client, TURN_1)
    service, client = run(Crypto(Encryption.KEYRING, key=b"\x01" * 32))
    # the keyed prefix hashes differ too: the other key's entries are never even found
    again = _turn(client, TURN_1)
    assert again.usage.prompt_tokens_details.cached_tokens == 0
    assert again.choices[0].message.content == first.choices[0].message.content


def test_a_tampered_snapshot_is_refused_and_dropped(run) -> None:
    crypto = Crypto(Encryption.KEYRING, key=load_or_create_key())
    service, client = run(crypto)
    first = _turn(client, TURN_1)
    _idle(service)
    (path,) = service.cache.folder.glob(f"*{SUFFIX}")
    data = bytearray(path.read_bytes())
    data[-40] ^= 0x01
    path.write_bytes(bytes(data))
    service, client = run(crypto)
    again = _turn(client, TURN_1)
    _idle(service)
    assert again.choices[0].message.content == first.choices[0].message.content
    assert service.cache.counters.refused == 1 and again.usage.prompt_tokens_details.cached_tokens == 0
    assert service.cache.counters.saved == 1  # dropped, then saved anew by this reply


def test_the_budget_evicts_the_least_recently_used(run) -> None:
    crypto = Crypto(Encryption.NONE)
    service, client = run(crypto)
    _turn(client, TURN_1)
    _idle(service)
    assert len(service.cache.entries()) == 1
    budget = int(service.cache.stats().bytes * 2.5)  # room for two: their files and pieces
    service, client = run(crypto, budget=budget)
    for question in ("Roses?", "Lilies?", "Basil?"):
        topic = f"Today's topic: {question} " + SYSTEM  # no block in common with the others
        _turn(client, [{"role": "system", "content": topic}, {"role": "user", "content": question}])
    _idle(service)
    assert len(service.cache.entries()) == 2
    assert service.cache.stats().bytes <= budget
    assert service.cache.counters.evicted >= 1
