"""One conversation's engine session over the patched ``llama_cpp.Llama`` (Qt-free)."""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import json
import os
import random
import re
import struct
import threading
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import llama_chat
from llama_cpp.llama_grammar import LlamaGrammar

from lazykv.core.chat.context_policy import fit_messages
from lazykv.core.chat.conversation import common_prefix
from lazykv.core.engine import chat_template, tool_calls
from lazykv.core.engine.abort import AbortWatch
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.memory import split_by_device
from lazykv.core.engine.model_load import (
    TYPE_NAMES,
    budget_n_ctx,
    kv_cache_params,
    read_checked_meta,
    refuse_what_does_not_fit,
    remote_backends,
)
from lazykv.core.engine.model_meta import KvSupport
from lazykv.core.engine.planner import AUTO
from lazykv.core.engine.tool_calls import (
    ChatPrompt,
    DeltaTracker,
    Grammar,
    ParsedReply,
    ReplyParser,
    ToolRequest,
)
from lazykv.core.engine.types import (
    CancelledError,
    GrammarError,
    KvLayout,
    KvModeError,
    KvRestoreError,
    KvSnapshot,
    KvStatus,
    ModelInfo,
    ModelLoadError,
    NoModelError,
    PromptError,
    ReplyResult,
    SamplingSettings,
    StepEvent,
)
from lazykv.core.errors import EngineError
from lazykv.core.kinds import (
    ContextFullPolicy,
    FinishReason,
    KvPhase,
    StepStage,
)

HEAD_MESSAGES = 64  # a re-read formats this many messages first, then twice as many while they fall short
# copies of a sliding-window model's window kept in memory (WindowCheckpoints): the last replies' ends, so
# a regenerate or an edit of the last turns reads at most one turn again
CHECKPOINTS = 3
WINDOW_ONLY = llama_cpp.LLAMA_STATE_SEQ_FLAGS_SWA_ONLY  # the sliding-window layers' cells of a sequence
WINDOWS_KEY = "lazykv_windows"  # a captured state's checkpoints: the engine's bytes' size, their points


