"""The routes of the local API (Starlette): /health, /v1/models, /v1/chat/completions, /v1/completions.

Each request is read within the body limit, validated (types.py), queued on the engine's thread
(engine_access.py: 429 when the queue is full) and answered whole or streamed as server-sent
events. A client that goes away cancels its generation: the engine stops within one token and
takes the next request. Errors have OpenAI's shape, with a sentence saying what to change.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from lazykv.core.engine import structured, tool_calls
from lazykv.core.engine.tool_calls import ToolRequest
from lazykv.core.engine.types import SamplingSettings
from lazykv.server import types
from lazykv.server.engine_access import (
    Access,
    Event,
    Generation,
    Outcome,
    Piece,
    QueueFullError,
    RequestFailed,
)
from lazykv.server.settings import ServerSettings

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1


class _BodyTooLarge(Exception):
    pass


def error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
          code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(types.error_body(message, type_, param, code), status_code=status, headers=headers)


class ApiKeyMiddleware:
    """Every /v1 route needs ``Authorization: Bearer <key>`` when a key is set (compared in constant
    time); /health stays open (it tells no more than that the server is up)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1") and scope.get("method") != "OPTIONS":
            given = b""
            for name, value in scope.get("headers", ()):
                if name == b"authorization":
                    scheme, _, token = value.partition(b" ")
                    given = token.strip() if scheme.lower() == b"bearer" else b""
            if not hmac.compare_digest(given, self._key):
                response = error(401, "Missing or wrong API key: send it as 'Authorization: Bearer KEY'.",
                                 code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Api:
    """The routes over one engine owner (Access); ``model_name`` answers every request's "model"."""

    def __init__(self, settings: ServerSettings, access: Access, model_name: str, created: int) -> None:
        self.settings = settings
        self.access = access
        self.model_name = model_name
        self.created = created

    # --- routes --------------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        body: dict[str, Any] = {"status": "ok", "model": self.model_name, "queue": self.access.pending,
                                "queue_size": self.settings.queue_size}
        if self.access.cache is not None:
            stats = self.access.cache.stats()
            body["api_cache"] = {"entries": stats.entries, "bytes": stats.bytes, "budget": stats.budget}
        return JSONResponse(body)

    async def models(self, request: Request) -> Response:
        return JSONResponse(types.models_list(self.model_name, self.created))

    async def chat_completions(self, request: Request) -> Response:
        parsed = await self._parse(request, types.ChatCompletionRequest)
        if isinstance(parsed, Response):
            return parsed
        if len(parsed.messages) > self.settings.max_messages:
            return error(400, f"At most {self.settings.max_messages} messages per request.", param="messages")
        messages = [m.as_engine_message() for m in parsed.messages]
        tools = _tools(parsed)
        if isinstance(tools, Response):
            return tools
        grammar = await asyncio.to_thread(_grammar, parsed.response_format)
        if isinstance(grammar, Response):
            return grammar
        if grammar is not None and tools is not None and tools.offered:
            return error(400, "A reply cannot be both held to 'response_format' and free to call 'tools': "
                         "send one of them (or tool_choice \"none\").", param="response_format",
                         code="invalid_value")
        return await self._serve(request, parsed, messages=messages, prompt=None, chat=True, grammar=grammar,
                                 tools=tools)

    async def completions(self, request: Request) -> Response:
        parsed = await self._parse(request, types.CompletionRequest)
        if isinstance(parsed, Response):
            return parsed
        return await self._serve(request, parsed, messages=None, prompt=parsed.prompt, chat=False)

    # --- the work ------------------------------------------------------------------------------------

    async def _parse(self, request: Request, model: type[types._Sampling]) -> Any:
        try:
            body = await _read_body(request, self.settings.max_body_bytes)
        except _BodyTooLarge:
            return error(413, f"The request body is larger than {self.settings.max_body_bytes} bytes.",
                         code="request_too_large")
        except ClientDisconnect:
            return Response(status_code=499)
        try:
            return model.model_validate_json(body)
        except ValidationError as err:
            message, param = types.validation_message(err)
            return error(400, message, param=param, code="invalid_value")

    def _generation(self, parsed: Any, messages: list[dict[str, Any]] | None, prompt: str | None,
                    emit: Callable[[Event], None], grammar: str | None = None,
                    tools: ToolRequest | None = None) -> Generation:
        limit = parsed.limit() or self.settings.default_max_tokens
        sampling = SamplingSettings(
            temperature=parsed.temperature, top_p=parsed.top_p, top_k=40, min_p=0.05, repeat_penalty=1.0,
            seed=None if parsed.seed is None else parsed.seed & 0xFFFFFFFF,
            presence_penalty=parsed.presence_penalty, frequency_penalty=parsed.frequency_penalty,
        )
        return Generation(messages, prompt, sampling, min(limit, self.settings.max_tokens_cap),
                          parsed.stop_list(), emit, grammar=grammar, tools=tools)

    async def _serve(self, request: Request, parsed: Any, messages: list[dict[str, Any]] | None,
                     prompt: str | None, chat: bool, grammar: str | None = None,
                     tools: ToolRequest | None = None) -> Response:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()

        def emit(event: Event) -> None:  # on the engine's thread
            with contextlib.suppress(RuntimeError):  # the loop is gone: the server is stopping
                loop.call_soon_threadsafe(events.put_nowait, event)

        job = self._generation(parsed, messages, prompt, emit, grammar, tools)
        try:
            self.access.submit(job)
        except QueueFullError:
            return error(429, f"The server is busy: {self.settings.queue_size} requests are running or "
                         "waiting. Try again shortly.", "rate_limit_exceeded", code="queue_full",
                         headers={"Retry-After": str(RETRY_AFTER_S)})
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            first = await _next(events, gone)
            if first is None:
                job.cancel.set()
                return Response(status_code=499)
            if isinstance(first, RequestFailed):
                return error(first.status, first.message, first.type, code=first.code)
            if not parsed.stream:
                return await self._whole(first, events, gone, job, chat)
        finally:
            gone.cancel()  # a streamed response watches for the disconnect itself from here on
        include_usage = bool(parsed.stream_options and parsed.stream_options.include_usage)
        return EventSourceResponse(
            self._stream(first, events, job, chat, include_usage),
            client_close_handler_callable=_cancel_on_close(job), ping=15,
        )

    async def _whole(self, first: Event, events: asyncio.Queue[Event], gone: asyncio.Future[None],
                     job: Generation, chat: bool) -> Response:
        pieces: list[str] = []
        event: Event | None = first
        while isinstance(event, Piece):
            pieces.append(event.text)
            event = await _next(events, gone)
        if event is None:
            job.cancel.set()
            return Response(status_code=499)
        if isinstance(event, RequestFailed):
            return error(event.status, event.message, event.type, code=event.code)
        usage = types.Usage.of(event.n_prompt, event.n_cached, event.n_completion)
        finish = _finish(event)
        id_ = types.new_id("chatcmpl" if chat else "cmpl")
        if chat:
            message = event.reply.message() if event.reply is not None else {"role": "assistant",
                                                                             "content": event.text}
            return JSONResponse(types.chat_completion(id_, self.model_name, message, finish, usage))
        return JSONResponse(types.completion(id_, self.model_name, event.text, finish, usage))

    async def _stream(self, first: Event, events: asyncio.Queue[Event], job: Generation, chat: bool,
                      include_usage: bool) -> AsyncIterator[dict[str, str]]:
        id_ = types.new_id("chatcmpl" if chat else "cmpl")
        model = self.model_name
        try:
            if chat:
                yield _sse(types.chat_chunk(id_, model, {"role": "assistant", "content": ""}))
            event = first
            while isinstance(event, Piece):
                if chat and event.deltas is not None:
                    for delta in event.deltas:
                        yield _sse(types.chat_chunk(id_, model, delta))
                elif chat:
                    yield _sse(types.chat_chunk(id_, model, {"content": event.text}))
                else:
                    yield _sse(types.completion(id_, model, event.text, None, None))
                event = await events.get()
            if isinstance(event, RequestFailed):
                yield _sse(types.error_body(event.message, event.type, code=event.code))
            else:
                assert isinstance(event, Outcome)
                finish = _finish(event)
                yield _sse(types.chat_chunk(id_, model, {}, finish) if chat
                           else types.completion(id_, model, "", finish, None))
                if include_usage:
                    usage = types.Usage.of(event.n_prompt, event.n_cached, event.n_completion)
                    body = (types.chat_chunk(id_, model, {}, usage=usage, choices=False) if chat
                            else {**types.completion(id_, model, "", None, usage), "choices": []})
                    yield _sse(body)
            yield {"data": "[DONE]"}
        finally:
            job.cancel.set()  # a no-op once it has ended; stops it when the client went away


