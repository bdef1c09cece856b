"""Tools offered to the model and the calls it makes (Qt-free): OpenAI's ``tools`` and ``tool_choice``.

A model whose chat template knows tools (Qwen, Llama 3.x, Mistral, Hermes, ...) is spoken to by llama.cpp's
own ``common/chat`` (``llama_cpp.llama_chat``): the template renders the tools and the tool turns, a lazy
grammar holds a call to the tool's schema from its first marker on, and its parser reads the reply. A
template that knows none (the demo models: SmolLM2, Gemma-3) gets the *generic* format defined here: the
tools described in the system prompt, a call written as one JSON object
``{"tool_call": {"name", "arguments"}}`` (``{"tool_calls": [...]}`` when parallel calls are allowed),
held to the tools' schemas by a grammar, lazily from ``{"tool_call`` on (``auto``) or from the first
character (``required`` or a named function).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from llama_cpp import llama_chat

from lazykv.core.engine import structured
from lazykv.core.engine.types import PromptError

ToolChoice = Literal["auto", "none", "required"]
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

GENERIC_PROMPT = (
    "You can call tools. To call one, answer with nothing but one JSON object: "
    '{{"{key}": {example}}}, its arguments following the tool\'s JSON schema. {otherwise}'
    "A tool's result comes back in a message that starts with \"Tool result\".\n\nThe tools:\n{tools}"
)
GENERIC_RESULT = "Tool result ({name}):\n{content}"
CALL_KEY, CALLS_KEY = "tool_call", "tool_calls"
OPENERS = ('{"tool_call', '{"tool_calls')


@dataclass(frozen=True)
class ToolRequest:
    """The tools a reply may call and how: ``choice`` auto (the model decides), none, required (at least
    one call); ``function``: a named function (tool_choice {"type": "function", ...}): that one is called."""

    tools: tuple[Mapping[str, Any], ...]  # OpenAI's {"type": "function", "function": {...}}
    choice: ToolChoice = "auto"
    function: str | None = None
    parallel: bool = False

    @property
    def offered(self) -> tuple[Mapping[str, Any], ...]:
        """The tools the model sees: only the named function when one is named; none for "none"."""
        if self.choice == "none":
            return ()
        if self.function is not None:
            return tuple(t for t in self.tools if t["function"]["name"] == self.function)
        return self.tools

    @property
    def forced(self) -> bool:
        return self.function is not None or self.choice == "required"


@dataclass(frozen=True)
class Grammar:
    """A GBNF grammar (root rule ``root``); lazy when it applies only from a trigger on: a regular
    expression matched by the reply so far, or a word (one token when the vocabulary has it as one)."""

    gbnf: str
    trigger_patterns: tuple[str, ...] = ()
    trigger_words: tuple[str, ...] = ()

    @property
    def lazy(self) -> bool:
        return bool(self.trigger_patterns or self.trigger_words)


@dataclass(frozen=True)
class ReplyParser:
    """How a reply is read back: llama.cpp's parser (``common``: its opaque description), the generic
    one, or none (plain text)."""

    kind: Literal["plain", "common", "generic"]
    common: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedReply:
    """A reply as OpenAI's assistant message: its text and the calls it makes (OpenAI's shape, ids set)."""

    content: str
    tool_calls: tuple[dict[str, Any], ...] = ()
    reasoning: str = ""

    def message(self) -> dict[str, Any]:
        content = self.content or (None if self.tool_calls else "")
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if self.tool_calls:
            msg["tool_calls"] = [dict(call) for call in self.tool_calls]
        return msg


CALL_ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def new_call_id() -> str:
    """A tool call's id: 9 letters and digits, the one shape every template takes (Mistral's insists)."""
    return "".join(secrets.choice(CALL_ID_CHARS) for _ in range(9))


class ToolError(ValueError):
    """A malformed tool; ``field`` names where ("tools[0].function.name")."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"'{field}' {why}")
        self.field = field


