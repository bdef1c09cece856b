"""Both test models given tools through the engine (their templates know none: the generic format, through
SmolLM2's own template and Gemma-3's built-in one): the tools are in the prompt, a required call is held
to the tool's schema by the grammar and read back as a call."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.tool_calls import ToolRequest
from lazykv.core.engine.types import SamplingSettings
from tests.native.rawctx import engine_threads

ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers",
                                        "parameters": {"type": "object", "properties": {
                                            "a": {"type": "integer"}, "b": {"type": "integer"}},
                                            "required": ["a", "b"], "additionalProperties": False}}}
GREEDY = SamplingSettings(temperature=0.0, top_p=1.0, top_k=1, min_p=0.0, repeat_penalty=1.0, seed=1)


def test_a_required_call_is_written_in_the_schema_and_read_back(model_path: Path) -> None:
    s = EngineSession()
    s.load(LoadSpec(model_path, n_ctx=1024, kv_mode="f16", n_threads=engine_threads()))
    try:
        messages = [{"role": "user", "content": "What is 2 + 3?"}]
        prompt = s.chat_prompt(messages, tools=ToolRequest((ADD,), "required"))
        plain = s.chat_prompt(messages)
        assert len(prompt.tokens) > len(plain.tokens) and prompt.grammar is not None
        assert '"add"' in s._llama.detokenize(prompt.tokens).decode()  # type: ignore[union-attr]
        stream = s.stream_tokens(prompt.tokens, prompt.stop, GREEDY, threading.Event(), 64, prompt.grammar,
                                 prompt.special)
        while True:
            try:
                next(stream)
            except StopIteration as end:
                result = end.value
                break
        reply = s.parse_reply(result.text, prompt)
        assert [c["function"]["name"] for c in reply.tool_calls] == ["add"], result.text
        args = json.loads(reply.tool_calls[0]["function"]["arguments"])
        assert set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values())
    finally:
        s.close()
