"""The local API through the official ``openai`` client (and raw HTTP for what a client never sends)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
import openai
import pytest

from lazykv.core.engine.engine import EngineSession
from lazykv.server.service import Service
from tests.server.conftest import API_KEY

CHAT = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name a fruit."}]


def test_models_and_health(client: openai.OpenAI, server: Service) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct.Q4_1"]
    health = httpx.get(server.base_url.removesuffix("/v1") + "/health").json()
    assert health["status"] == "ok" and health["queue"] == 0


def test_chat_whole_and_streamed_give_the_same_reply_with_a_seed(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="anything", messages=CHAT, max_tokens=8, seed=7,
                                           temperature=0.7)
    assert whole.choices[0].finish_reason in ("length", "stop")
    assert whole.choices[0].message.role == "assistant" and whole.choices[0].message.content
    usage = whole.usage
    assert usage.prompt_tokens > 10 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    if whole.choices[0].finish_reason == "length":
        assert usage.completion_tokens == 8
    chunks = list(client.chat.completions.create(model="x", messages=CHAT, max_tokens=8, seed=7,
                                                 temperature=0.7, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == usage.prompt_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason


def test_completions_whole_and_streamed(client: openai.OpenAI) -> None:
    whole = client.completions.create(model="m", prompt="The capital of France is", max_tokens=6, seed=3)
    assert whole.object == "text_completion" and whole.usage.completion_tokens >= 1
    pieces = list(client.completions.create(model="m", prompt="The capital of France is", max_tokens=6,
                                            seed=3, stream=True))
    assert "".join(p.choices[0].text for p in pieces) == whole.choices[0].text


def test_a_request_extending_the_previous_one_reuses_its_cache(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model="m", messages=CHAT, max_tokens=6, seed=1)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    longer = [*CHAT, {"role": "assistant", "content": first.choices[0].message.content},
              {"role": "user", "content": "Another one?"}]
    second = client.chat.completions.create(model="m", messages=longer, max_tokens=6, seed=1)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens - 1 <= cached < second.usage.prompt_tokens


def test_fields_real_clients_send_are_accepted(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "developer", "content": "Be brief."},
                                  {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        max_completion_tokens=4, n=1, user="someone", presence_penalty=0.5, frequency_penalty=0.2,
        logit_bias={"42": 1}, response_format={"type": "text"}, top_p=0.9, stop=["\n\n"],
        stream_options=None, extra_body={"unknown_field": {"nested": True}},
    )
    assert reply.usage.completion_tokens <= 4


@pytest.mark.parametrize(("body", "param"), [
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "12"}', "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000000000000000000000}',
     "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}', "temperature"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "n": 2}', "n"),
    (b'{"messages": [{"role": "robot", "content": "hi"}]}', "messages.0.role"),
    (b'{"messages": []}', "messages"),
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', None),  # no Unicode: refused as JSON
    (b'{"messages": [{"role": "user", "content": "hi"}], "stop": 5}', "stop"),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url", '
     b'"image_url": {"url": "file:///etc/passwd"}}]}]}', "messages.0.content"),
])
def test_malformed_values_get_a_400_naming_the_field(server: Service, body: bytes, param: str | None
                                                     ) -> None:
    answer = httpx.post(f"{server.base_url}/chat/completions", content=body,
                        headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


@pytest.mark.parametrize("body", [b"{", b"[1, 2]", b"\xff\xfe{}", b"", b'{"prompt": "a", "prompt": 5}'])
def test_bodies_that_are_no_json_object_get_a_400_and_the_server_goes_on(server: Service, body: bytes,
                                                                       client: openai.OpenAI) -> None:
    answer = httpx.post(f"{server.base_url}/completions", content=body)
    assert answer.status_code == 400 and answer.json()["error"]["message"]
    assert client.completions.create(model="m", prompt="Hello", max_tokens=2).usage.completion_tokens >= 1


def test_an_unknown_route_and_method_have_the_error_shape(server: Service) -> None:
    assert httpx.get(f"{server.base_url}/embeddings").json()["error"]["code"] == "not_found"
    assert httpx.get(f"{server.base_url}/chat/completions").status_code == 405


def test_a_prompt_longer_than_the_context_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="m", prompt="word " * 2000, max_tokens=4)
    assert refused.value.body["code"] == "context_length_exceeded"


def test_an_empty_prompt_is_refused_and_the_server_goes_on(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:  # SmolLM2 adds no BOS: no token at all
        client.completions.create(model="m", prompt="", max_tokens=2)
    assert refused.value.body["code"] == "empty_prompt"
    assert client.completions.create(model="m", prompt="Hi", max_tokens=2).usage.completion_tokens >= 1


def test_a_body_over_the_limit_gets_413(start: Callable[..., Service]) -> None:
    server = start(max_body_bytes=4096)
    answer = httpx.post(f"{server.base_url}/completions", json={"prompt": "x" * 5000, "max_tokens": 1})
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "request_too_large"

    def chunks():  # no content-length: counted as it arrives
        for _ in range(10):
            yield b"x" * 1000

    answer = httpx.post(f"{server.base_url}/completions", content=chunks())
    assert answer.status_code == 413


def test_max_tokens_is_capped(start: Callable[..., Service]) -> None:
    server = start(max_tokens_cap=3)
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    reply = client.completions.create(model="m", prompt="Count: one, two, three,", max_tokens=500,
                                      temperature=0)
    assert reply.usage.completion_tokens <= 3


def test_the_api_key_is_required_when_set(start: Callable[..., Service]) -> None:
    server = start(api_key=API_KEY)
    for key in ("wrong", API_KEY[:-1], API_KEY + "x"):
        with pytest.raises(openai.AuthenticationError) as refused:
            openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0).models.list()
        assert refused.value.status_code == 401 and refused.value.body["code"] == "invalid_api_key"
    assert httpx.get(f"{server.base_url}/models").status_code == 401  # no header at all
    good = openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)
    assert good.models.list().data
    assert httpx.get(server.base_url.removesuffix("/v1") + "/health").status_code == 200


def test_cors_is_off_unless_an_origin_is_allowed(start: Callable[..., Service]) -> None:
    headers = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
    closed = start()
    answer = httpx.options(f"{closed.base_url}/chat/completions", headers=headers)
    assert "access-control-allow-origin" not in answer.headers
    opened = start(cors_origins=("http://localhost:3000",))
    allowed = httpx.options(f"{opened.base_url}/chat/completions",
                            headers={**headers, "Origin": "http://localhost:3000"})
    assert allowed.headers["access-control-allow-origin"] == "http://localhost:3000"
    refused = httpx.options(f"{opened.base_url}/chat/completions", headers=headers)
    assert "access-control-allow-origin" not in refused.headers


def test_a_full_queue_answers_429_and_then_serves_again(start: Callable[..., Service]) -> None:
    server = start(queue_size=1)
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=60)
    stream = client.completions.create(model="m", prompt="Once upon a time", max_tokens=500, stream=True)
    next(iter(stream))  # the first request runs
    with pytest.raises(openai.RateLimitError) as busy:
        client.completions.create(model="m", prompt="Hi", max_tokens=2)
    assert busy.value.body["code"] == "queue_full" and busy.value.response.headers["retry-after"]
    stream.close()
    _wait_until(lambda: server.access.pending == 0)
    assert client.completions.create(model="m", prompt="Hi", max_tokens=2).usage.completion_tokens >= 1


def test_a_client_gone_mid_stream_stops_its_generation(start: Callable[..., Service],
                                                        session: EngineSession) -> None:
    server = start()
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=60)
    stream = client.completions.create(model="m", prompt="Once upon a time", max_tokens=600,
                                       temperature=1.0, stream=True)
    pieces = iter(stream)
    next(pieces), next(pieces)
    stream.close()
    _wait_until(lambda: server.access.pending == 0, timeout=5)
    assert len(session.cached_tokens()) < 100  # far from the 600 asked for: stopped when the client went
    assert client.completions.create(model="m", prompt="Hi", max_tokens=2).usage.completion_tokens >= 1


def test_a_client_gone_while_waiting_for_a_whole_reply_stops_it(start: Callable[..., Service],
                                                                session: EngineSession) -> None:
    server = start()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/completions", timeout=0.5,
                   json={"prompt": "Once upon a time", "max_tokens": 900, "temperature": 1.0})
    _wait_until(lambda: server.access.pending == 0, timeout=5)
    assert len(session.cached_tokens()) < 900


def _wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_requests_from_many_threads_are_each_answered(server: Service) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=60)
    answers: list[str] = []

    def ask(i: int) -> None:
        try:
            answers.append(client.completions.create(model="m", prompt=f"{i} +", max_tokens=2).object)
        except openai.RateLimitError:
            answers.append("429")

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 12 and set(answers) <= {"text_completion", "429"}
    assert "text_completion" in answers
