"""The model's tool calls in the app: each one asked about (unless its tool is always allowed), run off the
GUI thread on its MCP server, and its result added to the conversation; then the chat flow lets the model
answer. Nothing runs without the user's say-so; a Private chat remembers no "always"."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any, Protocol

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QWidget

from lazykv.core.chat.conversation import Conversation
from lazykv.core.engine import tool_calls
from lazykv.core.engine.tool_calls import ToolRequest
from lazykv.core.kinds import ToolStatus
from lazykv.core.tools.consent import ConsentStore, Decision
from lazykv.core.tools.mcp_hub import McpHub, ToolResult, ToolSpec, cap_text
from lazykv.qt.background import Background
from lazykv.qt.tool_consent import ToolConsentDialog

MAX_ROUNDS = 8  # replies in a row that call tools before the model must answer in words
CONTEXT_SHARE = 2  # a result takes at most this many bytes per token of the context: about half of it
DENIED = "The user did not allow this tool call."
CANCELLED = "The tool call was stopped by the user."


class ToolCallsHost(Protocol):
    @property
    def conversation(self) -> Conversation: ...
    @property
    def private(self) -> bool: ...  # a Private chat: no "always" is remembered
    def context_tokens(self) -> int: ...  # the loaded model's context (0: none loaded)


class ToolCalls(QObject):
    """The tools the model is offered (those of the MCP servers that are up) and the running of its calls."""

    def __init__(self, host: ToolCallsHost, hub: McpHub | None, consent: ConsentStore,
                 dialog_parent: QWidget, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.host = host
        self.hub = hub
        self.consent = consent
        self.private_consent = ConsentStore(None)  # a Private chat's "always" lasts while it is open
        self._dialog_parent = dialog_parent
        self._calls = Background(self)  # its own thread: a hanging tool never delays a save
        self._cancel: threading.Event | None = None
        self._dialog: ToolConsentDialog | None = None
        self._on_done: Callable[[bool], None] | None = None
        self.rounds = 0  # replies in a row that called tools
        self._forced: str | None = None  # the tool the next reply must call (force_next)
        self._answer_next = False  # after a forced call: the reply after its result answers in words

    def offered(self) -> ToolRequest | None:
        """The tools of the servers that are up, for the next reply (None: none, or too many rounds)."""
        if self.hub is None or self.rounds >= MAX_ROUNDS:
            return None
        tools = [_checked(spec.openai_tool()) for spec in self.hub.tools()]
        forced, self._forced = self._forced, None
        if forced is not None and any(t["function"]["name"] == forced for t in tools):
            self._answer_next = True
            return ToolRequest(tuple(tools), "required", forced)
        if self._answer_next:
            self._answer_next = False
            return ToolRequest(tuple(tools), "none")
        return ToolRequest(tuple(tools)) if tools else None

    def force_next(self, qualified: str) -> None:
        """The next reply calls this tool (as the API's named tool_choice does; it is still asked about),
        and the reply after its result answers in words."""
        self._forced, self._answer_next = qualified, False

    @property
    def running(self) -> bool:
        return self._on_done is not None

    def run(self, on_done: Callable[[bool], None]) -> None:
        """Run the calls of the conversation's last reply that have no result yet, one after the other;
        ``on_done(stopped)`` when each has one (``stopped``: Stop was pressed meanwhile)."""
        self.rounds += 1
        self._on_done = on_done
        self._next()

    def stop(self) -> None:
        """Stop: the call running is cancelled, the one being asked about is denied; the rest are not run."""
        if self._on_done is None:
            return
        if self._cancel is not None:
            self._cancel.set()
        if self._dialog is not None:
            dialog, self._dialog = self._dialog, None
            dialog.close()
            self._finish(stopped=True)

    def _next(self) -> None:
        pending = self.host.conversation.pending_tool_calls()
        if not pending:
            self._finish(stopped=False)
            return
        call = pending[0]
        name = call["function"]["name"]
        spec = self.hub.find(name) if self.hub is not None else None
        if spec is None:
            unknown = ToolResult(f"There is no tool named {name!r}.", True, False)
            self._result(call, unknown, ToolStatus.ERROR)
            return
        try:
            arguments = json.loads(call["function"]["arguments"] or "{}")
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            bad = ToolResult("The arguments are not a JSON object.", True, False)
            self._result(call, bad, ToolStatus.ERROR)
            return
        store = self.private_consent if self.host.private else self.consent
        if store.allowed(spec.server, spec.name):
            self._execute(call, spec, arguments)
            return
        self._dialog = dialog = ToolConsentDialog(self._dialog_parent, spec, arguments)
        dialog.decided.connect(lambda decision: self._decided(call, spec, arguments, store, decision))
        dialog.open()

    def _decided(self, call: dict[str, Any], spec: ToolSpec, arguments: dict[str, Any], store: ConsentStore,
                 decision: str) -> None:
        if self._dialog is None:  # stopped meanwhile
            return
        self._dialog = None
        store.record(spec.server, spec.name, decision)
        if decision == Decision.DENY:
            self._result(call, ToolResult(DENIED, True, False), ToolStatus.DENIED)
        else:
            self._execute(call, spec, arguments)

    def _execute(self, call: dict[str, Any], spec: ToolSpec, arguments: dict[str, Any]) -> None:
        assert self.hub is not None
        hub, cancel = self.hub, threading.Event()
        self._cancel = cancel

        def done(result: ToolResult) -> None:
            self._cancel = None
            if cancel.is_set():
                self._result(call, ToolResult(CANCELLED, True, False), ToolStatus.CANCELLED)
            else:
                self._result(call, result, ToolStatus.ERROR if result.is_error else ToolStatus.OK)

        def failed(err: Exception) -> None:
            self._cancel = None
            failure = ToolResult(f"The tool could not be called: {err}", True, False)
            self._result(call, failure, ToolStatus.ERROR)

        self._calls.run(lambda: hub.call(spec.qualified, arguments, cancel), done, failed,
                        what="A tool call")

    def _result(self, call: dict[str, Any], result: ToolResult, status: ToolStatus) -> None:
        if self._on_done is None:  # the chat went away meanwhile
            return
        spec = self.hub.find(call["function"]["name"]) if self.hub is not None else None
        n_ctx = self.host.context_tokens()
        if n_ctx > 0:  # an output the context cannot hold would only make the answer fail
            text, cut = cap_text(result.text, CONTEXT_SHARE * n_ctx)
            result = ToolResult(text, result.is_error, result.truncated or cut)
        self.host.conversation.add_tool_result(
            call["id"], call["function"]["name"], result.for_model(), status, result.truncated,
            spec.server if spec else "", spec.name if spec else "")
        if status is ToolStatus.CANCELLED:
            self._finish(stopped=True)
        else:
            self._next()

    def _finish(self, stopped: bool) -> None:
        if stopped and self._on_done is not None:  # every call gets its answer: the rest were not run
            for call in self.host.conversation.pending_tool_calls():
                self.host.conversation.add_tool_result(call["id"], call["function"]["name"], CANCELLED,
                                                       ToolStatus.CANCELLED)
        on_done, self._on_done = self._on_done, None
        if on_done is not None:
            on_done(stopped)

    def abandon(self) -> None:
        """The chat was replaced: nothing more is added to it."""
        if self._cancel is not None:
            self._cancel.set()
        if self._dialog is not None:
            self._dialog.close()
        self._dialog, self._on_done, self.rounds = None, None, 0


def _checked(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool whose schema a grammar cannot enforce is offered with any object as its arguments (its
    server still checks them)."""
    try:
        tool_calls.check_tools([tool])
    except tool_calls.ToolError:
        return {**tool, "function": {**tool["function"], "parameters": {"type": "object"}}}
    return tool
