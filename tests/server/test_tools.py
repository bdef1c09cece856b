"""Tool calling through the official ``openai`` client, on the demo model (SmolLM2's template knows no tools:
the generic format): a required call validates against the tool's schema, whole and streamed; a round trip
call -> result -> answer reuses the cache; bad tool definitions get a 400 naming the field."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_weather(arguments: str) -> dict[str, Any]:
    """WEATHER's schema by hand (jsonschema is not installed)."""
    args = json.loads(arguments)
    assert set(args) == {"city", "unit"}, args
    assert isinstance(args["city"], str) and len(args["city"]) <= 40
    assert args["unit"] in ("celsius", "fahrenheit")
    return args


def test_required_returns_a_call_whose_arguments_validate(client: openai.OpenAI) -> None:
    for seed in (1, 2):
        reply = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, TIME],
                                               tool_choice="required", max_tokens=96, seed=seed,
                                               temperature=1.0)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice.message
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.id and call.function.name in ("get_weather", "get_time")
        if call.function.name == "get_weather":
            check_weather(call.function.arguments)


def test_a_named_function_is_the_one_called_and_streams_as_deltas(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model="m", messages=ASK, tools=[TIME, WEATHER], max_tokens=96, seed=3, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    parts = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert parts and parts[0].id and parts[0].function.name == "get_weather" and parts[0].index == 0
    arguments = "".join(p.function.arguments or "" for p in parts)
    check_weather(arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_a_round_trip_call_result_answer_reuses_the_cache(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=96, seed=4)
    call = first.choices[0].message.tool_calls[0]
    follow = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": call.id, "name": call.function.name,
               "content": "Sunny and 21 degrees."}]
    answer = client.chat.completions.create(model="m", messages=follow, tools=[WEATHER], tool_choice="none",
                                            max_tokens=32, seed=4)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    assert answer.usage.prompt_tokens_details.cached_tokens > 0
    streamed = list(client.chat.completions.create(
        model="m", messages=follow, tools=[WEATHER], tool_choice="none", max_tokens=32, seed=4, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text.strip()  # the answer streamed (a fresh sample: not compared with the whole one)
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_auto_lets_the_model_decide_and_whatever_it_does_parses(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], max_tokens=48, seed=5)
    message = reply.choices[0].message
    if message.tool_calls:
        assert reply.choices[0].finish_reason == "tool_calls"
        check_weather(message.tool_calls[0].function.arguments)
    else:
        assert message.content and reply.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
])
def test_bad_tool_requests_get_a_400_naming_the_field(client: openai.OpenAI, body: dict[str, Any],
                                                      param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=ASK, max_tokens=8, **body)
    assert err.value.body["param"] == param, err.value.body  # type: ignore[index]


def test_a_tool_result_without_its_call_id_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="tool_call_id"):
        client.chat.completions.create(model="m", max_tokens=8, messages=[
            *ASK, {"role": "tool", "content": "Sunny"}])  # type: ignore[list-item]
