"""Fuzzed request bodies (Hypothesis): whatever arrives gets an answer or a 4xx with a reason in OpenAI's
shape, never a 5xx, and the server keeps serving."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lazykv.server.service import Service

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool", ""]) | st.text(max_size=8)
CONTENT = st.text(max_size=60) | st.lists(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]) | JSON, "text": st.text(max_size=20)
                           | JSON}), max_size=2) | JSON
MESSAGE = st.fixed_dictionaries({"role": ROLES, "content": CONTENT}) | JSON
SAMPLING = {
    "model": st.text(max_size=10) | JSON,
    "max_tokens": st.integers(-5, 10**30) | JSON,
    "temperature": st.floats(-1, 3) | st.integers(-2, 3) | JSON,
    "top_p": st.floats(-1, 2) | JSON,
    "seed": st.integers(-(2**70), 2**70) | JSON,
    "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=20) | JSON,
    "stream": st.booleans() | JSON,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | JSON}) | JSON,
    "n": st.integers(-1, 3) | JSON,
    "presence_penalty": st.floats(-3, 3) | JSON,
    "logit_bias": JSON,
    "user": st.text(max_size=10) | JSON,
    "response_format": JSON,
}
CHAT = st.fixed_dictionaries({}, optional={"messages": st.lists(MESSAGE, max_size=3) | JSON, **SAMPLING})
COMPLETION = st.fixed_dictionaries({}, optional={"prompt": st.text(max_size=60) | JSON, **SAMPLING})


def _check(server: Service, route: str, body: bytes) -> None:
    with httpx.stream("POST", f"{server.base_url}/{route}", content=body, timeout=60,
                      headers={"content-type": "application/json"}) as answer:
        text = answer.read().decode("utf-8")
    assert answer.status_code in (200, 400), (answer.status_code, text)
    if answer.status_code == 400:
        error = json.loads(text)["error"]
        assert isinstance(error["message"], str) and error["message"] and error["type"]
    elif answer.headers["content-type"].startswith("text/event-stream"):
        assert "data: [DONE]" in text and '"error"' not in text, text
    else:
        assert json.loads(text)["usage"]["completion_tokens"] <= 2


@pytest.fixture
def fuzzed(start: Callable[..., Service]) -> Service:
    return start(max_tokens_cap=2)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=CHAT)
def test_fuzzed_chat_bodies(fuzzed: Service, body: dict) -> None:
    _check(fuzzed, "chat/completions", json.dumps(body).encode("utf-8"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=COMPLETION)
def test_fuzzed_completion_bodies(fuzzed: Service, body: dict) -> None:
    _check(fuzzed, "completions", json.dumps(body).encode("utf-8"))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=200) | st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_fuzzed_raw_bytes(fuzzed: Service, body: bytes) -> None:
    _check(fuzzed, "chat/completions", body)
    assert httpx.get(fuzzed.base_url.removesuffix("/v1") + "/health").json()["status"] == "ok"
