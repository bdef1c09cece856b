"""A bounded load: 8 clients, 200 requests with small replies, a queue smaller than the crowd. Every request
gets an answer or a 429, none is lost, the server's memory stays flat after warm-up."""

from __future__ import annotations

import gc
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from lazykv.core.engine.memory import MiB, process_rss
from lazykv.core.history.keys import load_or_create_key
from lazykv.core.history.persistence import Crypto
from lazykv.core.history.snapshot import Encryption
from lazykv.server.service import Service

CLIENTS = 8
REQUESTS = 200
WARM_UP = 24
MAX_RSS_GROWTH = 50 * MiB
TIME_LIMIT_S = 400
BACK_OFF_S = 0.3

SYSTEM = "You answer with one word. " * 12  # past the API cache's 64 tokens: replies are saved too


@pytest.mark.slow
def test_eight_clients_two_hundred_requests(start: Callable[..., Service], tmp_path: Path) -> None:
    crypto = Crypto(Encryption.KEYRING, key=load_or_create_key())
    server = start(crypto, queue_size=4, cache_dir=tmp_path / "api-cache", cache_budget_bytes=24 * MiB)
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()
    issued = iter(range(REQUESTS))
    rss_after_warm_up: list[int] = []

    def ask(i: int) -> str:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Colour number {i}?"}]
        try:
            if i % 3 == 0:
                chunks = list(client.chat.completions.create(model="m", messages=messages, max_tokens=3,
                                                             stream=True, seed=i))
                assert chunks[-1].choices[0].finish_reason in ("stop", "length")
                return "streamed"
            reply = client.chat.completions.create(model="m", messages=messages, max_tokens=3, seed=i)
            assert reply.usage.completion_tokens <= 3
            return "answered"
        except openai.RateLimitError:
            time.sleep(BACK_OFF_S)  # as a client does after a 429 (the next request is another one)
            return "429"

    def worker() -> None:
        while True:
            with lock:
                i = next(issued, None)
            if i is None:
                return
            result = ask(i)
            with lock:
                outcomes[result] += 1
                if sum(outcomes.values()) == WARM_UP:
                    gc.collect()
                    rss_after_warm_up.append(process_rss())

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIME_LIMIT_S)
    elapsed = time.monotonic() - t0
    assert not any(t.is_alive() for t in threads), f"not done in {TIME_LIMIT_S} s: {outcomes}"
    assert sum(outcomes.values()) == REQUESTS, outcomes  # none lost
    assert outcomes["answered"] >= CLIENTS and outcomes["streamed"] >= 1, outcomes
    assert outcomes["429"] > 0, outcomes  # 8 clients on a queue of 4 are turned away at times
    gc.collect()
    growth = process_rss() - rss_after_warm_up[0]
    assert growth <= MAX_RSS_GROWTH, f"RSS grew {growth / MiB:.1f} MiB after warm-up"
    deadline = time.monotonic() + 30  # the last answer is out before its snapshot is saved
    while server.access.pending:
        assert time.monotonic() < deadline, "the engine did not finish"
        time.sleep(0.01)
    stats = server.cache.stats()
    assert stats.bytes <= stats.budget
    print(f"load: {dict(outcomes)} in {elapsed:.1f} s, RSS growth {growth / MiB:+.1f} MiB, "
          f"API cache {stats.entries} entries")
