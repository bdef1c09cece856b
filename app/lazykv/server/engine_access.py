"""The engine's one thread and its bounded queue: every API request is a ``Generation`` run there, in
order, one at a time (the engine holds one sequence). A full queue is refused at once (HTTP 429);
a generation's ``cancel`` token, set from any thread (a client gone), stops it within one token.

``run_generation`` is the whole of one request's engine work (prompt, API cache, stream, save); it
takes the session and cache it is given, so that another owner of the engine (the app's worker)
can run it on its own thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from lazykv.core.chat.conversation import common_prefix
from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.tool_calls import ChatPrompt, DeltaTracker, ParsedReply, ToolRequest
from lazykv.core.engine.types import GrammarError, PromptError, SamplingSettings
from lazykv.core.errors import EngineError
from lazykv.core.kinds import FinishReason
from lazykv.server.prefix_cache import PrefixCache

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Piece:
    text: str
    # a reply read as it is written (tools offered): OpenAI's deltas for this piece (content and tool-call
    # parts; none while text that may become a call is held back); None: the text is the content
    deltas: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True)
class Outcome:
    text: str
    finish_reason: FinishReason
    n_prompt: int
    n_cached: int  # prompt tokens found in the cache (live, or restored from the API cache)
    n_completion: int
    restored: bool = False  # the API cache's snapshot was restored for it
    reply: ParsedReply | None = None  # the reply read back (tools offered): its text and its calls


@dataclass(frozen=True)
class RequestFailed:
    """A request the engine could not serve: an HTTP status and OpenAI's error fields."""

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None


Event = Piece | Outcome | RequestFailed


@dataclass(eq=False)
class Generation:
    """One request. Exactly one Outcome or RequestFailed is emitted last (Pieces before it)."""

    messages: list[dict[str, Any]] | None  # a chat (the model's template), or
    prompt: str | None  # a raw prompt
    sampling: SamplingSettings
    max_tokens: int
    stop: list[str]
    emit: Callable[[Event], None]
    cancel: threading.Event = field(default_factory=threading.Event)
    ended: bool = False  # its end was emitted
    grammar: str | None = None  # GBNF the reply must follow (response_format), None: free text
    tools: ToolRequest | None = None  # the tools the reply may call


class QueueFullError(Exception):
    """As many requests as the queue holds are running or waiting."""


class Access(Protocol):
    """What the routes need of an engine's owner: this module's EngineAccess (the headless server), or
    the app's engine worker (its requests then wait for the chat's)."""

    cache: PrefixCache | None

    @property
    def pending(self) -> int: ...

    def submit(self, job: Generation) -> None:
        """Queue ``job``, or QueueFullError."""


def run_generation(session: EngineSession, cache: PrefixCache | None, job: Generation) -> Event:
    """Run ``job`` on ``session`` (from the thread that owns it): emit its pieces and its end, then save
    the cache for later requests (the client has its answer by then); returns the end."""
    if job.messages is not None:
        prompt = session.chat_prompt(job.messages, tools=job.tools)
    else:
        prompt = ChatPrompt(session.tokenize(job.prompt or ""), [])
    tokens = prompt.tokens
    n_ctx = session.model_info().n_ctx
    if not tokens:  # a model without a BOS token and an empty prompt: nothing to continue
        return _end(job, RequestFailed(400, "The prompt is empty: give some text to continue.",
                                       code="empty_prompt"))
    if len(tokens) >= n_ctx:
        return _end(job, RequestFailed(
            400, f"This prompt is {len(tokens)} tokens long; the server's context holds {n_ctx} tokens "
            "(prompt and reply together). Shorten it, or start the server with a larger --ctx.",
            code="context_length_exceeded"))
    restored = False
    if cache is not None:
        match = cache.best(tokens)
        if match is not None and match.n_tokens > common_prefix(session.cached_tokens(), tokens):
            restored = cache.restore(session, match)
    reading = prompt.parser.kind != "plain"  # the reply is read back: tool calls
    stream = session.stream_tokens(tokens, [*prompt.stop, *job.stop], job.sampling, job.cancel,
                                   max_tokens=min(job.max_tokens, n_ctx - len(tokens)),
                                   grammar=job.grammar or prompt.grammar, special=prompt.special)
    tracker, text = DeltaTracker(), ""
    while True:
        try:
            piece = next(stream)
        except StopIteration as end:
            result = end.value
            break
        if reading:
            text += piece
            job.emit(Piece(piece, tuple(tracker.deltas(session.parse_reply(text, prompt, partial=True)))))
        else:
            job.emit(Piece(piece))
    reply = _read_back(session, prompt, result.text, tracker) if reading else None
    # a prompt found whole is read again from its last token (the engine needs fresh logits)
    n_cached = min(result.n_reused, max(0, result.n_prompt - 1))
    outcome = _end(job, Outcome(result.text, result.finish_reason, result.n_prompt, n_cached,
                                result.n_generated, restored, reply))
    if cache is not None and not result.cancelled:
        try:
            cache.save(session)
        except EngineError as err:  # the answer is out; only later requests miss this snapshot
            log.warning("API cache: the KV cache could not be captured: %s", err)
    return outcome


