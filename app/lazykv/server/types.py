"""OpenAI's request and response schemas, as far as this server implements them, and its error shape.

Requests are validated strictly (no string where a number belongs, no NaN, bounded numbers and sizes);
fields that real clients send and this server does not implement are accepted and ignored, as listed
in ``IGNORED``; unknown fields are ignored, as OpenAI does. Only malformed values are refused.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

INT32_MAX = 2**31 - 1
MAX_TEXT_CHARS = 4 * 1024 * 1024
MAX_STOPS = 16

# accepted and ignored: the API documents them, clients send them, they change nothing here
IGNORED = ("user", "logit_bias", "logprobs", "top_logprobs", "service_tier", "store", "metadata", "suffix",
           "echo", "best_of")

Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]


def _valid_unicode(text: str) -> str:
    """Lone surrogates (a JSON escape like "\\ud800") are no text the model can read."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the text is not valid Unicode (a lone surrogate)") from None
    return text


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class TextPart(_Strict):
    type: Literal["text"]
    text: Text

    _unicode = field_validator("text")(_valid_unicode)


class StreamOptions(_Strict):
    include_usage: bool = False


class FunctionCall(_Strict):
    name: str = Field(min_length=1, max_length=64)
    arguments: Text = ""  # JSON text, as the model wrote it


class ToolCall(_Strict):
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: str | None = None  # a tool result's tool; otherwise accepted, not sent to the model
    tool_calls: list[ToolCall] | None = None  # an assistant turn's calls
    tool_call_id: str | None = Field(None, max_length=256)  # the call a tool result answers

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a message with role 'tool' needs the 'tool_call_id' of the call it answers")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant message has 'tool_calls'")
        return self

    @field_validator("content")
    @classmethod
    def _content_unicode(cls, value: str | list[TextPart] | None) -> str | list[TextPart] | None:
        return _valid_unicode(value) if isinstance(value, str) else value

    def as_engine_message(self) -> dict[str, Any]:
        """{"role", "content"} for the chat template: text parts joined, "developer" as "system"; an
        assistant's tool calls and a tool result's call id and tool name in OpenAI's shape."""
        if isinstance(self.content, list):
            text = "".join(part.text for part in self.content)
        else:
            text = self.content or ""
        role = "system" if self.role == "developer" else self.role
        message: dict[str, Any] = {"role": role, "content": text}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.role == "tool":
            message["tool_call_id"] = self.tool_call_id
            if self.name:
                message["name"] = self.name
        return message


class _Sampling(_Strict):
    model: str = Field("", max_length=512)  # any name is answered by the loaded model
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    temperature: float = Field(0.8, ge=0.0, le=2.0)  # llama-cpp-python's server defaults, not OpenAI's 1/1
    top_p: float = Field(0.95, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    stop: Text | list[Text] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1  # one choice per request
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings")
        for stop in stops:
            _valid_unicode(stop)
        return value

    def stop_list(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return [s for s in stops if s]


class JsonSchemaFormat(_Strict):
    """OpenAI's ``response_format.json_schema``: the schema the reply must validate against."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: Text | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")  # none: any JSON object
    strict: bool | None = None  # enforced either way (a grammar); an unenforceable schema is refused


class ResponseFormat(_Strict):
    """``text`` (free text), ``json_object`` (any JSON object) or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs 'json_schema' (with its 'name' and 'schema')")
        return self


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    """``{"type": "function", "function": {"name": ...}}``: that function is called."""

    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    response_format: ResponseFormat | None = None
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)  # the newer name of max_tokens
    tools: list[dict[str, Any]] | None = Field(None, max_length=128)  # checked by tool_calls.check_tools
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = False  # one call per reply unless asked (OpenAI's default is true)

    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    prompt: Text

    _unicode = field_validator("prompt")(_valid_unicode)

    def limit(self) -> int | None:
        return self.max_tokens


# --- responses ---------------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, n_prompt: int, n_cached: int, n_completion: int) -> Usage:
        return cls(prompt_tokens=n_prompt, completion_tokens=n_completion,
                   total_tokens=n_prompt + n_completion,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=n_cached))


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def chat_completion(id_: str, model: str, message: dict[str, Any], finish_reason: str, usage: Usage
                    ) -> dict[str, Any]:
    return {
        "id": id_, "object": "chat.completion", "created": now(), "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage.model_dump(),
    }


def chat_chunk(id_: str, model: str, delta: dict[str, Any], finish_reason: str | None = None,
               usage: Usage | None = None, choices: bool = True) -> dict[str, Any]:
    """One streamed piece; the usage chunk (stream_options.include_usage) has no choices."""
    chunk: dict[str, Any] = {"id": id_, "object": "chat.completion.chunk", "created": now(), "model": model,
                             "choices": []}
    if choices:
        chunk["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    if usage is not None:
        chunk["usage"] = usage.model_dump()
    return chunk


def completion(id_: str, model: str, text: str, finish_reason: str | None, usage: Usage | None
               ) -> dict[str, Any]:
    """A text completion, or one streamed piece of it (``usage`` None)."""
    body: dict[str, Any] = {
        "id": id_, "object": "text_completion", "created": now(), "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
    }
    if usage is not None:
        body["usage"] = usage.model_dump()
    return body


def models_list(model: str, created: int) -> dict[str, Any]:
    return {"object": "list",
            "data": [{"id": model, "object": "model", "created": created, "owned_by": "lazykv"}]}


# --- errors ------------------------------------------------------------------------------------------


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def validation_message(err: ValidationError) -> tuple[str, str | None]:
    """The first problem of a refused body, as one sentence and the parameter it concerns."""
    first = err.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first.get("loc", ()) if _is_field(part))
    kind = first.get("type", "")
    if kind == "json_invalid":
        return f"The request body is not valid JSON: {first.get('msg', '')}", None
    if kind in ("model_type", "model_attributes_type") and not where:
        return "The request body must be a JSON object.", None
    return f"Invalid value for '{where}': {first.get('msg', 'invalid')}", where or None


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _is_field(part: str | int) -> bool:
    """A location part that names a field or an index, not a union member's tag ("constrained-str")."""
    return isinstance(part, int) or (part.isidentifier() and part not in _TYPE_TAGS)
