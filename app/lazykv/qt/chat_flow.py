"""The chat flow of the window: send, stream the reply, stop, regenerate, edit, versions, resuming,
and the context memory's compaction as the chat shows it. ``ChatFlow`` sees the window only through
``ChatFlowHost``."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QObject, QTimer, Signal, Slot
from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import (
    QFrame,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
)

from lazykv.core.chat import turns
from lazykv.core.chat.conversation import Conversation
from lazykv.core.chat.turns import PendingReply
from lazykv.core.engine.types import KvStatus, ModelInfo, ReplyResult, SamplingSettings, StepEvent
from lazykv.core.history.persistence import OpenHow, OpenResult
from lazykv.core.idle import wants_idle_step
from lazykv.core.kinds import ContextFullPolicy, FinishReason, KvPhase, StepStage
from lazykv.core.settings import Settings
from lazykv.qt.chat_input import ChatInput
from lazykv.qt.context_meter import ContextMeter
from lazykv.qt.conversations_panel import ConversationsPanel
from lazykv.qt.elided_label import StatusBar
from lazykv.qt.memory_panel import MemoryPanel
from lazykv.qt.operations import EngineClient
from lazykv.qt.reply_stats import ReplyClock
from lazykv.qt.step_banner import StepBanner, compacted_text, marker_label
from lazykv.qt.tool_flow import ToolCalls
from lazykv.qt.transcript import TranscriptView
from lazykv.qt.ui_state import UiState
from lazykv.qt.worker import (
    Failure,
    Reply,
    ReplyOptions,
    Step,
    SyncKv,
)

if TYPE_CHECKING:
    from lazykv.qt.conversations import Conversations


class ChatFlowHost(Protocol):
    """What the chat flow uses of its window: the widgets it fills, the engine, the chat's owner."""

    settings: Settings
    conversations: Conversations
    engine: EngineClient
    model_info: ModelInfo | None
    kv: KvStatus | None  # the engine's last word on the KV cache
    transcript: TranscriptView
    banner: StepBanner
    system_edit: QLineEdit
    input: ChatInput
    edit_bar: QFrame
    edit_label: QLabel
    stop_button: QPushButton
    stop_action: QAction
    compact_action: QAction
    versions_bar: QFrame
    versions_label: QLabel
    previous_version: QPushButton
    next_version: QPushButton
    memory_panel: MemoryPanel
    context_meter: ContextMeter
    conversations_panel: ConversationsPanel
    tool_calls: ToolCalls

    @property
    def conversation(self) -> Conversation: ...
    @property
    def state(self) -> UiState: ...
    def setting(self, name: str) -> Any: ...
    def statusBar(self) -> StatusBar: ...  # noqa: N802 - Qt's name
    def set_state(self, state: UiState) -> None: ...
    def idle_state(self) -> UiState: ...
    def show_error(self, title: str, message: str, details: str = "") -> QMessageBox: ...