def default_threads() -> int:
    """One engine thread per core this process may run on (its CPU affinity: `taskset`, a
    container's cpuset), not per core of the machine: more threads than cores only wait."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class EngineSession:
    """A loaded model and its context, used for one conversation from one thread at a time.

    ``kv_status`` may also be called while that thread decodes.
    """

    def __init__(self) -> None:
        self._llama: llama_cpp.Llama | None = None
        self._info: ModelInfo | None = None
        self._formatter: _ChatFormat | None = None
        self._on_step: Callable[[StepEvent], None] | None = None
        self._step_cells = 0
        self._last_prompt: tuple[object, ChatPrompt] | None = None
        self._checkpoints = WindowCheckpoints()
        self._abort: AbortWatch | None = None
        self._cancel: threading.Event | None = None  # the token of the request running (see cancellable)

    def load(self, spec: LoadSpec) -> ModelInfo:
        """Load ``spec.model`` as ``spec`` says, replacing the current model only once the new one has loaded.

        A context budget replaces ``n_ctx`` with the longest context whose KV cache fits in it in this KV
        mode (memory.context_for_budget; ContextBudgetError when not even the smallest does). RPC servers
        that answer get ``rpc_layers`` layers (0: all) with their part of the KV cache, the others are left
        out and listed in ``ModelInfo.unreachable``. GPU layers ``AUTO``: as many as the memory plan fits on
        this machine's GPUs, each used up to ``gpu_memory`` bytes (0: its free memory less the headroom); none
        without a usable GPU (``ModelInfo.plan_note`` says so on a GPU build). A model whose plan needs more
        RAM than is available is refused with a sentence naming the context that fits (ModelLoadError),
        before llama.cpp could run out of memory. On any error the previous model stays loaded and usable.
        """
        path = spec.model
        meta = read_checked_meta(path)
        kv_mode, recent = spec.kv_mode, spec.window
        params = kv_cache_params(kv_mode, spec.flash_attn, spec.kv_recent, spec.kv_sinks)
        support: KvSupport = meta.kv_support(spec.flash_attn)
        if not support.allows(kv_mode):
            raise KvModeError(f"a {kv_mode} KV cache cannot run {path.name}: {support.reason}")
        n_ctx = budget_n_ctx(meta, spec.context_budget, kv_mode, recent) if spec.context_budget > 0 \
            else spec.n_ctx
        threads = spec.n_threads or default_threads()
        remote, unreachable = remote_backends(spec.rpc_servers)
        from lazykv.core.engine import devices as found  # it imports this module

        gpus = tuple(found.local_gpus())
        offered = tuple(found.registered(remote)) + gpus  # llama.cpp's order: the servers, then the GPUs
        if remote:
            params.update(rpc_servers=remote)
        chosen = spec.plan(meta, offered, n_ctx=n_ctx)
        n_gpu_layers = spec.layers(meta, offered)
        if n_gpu_layers == AUTO:
            n_gpu_layers = chosen.n_gpu_layers
        note = found.no_device_note(found.gpu_build(), gpus) if not remote else ""
        refuse_what_does_not_fit(path, meta, chosen, offered, spec.gpu_memory)
        try:
            llama = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=n_ctx,
                n_threads=threads,
                n_threads_batch=threads,
                n_gpu_layers=n_gpu_layers,
                verbose=False,
                **params,
            )
        except ValueError as err:  # llama_cpp raises ValueError for every native load failure
            raise ModelLoadError(f"llama.cpp could not load {path.name}: {err}") from err
        info = ModelInfo(
            path=path,
            architecture=llama.metadata.get("general.architecture", meta.architecture),
            n_params=llama_cpp.llama_model_n_params(llama.model),
            n_ctx_train=llama_cpp.llama_model_n_ctx_train(llama.model),
            file_size=path.stat().st_size,
            n_ctx=llama.n_ctx(),
            kv_mode=kv_mode,
            n_threads=threads,
            meta=meta,
            memory=split_by_device(llama.memory_breakdown()),
            plan=chosen,
            devices=offered,
            plan_note=note,
            remote=tuple(remote),
            unreachable=tuple(unreachable),
        )
        chat_format = _ChatFormat(llama)  # the file's chat template, else a known one, else plain
        info = replace(info, chat_template=chat_format.choice)
        self.close()
        self._llama, self._info = llama, info
        self._formatter, self._last_prompt = chat_format, None
        self._abort = AbortWatch(llama.ctx, lambda: self._cancel)
        if kv_mode.is_lazy:
            llama.set_kv_lazy_progress_callback(self._step_progress)
        return info

    @contextmanager
    def cancellable(self, cancel: threading.Event) -> Iterator[None]:
        """While inside, setting ``cancel`` (from any thread) stops a decode between graph nodes:
        a prompt being read, a transcript being re-read. Nests: the outer token is watched again after."""
        previous, self._cancel = self._cancel, cancel
        try:
            yield
        finally:
            self._cancel = previous

    def model_info(self) -> ModelInfo:
        if self._info is None:
            raise NoModelError("no model is loaded")
        return self._info

    def set_step_listener(self, fn: Callable[[StepEvent], None] | None) -> None:
        """``fn`` is called on the decoding thread at the start, progress and end of each conversion."""
        self._on_step = fn

    def kv_status(self) -> KvStatus:
        llama, info = self._require()
        lazy = llama.kv_lazy_info()
        if lazy.phase == "disabled":
            storage = KvPhase(info.kv_mode.storage)
            return KvStatus(info.kv_mode, storage, llama.n_tokens, info.n_ctx, info.n_ctx, lazy.kv_bytes)
        return KvStatus(
            kv_mode=info.kv_mode,
            phase=KvPhase(lazy.phase),
            n_cells_used=lazy.n_cells_used,
            n_cells_capacity=lazy.n_cells_capacity,
            n_cells_total=lazy.n_cells_total,
            kv_bytes=lazy.kv_bytes,
            n_steps=lazy.n_conversions,
            last_step_s=lazy.last_conversion_s,
            rungs=tuple(KvPhase(rung) for rung in lazy.rungs),
            n_cells_next=lazy.n_cells_next,
            target=KvPhase(lazy.target) if lazy.target else None,
        )

    def step_kv_now(self) -> bool:
        """Compact a lazy cache one step now (to 8-bit, then on a ladder to 4-bit), e.g. while the user
        reads; False if there was nothing to do (the last rung, or an empty cache)."""
        llama, info = self._require()
        if not info.kv_mode.is_lazy:
            return False
        return llama.kv_lazy_convert()

    def layout(self, written_at: str | None = None) -> KvLayout:
        """What a saved KV state must match to restore here (the snapshot header carries the same keys);
        ``written_at``: the layout of a state written at that later rung (see capture_kv)."""
        llama, info = self._require()
        meta = llama.state_metadata(written_at=written_at)
        return KvLayout(
            engine_version=llama_cpp.__version__,
            n_ctx=info.n_ctx,
            kv_mode=info.kv_mode,
            type_k=TYPE_NAMES.get(meta["type_k"], str(meta["type_k"])),
            type_v=TYPE_NAMES.get(meta["type_v"], str(meta["type_v"])),
            lazy_phase=str(meta["lazy_phase"]),
            lazy_rungs=tuple(str(rung) for rung in meta["lazy_rungs"]),
            lazy_rot_k=int(meta["lazy_rot"][0]),
            lazy_rot_v=int(meta["lazy_rot"][1]),
            n_rot_k=int(meta["n_rot_k"]),
            n_rot_v=int(meta["n_rot_v"]),
            n_rot_k_swa=int(meta["n_rot_k_swa"]),
            n_rot_v_swa=int(meta["n_rot_v_swa"]),
            state_version=int(meta["seq_version"]),
        )

    def capture_kv(self, compact: bool = False) -> KvSnapshot:
        """The conversation's KV cache (sequence 0) and the tokens it holds. ``compact``: a lazy cache
        saves its cells at its last rung (a ladder's 4-bit) even while they are still on an earlier one,
        converted on the way out; the live cache is unchanged."""
        llama, _ = self._require()
        lazy = llama.kv_lazy_info()
        rung = lazy.final if compact and lazy.phase in lazy.rungs and lazy.phase != lazy.final else None
        state = llama.save_state(seq_id=0, rung=rung)
        windows = self._checkpoints.held(llama)  # earlier points a branch or an edit may go back to
        metadata = dict(state.metadata)
        if windows:
            at = [[n, len(w)] for n, w in windows]
            metadata[WINDOWS_KEY] = {"native": len(state.llama_state), "at": at}
        meta = json.dumps(metadata, sort_keys=True).encode("utf-8")
        blob = b"".join([struct.pack("<I", len(meta)), meta, state.llama_state, *(w for _, w in windows)])
        tokens = llama.input_ids[: llama.n_tokens].tolist()
        return KvSnapshot(self.layout(written_at=rung), tokens, blob)

    def kv_refusal(self, tokens: Sequence[int], state: bytes | memoryview) -> str | None:
        """Why restore_kv would refuse a captured KV cache (the engine's own check: the layout, the rung
        a lazy cache would step to, the cell counts), or None when it would take it; changes nothing."""
        llama, _ = self._require()
        try:
            return llama.state_refusal(self._saved_state(tokens, state)[0], seq_id=0)
        except KvRestoreError as err:
            return str(err)

    def restore_kv(self, tokens: Sequence[int], state: bytes | memoryview) -> None:
        """Put a captured KV cache back; KvRestoreError (cache left empty) when it does not fit here.

        A writable ``state`` (a memoryview of a bytearray, as read_snapshot returns) is read by the
        engine in place; bytes are copied once."""
        llama, _ = self._require()
        self._checkpoints.clear()  # another conversation's, or another point's
        saved, windows = self._saved_state(tokens, state)
        try:
            llama.load_state(saved, seq_id=0)
        except llama_cpp.StateMismatchError as err:
            raise KvRestoreError(err.reason) from err
        for n, window in windows:
            self._checkpoints.add(n, _digest(tokens[:n]), window)

    def _saved_state(self, tokens: Sequence[int], state: bytes | memoryview
                     ) -> tuple[llama_cpp.LlamaState, list[tuple[int, bytes]]]:
        """capture_kv's blob (its metadata, then the engine's bytes, not copied) as a LlamaState, and the
        window checkpoints after them (those cut short: none)."""
        llama, info = self._require()
        state = memoryview(state)
        try:
            (n_meta,) = struct.unpack_from("<I", state)
            metadata = json.loads(bytes(state[4 : 4 + n_meta]).decode("utf-8"))
            listed = metadata.pop(WINDOWS_KEY, None)
            end = 4 + n_meta + int(listed["native"]) if listed else len(state)
            native = state[4 + n_meta : end]
            windows = _windows(state, end, listed["at"]) if listed else []
        except (struct.error, UnicodeDecodeError, ValueError, TypeError, KeyError) as err:
            raise KvRestoreError(f"the saved KV state is damaged ({err})") from err
        if len(tokens) > info.n_ctx:
            raise KvRestoreError(f"{len(tokens)} saved tokens do not fit the context of {info.n_ctx}")
        input_ids = np.zeros(info.n_ctx, dtype=np.intc)
        input_ids[: len(tokens)] = tokens
        return llama_cpp.LlamaState(
            input_ids=input_ids,
            scores=np.empty((0, llama.n_vocab()), np.single),
            n_tokens=len(tokens),
            llama_state=native,
            llama_state_size=len(native),
            seed=llama._seed,
            seq_id=0,
            metadata=metadata,
        ), windows

    def rebuild_kv(self, messages: Sequence[dict[str, str]], on_progress: Callable[[int, int], None],
                   chunk: int = 256) -> int:
        """Read the conversation into an empty cache in chunks, reporting (done, total) tokens after each.

        The fallback when a snapshot cannot be restored: afterwards the next reply only reads its
        own turn. Returns the number of tokens read. Inside ``cancellable(token)``, setting the token
        raises CancelledError within one graph node; the chunks read stay cached (the next reply
        reuses them and reads the rest).
        """
        llama, info = self._require()
        tokens = self._head_tokens(messages, max(0, info.n_ctx - 1))
        self.clear_kv()
        on_progress(0, len(tokens))
        done = 0
        for stop in [*self._message_ends(llama, messages, tokens), len(tokens)]:
            for start in range(done, stop, chunk):
                self._eval_or_cancel(llama, tokens[start : min(start + chunk, stop)])
                on_progress(min(start + chunk, stop), len(tokens))
            done = stop
            self._checkpoints.take(llama)  # the end of a message: a point to go back to
        return len(tokens)

    def _message_ends(self, llama: llama_cpp.Llama, messages: Sequence[dict[str, Any]],
                      tokens: Sequence[int]) -> list[int]:
        """Where the last messages end in ``tokens`` (a sliding-window model's re-read takes its window
        checkpoints there); none for a model without a window."""
        if llama_cpp.llama_model_n_swa(llama.model) <= 0:
            return []
        ends = []
        for i in range(max(1, len(messages) - self._checkpoints.keep), len(messages)):
            head = self._prompt(messages[:i], add_generation_prompt=False).tokens
            if 0 < len(head) < len(tokens) and list(tokens[: len(head)]) == head:
                ends.append(len(head))
        return sorted(set(ends))

    def _head_tokens(self, messages: Sequence[dict[str, str]], limit: int) -> list[int]:
        """The first ``limit`` tokens of the conversation's prompt, made from only as many messages as
        they take (prefixes that double): tokenizing all of a 4,000-message conversation to keep its
        first 2,047 tokens took a second, with 100,000 messages minutes nothing could stop."""
        n = min(len(messages), HEAD_MESSAGES)
        while True:
            tokens = self._prompt(messages[:n], add_generation_prompt=False).tokens
            if len(tokens) >= limit or n == len(messages):
                return tokens[:limit]
            n = min(len(messages), 2 * n)

    def _eval_or_cancel(self, llama: llama_cpp.Llama, tokens: Sequence[int]) -> None:
        stopped = "stopped before the conversation was read to the end"
        if self._cancel is not None and self._cancel.is_set():
            raise CancelledError(stopped)
        assert self._abort is not None
        try:
            with self._abort.installed():
                llama.eval(tokens)
        except RuntimeError as err:  # llama_decode returned 2: aborted
            if self._cancel is not None and self._cancel.is_set():
                raise CancelledError(stopped) from err
            raise

    def sync_kv(self, messages: Sequence[dict[str, str]]) -> int:
        """Make the cache hold ``messages`` and nothing else (e.g. another version of the last reply was
        chosen): the common prefix stays, the rest is dropped and what differs is read. Returns the
        tokens read. Inside ``cancellable(token)``, setting the token stops the reading (the next reply
        reads the rest)."""
        llama, info = self._require()
        tokens = self._head_tokens(messages, max(0, info.n_ctx - 1))
        n_reused = self._reusable(llama, tokens)
        if n_reused < llama.n_tokens:
            llama._ctx.kv_cache_seq_rm(-1, n_reused, -1)
            llama.n_tokens = n_reused
        self._eval_or_cancel(llama, tokens[n_reused:])
        self._checkpoints.take(llama)
        return len(tokens) - n_reused

    def keep_kv_prefix(self, n: int) -> bool:
        """Keep the first ``n`` cached tokens and remove the cells after them (sequence 0), as a branch of
        the conversation at that point needs. False, the cache unchanged, when it holds fewer tokens, or
        when a sliding-window model's cache no longer holds the window the next token attends to (its
        older cells went as the window moved on): only a re-read gives that point then."""
        llama, _ = self._require()
        if n > llama.n_tokens:
            return False
        if not _holds_prefix(llama, n):  # a sliding-window model: exact only from a checkpoint there
            return self._checkpoints.back_to(llama, n, exact=True) == n
        llama._ctx.kv_cache_seq_rm(-1, n, -1)
        llama.n_tokens = n
        return True

    def reread_from_checkpoint(self, n: int) -> int | None:
        """Make the cache hold its first ``n`` tokens from the nearest window checkpoint before them,
        reading what follows it: the tokens read, or None when no checkpoint fits (the cache unchanged)."""
        llama, _ = self._require()
        if n > llama.n_tokens:
            return None
        tokens = llama.input_ids[:n].tolist()
        kept = self._checkpoints.back_to(llama, n)
        if not kept:
            return None
        self._eval_or_cancel(llama, tokens[kept:])
        return n - kept

    def _reusable(self, llama: llama_cpp.Llama, tokens: Sequence[int]) -> int:
        """How many cached tokens a prompt of ``tokens`` can keep: their common prefix, if the cache cut
        there still holds what the next token attends to; else none (the cache is emptied: a restored
        sliding-window model's state holds only its window's last cells, so a cut further back would
        leave the window with holes)."""
        n = common_prefix(llama.input_ids[: llama.n_tokens].tolist(), tokens)
        # llama-cpp-python reads a prompt found whole again from its last token (fresh logits)
        cut = n - 1 if n == len(tokens) and n > 0 else n
        if cut < llama.n_tokens and not _holds_prefix(llama, cut):
            return self._checkpoints.back_to(llama, cut) or self._emptied()
        return n

    def _emptied(self) -> int:
        self.clear_kv()
        return 0

    def transcript_tokens(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """The tokens a re-read of ``messages`` puts in the cache (rebuild_kv's, without a reply's prompt)."""
        _, info = self._require()
        return self._head_tokens(messages, max(0, info.n_ctx - 1))

    def clear_kv(self) -> None:
        """Empty the KV cache (a lazy cache returns to its f16 phase)."""
        llama, _ = self._require()
        self._checkpoints.clear()
        llama.reset()
        llama._ctx.kv_cache_clear()

    def count_tokens(self, messages: Sequence[dict[str, str]]) -> int:
        return len(self._prompt(messages).tokens)

    def stream_reply(
        self,
        messages: Sequence[dict[str, str]],
        sampling: SamplingSettings,
        cancel: threading.Event,
        max_tokens: int | None = None,
        context_full: str = ContextFullPolicy.STOP,
        tools: ToolRequest | None = None,
    ) -> Generator[str, None, ReplyResult]:
        """Yield the assistant's reply to ``messages`` piece by piece; return a ReplyResult.

        The prompt is the model's own chat template applied to ``messages``, cut to fit the
        context under the ``context_full`` policy (see context_policy). The KV cache keeps
        the common prefix with the previous prompt, so an edited or regenerated turn only
        re-reads what changed. ``cancel`` stops the prompt's reading through the context's abort
        callback (within one graph node) and generation after every streamed piece: llama.cpp
        streams one token per piece, so generation stops within one token (a few more only
        while it holds back an incomplete UTF-8 character or a partial stop string). A reply
        cancelled before its first piece returns empty, ``cancelled``.
        ``max_tokens=None`` lets the reply run to the end of the model's turn or of the context.
        With ``tools``, the reply may call them: only its own words are yielded (a call being written is
        not), and the result carries the calls.
        """
        _, info = self._require()
        fitted = fit_messages(messages, self.count_tokens, info.n_ctx, context_full, max_tokens)
        prompt = self._prompt(fitted.messages, tools=tools)
        stream = self.stream_tokens(prompt.tokens, prompt.stop, sampling, cancel, max_tokens, prompt.grammar,
                                    prompt.special)
        if prompt.parser.kind == "plain":
            result = yield from stream
        else:
            result = yield from self._read_back(stream, prompt)
        return replace(result, dropped=fitted.dropped)

    def stream_tokens(
        self,
        tokens: list[int],
        stop: list[str],
        sampling: SamplingSettings,
        cancel: threading.Event,
        max_tokens: int | None = None,
        grammar: str | Grammar | None = None,
        special: bool = False,
    ) -> Generator[str, None, ReplyResult]:
        """Yield the continuation of a prompt given as ``tokens`` piece by piece (see stream_reply,
        which makes them from a conversation; the local API also sends raw prompts); return a ReplyResult.
        The cache keeps its common prefix with ``tokens`` (``n_reused``) and reads the rest.
        ``grammar`` (GBNF, root rule ``root``): every sampled token keeps the reply inside it, and the
        reply ends only where it is complete (a lazy one: from its trigger on); GrammarError before
        anything is read when llama.cpp cannot parse it. ``special``: special tokens the model writes are
        part of the text (a tool call's markers, for ``parse_reply``)."""
        llama, _ = self._require()
        if isinstance(grammar, str):
            grammar = Grammar(grammar)
        if grammar is not None:
            _check_grammar(llama, grammar.gbnf)
        n_reused = self._reusable(llama, tokens)
        result = ReplyResult("", FinishReason.CANCELLED, len(tokens), n_reused)
        if cancel.is_set():
            return result
        with self.cancellable(cancel):
            text, finish_reason = yield from self._stream(llama, tokens, stop, sampling, cancel, max_tokens,
                                                          grammar, special)
        if finish_reason is not FinishReason.CANCELLED:
            self._checkpoints.take(llama)  # the reply's end: where an edit or a regenerate goes back to
        # the cache took every generated token but the last one when a limit or a stop string ended it
        n_generated = max(0, llama.n_tokens - len(tokens))
        if finish_reason is FinishReason.LENGTH and max_tokens:
            n_generated = max_tokens
        return replace(result, text=text, finish_reason=finish_reason, n_generated=n_generated)

    def stream_continue(
        self,
        messages: Sequence[dict[str, str]],
        sampling: SamplingSettings,
        cancel: threading.Event,
        max_tokens: int | None = None,
    ) -> Generator[str, None, ReplyResult]:
        """Go on with the last message, a reply that was cut off (a length limit, Stop): the prompt is
        the conversation before it, opened for the assistant, and the reply so far; yields only what
        follows it. The cache keeps the common prefix, as for any reply."""
        llama, _ = self._require()
        if not messages or messages[-1]["role"] != "assistant":
            raise ValueError("there is no reply to continue")
        prompt = self._prompt(messages[:-1])
        partial = llama.tokenize(messages[-1]["content"].encode("utf-8"), add_bos=False, special=False)
        tokens = prompt.tokens + partial
        return (yield from self.stream_tokens(tokens, prompt.stop, sampling, cancel, max_tokens))

    def chat_prompt(self, messages: Sequence[dict[str, Any]], tools: ToolRequest | None = None) -> ChatPrompt:
        """``messages`` under the model's own chat template, ready for a reply: its tokens, the template's
        stop strings and, with ``tools``, the grammar a call is held to and how the reply is read back
        (``parse_reply``); PromptError when the template refuses them."""
        return self._prompt(messages, tools=tools)

    def _read_back(self, stream: Generator[str, None, ReplyResult], prompt: ChatPrompt
                   ) -> Generator[str, None, ReplyResult]:
        """``stream``'s words as the parser reads them while they come, and its calls at the end."""
        text, tracker = "", DeltaTracker()
        while True:
            try:
                text += next(stream)
            except StopIteration as end:
                result: ReplyResult = end.value
                break
            for delta in tracker.deltas(self.parse_reply(text, prompt, partial=True)):
                if "content" in delta:
                    yield delta["content"]
        reply = self.parse_reply(result.text, prompt)
        return replace(result, text=reply.content, tool_calls=reply.tool_calls)

    @staticmethod
    def parse_reply(text: str, prompt: ChatPrompt, partial: bool = False) -> ParsedReply:
        """A reply to ``prompt`` as OpenAI's assistant message: its text and the tool calls it makes
        (``partial``: the part written so far; text that may still become a call is held back)."""
        return tool_calls.parse(text, prompt.parser, partial)

    def tokenize(self, text: str) -> list[int]:
        """A raw prompt's tokens (with the model's BOS; special tokens in the text stay plain text)."""
        llama, _ = self._require()
        return llama.tokenize(text.encode("utf-8"), add_bos=True, special=False)

    def cached_tokens(self) -> list[int]:
        """The tokens the KV cache holds now (sequence 0), in order."""
        llama, _ = self._require()
        return llama.input_ids[: llama.n_tokens].tolist()

    def _stream(
        self,
        llama: llama_cpp.Llama,
        tokens: list[int],
        stop: list[str],
        sampling: SamplingSettings,
        cancel: threading.Event,
        max_tokens: int | None,
        grammar: Grammar | None = None,
        special: bool = False,
    ) -> Generator[str, None, tuple[str, FinishReason]]:
        seed = sampling.seed if sampling.seed is not None else random.getrandbits(32)
        pieces: list[str] = []
        finish_reason = FinishReason.STOP
        try:
            chunks = llama.create_completion(
                prompt=tokens,
                stream=True,
                stop=stop,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                min_p=sampling.min_p,
                repeat_penalty=sampling.repeat_penalty,
                presence_penalty=sampling.presence_penalty,
                frequency_penalty=sampling.frequency_penalty,
                seed=seed,
                max_tokens=max_tokens if max_tokens else -1,
                grammar=None if grammar is None else _llama_grammar(llama, grammar),
                special=special,
            )
            try:
                assert self._abort is not None
                with self._abort.installed():  # the prompt is read inside the first step
                    first = next(chunks, None)
                for chunk in itertools.chain([first] if first is not None else [], chunks):
                    if cancel.is_set():
                        finish_reason = FinishReason.CANCELLED
                        break
                    choice = chunk["choices"][0]
                    piece = choice.get("text")
                    if piece:
                        pieces.append(piece)
                        yield piece
                    if choice.get("finish_reason"):
                        finish_reason = FinishReason(choice["finish_reason"])
            finally:
                chunks.close()
        except ValueError as err:  # e.g. the conversation no longer fits the context
            raise EngineError(str(err)) from err
        except RuntimeError:  # llama_decode returned 2: the prompt's reading was aborted
            if not cancel.is_set():
                raise
            finish_reason = FinishReason.CANCELLED
        return "".join(pieces), finish_reason

    def close(self) -> None:
        """Free the model and its context now rather than at garbage collection."""
        if self._llama is not None:
            if self._info is not None and self._info.kv_mode.is_lazy:
                self._llama.set_kv_lazy_progress_callback(None)
            self._llama.close()
        self._llama, self._info, self._formatter, self._last_prompt = None, None, None, None
        self._abort = None

    def _require(self) -> tuple[llama_cpp.Llama, ModelInfo]:
        if self._llama is None or self._info is None:
            raise NoModelError("no model is loaded")
        return self._llama, self._info

    def _prompt(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True,
        tools: ToolRequest | None = None,
    ) -> ChatPrompt:
        """The prompt; the last one is kept, as fitting a reply to the context counts the very messages
        the reply then sends."""
        key = (json.dumps(list(messages), sort_keys=True), add_generation_prompt, tools)
        if self._last_prompt is not None and self._last_prompt[0] == key:
            return self._last_prompt[1]
        llama, _ = self._require()
        assert self._formatter is not None
        rendered = self._formatter.render(messages, add_generation_prompt, tools)
        tokens = llama.tokenize(rendered.text.encode("utf-8"), add_bos=not rendered.has_bos, special=True)
        stop = [*self._formatter.stop, *rendered.stops]
        prompt = ChatPrompt(tokens, stop, rendered.grammar, rendered.parser,
                            special=rendered.parser.kind == "common")
        self._last_prompt = (key, prompt)
        return prompt

    def _step_progress(self, lazy: llama_cpp.KvLazyInfo) -> None:
        if lazy.phase == KvPhase.CONVERTING and lazy.progress_done == 0:
            self._step_cells = lazy.n_cells_used
            stage = StepStage.START
        elif lazy.phase == KvPhase.CONVERTING:
            stage = StepStage.PROGRESS
        else:
            stage = StepStage.END
        event = StepEvent(
            stage=stage,
            done=lazy.progress_done,
            total=lazy.progress_total,
            n_cells=self._step_cells,
            duration_s=lazy.last_conversion_s if stage is StepStage.END else 0.0,
            target=KvPhase(lazy.target) if lazy.target else KvPhase.Q8_0,
        )
        if self._on_step is not None:
            self._on_step(event)


@dataclass(frozen=True)
class _Rendered:
    text: str
    has_bos: bool  # the text holds the BOS token already (a file's template writes it)
    grammar: Grammar | None = None
    parser: ReplyParser = ReplyParser("plain")
    stops: tuple[str, ...] = ()


def _template_reason(err: Exception) -> str:
    """The template's own words in a Jinja error (its ``raise_exception`` message, or the rule it broke),
    without the source excerpt around them: the error ends with ``Error: <what>`` where it was executing."""
    text = str(err).strip()
    reason = text.rpartition("Error: ")[2].strip() if "Error: " in text else text
    line = reason.splitlines()[0].rstrip(".") if reason else "it gives no reason"
    return line[0].lower() + line[1:] if line[1:2].islower() else line


class _ChatFormat:
    """How a conversation becomes the model's prompt: the file's own chat template (through llama.cpp's
    ``common/chat``, which also renders tools), else llama.cpp's built-in one for the model's family, else
    a plain transcript (the choice: chat_template.choose); ``stop``: the format's end-of-turn markers and
    the vocabulary's end tokens, which end a reply. Tools go through the template where it knows them,
    else through the generic format (tool_calls)."""

    def __init__(self, llama: llama_cpp.Llama) -> None:
        vocab = llama_cpp.llama_model_get_vocab(llama.model)

        def token_text(token: int) -> str:
            return llama.detokenize([token], special=True).decode("utf-8", "replace") if token >= 0 else ""

        template = llama.metadata.get("tokenizer.chat_template")
        specials = () if template else _special_tokens(llama)
        self.choice = chat_template.choose(template, llama.metadata.get("general.architecture", ""), specials)
        self._common: llama_chat.ChatTemplates | None = None
        self.native_tools = False
        if template:
            try:
                self._common = llama_chat.ChatTemplates(model=llama.model)
            except llama_chat.ChatTemplateError as err:
                raise EngineError(f"The model's chat template cannot be used: {_template_reason(err)}.",
                                  details=str(err)) from err
            self.native_tools = bool(self._common.caps.get("supports_tool_calls"))
        ends = (token_text(llama.token_eos()), token_text(llama_cpp.llama_vocab_eot(vocab)))
        self.stop = tuple(dict.fromkeys(m for m in (*self.choice.end_markers, *ends) if m))

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool,
               tools: ToolRequest | None = None) -> _Rendered:
        """The prompt's text (PromptError when the template refuses the messages)."""
        if self._common is not None and self.native_tools:
            return self._render_common(messages, add_generation_prompt, tools)
        plain = tool_calls.generic_messages(messages, tools)
        grammar = tool_calls.generic_grammar(tools) if tools is not None else None
        parser = ReplyParser("generic" if tools is not None and tools.offered else "plain")
        if self._common is not None:
            rendered = self._render_common(plain, add_generation_prompt, None)
            return replace(rendered, grammar=grammar, parser=parser)
        if self.choice.source is chat_template.TemplateSource.BUILTIN:
            text = chat_template.render(self.choice.name, plain, add_generation_prompt)
            if text is None:
                raise PromptError(f"llama.cpp's built-in {self.choice.name} template refused these messages")
            return _Rendered(text, False, grammar, parser)
        return _Rendered(chat_template.plain_prompt(plain, add_generation_prompt), False, grammar, parser)

    def _render_common(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool,
                       tools: ToolRequest | None) -> _Rendered:
        assert self._common is not None
        try:
            out = self._common.apply(tool_calls.common_request(messages, tools, add_generation_prompt))
        except llama_chat.ChatTemplateError as err:  # the template's raise_exception, or a broken template
            raise PromptError(f"The model's chat template refused these messages: {_template_reason(err)}",
                              details=str(err)) from err
        grammar = None
        if out["grammar"]:
            lazy = bool(out["grammar_lazy"])
            grammar = Grammar(out["grammar"], tuple(out["trigger_patterns"]) if lazy else (),
                              tuple(out["trigger_words"]) if lazy else ())
        offered = tools is not None and bool(tools.offered)
        parser = ReplyParser("common", out["parser"]) if offered else ReplyParser("plain")
        return _Rendered(out["prompt"], True, grammar, parser, tuple(out["additional_stops"]))


