"""The chat window: transcript, composer, memory panel, conversion banner, and the engine worker's thread."""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt, QThread, QTimer, Signal, Slot
from PySide6.QtGui import QCloseEvent, QDragEnterEvent, QDropEvent, QResizeEvent
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from lazykv.core.chat.conversation import Conversation
from lazykv.core.engine import memory
from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.types import KvStatus, ModelInfo
from lazykv.core.history.store import Database
from lazykv.core.idle import IDLE_DELAY_S
from lazykv.core.paths import tool_permissions_file
from lazykv.core.settings import SETTINGS_BY_NAME, Settings
from lazykv.core.tools import mcp_config
from lazykv.core.tools.consent import ConsentStore
from lazykv.core.tools.mcp_hub import McpHub
from lazykv.qt import actions, theme, window_state
from lazykv.qt.about_dialog import AboutDialog
from lazykv.qt.background import Background
from lazykv.qt.branching import Branching
from lazykv.qt.chat_flow import ChatFlow
from lazykv.qt.chat_input import ChatInput
from lazykv.qt.context_meter import ContextMeter
from lazykv.qt.conversations import ERASE_MS, UNDO_MS, Conversations
from lazykv.qt.conversations_panel import ConversationsPanel
from lazykv.qt.elided_label import ElidedLabel, StatusBar
from lazykv.qt.local_server import LOCAL_SERVER_SETTINGS, LocalServerSwitch
from lazykv.qt.memory_panel import MemoryPanel
from lazykv.qt.model_loading import ModelLoading
from lazykv.qt.notice_banner import NoticeBanner, wrap_without_widening
from lazykv.qt.operations import EngineClient, Operations
from lazykv.qt.settings_dialog import SettingsDialog
from lazykv.qt.shortcuts_dialog import ShortcutsDialog
from lazykv.qt.step_banner import StepBanner
from lazykv.qt.tool_flow import ToolCalls
from lazykv.qt.tools_page import ToolsPage
from lazykv.qt.transcript import TranscriptView
from lazykv.qt.ui_state import APP_TITLE, UiState
from lazykv.qt.window_close import Closing
from lazykv.qt.worker import (
    EngineWorker,
    Failure,
    Request,
    SaveSnapshot,
    failure,
)

FIRST_RUN_DOCK_WIDTHS = (240, 250)  # conversations, memory (px)
MIN_DOCK_WIDTH = 200  # the memory panel's rows stay readable
MODEL_LABEL_MIN = 160  # px: the status bar's model line takes at most 2/5 of the window, at least this
ROOMY_CENTRAL = 160  # px beyond the chat's own minimum: the window is not squeezing its docks
SAMPLE_INTERVAL_MS = 1000  # memory panel: RSS and the history graph
SHUTDOWN_DEADLINE_MS = 10_000  # at exit, the engine thread gets this long to end (a decode aborts at once)


@dataclass(frozen=True)
class Timings:
    """Every delay of the window, injectable so that tests never wait in real time."""

    idle_delay_ms: int = int(IDLE_DELAY_S * 1000)  # idle time before compacting a nearly full lazy cache
    sample_interval_ms: int = SAMPLE_INTERVAL_MS
    undo_ms: int = UNDO_MS
    erase_ms: int = ERASE_MS  # how long a delete can be undone before the conversation is erased
    shutdown_deadline_ms: int = SHUTDOWN_DEADLINE_MS


