"""Tools through llama.cpp's ``common/chat`` (``llama_cpp.llama_chat``), from the template files of the
common families (tests/data/chat_templates, no model): the tools and a tool result are rendered into the
prompt, and a reply in the family's own call format is parsed into OpenAI's ``tool_calls``. And the generic
format for templates that know no tools (the demo models)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from llama_cpp import llama_chat

from lazykv.core.engine import tool_calls
from lazykv.core.engine.tool_calls import DeltaTracker, ReplyParser, ToolRequest

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "chat_templates"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_ID = "abc123XYZ"
ANSWERED = [*ASK,
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": CALL_ID, "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
            {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": "Sunny, 21 C"}]
# each family's own way of writing the call
FAMILIES = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                                      "</tool_call>",
    "Qwen-Qwen3-0.6B.jinja": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                             "</tool_call>",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": '<tool_call>\n{"name": "get_weather", "arguments": '
                                                         '{"city": "Paris"}}\n</tool_call>',
    "meta-llama-Llama-3.1-8B-Instruct.jinja": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "meta-llama-Llama-3.2-3B-Instruct.jinja": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": '[TOOL_CALLS][{"name": "get_weather", "arguments": '
                                                  f'{{"city": "Paris"}}, "id": "{CALL_ID}"}}]',
}


def templates(name: str) -> llama_chat.ChatTemplates:
    source = (TEMPLATES / name).read_text()
    return llama_chat.ChatTemplates(template=source, bos_token="<s>", eos_token="</s>")


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_family_renders_tools_and_results_and_parses_its_call(name: str) -> None:
    t = templates(name)
    assert t.caps["supports_tool_calls"]
    out = t.apply(tool_calls.common_request(ASK, ToolRequest((WEATHER,)), add_generation_prompt=True))
    assert "get_weather" in out["prompt"] and "The weather of a city" in out["prompt"]
    reply = tool_calls.parse(FAMILIES[name], ReplyParser("common", out["parser"]))
    assert [c["function"]["name"] for c in reply.tool_calls] == ["get_weather"]
    assert json.loads(reply.tool_calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert reply.tool_calls[0]["id"] and not reply.content
    follow = t.apply(tool_calls.common_request(ANSWERED, ToolRequest((WEATHER,)), add_generation_prompt=True))
    assert "Sunny, 21 C" in follow["prompt"]
    assert follow["prompt"].startswith(out["prompt"][: len(out["prompt"]) // 2])  # the prefix a cache reuses


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_plain_text_from_a_family_is_content(name: str) -> None:
    out = templates(name).apply(tool_calls.common_request(ASK, ToolRequest((WEATHER,)), True))
    reply = tool_calls.parse("It is sunny.", ReplyParser("common", out["parser"]))
    assert reply.content == "It is sunny." and not reply.tool_calls


def test_required_gives_a_grammar_from_the_first_token_and_auto_a_lazy_one() -> None:
    t = templates("Qwen-Qwen2.5-7B-Instruct.jinja")
    lazy = t.apply(tool_calls.common_request(ASK, ToolRequest((WEATHER,), "auto"), True))
    forced = t.apply(tool_calls.common_request(ASK, ToolRequest((WEATHER,), "required"), True))
    assert lazy["grammar"] and lazy["grammar_lazy"] and (lazy["trigger_words"] or lazy["trigger_patterns"])
    assert forced["grammar"] and not forced["grammar_lazy"]
    none = t.apply(tool_calls.common_request(ASK, ToolRequest((WEATHER,), "none"), True))
    assert "get_weather" not in none["prompt"] and not none["grammar"]


N = 100_000
# a crafted GGUF's template: parse errors, and nesting that overflowed the stack of llama.cpp's Jinja engine
# until patch 0025 bounded it (each of the last eight was a segfault)
BROKEN = ["{% for %}", "{{ messages[0].content | nosuchfilter }}", "{% if %}{% endif", "{{ " * 2000,
          "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",
          "{% macro m() %}{% call m() %}x{% endcall %}{% endmacro %}{{ m() }}",
          "{{ " + "(" * N + "1" + ")" * N + " }}",
          "{% if true %}" * N + "{% endif %}" * N,
          "{{ 1" + " | string" * N + " }}",
          "{{ " + "-" * N + "1 }}",
          "{% set a = [] %}{% set _ = a.append(a) %}{{ a | tojson }}",
          "{% set ns = namespace(a=[]) %}{% for i in range(2000) %}{% set ns.a = [ns.a] %}{% endfor %}"
          "{{ ns.a }}"]


def test_broken_templates_are_refused_with_a_reason_never_an_abort() -> None:
    """Hostile template sources (a crafted GGUF's): each is refused with a reason, in a child process (an
    abort fails this test, not pytest), on a thread with 512 KiB of stack (macOS's default for a thread)."""
    script = (
        "import json, sys, threading\n"
        "from llama_cpp import llama_chat\n"
        "def render(src):\n"
        "    try:\n"
        "        t = llama_chat.ChatTemplates(template=src, bos_token='<s>', eos_token='</s>')\n"
        "        t.apply({'messages': [{'role': 'user', 'content': 'Hi'}]})\n"
        "        print('rendered', flush=True)\n"
        "    except llama_chat.ChatTemplateError as err:\n"
        "        print('refused', bool(str(err)), flush=True)\n"
        "threading.stack_size(512 * 1024)\n"
        "for src in json.load(sys.stdin):\n"
        "    worker = threading.Thread(target=render, args=(src,))\n"
        "    worker.start()\n"
        "    worker.join()\n")
    done = subprocess.run([sys.executable, "-c", script], input=json.dumps(BROKEN), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:len(BROKEN)] == ["refused True"] * len(BROKEN), done.stdout


def test_a_recursive_macro_as_deep_as_real_templates_go_still_renders() -> None:
    t = llama_chat.ChatTemplates(
        template="{% macro m(k) %}{% if k > 0 %}{{ m(k - 1) }}{% else %}{{ messages[0].content }}{% endif %}"
                 "{% endmacro %}{{ m(50) }}", bos_token="<s>", eos_token="</s>")
    assert t.apply({"messages": [{"role": "user", "content": "Hi"}]})["prompt"] == "Hi"


# --- the generic format ---------------------------------------------------------------------------------


def test_generic_messages_describe_the_tools_and_write_calls_and_results_as_turns() -> None:
    out = tool_calls.generic_messages([{"role": "system", "content": "Be brief."}, *ANSWERED[1:]],
                                      ToolRequest((WEATHER,)))
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Be brief.")
    assert "get_weather" in out[0]["content"] and '"tool_call"' in out[0]["content"]
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert json.loads(out[1]["content"]) == {"tool_call": call}
    assert out[2] == {"role": "user", "content": "Tool result (get_weather):\nSunny, 21 C"}
    assert all(set(m) == {"role", "content"} for m in out)


def test_generic_grammar_is_lazy_for_auto_and_whole_when_a_call_is_required() -> None:
    auto = tool_calls.generic_grammar(ToolRequest((WEATHER,)))
    required = tool_calls.generic_grammar(ToolRequest((WEATHER,), "required"))
    assert auto is not None and auto.lazy and required is not None and not required.lazy
    assert tool_calls.generic_grammar(ToolRequest((WEATHER,), "none")) is None
    assert '"get_weather"' in required.gbnf.replace("\\", "")


def test_generic_parse_reads_a_call_holds_back_a_call_being_written_and_keeps_text() -> None:
    call = tool_calls.parse_generic('{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}')
    assert call.tool_calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert len(call.tool_calls[0]["id"]) == 9 and call.tool_calls[0]["id"].isalnum()
    assert tool_calls.parse_generic('{"tool_ca', partial=True).content == ""
    assert tool_calls.parse_generic("{not json", partial=False).content == "{not json"
    assert tool_calls.parse_generic("Hello", partial=True).content == "Hello"
    assert tool_calls.parse_generic('{"answer": 1}').content == '{"answer": 1}'


def test_deltas_stream_content_then_a_call_with_its_arguments_growing() -> None:
    tracker = DeltaTracker()
    first = tool_calls.ParsedReply("Let me check", ())
    assert tracker.deltas(first) == [{"content": "Let me check"}]
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"ci'}}
    d = tracker.deltas(tool_calls.ParsedReply("Let me check", (call,)))
    assert d[0]["tool_calls"][0]["id"] == "c1" and d[1]["tool_calls"][0]["function"]["arguments"] == '{"ci'
    grown = {**call, "id": "other", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    d = tracker.deltas(tool_calls.ParsedReply("Let me check", (grown,)))
    assert d == [{"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Paris"}'}}]}]
    assert tracker.ids() == ["c1"]


@pytest.mark.parametrize(("tool", "field"), [
    ({"type": "function"}, "tools[0].function"),
    ({"type": "function", "function": {"name": "has space"}}, "tools[0].function.name"),
    ({"type": "retrieval", "function": {"name": "x"}}, "tools[0].type"),
    ({"type": "function", "function": {"name": "x", "parameters": "object"}}, "tools[0].function.parameters"),
    ({"type": "function", "function": {"name": "x", "parameters": {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 3}}}}}, "tools[0].function.parameters"),
])
def test_a_bad_tool_is_refused_naming_its_field(tool: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        tool_calls.check_tools([tool])