class WindowCheckpoints:
    """Copies of a sliding-window model's window cells at the ends of its last replies (llama.cpp's
    sliding-window-only sequence state, as llama-server's context checkpoints): the window-sized cache
    forgets the cells the window passed, so going back to an earlier point (a regenerate, an edited
    message, a branch) restores the nearest copy at or before it and reads only what follows."""

    def __init__(self, keep: int = CHECKPOINTS) -> None:
        self.keep = keep
        self._taken: list[tuple[int, bytes, bytes]] = []  # (tokens held, their digest, the state)

    def clear(self) -> None:
        self._taken.clear()

    @property
    def positions(self) -> list[int]:
        return [n for n, _, _ in self._taken]

    def take(self, llama: llama_cpp.Llama) -> None:
        """A copy of the window as it is now (nothing for a model without one)."""
        n = llama.n_tokens
        if n <= 0 or self.keep <= 0 or llama_cpp.llama_model_n_swa(llama.model) <= 0:
            return
        size = llama_cpp.llama_state_seq_get_size_ext(llama.ctx, 0, WINDOW_ONLY)
        buf = (ctypes.c_uint8 * size)()
        if llama_cpp.llama_state_seq_get_data_ext(llama.ctx, buf, size, 0, WINDOW_ONLY) != size:
            return
        self.add(n, _digest(llama.input_ids[:n]), bytes(buf))

    def add(self, n: int, digest: bytes, state: bytes) -> None:
        """A copy of the window at ``n`` tokens (taken now, or a snapshot's); the latest ``keep`` stay."""
        self._taken = [t for t in self._taken if t[0] != n][-(self.keep - 1):] if self.keep > 1 else []
        if self.keep > 0:
            self._taken.append((n, digest, state))
            self._taken.sort(key=lambda t: t[0])

    def held(self, llama: llama_cpp.Llama) -> list[tuple[int, bytes]]:
        """The copies of points the cache still holds the tokens of (before its end), oldest first."""
        return [(n, state) for n, digest, state in self._taken
                if n < llama.n_tokens and digest == _digest(llama.input_ids[:n])]

    def back_to(self, llama: llama_cpp.Llama, n: int, exact: bool = False) -> int:
        """Put back the latest copy at or before ``n`` (``exact``: at ``n``) taken of the tokens the cache
        still holds, and cut the cache there: the tokens it keeps (0: none fits, the cache as it was)."""
        for at, digest, state in reversed(self._taken):
            if at > n or (exact and at != n) or at >= llama.n_tokens:
                continue
            if digest != _digest(llama.input_ids[:at]):
                continue
            data = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
            restored = llama_cpp.llama_state_seq_set_data_ext(llama.ctx, data, len(state), 0, WINDOW_ONLY)
            if restored != len(state):
                return 0
            llama._ctx.kv_cache_seq_rm(-1, at, -1)
            llama.n_tokens = at
            return at
        return 0