def check_tools(tools: Sequence[Mapping[str, Any]]) -> None:
    """ToolError naming the field of the first malformed tool (the API answers 400 with it)."""
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if tool.get("type") != "function":
            raise ToolError(f"{where}.type", 'must be "function"')
        fn = tool.get("function")
        if not isinstance(fn, Mapping):
            raise ToolError(f"{where}.function", "must be an object with a 'name'")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ToolError(f"{where}.function.name", "must be 1-64 letters, digits, '_' or '-'")
        if name in seen:
            raise ToolError(f"{where}.function.name", f"{name!r} names two tools")
        seen.add(name)
        if "description" in fn and not isinstance(fn["description"], str):
            raise ToolError(f"{where}.function.description", "must be a string")
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, Mapping):
            raise ToolError(f"{where}.function.parameters", "must be a JSON schema object")
        try:
            structured.schema_grammar(dict(params))
        except structured.SchemaError as err:
            raise ToolError(f"{where}.function.parameters", f"cannot be enforced: {err}") from None


# --- the generic format ---------------------------------------------------------------------------------


def generic_messages(messages: Sequence[Mapping[str, Any]], request: ToolRequest | None
                     ) -> list[dict[str, str]]:
    """``messages`` for a template that knows no tools: the tools described in the system prompt,
    earlier calls written as the JSON the model answers with, results as user turns."""
    out: list[dict[str, str]] = []
    for m in messages:
        role = m["role"]
        if role == "tool":
            name = m.get("name") or "tool"
            content = GENERIC_RESULT.format(name=name, content=m.get("content") or "")
            if out and out[-1]["role"] == "user" and out[-1]["content"].startswith("Tool result"):
                out[-1] = {"role": "user", "content": out[-1]["content"] + "\n\n" + content}
            else:
                out.append({"role": "user", "content": content})
        elif role == "assistant" and m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": _arguments(c["function"].get("arguments"))}
                     for c in m["tool_calls"]]
            body = {CALL_KEY: calls[0]} if len(calls) == 1 else {CALLS_KEY: calls}
            out.append({"role": "assistant", "content": json.dumps(body, ensure_ascii=False)})
        else:
            out.append({"role": role, "content": _text(m.get("content"))})
    offered = request.offered if request is not None else ()
    if offered:
        system = _generic_system(request, offered)  # type: ignore[arg-type]
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{system}"}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


def _generic_system(request: ToolRequest, offered: Sequence[Mapping[str, Any]]) -> str:
    described = json.dumps([{"name": t["function"]["name"],
                             "description": t["function"].get("description", ""),
                             "parameters": t["function"].get("parameters", {"type": "object"})}
                            for t in offered], ensure_ascii=False, indent=1)
    key = CALLS_KEY if request.parallel else CALL_KEY
    one = '{"name": "<tool name>", "arguments": {...}}'
    example = f"[{one}, ...]" if request.parallel else one
    otherwise = "" if request.forced else "Otherwise answer in plain text. "
    return GENERIC_PROMPT.format(key=key, example=example, otherwise=otherwise, tools=described)


def generic_grammar(request: ToolRequest) -> Grammar | None:
    """The grammar of a generic call to one of the offered tools; lazy unless a call is required."""
    offered = request.offered
    if not offered:
        return None
    calls = [{"type": "object", "properties": {
        "name": {"const": t["function"]["name"]},
        "arguments": dict(t["function"].get("parameters") or {"type": "object"})},
        "required": ["name", "arguments"]} for t in offered]
    one: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if request.parallel:
        schema = {"type": "object", "properties": {CALLS_KEY: {"type": "array", "items": one, "minItems": 1}},
                  "required": [CALLS_KEY]}
    else:
        schema = {"type": "object", "properties": {CALL_KEY: one}, "required": [CALL_KEY]}
    gbnf = structured.schema_grammar(schema)
    if request.forced:
        return Grammar(gbnf)
    key = CALLS_KEY if request.parallel else CALL_KEY
    return Grammar(gbnf, trigger_patterns=(rf'^\s*(\{{\s*"{key}"[\s\S]*)',))