def _grammar(response_format: types.ResponseFormat | None) -> str | None | Response:
    """The grammar a reply must follow (None: free text), or the 400 naming what cannot be enforced."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object" or response_format.json_schema is None:
        return structured.json_object_grammar()
    try:
        return structured.schema_grammar(response_format.json_schema.schema_)
    except structured.SchemaError as err:
        return error(400, f"{err}", param="response_format.json_schema.schema", code="unsupported_schema")


def _sse(body: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(body, ensure_ascii=False, separators=(",", ":"))}


def _finish(outcome: Outcome) -> str:
    if outcome.reply is not None and outcome.reply.tool_calls:
        return "tool_calls"
    return "length" if outcome.finish_reason == "length" else "stop"


def _tools(parsed: types.ChatCompletionRequest) -> ToolRequest | None | Response:
    """The request's tools and tool choice, or the 400 naming the field that is wrong."""
    if not parsed.tools:
        if isinstance(parsed.tool_choice, types.NamedToolChoice) or parsed.tool_choice == "required":
            return error(400, "'tool_choice' asks for a tool call, but the request has no 'tools'.",
                         param="tool_choice", code="invalid_value")
        return None
    try:
        tool_calls.check_tools(parsed.tools)
    except tool_calls.ToolError as err:
        return error(400, f"Invalid tool definition: {err}.", param=err.field, code="invalid_value")
    choice, function = parsed.tool_choice or "auto", None
    if isinstance(choice, types.NamedToolChoice):
        function = choice.function.name
        if function not in {t["function"]["name"] for t in parsed.tools}:
            return error(400, f"'tool_choice' names the function {function!r}, which is not in 'tools'.",
                         param="tool_choice.function.name", code="invalid_value")
        choice = "required"
    return ToolRequest(tuple(parsed.tools), choice, function, parsed.parallel_tool_calls)