def _windows(state: memoryview, start: int, listed: Sequence[Sequence[int]]) -> list[tuple[int, bytes]]:
    """The window checkpoints a captured state lists (their points and sizes), read from ``start`` on;
    none when they are cut short."""
    out = []
    for n, size in listed:
        if start + int(size) > len(state):
            return []
        out.append((int(n), bytes(state[start : start + int(size)])))
        start += int(size)
    return out


def _digest(tokens: Any) -> bytes:
    return hashlib.blake2b(np.asarray(tokens, dtype=np.int32).tobytes(), digest_size=16).digest()


def _holds_prefix(llama: llama_cpp.Llama, n: int) -> bool:
    """Whether the cache cut to its first ``n`` tokens still holds every cell the token at position ``n``
    attends to. A sliding-window model's cache may lack cells the window has passed (a restored state
    keeps only the window's last ``n_swa`` positions): that token needs positions from ``n - n_swa + 1``."""
    if n <= 0 or n >= llama.n_tokens:
        return True
    n_swa = llama_cpp.llama_model_n_swa(llama.model)
    if n_swa <= 0:
        return True
    pos_min = llama_cpp.llama_memory_seq_pos_min(llama_cpp.llama_get_memory(llama.ctx), 0)
    return pos_min <= max(0, n - n_swa + 1)