def _read_back(session: EngineSession, prompt: ChatPrompt, text: str, tracker: DeltaTracker) -> ParsedReply:
    """The whole reply read back; its calls keep the ids already streamed."""
    reply = session.parse_reply(text, prompt)
    ids = tracker.ids()
    calls = tuple({**call, "id": ids[i]} if i < len(ids) else call for i, call in enumerate(reply.tool_calls))
    return replace(reply, tool_calls=calls)


def _end(job: Generation, end: Event) -> Event:
    job.ended = True
    job.emit(end)
    return end


class EngineAccess:
    """Owns the session on a thread of its own; ``submit`` from any thread (the server's event loop)."""

    def __init__(self, session: EngineSession, cache: PrefixCache | None, queue_size: int) -> None:
        self.session = session
        self.cache = cache
        self.queue_size = queue_size
        self._jobs: queue.Queue[Generation | None] = queue.Queue()
        self._lock = threading.Lock()
        self._pending = 0  # running + waiting
        self._running: Generation | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="lazykv-api-engine", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    def submit(self, job: Generation) -> None:
        """Queue ``job``; QueueFullError when ``queue_size`` requests are already running or waiting."""
        with self._lock:
            if self._closed:
                raise QueueFullError("the server is stopping")
            if self._pending >= self.queue_size:
                raise QueueFullError(f"{self._pending} requests are running or waiting")
            self._pending += 1
        self._jobs.put(job)

    def close(self, timeout: float = 30.0) -> bool:
        """Cancel what runs and what waits, end the thread; True when it ended within ``timeout``."""
        with self._lock:
            self._closed = True
            running = self._running
        if running is not None:
            running.cancel.set()
        self._jobs.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                self._running = job
                closed = self._closed
            try:
                if closed or job.cancel.is_set():
                    _end(job, RequestFailed(503, "The request was cancelled.", "server_error", "cancelled"))
                else:
                    answer(self.session, self.cache, job)
            finally:
                with self._lock:
                    self._running = None
                    self._pending -= 1


def answer(session: EngineSession, cache: PrefixCache | None, job: Generation) -> None:
    """run_generation with every failure answered: the client gets a reason, the thread lives on."""
    try:
        run_generation(session, cache, job)
        return
    except PromptError as err:
        failed = RequestFailed(400, str(err), code="invalid_messages")
    except GrammarError as err:
        failed = RequestFailed(400, f"{err}; simplify the response_format's schema.",
                               code="invalid_response_format")
    except EngineError as err:
        log.warning("API request failed in the engine: %s", err)
        failed = RequestFailed(500, f"The engine could not answer: {err}", "server_error")
    except Exception:
        log.exception("API request failed")
        failed = RequestFailed(500, "The server failed to answer this request (a bug; see its log).",
                               "server_error")
    if not job.ended:
        _end(job, failed)