def parse_generic(text: str, partial: bool = False) -> ParsedReply:
    """A generic reply: its call(s) when it is one, else its text. While a reply is being written
    (``partial``), text that may still become a call is held back (no content yet)."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            body = json.loads(stripped)
        except ValueError:
            if partial and _may_be_call(stripped):
                return ParsedReply("")
            return ParsedReply(text)
        calls = _generic_calls(body)
        if calls is not None:
            return ParsedReply("", tuple(calls))
    elif partial and stripped and any(o.startswith(stripped) for o in OPENERS):
        return ParsedReply("")
    return ParsedReply(text)


def _may_be_call(text: str) -> bool:
    squeezed = re.sub(r"\s+", "", text)
    return any(squeezed.startswith(o) or o.startswith(squeezed) for o in OPENERS)


def _generic_calls(body: Any) -> list[dict[str, Any]] | None:
    if not isinstance(body, dict) or len(body) != 1:
        return None
    raw = [body[CALL_KEY]] if CALL_KEY in body else body.get(CALLS_KEY)
    if not isinstance(raw, list) or not raw:
        return None
    calls = []
    for call in raw:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        arguments = call.get("arguments", {})
        calls.append({"id": new_call_id(), "type": "function", "function": {
            "name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}})
    return calls


# --- llama.cpp's parser ---------------------------------------------------------------------------------


def parse_common(message: Mapping[str, Any]) -> ParsedReply:
    """llama.cpp's parsed message (OpenAI's shape) as a ParsedReply, every call with an id."""
    calls = []
    for call in message.get("tool_calls") or ():
        fn = call.get("function", {})
        calls.append({"id": call.get("id") or new_call_id(), "type": "function",
                      "function": {"name": fn.get("name", ""), "arguments": fn.get("arguments") or ""}})
    return ParsedReply(_text(message.get("content")), tuple(calls), message.get("reasoning_content") or "")


def common_request(messages: Sequence[Mapping[str, Any]], request: ToolRequest | None,
                   add_generation_prompt: bool) -> dict[str, Any]:
    """The JSON request llama.cpp's ``common_chat_templates_apply`` takes."""
    body: dict[str, Any] = {"messages": [dict(m) for m in messages],
                            "add_generation_prompt": add_generation_prompt}
    if request is not None and request.offered:
        body.update(tools=[dict(t) for t in request.offered],
                    tool_choice="required" if request.forced else "auto",
                    parallel_tool_calls=request.parallel)
    return body


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments if arguments is not None else {}


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    raise PromptError("a message's content must be text")


# --- streaming ------------------------------------------------------------------------------------------


@dataclass
class DeltaTracker:
    """Turns the parses of a growing reply into OpenAI's streamed deltas: new content, and for each tool call
    its id and name once, then its arguments as they grow. A call's id is kept from its first parse."""

    sent_content: str = ""
    sent_calls: list[dict[str, Any]] = field(default_factory=list)

    def deltas(self, reply: ParsedReply) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if reply.content.startswith(self.sent_content) and len(reply.content) > len(self.sent_content):
            out.append({"content": reply.content[len(self.sent_content):]})
            self.sent_content = reply.content
        for i, call in enumerate(reply.tool_calls):
            fn = call["function"]
            if i >= len(self.sent_calls):
                if not fn["name"]:
                    break
                self.sent_calls.append({"id": call["id"], "name": fn["name"], "arguments": ""})
                out.append({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                            "function": {"name": fn["name"], "arguments": ""}}]})
            sent = self.sent_calls[i]
            args = fn["arguments"]
            if args.startswith(sent["arguments"]) and len(args) > len(sent["arguments"]):
                grown = args[len(sent["arguments"]):]
                out.append({"tool_calls": [{"index": i, "function": {"arguments": grown}}]})
                sent["arguments"] = args
        return out

    def ids(self) -> list[str]:
        return [c["id"] for c in self.sent_calls]


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation made ready for a reply: its tokens, the strings that end the reply, the grammar a
    tool call is held to, how the reply is read back, and whether special tokens are part of its text
    (a call's markers)."""

    tokens: list[int]
    stop: list[str]
    grammar: Grammar | None = None
    parser: ReplyParser = field(default_factory=lambda: ReplyParser("plain"))
    special: bool = False


def parse(text: str, parser: ReplyParser, partial: bool = False) -> ParsedReply:
    """A reply (or the part written so far) read the way its prompt said."""
    if parser.kind == "generic":
        return parse_generic(text, partial)
    if parser.kind == "common":
        try:
            return parse_common(llama_chat.parse_reply(text, dict(parser.common), is_partial=partial))
        except llama_chat.ChatTemplateError:
            return ParsedReply("" if partial else text)
    return ParsedReply(text)