def _llama_grammar(llama: llama_cpp.Llama, grammar: Grammar) -> LlamaGrammar:
    """llama-cpp-python's grammar; a trigger word that is one token of the vocabulary triggers as that
    token (a special token is never matched as text), any other as the word's text."""
    patterns, tokens = list(grammar.trigger_patterns), []
    for word in grammar.trigger_words:
        ids = llama.tokenize(word.encode("utf-8"), add_bos=False, special=True)
        if len(ids) == 1:
            tokens.append(ids[0])
        else:
            patterns.append(re.escape(word))
    return LlamaGrammar.from_string(grammar.gbnf, trigger_patterns=patterns or None,
                                    trigger_tokens=tokens or None)


def _check_grammar(llama: llama_cpp.Llama, grammar: str) -> None:
    """GrammarError when llama.cpp cannot parse ``grammar`` (its sampler would be null)."""
    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), b"root")
    if not sampler:
        raise GrammarError("llama.cpp could not parse the grammar made for this response format")
    llama_cpp.llama_sampler_free(sampler)


def _special_tokens(llama: llama_cpp.Llama) -> list[str]:
    """The text of the vocabulary's control and user-defined tokens (``<start_of_turn>``, ``<|im_end|>``);
    none for a model without a vocabulary (llama.cpp asserts on the attributes of its tokens)."""
    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    if llama_cpp.llama_vocab_type(vocab) == llama_cpp.LLAMA_VOCAB_TYPE_NONE:
        return []
    special = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
    return [llama_cpp.llama_vocab_get_text(vocab, token).decode("utf-8", errors="replace")
            for token in range(llama.n_vocab()) if llama_cpp.llama_vocab_get_attr(vocab, token) & special]