def _cancel_on_close(job: Generation) -> Callable[[Any], Awaitable[None]]:
    async def closed(_message: Any) -> None:
        job.cancel.set()

    return closed


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _BodyTooLarge
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _BodyTooLarge
    return bytes(body)


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body is read by then: only a disconnect can come)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _next(events: asyncio.Queue[Event], gone: asyncio.Future[None]) -> Event | None:
    """The engine's next event, or None when the client went away first."""
    if not events.empty():
        return events.get_nowait()
    getter = asyncio.ensure_future(events.get())
    await asyncio.wait({getter, gone}, return_when=asyncio.FIRST_COMPLETED)
    if getter.done():
        return getter.result()
    getter.cancel()
    return None


def create_app(settings: ServerSettings, access: Access, model_name: str, created: int) -> Starlette:
    api = Api(settings, access, model_name, created)
    middleware = []
    if settings.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                                     allow_methods=["GET", "POST", "OPTIONS"],
                                     allow_headers=["authorization", "content-type"]))
    if settings.api_key:
        middleware.append(Middleware(ApiKeyMiddleware, api_key=settings.api_key))
    routes = [
        Route("/health", api.health, methods=["GET"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
    ]
    app = Starlette(routes=routes, middleware=middleware)
    app.state.api = api  # its owner may rename the model (the app loads another)
    app.add_exception_handler(404, _not_found)
    app.add_exception_handler(405, _not_allowed)
    return app


async def _not_found(request: Request, exc: Exception) -> Response:
    return error(404, f"There is no route {request.url.path}; this server answers /v1/models, "
                 "/v1/chat/completions, /v1/completions and /health.", code="not_found")


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return error(405, f"{request.method} is not allowed on {request.url.path}.", code="method_not_allowed")
