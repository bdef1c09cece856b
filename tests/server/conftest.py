"""Servers over the 135M SmolLM2 on 127.0.0.1, ephemeral ports, small contexts and replies."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest

from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.history.persistence import Crypto
from lazykv.core.history.snapshot import Encryption
from lazykv.server.service import Service
from lazykv.server.settings import ServerSettings
from tests.native.rawctx import engine_threads

N_CTX = 1024
API_KEY = "test-key-0123456789"


@pytest.fixture(scope="module")
def session(smollm2_path: Path) -> Iterator[EngineSession]:
    """One loaded engine per test module (a server's thread owns it while the server runs)."""
    s = EngineSession()
    s.load(LoadSpec(smollm2_path, n_ctx=N_CTX, kv_mode="f16", n_threads=engine_threads()))
    yield s
    s.close()


@pytest.fixture
def start(session: EngineSession, tmp_path: Path) -> Iterator[Callable[..., Service]]:
    """Start a server over ``session`` with these settings (no API cache unless a cache_dir is given);
    every one started is stopped at the end."""
    started: list[Service] = []

    def _start(crypto: Crypto | None = None, **settings: object) -> Service:
        settings.setdefault("port", 0)
        service = Service(ServerSettings(**settings), session, crypto, log_level="warning")
        started.append(service)
        service.start()
        return service

    yield _start
    for service in started:
        service.stop()
    session.clear_kv()


@pytest.fixture
def server(start: Callable[..., Service]) -> Service:
    return start()


@pytest.fixture
def client(server: Service) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)


def plain() -> Crypto:
    return Crypto(Encryption.NONE)