class ChatFlow(QObject):
    """The chat on screen as it is sent, streamed and compacted; a QObject of the GUI thread (its slots
    take the worker's conversion events). Says what happened through its signals."""

    reply_finished = Signal(object)  # ReplyResult, after the window showed it
    reply_failed = Signal(object)  # Failure, after the turn was taken back
    converted = Signal(bool)  # an idle/manual conversion answered (after the window showed it)
    step_shown = Signal(object)  # StepEvent, after the window showed it

    def __init__(self, host: ChatFlowHost, idle_delay_ms: int, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.host = host
        self._editing: int | None = None  # index of the user turn being edited
        self._reply: Reply | None = None  # the reply streaming now
        self._replying = PendingReply()  # the reply streaming: its text so far, the lines to put under it
        self.reply_clock = ReplyClock()
        self.resume_note = ""
        self.resuming = False  # the chat on screen is being resumed (its snapshot, or re-read)
        self._drop_oldest_once = False  # the next reply drops the oldest turns to fit (a retry)
        self._conversion_from: KvStatus | None = None  # the cache's status when a conversion started
        # the cache's steps while the chat on screen is resumed, with its status before each
        self._resume_steps: tuple[tuple[StepEvent, KvStatus | None], ...] = ()
        self.idle_timer = QTimer(self)  # idle time before compacting a nearly full lazy cache
        self.idle_timer.setSingleShot(True)
        self.idle_timer.setInterval(idle_delay_ms)
        self.idle_timer.timeout.connect(self._convert_while_idle)

    @property
    def reply_request(self) -> Reply | None:
        """The reply streaming now, if any."""
        return self._reply

    @property
    def idle_conversion_pending(self) -> bool:
        return self.idle_timer.isActive()

    def state_changed(self, state: UiState) -> None:
        """The window's state changed: the versions bar, the compact action's tip, the idle timer."""
        self.update_versions_bar()
        self.update_compact_action()
        if state is not UiState.READY:
            self.idle_timer.stop()

    def stop_idle(self) -> None:
        self.idle_timer.stop()

    def can_switch_conversation(self) -> bool:
        """Idle; re-reading a conversation (the one chosen replaces it); or loading the first model (the
        chat chosen is resumed once it has loaded). Not while a reply streams or a model reloads."""
        state = self.host.state
        first_load = state is UiState.LOADING and self.host.model_info is None
        return state in (UiState.NO_MODEL, UiState.READY) or self.resuming or first_load

    # what a reply is asked with (the settings, the command line's overrides first)

    def sampling(self) -> SamplingSettings:
        seed = self.host.setting("seed")
        return SamplingSettings(
            temperature=self.host.setting("temperature"),
            top_p=self.host.setting("top_p"),
            top_k=self.host.setting("top_k"),
            min_p=self.host.setting("min_p"),
            repeat_penalty=self.host.setting("repeat_penalty"),
            seed=None if seed < 0 else seed,
        )

    def reply_options(self) -> ReplyOptions:
        """The next reply's; "Drop the oldest turns and retry" drops them for that one reply only."""
        policy = (ContextFullPolicy.DROP_OLDEST if self._drop_oldest_once
                  else self.host.setting("context_full"))
        return ReplyOptions(self.host.setting("max_reply_tokens") or None, policy)

    # the chat on screen

    def escape_in_input(self) -> None:
        """Esc in the message box: leaves edit mode (as Cancel edit does)."""
        if self._editing is not None:
            self.cancel_edit()

    def new_chat(self) -> None:
        if self.host.state not in (UiState.NO_MODEL, UiState.READY):
            return
        self.host.conversations.new_chat(self.host.settings["system_prompt"])
        self.host.statusBar().clearMessage()

    def new_private_chat(self) -> None:
        """A new, empty chat with Private on: nothing of it is saved; unticking Private ends it."""
        if self.host.state not in (UiState.NO_MODEL, UiState.READY):
            return
        self.host.conversations.new_chat(self.host.settings["system_prompt"])
        self.host.conversations.private_chat.set_private(True)
        self.host.statusBar().showMessage("New private chat: nothing of it is saved", 5000)

    def show_chat(self, title: str | None) -> None:
        """Show the chat on screen (Conversations changed it); a saved one's KV cache is resumed next."""
        self.cancel_edit()
        self.host.banner.close_task()  # a note of the chat shown before ("Resumed from the snapshot…")
        self.resume_note = ""
        self.host.system_edit.setText(self.host.conversation.system_prompt)
        self._rerender()
        self.host.set_state(self.host.state)
        if title is not None:
            self.host.statusBar().showMessage(f"Opened “{title}”", 3000)

    def send_text(self, text: str) -> None:
        self.host.input.setPlainText(text)
        self.send()

    def regenerate(self) -> None:
        """Replace the last reply with a new one (the cache keeps the prompt up to it)."""
        if self.host.state is not UiState.READY or not self.ends_with_reply():
            return
        pending = turns.begin_regenerate(self.host.conversation)  # the new reply joins it as one more version
        self._rerender()
        self._request_reply(pending)

    def show_version(self, step: int) -> None:
        """Page the last reply ``step`` versions back or on (1/3 ‹ ›): the chat continues from the
        version shown, which is saved as the reply."""
        if self.host.state is not UiState.READY:
            return
        if turns.page_version(self.host.conversation, step):
            self._rerender()
            self.host.conversations.persist(snapshot=False)
            # the cache, and so the context indicator, follow the version shown (its snapshot too)
            self.host.engine.submit(SyncKv(self.host.conversation.messages()),
                               lambda _read: self.host.conversations.persist(snapshot=True))

    def edit_message(self, index: int) -> None:
        """Put a user turn back into the composer; sending replaces it and everything after it."""
        if self.host.state is not UiState.READY:
            return
        self._editing = index
        self.host.input.setPlainText(self.host.conversation.turns()[index]["content"])
        self.host.edit_label.setText(
            f"Editing message {index + 1}: sending replaces it and the turns after it.")
        self.host.edit_bar.show()
        self.host.input.setFocus()

    def cancel_edit(self) -> None:
        self._editing = None
        self.host.edit_bar.hide()

    def copy_last_reply(self) -> None:
        index = self.host.conversation.last_index("assistant")
        if index is not None:
            QGuiApplication.clipboard().setText(self.host.conversation.turns()[index]["content"])
            self.host.statusBar().showMessage("Reply copied", 3000)

    def update_versions_bar(self) -> None:
        number, count = turns.versions_shown(self.host.conversation)
        self.host.versions_bar.setVisible(count > 1)
        if count > 1:
            self.host.versions_label.setText(f"Reply {number + 1}/{count}")
            ready = self.host.state is UiState.READY
            self.host.previous_version.setEnabled(ready and number > 0)
            self.host.next_version.setEnabled(ready and number < count - 1)

    def ends_with_reply(self) -> bool:
        return turns.ends_with_reply(self.host.conversation)

    def _rerender(self, but_last: bool = False) -> None:
        """The transcript shown again from the conversation (``but_last``: without its last turn, a reply
        that is streamed again to go on with it)."""
        shown, markers = self.host.conversation.shown(), self.host.conversation.markers()
        if but_last:
            shown = shown[:-1]
            markers = [m for m in markers if m.message_index < len(shown)]
        conversation = self.host.conversation
        self.host.transcript.show_messages(shown, markers, conversation.stats(), conversation.first_sent)
        self.update_versions_bar()

    def system_prompt_edited(self) -> None:
        self.host.conversation.system_prompt = self.host.system_edit.text()

    def send(self) -> None:
        text = self.host.input.toPlainText().strip()
        if not text:
            return
        if self.host.state is not UiState.READY:
            if self.host.state is UiState.NO_MODEL:
                self.host.statusBar().showMessage("Open a model first (File > Open model…)", 5000)
            return
        if (opening := self.host.conversations.opening) is not None:  # shown in the list, not yet on screen
            title = self.host.conversations_panel.title(opening) or "Another conversation"
            self.host.statusBar().showMessage(f"“{title}” is opening: send again once it shows", 5000)
            return
        if self._editing is not None:
            self.host.conversation.truncate(self._editing)
            self.cancel_edit()
            self._rerender()
        self.host.conversation.system_prompt = self.host.system_edit.text()
        self.host.conversation.add("user", text)
        self.host.tool_calls.rounds = 0  # the model may call tools again for this message
        self.host.input.clear()
        self.host.transcript.follow_end()  # scrolled up: the new turn and its reply come into sight
        self.host.transcript.add_message("user", text)
        self.host.conversations.persist(snapshot=False)
        self._request_reply(PendingReply())

    def can_continue(self) -> bool:
        """The last reply was cut off (a length limit, Stop, the app closed) and can go on."""
        return turns.can_continue(self.host.conversation)

    def continue_reply(self) -> None:
        """Go on with a reply that was cut off: what follows is added to it, in place (the same
        version, its figures both parts'); it is streamed again from its start while it goes on."""
        if self.host.state is not UiState.READY or not self.can_continue():
            return
        pending = turns.begin_continue(self.host.conversation)
        self._rerender(but_last=True)
        self._request_reply(pending)

    def _request_reply(self, pending: PendingReply) -> None:
        self._replying = pending
        self.reply_clock = ReplyClock()
        self.host.transcript.begin_reply()
        self.host.transcript.append_to_reply(pending.continued)
        self.host.set_state(UiState.REPLYING)
        self.host.input.setFocus()  # a clicked Send button is disabled now: Qt would move focus elsewhere
        self.host.statusBar().showMessage("Generating…")
        messages, options = self.host.conversation.messages(), self.reply_options()
        if pending.continuing:  # the conversation sent ends with the reply cut off
            options = replace(options, continue_last=True)
        tools = None if pending.continuing else self.host.tool_calls.offered()
        self._reply = request = Reply(messages, self.sampling(), options, tools)
        self._drop_oldest_once = False
        chat = self.host.conversations.chat
        self.host.engine.submit(
            request,
            lambda result: self._on_reply_finished(result) if chat is self.host.conversations.chat
            else self._reply_abandoned(),
            lambda failure: self._on_reply_failed(failure) if chat is self.host.conversations.chat
            else self._reply_abandoned(),
            self._on_token,
        )

    def _reply_abandoned(self) -> None:
        """The reply's chat was replaced meanwhile (e.g. deleted): its answer goes nowhere."""
        self.host.tool_calls.abandon()
        self._reply, self._replying = None, PendingReply()
        self.host.transcript.end_reply()
        self.host.set_state(self.host.idle_state())

    def edit_last(self) -> None:
        index = self.host.conversation.last_index("user")
        if index is not None:
            self.edit_message(index)

    def stop_reply(self) -> None:
        """Stop the reply streaming now, if any: its own token, so no other request is touched (its
        answer is then abandoned when its chat is gone); or the tool calls running between two replies."""
        if self.host.tool_calls.running:
            self.host.tool_calls.stop()
            return
        if self._reply is not None:
            self._reply.cancel.set()
            self.host.stop_button.setEnabled(False)
            self.host.stop_action.setEnabled(False)
            self.host.input.setFocus()  # not wherever Qt moves it from the disabled button
            self.host.statusBar().showMessage("Stopping…")

    def _on_token(self, piece: str) -> None:
        self._replying.add(piece)
        self.reply_clock.token()
        self.host.transcript.append_to_reply(piece)

    def _on_reply_finished(self, result: ReplyResult) -> None:
        if result.tool_calls and not result.cancelled:
            self._call_tools(result)
            return
        self._reply = None
        pending, self._replying = self._replying, PendingReply()
        end = turns.finish_reply(self.host.conversation, pending, result.text, result.finish_reason,
                                 result.dropped, self.reply_clock.stats(), self.reply_options().max_tokens)
        if end.kept:  # a regenerate, or a continue, that wrote nothing: the reply is as it was
            self._keep_the_earlier_reply()
            self.host.set_state(UiState.READY)
            status = self.host.statusBar()
            if pending.continuing:
                status.showMessage(f"Nothing was added ({end.kept}): the reply is kept", 10_000)
            else:
                status.showMessage(f"No new reply ({end.kept}): the earlier reply is kept", 10_000)
            self.maybe_schedule_idle_conversion()
            self.reply_finished.emit(result)
            return
        notes, note, stats = list(end.notes), end.note, end.stats
        self.host.transcript.end_reply(note or None, stats.summary() if stats else None)
        if pending.continuing:  # the whole reply again, with its own lines from before it was cut
            self._rerender()
        self.host.transcript.set_left_out(self.host.conversation.first_sent)  # the turns dropped: greyed
        self.host.set_state(UiState.READY)
        self.host.conversations.persist(snapshot=True)
        if notes:
            self.host.statusBar().showMessage(notes[-1].capitalize(), 8000)
        else:
            self.host.statusBar().showMessage(
                f"Prompt {result.n_prompt} tokens, {result.n_reused} reused from the cache", 5000
            )
        self.maybe_schedule_idle_conversion()
        self.reply_finished.emit(result)

    def _call_tools(self, result: ReplyResult) -> None:
        """The reply asks for tools: it is kept as it is (its words and its calls), each call is asked
        about and run (ToolCalls), then the model answers with the results in its prompt."""
        self._reply, self._replying = None, PendingReply()
        self.host.conversation.add_tool_calls(result.text, result.tool_calls)
        self.host.transcript.end_reply()
        self._rerender()
        self.host.conversations.persist(snapshot=False)
        names = ", ".join(call["function"]["name"] for call in result.tool_calls)
        self.host.statusBar().showMessage(f"The model asks to use a tool: {names}")
        chat = self.host.conversations.chat
        self.host.tool_calls.run(lambda stopped: self._tools_answered(stopped) if chat is
                                 self.host.conversations.chat else None)

    def _tools_answered(self, stopped: bool) -> None:
        """Every call has its result (or was stopped): shown and saved; the model answers unless stopped."""
        self._rerender()
        self.host.conversations.persist(snapshot=False)
        if stopped:
            self.host.set_state(UiState.READY)
            self.host.statusBar().showMessage("Stopped: the tool calls that had not run were not run", 8000)
            return
        self._request_reply(PendingReply())

    def _retry_dropping_oldest(self) -> None:
        """The message that did not fit, sent again with the oldest turns left out (this once)."""
        self._drop_oldest_once = True
        self.send()
        self._drop_oldest_once = False  # not sent (e.g. the box was empty): the setting applies again

    def _on_reply_failed(self, failure: Failure) -> None:
        """Stopped before anything was read: a reply with no text. A regenerate or a continue that
        failed: the reply stays as it was. Refused: take the turn back (drop the user's message from the
        transcript and the database, return it to the input)."""
        if failure.cancelled:
            self._on_reply_finished(ReplyResult("", FinishReason.CANCELLED, 0, 0))
            return
        self._reply = None
        pending, self._replying = self._replying, PendingReply()
        failed = turns.undo_reply(self.host.conversation, pending)
        if pending.regenerate or pending.continuing:
            self._keep_the_earlier_reply()
            self.host.set_state(self.host.idle_state())
            if pending.continuing:
                self.host.show_error("The reply was not continued", f"{failure.message} The reply is kept "
                                     "as it was; Continue tries again.", failure.details)
            else:
                self.host.show_error("No new reply was written", f"{failure.message} The earlier reply is "
                                     "kept; Regenerate tries again.", failure.details)
            self.reply_failed.emit(failure)
            return
        if failed is not None:
            typed_since = self.host.input.toPlainText()
            self.host.input.setPlainText(f"{failed}\n{typed_since}" if typed_since else failed)
            self.host.conversations.forget_turn()
        self._rerender()
        self.host.set_state(self.host.idle_state())
        box = self.host.show_error("The reply failed", failure.message, failure.details)
        if failure.context_full and self.host.setting("context_full") != ContextFullPolicy.DROP_OLDEST:
            retry = box.addButton("Drop the oldest turns and retry", QMessageBox.ButtonRole.AcceptRole)
            retry.setObjectName("drop-oldest-retry")
            retry.clicked.connect(self._retry_dropping_oldest)
        self.reply_failed.emit(failure)

    def _keep_the_earlier_reply(self) -> None:
        """A regenerate or a continue gave nothing (stopped before its first word, or failed): the
        conversation is as it was, every earlier reply with it (and saved as such: a save made meanwhile,
        e.g. once the history opened, did not have a regenerated reply)."""
        self.host.transcript.end_reply()
        self._rerender()
        self.host.conversations.persist(snapshot=False)

    def keep_cut_reply(self) -> None:
        """Quitting while a reply streams: what it had written is kept and saved, with a line saying
        that closing the app stopped it (its answer will never come)."""
        if self._reply is None:
            return
        end = turns.keep_cut(self.host.conversation, self._replying, self.reply_clock.stats())
        if not end.added:
            return
        self._reply, self._replying = None, PendingReply()
        self.host.transcript.end_reply(end.note, end.stats.summary() if end.stats else None)
        self.host.conversations.persist(snapshot=False)

    def add_marker(self, label: str) -> bool:
        """A line under the last message (a marker at its end), saved with the conversation at once unless
        a reply is on its way (its end saves it); False when that line is there already."""
        added = turns.mark_end(self.host.conversation, label)
        if added and self.host.state is not UiState.REPLYING:
            self.host.conversations.persist(snapshot=False)
        return added

    def convert_now(self) -> None:
        if self.host.model_info is not None and self.host.model_info.kv_mode.is_lazy:
            self.host.engine.submit(Step(), self._on_stepped, self._on_step_failed)

    def _next_rung(self) -> KvPhase | None:
        """The rung a compaction would go to, if any."""
        return self.host.kv.next_rung if self.host.kv is not None and self.host.kv.n_cells_used > 0 else None

    def can_compact(self) -> bool:
        """A lazy cache in use can go one step down and no compaction is on its way (a second click must
        not take a ladder two steps down): the compact action's check (lazykv.qt.actions)."""
        return self._next_rung() is not None and not self._compacting()

    def update_compact_action(self) -> None:
        """The compact action's tip says to which rung (its enabled state is the declaration's)."""
        rung = self._next_rung()
        if rung is not None:
            tip = f"Compact the context memory to {rung.words} now"
        elif self.host.kv is None or not self.host.kv.kv_mode.is_lazy:
            tip = "Only a lazy or ladder KV cache compacts (Settings > KV cache)"
        else:
            tip = "Nothing to compact: the context memory is empty or at its last level"
        self.host.compact_action.setStatusTip(tip)
        self.host.compact_action.setToolTip(tip)

    def _compacting(self) -> bool:
        """A compaction (manual or idle) is on its way to the engine."""
        return any(isinstance(r, Step) for r in self.host.engine.pending())

    def _convert_while_idle(self) -> None:
        wanted = (wants_idle_step(self.host.kv) and self.host.setting("idle_conversion")
                  and not self._compacting())
        if self.host.state is UiState.READY and wanted:
            self.host.statusBar().showMessage("Compacting context memory while idle…", 3000)
            self.host.engine.submit(Step(), self._on_stepped, self._on_step_failed)

    def maybe_schedule_idle_conversion(self) -> None:
        if (self.host.state is UiState.READY and self.host.setting("idle_conversion")
                and wants_idle_step(self.host.kv) and not self.idle_timer.isActive()):
            self.idle_timer.start()

    def _on_stepped(self, converted: bool) -> None:
        self.converted.emit(converted)

    def _on_step_failed(self, failure: Failure) -> None:
        """An idle or manual conversion failed: said as such; the conversation is not touched."""
        if not failure.cancelled:
            self.host.show_error("Compacting the context memory failed", failure.message, failure.details)

    @Slot(object)
    def show_step(self, event: StepEvent) -> None:
        """A conversion of the KV cache began or ended (the worker's signal, queued to this thread)."""
        self.host.banner.on_event(event)
        if event.stage is StepStage.START:
            self._conversion_from = self.host.kv  # the rung it leaves, for the marker at its end
        if event.stage is StepStage.START and self.host.kv is not None:
            converting = replace(self.host.kv, phase=KvPhase.CONVERTING, n_cells_used=event.n_cells,
                                 target=event.target)
            self.host.memory_panel.set_status(converting)
            self.host.context_meter.set_status(converting)
        if event.stage is StepStage.END and self.resuming:  # said once it is known how it resumed
            self._resume_steps = (*self._resume_steps, (event, self._conversion_from))
            self.host.statusBar().showMessage(compacted_text(event), 10_000)
        elif event.stage is StepStage.END:
            in_reply = self.host.state is UiState.REPLYING and bool(self._replying.text)
            reading = self.host.state is not UiState.READY and not in_reply  # a prompt or a transcript
            label = marker_label(event, during_reply=in_reply,
                                 before=self._conversion_from if reading else None)
            if in_reply:
                self._replying.markers.append(label)
            # idle, or while the prompt was read: a line under the last message
            if in_reply or self.add_marker(label):
                before_reply = self.host.state is UiState.REPLYING and not in_reply
                self.host.transcript.mark_here(label, before_reply=before_reply)
            self.host.statusBar().showMessage(compacted_text(event), 10_000)
        self.step_shown.emit(event)

    # -- resuming a saved chat's context memory ---------------------------------------------

    def begin_resume(self) -> None:
        self.resuming = True
        self._resume_steps = ()
        self.host.set_state(UiState.LOADING)
        self.host.banner.show_progress("Resuming the conversation…", 0.0)

    def resume_progress(self, done: int, total: int) -> None:
        fraction = done / total if total else 1.0
        self.host.banner.show_progress(f"Re-reading the conversation… {done} of {total} tokens", fraction,
                                  can_stop=True)

    def end_resume(self, result: OpenResult | None, failure: Failure | None = None,
                   restored: str = "") -> None:
        """The resume answered: restored, rebuilt or empty; else stopped (the banner's Stop, or the chat
        was replaced) or failed. ``restored``: where a cache that was not re-read came from, when not the
        chat's snapshot (a new branch's: its parent's)."""
        self.resuming = False
        self.host.set_state(self.host.idle_state())
        self._mark_resume_steps(result, failure)
        if result is None:
            assert failure is not None
            self.host.banner.close_task()
            if failure.message and not failure.cancelled:
                self.host.show_error("The conversation could not be resumed", failure.message,
                                     failure.details)
            elif failure.message:
                self.resume_note = "Stopped re-reading; the next reply reads the rest of the conversation"
                self.host.statusBar().showMessage(self.resume_note, 10_000)
            return
        if result.how is OpenHow.RESTORED:
            text = (f"{restored or 'Resumed from the snapshot'}: {result.n_tokens} tokens in "
                    f"{1000 * result.seconds:.0f} ms")
        elif result.how is OpenHow.REBUILT:
            text = (f"Re-read from the transcript ({result.n_tokens} tokens in {result.seconds:.1f} s) "
                    f"because {result.note}")
        else:
            text = "Empty conversation"
        self.resume_note = text
        self.host.banner.show_note(text, details=result.details)
        self.host.statusBar().showMessage(text, 10_000)

    def _mark_resume_steps(self, result: OpenResult | None, failure: Failure | None) -> None:
        """The lines for the cache's steps while the chat resumed. Restored from its snapshot: the
        cache only went to the rung the snapshot was saved at, before anything was read (one line
        says so, nothing about the conversation not fitting). Re-read (also in part, until stopped):
        each step as any other taken while text was read. The resume of a chat replaced meanwhile: none."""
        steps, self._resume_steps = self._resume_steps, ()
        if not steps or (result is None and (failure is None or not failure.message)):
            return
        if result is not None and result.how is OpenHow.RESTORED:
            labels = [f"Context memory restored from the snapshot at {steps[-1][0].target.words}"]
        else:
            labels = [marker_label(event, before=before) for event, before in steps]
        for label in labels:
            if self.add_marker(label):  # a resume's line stored from the last time is not said twice
                self.host.transcript.mark_here(label)