class MainWindow(QMainWindow):
    """Sends engine requests to an EngineWorker on its own QThread and never waits on it.

    ``overrides`` (from the command line) take precedence over the saved settings for this
    session only; changing that setting in the dialog drops the override. ``session`` replaces
    the real EngineSession (tests use a fake one), ``timings`` the delays. ``reopen_last``: once
    the list has loaded, open the most recent conversation (the app does; tests start blank).

    Its parts are objects of their own, each seeing the window through a small protocol of what it uses:
    ``chat`` (ChatFlow: send, stream, versions, compaction, resuming), ``loading`` (ModelLoading),
    ``closing`` (Closing) and ``conversations`` (the chat on screen, saved; its list and protection).
    """

    model_loaded = Signal(object)  # ModelInfo, after the window took it
    reply_finished = Signal(object)  # ReplyResult, after the window showed it
    reply_failed = Signal(object)  # Failure, after the turn was taken back
    converted = Signal(bool)  # an idle/manual conversion answered (after the window showed it)
    step_shown = Signal(object)  # StepEvent, after the window showed it
    shutdown_requested = Signal()  # to the worker: free the model, end the thread

    def __init__(
        self,
        settings: Settings | None = None,
        overrides: dict[str, Any] | None = None,
        default_model: Path | None = None,
        *,
        session: EngineSession | None = None,
        timings: Timings | None = None,
        reopen_last: bool = False,
    ) -> None:
        super().__init__()
        self.settings = settings if settings is not None else Settings.load()
        self.overrides = {k: SETTINGS_BY_NAME[k].validate(v) for k, v in (overrides or {}).items()}
        self.default_model = default_model
        self.timings = timings or Timings()
        self.model_info: ModelInfo | None = None
        self.kv: KvStatus | None = None
        self._state = UiState.NO_MODEL
        self.about_dialog: AboutDialog | None = None  # Help > About, made when first opened
        self.chat = ChatFlow(self, self.timings.idle_delay_ms, self)
        self.loading = ModelLoading(self, self)
        self.closing = Closing(self, self, self.timings.shutdown_deadline_ms)
        self.branching = Branching(self)  # Branch from here: a message's menu, Chat > Branch
        for signal, forwarded in ((self.chat.reply_finished, self.reply_finished),
                                  (self.chat.reply_failed, self.reply_failed),
                                  (self.chat.converted, self.converted),
                                  (self.chat.step_shown, self.step_shown),
                                  (self.loading.model_loaded, self.model_loaded)):
            signal.connect(forwarded)
        self.ops = Operations(self)
        self.background = Background(self, self.ops)
        self.background.unhandled.connect(lambda what, err: self.show_exception(f"{what} failed", err))

        self.database = Database()  # the process's one connection to the conversation database
        self._build_ui()
        self._watch_dock_widths()
        theme.apply(QApplication.instance(), self.setting("theme"))
        if not window_state.restore(self):  # first run: the transcript gets most of the width
            QTimer.singleShot(0, lambda: self.resizeDocks(
                [self.conversations_dock, self.memory_dock], list(FIRST_RUN_DOCK_WIDTHS),
                Qt.Orientation.Horizontal))  # once shown: before, the docks' size hints win
        self._start_worker(session)
        self.local_server = LocalServerSwitch(self)
        self.conversations = Conversations(self, self.chat, self, self.setting("system_prompt"),
                                           self.timings.undo_ms, self.timings.erase_ms)
        self._connect_conversations()
        self.tool_calls = self._start_tools()
        self._sampler = QTimer(self)
        self._sampler.timeout.connect(self._sample_memory)
        self._sampler.start(self.timings.sample_interval_ms)
        self.set_state(UiState.NO_MODEL)
        self._sample_memory()
        self.chat.show_chat(None)
        if reopen_last:
            self.conversations_panel.listed.connect(self._open_last_conversation)
        self.conversations.prompts.setup_crypto()  # then the history, opened with the scheme's key, is listed
        if self.settings.problems:
            QTimer.singleShot(0, lambda: self.show_error("Some settings were reset", "\n".join(
                self.settings.problems)))

    @property
    def conversation(self) -> Conversation:
        """The transcript on screen (owned by ``conversations``)."""
        return self.conversations.chat.conversation

    @property
    def private(self) -> bool:
        return self.conversations.private

    def context_tokens(self) -> int:
        return self.model_info.n_ctx if self.model_info is not None else 0

    def _start_tools(self) -> ToolCalls:
        """The MCP servers the user set up, connecting in the background; the tools always allowed."""
        try:
            servers = mcp_config.load_servers()
        except mcp_config.McpConfigError as err:
            servers, problem = [], str(err)
            QTimer.singleShot(0, lambda: self.show_error("The MCP servers were not started", problem))
        hub = McpHub(servers, self.setting("tool_timeout_s"), self.setting("tool_output_kib") * 1024)
        hub.start()
        return ToolCalls(self, hub, ConsentStore(tool_permissions_file()), self, self)

    def setting(self, name: str) -> Any:
        return self.overrides[name] if name in self.overrides else self.settings[name]

    def apply_settings(self, changed: dict[str, Any]) -> None:
        """Take new values (e.g. from the dialog), save them off the GUI thread, reload if needed."""
        reload = False
        for name, value in changed.items():
            self.overrides.pop(name, None)
            if self.settings.set(name, value) and SETTINGS_BY_NAME[name].reloads_engine:
                reload = True
        self.save_settings()
        if "theme" in changed:
            theme.apply(QApplication.instance(), self.setting("theme"))
        if "snapshot_encryption" in changed:
            self.conversations.prompts.setup_crypto()
        if reload and self.model_info is not None and self._state is UiState.READY:
            self.loading.open_model(self.model_info.path)
        if LOCAL_SERVER_SETTINGS.intersection(changed):
            self.local_server.sync()
        if {"tool_timeout_s", "tool_output_kib"}.intersection(changed) and self.tool_calls.hub is not None:
            self.tool_calls.hub.set_limits(self.setting("tool_timeout_s"),
                                           self.setting("tool_output_kib") * 1024)

    def save_settings(self) -> None:
        snapshot = self.settings.copy()
        self.background.run(snapshot.save, on_error=lambda err: self.show_exception(
            "Settings were not saved", err))

    @property
    def worker(self) -> EngineWorker:
        return self._worker

    @property
    def engine_thread(self) -> QThread:
        return self._thread

    @property
    def state(self) -> UiState:
        return self._state

    def _build_ui(self) -> None:
        self.setWindowTitle(APP_TITLE)
        self.resize(1100, 700)
        self.setAcceptDrops(True)

        self.system_edit = QLineEdit()
        self.system_edit.setPlaceholderText("System prompt of this chat (optional)")
        self.system_edit.editingFinished.connect(self.chat.system_prompt_edited)
        system_row = QHBoxLayout()
        system_row.addWidget(QLabel("System:"))
        system_row.addWidget(self.system_edit, 1)

        self.transcript = TranscriptView()
        self.transcript.edit_requested.connect(self.chat.edit_message)
        self.transcript.regenerate_requested.connect(self.chat.regenerate)
        self.transcript.branch_requested.connect(self.branching.branch_from)
        self.transcript.code_copied.connect(lambda: self.statusBar().showMessage("Code copied", 3000))
        self.banner = StepBanner()
        self.banner.stop_requested.connect(lambda: self.conversations.cancel_resume())
        self.keyring_notice = NoticeBanner("keyring-banner")
        self.history_notice = NoticeBanner("history-banner")
        self.remote_notice = NoticeBanner("remote-banner")  # remote backends left out at the last load
        self.demo_notice = NoticeBanner("demo-banner")  # the demo model is loaded: where real ones are

        self.edit_bar = QFrame()
        self.edit_label = QLabel()
        wrap_without_widening(self.edit_label)
        wrap_without_widening(self.banner.label)
        cancel_edit = QPushButton("Cancel edit")
        cancel_edit.clicked.connect(self.chat.cancel_edit)
        edit_row = QHBoxLayout(self.edit_bar)
        edit_row.setContentsMargins(0, 0, 0, 0)
        edit_row.addWidget(self.edit_label, 1)
        edit_row.addWidget(cancel_edit)
        self.edit_bar.hide()
        self._build_versions_bar()

        self.input = ChatInput()
        self.input.submitted.connect(self.chat.send)
        self.input.escaped.connect(self.chat.escape_in_input)
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.send_button.clicked.connect(self.chat.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.chat.stop_reply)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch()
        composer = QHBoxLayout()
        composer.addWidget(self.input, 1)
        composer.addLayout(buttons)

        layout = QVBoxLayout()
        layout.setContentsMargins(8, 8, 8, 4)
        layout.addLayout(system_row)
        layout.addWidget(self.history_notice)
        layout.addWidget(self.keyring_notice)
        layout.addWidget(self.remote_notice)
        layout.addWidget(self.demo_notice)
        layout.addWidget(self.transcript, 1)
        layout.addWidget(self.banner)
        layout.addWidget(self.versions_bar)
        layout.addWidget(self.edit_bar)
        layout.addLayout(composer)
        self.context_meter = ContextMeter()
        layout.addWidget(self.context_meter)
        central = QWidget()
        central.setLayout(layout)
        self.setCentralWidget(central)

        self.memory_panel = MemoryPanel()
        self.memory_dock = QDockWidget("Memory", self)
        self.memory_dock.setObjectName("memory-dock")
        # in a small window the panel scrolls instead of squeezing its rows onto each other
        memory_scroll = QScrollArea()
        memory_scroll.setObjectName("memory-scroll")
        memory_scroll.setWidgetResizable(True)
        memory_scroll.setFrameShape(QFrame.Shape.NoFrame)
        memory_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        memory_scroll.setWidget(self.memory_panel)
        self.memory_dock.setWidget(memory_scroll)
        self.memory_dock.setMinimumWidth(MIN_DOCK_WIDTH)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.memory_dock)

        self.conversations_panel = ConversationsPanel()
        self.conversations_dock = QDockWidget("Conversations", self)
        self.conversations_dock.setObjectName("conversations-dock")
        self.conversations_dock.setWidget(self.conversations_panel)
        self.conversations_dock.setMinimumWidth(240)
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, self.conversations_dock)

        self.setStatusBar(StatusBar())  # its messages shortened with "…", a notice beside them
        self.model_label = ElidedLabel("No model loaded")  # shortened, never over the status messages
        self.statusBar().addPermanentWidget(self.model_label)
        self._build_actions()

    def _build_versions_bar(self) -> None:
        """Under a regenerated reply: which version is shown, and the way to the others."""
        self.versions_bar = QFrame()
        self.versions_bar.setObjectName("versions-bar")
        self.versions_label = QLabel()
        self.previous_version = QPushButton("‹ Previous")
        self.previous_version.clicked.connect(lambda: self.chat.show_version(-1))
        self.next_version = QPushButton("Next ›")
        self.next_version.clicked.connect(lambda: self.chat.show_version(1))
        row = QHBoxLayout(self.versions_bar)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.versions_label)
        row.addWidget(self.previous_version)
        row.addWidget(self.next_version)
        row.addStretch()
        self.versions_bar.hide()

    def _build_actions(self) -> None:
        """The menus and the toolbar, from the actions' declaration (lazykv.qt.actions): each declared
        action is the window's ``<name>_action`` (the recent models' submenu ``recent_menu``)."""
        self.declared_actions = actions.build(self)
        self.conversations_panel.new_requested.connect(self.chat.new_chat)
        self.input.setFocus()

    # the declaration's checks (ActionSpec.check) and handlers that are not methods of their own elsewhere

    def engine_free(self) -> bool:
        """No reply, no load, nothing else on its way to the engine (a snapshot save, a compaction)."""
        return not self.loading.engine_busy()

    def has_model(self) -> bool:
        return self.model_info is not None

    def has_user_turn(self) -> bool:
        return self.conversation.last_index("user") is not None

    def has_reply(self) -> bool:
        return self.conversation.last_index("assistant") is not None

    def can_undo_delete(self) -> bool:
        return self.conversations.can_undo_delete

    def _undo_delete(self) -> None:
        self.conversations.undo_delete()

    def _set_private(self, on: bool) -> None:
        self.conversations.private_chat.set_private(on)

    def _start_worker(self, session: EngineSession | None) -> None:
        self._thread = QThread(self)
        self._thread.setObjectName("lazykv-engine")
        self._worker = EngineWorker(self.database, session)
        self._worker.moveToThread(self._thread)
        self._thread.finished.connect(self._worker.deleteLater)
        self.shutdown_requested.connect(self._worker.shutdown)
        self._worker.kv_status.connect(self._on_kv_status)
        self._worker.conversion.connect(self.chat.show_step)
        self.engine = EngineClient(self._worker, self.ops, self)
        self.engine.unhandled.connect(self._on_unhandled_failure)
        self._thread.start()

    # The worker's signals arrive at slots of QObjects of the GUI thread (this window, its ChatFlow), so
    # Qt queues them to that thread (a plain method would run on the worker's thread).

    @Slot(object)
    def _on_kv_status(self, status: KvStatus) -> None:
        """The KV cache's status, from the engine: the panel, the meter, the actions, the idle timer."""
        self.kv = status
        self.memory_panel.set_status(status)
        self.context_meter.set_status(status)
        self.set_state(self._state)
        self.chat.maybe_schedule_idle_conversion()

    def _on_unhandled_failure(self, request: Request, failure: Failure) -> None:
        self.show_error(f"{request.what} failed", failure.message, failure.details)

    def _connect_conversations(self) -> None:
        self.conversations.private_changed.connect(self._on_private_changed)
        self.conversations.undo_changed.connect(self._on_undo_changed)
        self.ops.changed.connect(lambda _: self.set_state(self._state))

    @Slot(str)
    def _on_undo_changed(self, title: str) -> None:
        spec = actions.ACTIONS_BY_NAME["undo_delete"]
        self.undo_delete_action.setEnabled(actions.enabled(self, spec, self._state))
        self.undo_delete_action.setText(f"&Undo delete of “{title}”" if title else spec.title)

    @Slot(bool)
    def _on_private_changed(self, private: bool) -> None:
        """The one private flag (Conversations') shown by both of its controls, and the title."""
        for control in (self.private_action, self.conversations_panel.private_box):
            blocked = control.blockSignals(True)
            control.setChecked(private)
            control.blockSignals(blocked)
        self.update_title()

    def set_state(self, state: UiState) -> None:
        self._state = state
        ready = state is UiState.READY
        idle = state in (UiState.NO_MODEL, UiState.READY)
        actions.update_enabled(self, state)  # the menus and the toolbar, as their declaration says
        self.send_button.setEnabled(ready)
        self.stop_button.setEnabled(state is UiState.REPLYING)
        self.system_edit.setReadOnly(not idle)
        self.transcript.actions_enabled = ready
        self.chat.state_changed(state)  # the versions bar, the compact action's tip, the idle timer
        # deleting a conversation while its snapshot is written would orphan the file (issue 16)
        self.conversations_panel.set_saving(
            {r.conv_id for r in self.engine.pending() if isinstance(r, SaveSnapshot)})

    def idle_state(self) -> UiState:
        return UiState.READY if self.model_info is not None else UiState.NO_MODEL

    @Slot()
    def open_settings(self) -> None:
        meta = self.model_info.meta if self.model_info else None
        tools = self.tool_calls
        dialog = SettingsDialog(self.settings.copy(self.overrides), meta, self,
                                keyring_works=not self.conversations.keyring_failed,
                                gpus=self.model_info.gpus if self.model_info else (),
                                tools_page=ToolsPage(tools.hub, tools.consent) if tools.hub else None)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self.apply_settings(dialog.changed()))
        self.settings_dialog = dialog
        dialog.open()

    @Slot()
    def _open_last_conversation(self) -> None:
        """Once, at start-up: the conversation on screen at the last quit (else the newest), unless the
        user has started chatting already. While the model still loads it is shown at once, and resumed
        (snapshot or re-read) once the model has loaded."""
        self.conversations_panel.listed.disconnect(self._open_last_conversation)
        ids = self.conversations_panel.ids()
        last = self.settings["last_conversation"]
        if ids and len(self.conversation) == 0 and self.conversations.current is None:
            self.conversations.open(last if last in ids else ids[0])

    @Slot()
    def _rename_current(self) -> None:
        """F2 anywhere in the window: rename the conversation selected in the list, else the one on
        screen; the focus comes back where it was."""
        conv_id = self.conversations_panel.selected_id() or self.conversations.current
        if conv_id is None:
            self.statusBar().showMessage("This chat is not saved yet: there is nothing to rename", 3000)
            return
        self.conversations.ask_rename(conv_id)

    @Slot()
    def _focus_search(self) -> None:
        self.conversations_dock.show()
        self.conversations_panel.search.setFocus()
        self.conversations_panel.search.selectAll()

    @Slot()
    def _show_shortcuts(self) -> None:
        dialog = ShortcutsDialog(self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()

    @Slot()
    def _show_about(self) -> None:
        if self.about_dialog is None:  # made when first opened; it asks the engine's facts once
            self.about_dialog = AboutDialog(self.background, self)
        self.about_dialog.open()

    @Slot()
    def _sample_memory(self) -> None:
        self.memory_panel.sample(memory.process_rss())

    def show_exception(self, title: str, err: BaseException) -> QMessageBox:
        """``show_error`` for an exception: its sentence for the user (worker.failure), the traceback
        under Details."""
        said = failure(err)
        return self.show_error(title, said.message, said.details)

    def show_error(self, title: str, message: str, details: str = "") -> QMessageBox:
        """Status bar plus a window-modal box that does not block the event loop; ``details`` on demand."""
        self.statusBar().showMessage(message)
        box = QMessageBox(QMessageBox.Icon.Warning, APP_TITLE, "", QMessageBox.StandardButton.Ok, self)
        box.setTextFormat(Qt.TextFormat.RichText)
        box.setText(f"<b>{html.escape(title)}</b><p>{html.escape(message)}</p>")
        if details:
            box.setDetailedText(details)
        box.setObjectName("error-box")
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        return box

    def update_title(self) -> None:
        parts = [self.model_info.name] if self.model_info else []
        if self.conversations.private:
            parts.append("private")
        self.setWindowTitle(" — ".join([*parts, APP_TITLE]))

    # the entry point's: the model to open at start, and the end

    def open_configured_model(self) -> None:
        self.loading.open_configured_model()

    def choose_another_model(self, message: str) -> None:
        self.loading.choose_another_model(message)

    def shutdown_engine(self) -> bool:
        """See ``Closing.shutdown_engine``: the engine, disk jobs and database ended within the deadline."""
        return self.closing.shutdown_engine()

    def stop_activity(self) -> None:
        """Quitting: a download stops, the timers stop, a reply streaming is kept as far as it got."""
        self.loading.stop_downloads()
        self._sampler.stop()
        self.chat.stop_idle()
        self.chat.keep_cut_reply()

    # Qt's events, handled by the parts they concern

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt's name
        if self.closing.asked_before_losing_turns():
            event.ignore()
            return
        window_state.save(self)
        self.closing.remember_last_conversation()
        self.closing.shutdown_engine()
        super().closeEvent(event)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 - Qt's name
        self.loading.drag_enter(event)

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 - Qt's name
        self.loading.drop(event)

    # -- dock widths through a small window ------------------------------------------------------------

    def _watch_dock_widths(self) -> None:
        self._dock_widths: dict[QDockWidget, int] = {}  # each dock's width while the window had room
        for dock in (self.conversations_dock, self.memory_dock):
            dock.installEventFilter(self)

    def _side_docks(self) -> list[QDockWidget]:
        docks = (self.conversations_dock, self.memory_dock)
        return [d for d in docks if d.isVisible() and not d.isFloating()]

    def _roomy(self) -> bool:
        """The chat area has room beyond its minimum: the docks are as wide as the user made them."""
        room = self.width() - sum(d.width() for d in self._side_docks())
        return room >= self.centralWidget().minimumSizeHint().width() + ROOMY_CENTRAL

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        if (isinstance(event, QResizeEvent) and watched in self._side_docks()
                and event.size().width() != event.oldSize().width() and self._roomy()):
            self._dock_widths[watched] = watched.width()  # type: ignore[index]  # the user's width
        return super().eventFilter(watched, event)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt's name
        self.model_label.setMaximumWidth(max(MODEL_LABEL_MIN, self.width() * 2 // 5))  # room for messages
        super().resizeEvent(event)
        QTimer.singleShot(0, self._widen_squeezed_docks)

    def _widen_squeezed_docks(self) -> None:
        """A window made small squeezed its docks; made large again, they get their widths back (the
        chat area no longer takes all the room it gains)."""
        if not self._roomy():
            return
        docks = self._side_docks()
        squeezed = [d for d in docks if d.width() < self._dock_widths.get(d, 0)]
        if squeezed:
            self.resizeDocks(squeezed, [self._dock_widths[d] for d in squeezed], Qt.Orientation.Horizontal)
        else:
            self._dock_widths.update((d, d.width()) for d in docks)
