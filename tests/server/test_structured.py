"""Structured output (``response_format``) through the official ``openai`` client: the reply parses and,
for a schema, validates; a schema the grammar cannot enforce, or a malformed format, gets a 400."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from lazykv.core.engine import structured
from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.types import SamplingSettings
from lazykv.server.engine_access import Event, Generation, RequestFailed, answer
from lazykv.server.service import Service

ASK = [{"role": "system", "content": "You answer in JSON."},
       {"role": "user", "content": "Describe a cat: its name, its age and its mood."}]
PET = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "mood": {"enum": ["happy", "sleepy", "grumpy"]},
    },
    "required": ["name", "age", "mood"],
    "additionalProperties": False,
}
PET_FORMAT = {"type": "json_schema", "json_schema": {"name": "pet", "schema": PET, "strict": True}}


def check_pet(reply: dict[str, Any]) -> None:
    """PET by hand (jsonschema is not installed): every field, its type, the enum, nothing else."""
    assert set(reply) == {"name", "age", "mood"}
    assert isinstance(reply["name"], str) and len(reply["name"]) <= 12
    assert isinstance(reply["age"], int) and not isinstance(reply["age"], bool)
    assert reply["mood"] in ("happy", "sleepy", "grumpy")


def test_json_object_reply_parses(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="m", messages=ASK, max_tokens=96, seed=5, temperature=0.9,
                                           response_format={"type": "json_object"})
    assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_json_schema_reply_validates_whole_and_streamed(client: openai.OpenAI) -> None:
    for seed in (1, 2):
        reply = client.chat.completions.create(model="m", messages=ASK, max_tokens=64, seed=seed,
                                               temperature=1.0, response_format=PET_FORMAT)
        assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
        check_pet(json.loads(reply.choices[0].message.content))
    chunks = list(client.chat.completions.create(model="m", messages=ASK, max_tokens=64, seed=3,
                                                 temperature=1.0, response_format=PET_FORMAT, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check_pet(json.loads(text))
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_cut_reply_says_length_and_a_follow_up_reuses_the_cache(client: openai.OpenAI) -> None:
    cut = client.chat.completions.create(model="m", messages=ASK, max_tokens=3, seed=1,
                                         response_format=PET_FORMAT)
    assert cut.choices[0].finish_reason == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.choices[0].message.content)
    first = client.chat.completions.create(model="m", messages=ASK, max_tokens=64, seed=1,
                                           response_format=PET_FORMAT)
    longer = [*ASK, {"role": "assistant", "content": first.choices[0].message.content},
              {"role": "user", "content": "Another cat?"}]
    second = client.chat.completions.create(model="m", messages=longer, max_tokens=64, seed=1,
                                            response_format=PET_FORMAT)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
    check_pet(json.loads(second.choices[0].message.content))


def test_text_format_changes_nothing(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model="m", messages=ASK, max_tokens=12, seed=9)
    text = client.chat.completions.create(model="m", messages=ASK, max_tokens=12, seed=9,
                                          response_format={"type": "text"})
    assert text.choices[0].message.content == plain.choices[0].message.content


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


@pytest.mark.parametrize(("schema", "keyword"), [
    ({"$ref": "https://example.com/pet.json"}, "$ref"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "$ref"),
    ({"type": "object", "patternProperties": {"^x": {"type": "string"}}}, "patternProperties"),
    ({"type": "strin"}, "type"),
    ({"type": "integer", "minimum": 3}, "minimum"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}, "required"),
    ({"type": "string", "format": "email"}, "format"),
    ({"type": "string", "pattern": "abc"}, "pattern"),
    ({"type": "array", "items": {"type": "string"}, "maxItems": 10**9}, "maxItems"),
    ({"not": {"type": "string"}}, "not"),
])
def test_a_schema_the_grammar_cannot_enforce_is_refused(client: openai.OpenAI, schema: dict[str, Any],
                                                        keyword: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", messages=ASK, max_tokens=8,
                                       response_format=schema_format(schema))
    err = caught.value.body
    assert f"'{keyword}'" in err["message"], err
    assert err["param"] == "response_format.json_schema.schema" and err["type"] == "invalid_request_error"


@pytest.mark.parametrize(("response_format", "param"), [
    ({"type": "json"}, "response_format.type"),
    ({"type": "json_schema"}, "response_format"),
    ({"type": "json_schema", "json_schema": {"schema": PET}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "pet", "schema": "object"}},
     "response_format.json_schema.schema"),
    ("json_object", "response_format"),
])
def test_a_malformed_response_format_is_refused(server: Service, response_format: Any, param: str) -> None:
    answer = httpx.post(f"{server.base_url}/chat/completions", timeout=30,
                        json={"messages": ASK, "max_tokens": 4, "response_format": response_format})
    assert answer.status_code == 400
    err = answer.json()["error"]
    assert err["param"] == param and param in err["message"], err


def test_the_grammar_keeps_strings_valid_json() -> None:
    """The converter's string character admits raw control characters; the grammar used does not."""
    grammar = structured.schema_grammar(PET)
    char = next(line for line in grammar.splitlines() if line.startswith("char ::="))
    assert "\\x00-\\x1F" in char
    assert "\\x00-\\x1F" in structured.json_object_grammar()


def test_list_types_and_single_all_of_are_rewritten_so_each_part_is_enforced() -> None:
    optional = structured.schema_grammar({"type": "object", "properties": {
        "note": {"type": ["string", "null"], "maxLength": 3}}, "required": ["note"]})
    assert "null" in optional and "char (char (char)?)?" in optional.replace("\n", " ")
    wrapped = structured.schema_grammar({"$defs": {"m": {"enum": ["a", "b"]}},
                                         "allOf": [{"$ref": "#/$defs/m"}]})
    assert '"\\"a\\""' in wrapped and '"{"' not in wrapped


def test_a_grammar_llama_cpp_cannot_parse_is_a_400_before_anything_is_read(session: EngineSession) -> None:
    events: list[Event] = []
    job = Generation(None, "Once upon a time", SamplingSettings(seed=1), 4, [], events.append,
                     grammar='root ::= "a" (')
    answer(session, None, job)
    assert len(events) == 1 and isinstance(events[0], RequestFailed) and events[0].status == 400
    assert "response_format" in events[0].message
