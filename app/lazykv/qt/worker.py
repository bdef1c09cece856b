"""The engine worker: owns the EngineSession and runs every engine request on its own QThread.

Every request is an object with its own id and cancel token (``Request``); the worker answers
each one exactly once, echoing it: ``finished(request, result)`` or ``failed(request, Failure)``,
with ``progress(request, ...)`` in between. A Stop therefore reaches only the request it was
meant for, and a failure is reported against the request that failed.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from PySide6.QtCore import QObject, QThread, Signal, Slot

from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.tool_calls import ToolRequest
from lazykv.core.engine.types import CancelledError, ReplyResult, SamplingSettings, StepEvent
from lazykv.core.errors import ContextFullError, EngineError
from lazykv.core.history.branches import BranchResult, open_branch
from lazykv.core.history.keys import KeyringUnavailableError, PassphraseError
from lazykv.core.history.persistence import Crypto, Persistence
from lazykv.core.history.records import StoreError
from lazykv.core.history.snapshot import SnapshotError
from lazykv.core.history.store import Database
from lazykv.core.kinds import ContextFullPolicy, StepStage
from lazykv.core.paths import fingerprints_file

STATUS_INTERVAL_S = 0.1  # kv_status while streaming, at most this often

_request_ids = itertools.count(1)


@dataclass(frozen=True)
class ReplyOptions:
    max_tokens: int | None = None
    context_full: ContextFullPolicy = ContextFullPolicy.STOP
    continue_last: bool = False  # the last message is a reply cut off: go on with it (stream_continue)


@dataclass(eq=False)
class Request:
    """One engine call. ``cancel`` may be set from any thread; the answer echoes the object itself."""

    what: ClassVar[str] = "The engine request"  # the failure's title: "<what> failed"
    id: int = field(default_factory=lambda: next(_request_ids), init=False)
    cancel: threading.Event = field(default_factory=threading.Event, init=False, repr=False)


@dataclass(eq=False)
class LoadModel(Request):
    what: ClassVar[str] = "Loading the model"
    spec: LoadSpec


@dataclass(eq=False)
class Reply(Request):
    """Answers with a ReplyResult; progress: each streamed piece of text."""

    what: ClassVar[str] = "The reply"
    messages: list[dict[str, Any]]
    sampling: SamplingSettings
    options: ReplyOptions
    tools: ToolRequest | None = None  # the tools the reply may call (its ReplyResult carries the calls)


@dataclass(eq=False)
class Step(Request):
    """Compact a lazy cache now (idle time); answers whether anything was converted."""

    what: ClassVar[str] = "Compacting the context memory"


@dataclass(eq=False)
class SyncKv(Request):
    """Make the cache hold ``messages`` (the common prefix stays, the rest is read): what is on screen
    changed without a reply (another version of the last reply was chosen)."""

    what: ClassVar[str] = "Reading the reply chosen"
    messages: list[dict[str, str]]


@dataclass(eq=False)
class ClearKv(Request):
    """Empty the KV cache (a new chat): a lazy cache starts again in its 16-bit phase."""

    what: ClassVar[str] = "Emptying the context memory"


@dataclass(eq=False)
class SetCrypto(Request):
    """How snapshots are protected from now on; None stops saving them (transcripts are saved apart)."""

    what: ClassVar[str] = "Setting up snapshot protection"
    crypto: Crypto | None


@dataclass(eq=False)
class ChangeCrypto(Request):
    """Re-encrypt the history and every snapshot key under ``crypto``, all or nothing
    (``Persistence.change_crypto``): on failure the old protection stays, and the change can be retried."""

    what: ClassVar[str] = "Re-encrypting the conversation history"
    crypto: Crypto


@dataclass(eq=False)
class SaveSnapshot(Request):
    what: ClassVar[str] = "Saving the KV snapshot"
    conv_id: int
    messages: list[dict[str, str]]  # what the cache holds (Conversation.messages()): the snapshot's binding
    budget_bytes: int
    compact: bool = False  # at the cache's last rung (the "compact_snapshots" setting)


@dataclass(eq=False)
class OpenConversation(Request):
    """Restore the snapshot or re-read the transcript; progress: (tokens read, tokens to read)."""

    what: ClassVar[str] = "Resuming the conversation"
    conv_id: int
    messages: list[dict[str, str]]


@dataclass(eq=False)
class Branch(Request):
    """Make the cache of the new branch ``branch_id`` (the first ``n_messages`` of ``parent_messages``) from
    its parent's: the live cache when ``live`` (the parent is the chat in the engine), else the parent's
    snapshot, re-read where that cannot be exact (``branches.open_branch``); then save the branch's
    snapshot. Answers with a BranchResult; progress: (tokens read, tokens to read) of a re-read."""

    what: ClassVar[str] = "Opening the branch"
    parent_id: int
    parent_messages: list[dict[str, str]]
    branch_id: int
    n_messages: int
    live: bool
    budget_bytes: int
    compact: bool = False


@dataclass(eq=False)
class Borrow(Request):
    """Lend the engine to another client for one call (the local API's requests): ``fn(session, crypto)``
    runs on the engine's thread, with the snapshot protection in force; the chat's KV cache is then put
    back as it was, so the chat's next reply reuses it."""

    what: ClassVar[str] = "A local API request"
    fn: Callable[[EngineSession, Crypto | None], Any]


@dataclass(frozen=True)
class Failure:
    """Why a request did not finish: a sentence for the user, the details on demand."""

    message: str
    details: str = ""
    cancelled: bool = False  # stopped on request (its cancel token), not an error
    context_full: bool = False  # the conversation did not fit the context (dropping old turns would help)


CANCELLED = Failure("stopped", cancelled=True)


class EngineWorker(QObject):
    """Move to a QThread, then drive it only through ``submit`` (a queued signal) and request tokens.

    Every request runs on the worker's thread, one at a time, in order, and is answered once.
    ``close()`` (any thread) cancels the running request and drops the queued ones unanswered.
    """

    finished = Signal(object, object)  # Request, its result
    failed = Signal(object, object)  # Request, Failure
    progress = Signal(object, object)  # Request, a reply's piece of text | (done, total) tokens re-read
    kv_status = Signal(object)  # KvStatus, after each request and while streaming
    conversion = Signal(object)  # StepEvent, also when a conversion happens inside a reply
    _queued = Signal(object)

    def __init__(self, database: Database, session: EngineSession | None = None) -> None:
        super().__init__()
        self._session = session if session is not None else EngineSession()
        self._session.set_step_listener(self._on_step)
        # owns the snapshot crypto (None: snapshots are not saved, no key kept); the database is the
        # process's one (the window's)
        self._persistence = Persistence(database, self._session, fingerprints_file())
        self._closing = threading.Event()
        self._running: Request | None = None
        self._handlers: dict[type[Request], Callable[[Any], Any]] = {
            LoadModel: self._load, Reply: self._reply, Step: self._convert, SetCrypto: self._set_crypto,
            SaveSnapshot: self._save_snapshot, OpenConversation: self._open, ClearKv: self._clear_kv,
            SyncKv: self._sync_kv,
            Borrow: self._borrow, Branch: self._branch,
            ChangeCrypto: self._change_crypto,
        }
        self._queued.connect(self._run)

    def submit(self, request: Request) -> Request:
        """Queue ``request`` (from the GUI thread); the answer arrives as ``finished`` or ``failed``."""
        self._queued.emit(request)
        return request

    def close(self) -> None:
        """Cancel what runs, drop what is queued (callable from any thread; for the app's exit)."""
        self._closing.set()
        running = self._running
        if running is not None:
            running.cancel.set()

    @Slot(object)
    def _run(self, request: Request) -> None:
        """The one wrapper around every request: exactly one answer, every error reported against it."""
        if self._closing.is_set():
            return
        if request.cancel.is_set():
            self.failed.emit(request, CANCELLED)
            return
        self._running = request
        try:
            with self._session.cancellable(request.cancel):
                result = self._handlers[type(request)](request)
        except CancelledError:
            self.failed.emit(request, CANCELLED)
        except Exception as err:  # every failure must reach the view, or it waits forever
            self.failed.emit(request, failure(err))
        else:
            self.finished.emit(request, result)
        finally:
            self._running = None
            self._emit_status()

    def _load(self, request: LoadModel) -> Any:
        return self._session.load(request.spec)

    def _reply(self, request: Reply) -> ReplyResult:
        last_status = 0.0
        if request.options.continue_last:
            stream = self._session.stream_continue(request.messages, request.sampling, request.cancel,
                                                   max_tokens=request.options.max_tokens)
        else:
            stream = self._session.stream_reply(
                request.messages, request.sampling, request.cancel, max_tokens=request.options.max_tokens,
                context_full=request.options.context_full, tools=request.tools,
            )
        while True:
            try:
                piece = next(stream)
            except StopIteration as end:
                return end.value
            self.progress.emit(request, piece)
            now = time.monotonic()
            if now - last_status >= STATUS_INTERVAL_S:
                last_status = now
                self._emit_status()

    def _convert(self, request: Step) -> bool:
        return self._session.step_kv_now()

    def _clear_kv(self, request: ClearKv) -> None:
        self._session.clear_kv()

    def _sync_kv(self, request: SyncKv) -> int:
        return self._session.sync_kv(request.messages)

    def _set_crypto(self, request: SetCrypto) -> None:
        self._persistence.set_crypto(request.crypto)  # None: no key kept for reading either

    def _change_crypto(self, request: ChangeCrypto) -> None:
        self._persistence.change_crypto(request.crypto)

    def _save_snapshot(self, request: SaveSnapshot) -> Any:
        """After a completed reply: the conversation's KV cache into its snapshot file (None: not saved)."""
        if self._persistence.crypto is None:
            return None
        return self._persistence.save(
            request.conv_id, request.messages, request.budget_bytes, request.compact
        )

    def _open(self, request: OpenConversation) -> Any:
        return self._persistence.open(request.conv_id, request.messages,
                                      lambda done, total: self.progress.emit(request, (done, total)))

    def _branch(self, request: Branch) -> BranchResult:
        return open_branch(self._persistence, request.parent_id, request.parent_messages, request.branch_id,
                           request.n_messages, lambda done, total: self.progress.emit(request, (done, total)),
                           live=request.live, budget_bytes=request.budget_bytes, compact=request.compact)

    def _borrow(self, request: Borrow) -> Any:
        chat = self._session.capture_kv() if self._session.cached_tokens() else None
        try:
            return request.fn(self._session, self._persistence.crypto)
        finally:
            self._session.clear_kv()  # a lazy cache the request compacted starts again at its 16-bit rung
            if chat is not None:
                self._session.restore_kv(chat.tokens, chat.state)

    @Slot()
    def shutdown(self) -> None:
        """Free the model, then end the worker's thread's event loop (the window closes the database)."""
        self._session.close()
        QThread.currentThread().quit()

    def _emit_status(self) -> None:
        try:
            self.kv_status.emit(self._session.kv_status())
        except EngineError:
            pass  # no model loaded: nothing to show

    def _on_step(self, event: StepEvent) -> None:
        self.conversion.emit(event)
        if event.stage is StepStage.END:
            self._emit_status()


# errors whose message is written for the user: shown as they are
USER_ERRORS = (EngineError, SnapshotError, StoreError, PassphraseError, KeyringUnavailableError)


def failure(err: BaseException) -> Failure:
    """The user's sentence for ``err``, never a bare ``str(err)`` (a KeyError(5) says "5"): our own errors
    are written for the user; a file error says which file and what to check; anything else is a bug,
    said as such with what to do. The traceback is always the details."""
    details = "".join(traceback.format_exception(err))
    if isinstance(err, USER_ERRORS) and str(err).strip():
        return Failure(str(err), details, context_full=isinstance(err, ContextFullError))
    if isinstance(err, MemoryError):
        return Failure("Out of memory: close other programs, or choose a smaller context or the q8_0, "
                       "lazy or ladder KV cache.", details)
    if isinstance(err, OSError):
        reason = err.strerror or (os.strerror(err.errno) if isinstance(err.errno, int) else "refused")
        where = f" ({err.filename})" if err.filename else ""
        return Failure(f"A file could not be read or written{where}: {reason}. Check that the disk has room "
                       "and that the folder can be written to, then try again.", details)
    return Failure(f"Something unexpected went wrong inside LazyKV Chat ({type(err).__name__}). Try again; "
                   "if it happens again, please report it with the details below.", details)
