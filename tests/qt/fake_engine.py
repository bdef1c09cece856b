"""A fake EngineSession for millisecond-scale GUI tests: no model, a stream that can be held and released.

It speaks EngineSession's API as the worker and Persistence use it. ``hold()`` stops every
stream, prefill, re-read and load at its next step until ``release()``; a held step still
notices its request's cancel token (as the real context's abort callback would).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from lazykv.core.chat.context_policy import fit_messages
from lazykv.core.chat.conversation import common_prefix
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.model_load import budget_n_ctx, read_checked_meta
from lazykv.core.engine.remote import probe_all
from lazykv.core.engine.types import (
    CancelledError,
    KvLayout,
    KvSnapshot,
    KvStatus,
    ModelInfo,
    NoModelError,
    ReplyResult,
    SamplingSettings,
    StepEvent,
)
from lazykv.core.kinds import FinishReason, KvMode, KvPhase, StepStage

HOLD_LIMIT_S = 10.0  # a test that forgets to release fails instead of hanging
N_CTX = 256
# each step of a lazy cache and the share of the cache's cells it holds (numerator, denominator)
RUNGS = {
    KvMode.LAZY: ((KvPhase.F16, 1, 2), (KvPhase.Q8_0, 1, 1)),
    KvMode.LADDER: ((KvPhase.F16, 18, 64), (KvPhase.Q8_0, 18, 34), (KvPhase.Q4_0, 1, 1)),
}
REPLY = ("Fake", " reply", " text.")


@dataclass
class _Kv:
    tokens: list[int]
    phase: KvPhase = KvPhase.F16
    target: KvPhase | None = None  # the last rung converted to
    n_steps: int = 0


class FakeSession:
    """Tokens are words; the reply is REPLY (or ``reply``), streamed one piece at a time."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()
        self._info: ModelInfo | None = None
        self._kv = _Kv([])
        self._cancel: threading.Event | None = None
        self._listener: Callable[[StepEvent], None] | None = None
        self.reply: tuple[str, ...] = REPLY
        self.finish_reason = FinishReason.STOP  # how a reply that is not stopped ends (LENGTH: cut off)
        self.convert_error: Exception | None = None
        self.reply_error: Exception | None = None  # raised once the prompt is read
        self.restore_error: Exception | None = None  # e.g. KvRestoreError: resuming re-reads instead
        self.calls: list[str] = []  # what ran, in order: "load", "reply", "convert", "rebuild", ...
        self.tool_replies: list[list[dict[str, Any]]] = []  # with tools offered, each reply calls these
        self.sent: list[tuple[list[dict[str, Any]], Any]] = []  # each reply's messages and tools
        self.waiting = threading.Event()  # set while a step is held
        self.after_reply = threading.Event()  # set by the first kv_status after a reply ended
        self._reply_ended = False
        self.uncancellable_load = False  # a load that ignores cancel tokens (as the real one does)

    # -- test controls ---------------------------------------------------------------------------------

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def _step(self, cancellable: bool = True) -> None:
        """One unit of work: waits while held; raises CancelledError when the request is cancelled."""
        deadline = time.monotonic() + HOLD_LIMIT_S
        while not self._open.is_set():
            self.waiting.set()
            if cancellable and self._cancelled():
                break
            if time.monotonic() > deadline:
                raise AssertionError("the fake engine was held and never released")
            self._open.wait(0.002)
        self.waiting.clear()
        if cancellable and self._cancelled():
            raise CancelledError("stopped")

    def _cancelled(self) -> bool:
        return self._cancel is not None and self._cancel.is_set()

    # -- EngineSession -----------------------------------------------------------------------------------

    def set_step_listener(self, fn: Callable[[StepEvent], None] | None) -> None:
        self._listener = fn

    @contextmanager
    def cancellable(self, cancel: threading.Event) -> Iterator[None]:
        previous, self._cancel = self._cancel, cancel
        try:
            yield
        finally:
            self._cancel = previous

    def load(self, spec: LoadSpec) -> ModelInfo:
        """Remote backends are probed as the real session does; those that answer are reported as used.
        A context memory budget sets n_ctx as the real session's does (with the recent window)."""
        self.calls.append("load")
        self.spec = spec
        self.kv_recent = spec.kv_recent
        path = spec.model
        meta = read_checked_meta(path)
        self._step(cancellable=not self.uncancellable_load)
        size = path.stat().st_size
        mode = spec.kv_mode
        n_ctx = budget_n_ctx(meta, spec.context_budget, mode, spec.window) if spec.context_budget > 0 \
            else spec.n_ctx
        remote, unreachable = probe_all(list(spec.rpc_servers))
        self._info = ModelInfo(path, meta.architecture, 1000, 4096, size, n_ctx, mode, spec.n_threads or 1,
                               meta,
                               remote=tuple(remote), unreachable=tuple(unreachable))
        self._kv = self._empty_kv()
        return self._info

    def model_info(self) -> ModelInfo:
        return self._require()

    def kv_status(self) -> KvStatus:
        try:
            info = self._require()
        finally:
            if self._reply_ended:
                self._reply_ended = False
                self.after_reply.set()
        n = len(self._kv.tokens)
        rungs = RUNGS.get(info.kv_mode, ())
        capacity = {rung: info.n_ctx * num // den for rung, num, den in rungs}
        steps = [rung for rung, _, _ in rungs]
        at = steps.index(self._kv.phase) if steps else 0
        following = steps[at + 1] if at + 1 < len(steps) else self._kv.phase
        return KvStatus(info.kv_mode, self._kv.phase, n, capacity.get(self._kv.phase, info.n_ctx), info.n_ctx,
                        1024, self._kv.n_steps, 0.01 if self._kv.n_steps else 0.0, tuple(steps),
                        capacity.get(following, 0), self._kv.target)

    def count_tokens(self, messages: Sequence[dict[str, str]]) -> int:
        return len(_words(messages))

    def stream_reply(self, messages: Sequence[dict[str, Any]], sampling: SamplingSettings,
                     cancel: threading.Event, max_tokens: int | None = None,
                     context_full: str = "stop", tools: Any = None) -> Generator[str, None, ReplyResult]:
        info = self._require()
        self.calls.append("reply")
        self.sent.append((list(messages), tools))
        if tools is not None and self.tool_replies:  # the model calls tools: no words, the calls
            calls = self.tool_replies.pop(0)
            return ReplyResult("", FinishReason.STOP, len(messages), 0, tool_calls=tuple(calls))
        self._reply_ended = False
        fitted = fit_messages(messages, self.count_tokens, info.n_ctx, context_full, max_tokens)
        tokens = _words(fitted.messages)
        n_reused = common_prefix(self._kv.tokens, tokens)
        pieces: list[str] = []
        finish = self.finish_reason
        with self.cancellable(cancel):
            try:
                self._step()  # the prompt's reading
                if self.reply_error is not None:
                    raise self.reply_error
                self._kv.tokens = tokens
                for piece in self.reply:
                    self._step()
                    pieces.append(piece)
                    self._kv.tokens = self._kv.tokens + [hash(w) & 0xFFFF for w in piece.split()]
                    yield piece
            except CancelledError:
                finish = FinishReason.CANCELLED
        self._reply_ended = True
        return ReplyResult("".join(pieces), finish, len(tokens), n_reused, fitted.dropped)

    def stream_continue(self, messages: Sequence[dict[str, str]], sampling: SamplingSettings,
                        cancel: threading.Event, max_tokens: int | None = None
                        ) -> Generator[str, None, ReplyResult]:
        """As the engine: the reply so far is the prompt's end; only what follows is yielded."""
        self._require()
        self.calls.append("continue")
        tokens = _words(messages)
        n_reused = common_prefix(self._kv.tokens, tokens)
        pieces: list[str] = []
        finish = self.finish_reason
        with self.cancellable(cancel):
            try:
                self._step()
                if self.reply_error is not None:
                    raise self.reply_error
                self._kv.tokens = tokens
                for piece in self.reply:
                    self._step()
                    pieces.append(piece)
                    self._kv.tokens = self._kv.tokens + [hash(w) & 0xFFFF for w in piece.split()]
                    yield piece
            except CancelledError:
                finish = FinishReason.CANCELLED
        self._reply_ended = True
        return ReplyResult("".join(pieces), finish, len(tokens), n_reused)

    def step_kv_now(self) -> bool:
        info = self._require()
        self.calls.append("convert")
        self._step()
        if self.convert_error is not None:
            raise self.convert_error
        steps = [rung for rung, _, _ in RUNGS.get(info.kv_mode, ())]
        if self._kv.phase not in steps[:-1]:
            return False
        target = steps[steps.index(self._kv.phase) + 1]
        n = len(self._kv.tokens)
        for done, stage in enumerate(StepStage):
            if self._listener is not None:
                duration = 0.01 if stage is StepStage.END else 0.0
                self._listener(StepEvent(stage, done, len(StepStage) - 1, n, duration, target))
        self._kv.phase, self._kv.target = target, target
        self._kv.n_steps += 1
        return True

    def rebuild_kv(self, messages: Sequence[dict[str, str]], on_progress: Callable[[int, int], None],
                   chunk: int = 4) -> int:
        self._require()
        self.calls.append("rebuild")
        tokens = _words(messages)
        self._kv = self._empty_kv()
        on_progress(0, len(tokens))
        for start in range(0, len(tokens), chunk):
            self._step()
            self._kv.tokens = tokens[: start + chunk]
            on_progress(min(start + chunk, len(tokens)), len(tokens))
        return len(tokens)

    def layout(self) -> KvLayout:
        info = self._require()
        rungs = tuple(str(rung) for rung, _, _ in RUNGS.get(info.kv_mode, ()))
        return KvLayout(engine_version="fake", n_ctx=info.n_ctx, kv_mode=info.kv_mode, type_k="f16",
                        type_v="f16", lazy_phase="f16", lazy_rungs=rungs, lazy_rot_k=0, lazy_rot_v=0,
                        n_rot_k=0, n_rot_v=0, n_rot_k_swa=0, n_rot_v_swa=0, state_version=1)

    def capture_kv(self, compact: bool = False) -> KvSnapshot:
        self.calls.append("capture-compact" if compact else "capture")
        return KvSnapshot(self.layout(), list(self._kv.tokens), b"fake-state" * 8)

    def kv_refusal(self, tokens: Sequence[int], state: bytes | memoryview) -> str | None:
        self._require()
        return None  # the fake's states fit; restore_error refuses in restore_kv

    def restore_kv(self, tokens: Sequence[int], state: bytes | memoryview) -> None:
        self.calls.append("restore")
        if self.restore_error is not None:
            raise self.restore_error
        self._kv = self._empty_kv(list(tokens))

    def sync_kv(self, messages: Sequence[dict[str, str]]) -> int:
        self._require()
        self.calls.append("sync")
        tokens = _words(messages)
        kept = common_prefix(self._kv.tokens, tokens)
        self._step()
        self._kv.tokens = tokens
        return len(tokens) - kept

    def clear_kv(self) -> None:
        self._kv = self._empty_kv()

    def cached_tokens(self) -> list[int]:
        self._require()
        return list(self._kv.tokens)

    def transcript_tokens(self, messages: Sequence[dict[str, str]]) -> list[int]:
        self._require()
        return _words(messages)

    def keep_kv_prefix(self, n: int) -> bool:
        """A branch's cache from its parent's (``branches.open_branch``): the first ``n`` tokens kept."""
        self._require()
        self.calls.append("keep-prefix")
        if n > len(self._kv.tokens):
            return False
        self._kv.tokens = self._kv.tokens[:n]
        return True

    def close(self) -> None:
        self.calls.append("close")
        self._info = None

    def _empty_kv(self, tokens: list[int] | None = None) -> _Kv:
        """A cache as loaded (restored too: the fake keeps no step in its state): a lazy one at f16."""
        mode = self._require().kv_mode
        return _Kv(tokens or [], KvPhase.F16 if mode.is_lazy else KvPhase(mode.storage))

    def _require(self) -> ModelInfo:
        if self._info is None:
            raise NoModelError("no model is loaded")
        return self._info


def _words(messages: Sequence[dict[str, Any]]) -> list[int]:
    return [hash(w) & 0xFFFF for m in messages for w in (m["role"], *(m["content"] or "").split())]

