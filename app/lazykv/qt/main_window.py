"""The chat window: transcript, composer, memory panel, conversion banner, and the engine worker's thread."""

from __future__ import annotations

import enum
import html
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QDeadlineTimer, Qt, QThread, QTimer, Signal, Slot
from PySide6.QtGui import QAction, QCloseEvent, QDragEnterEvent, QDropEvent, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QSizePolicy,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from lazykv import console
from lazykv.core.chat.conversation import Conversation
from lazykv.core.engine import memory
from lazykv.core.engine.engine import (
    ConversionEvent,
    EngineSession,
    KvStatus,
    ModelInfo,
    ReplyResult,
    SamplingSettings,
    read_checked_meta,
)
from lazykv.core.engine.remote import UNREACHABLE_DETAILS, unreachable_text
from lazykv.core.history.persistence import OpenHow, OpenResult
from lazykv.core.history.store import Database
from lazykv.core.idle import IDLE_DELAY_S, wants_idle_conversion
from lazykv.core.kinds import ConversionStage, FinishReason, KvMode, KvPhase
from lazykv.core.models.model_fetch import models_dir
from lazykv.core.settings import SETTINGS_BY_NAME, Settings
from lazykv.qt import theme, window_state
from lazykv.qt.background import Background
from lazykv.qt.chat_input import ChatInput
from lazykv.qt.context_meter import ContextMeter
from lazykv.qt.conversations import UNDO_MS, Conversations
from lazykv.qt.conversations_panel import ConversationsPanel
from lazykv.qt.conversion_banner import ConversionBanner, NoticeBanner, compacted_text, marker_label
from lazykv.qt.memory_panel import MemoryPanel
from lazykv.qt.model_info_dialog import ModelInfoDialog
from lazykv.qt.operations import EngineClient, Operations
from lazykv.qt.reply_stats import ReplyClock
from lazykv.qt.settings_dialog import SettingsDialog
from lazykv.qt.shortcuts_dialog import ShortcutsDialog
from lazykv.qt.transcript import TranscriptView
from lazykv.qt.worker import (
    Convert,
    EngineConfig,
    EngineWorker,
    Failure,
    LoadModel,
    Reply,
    ReplyOptions,
    Request,
    SaveSnapshot,
)

APP_TITLE = "LazyKV Chat"
FIRST_RUN_DOCK_WIDTHS = (240, 250)  # conversations, memory (px)
SAMPLE_INTERVAL_MS = 1000  # memory panel: RSS and the history graph
SHUTDOWN_DEADLINE_MS = 10_000  # at exit, the engine thread gets this long to end (a decode aborts at once)


class UiState(enum.Enum):
    NO_MODEL = enum.auto()
    LOADING = enum.auto()
    READY = enum.auto()
    REPLYING = enum.auto()


@dataclass(frozen=True)
class Timings:
    """Every delay of the window, injectable so that tests never wait in real time."""

    idle_delay_ms: int = int(IDLE_DELAY_S * 1000)  # idle time before compacting a nearly full lazy cache
    sample_interval_ms: int = SAMPLE_INTERVAL_MS
    undo_ms: int = UNDO_MS
    shutdown_deadline_ms: int = SHUTDOWN_DEADLINE_MS


class MainWindow(QMainWindow):
    """Sends engine requests to an EngineWorker on its own QThread and never waits on it.

    ``overrides`` (from the command line) take precedence over the saved settings for this
    session only; changing that setting in the dialog drops the override. ``session`` replaces
    the real EngineSession (tests use a fake one), ``timings`` the delays. ``reopen_last``: once
    the list has loaded, open the most recent conversation (the app does; tests start blank).
    """

    model_loaded = Signal(object)  # ModelInfo, after the window took it
    reply_finished = Signal(object)  # ReplyResult, after the window showed it
    reply_failed = Signal(object)  # Failure, after the turn was taken back
    converted = Signal(bool)  # an idle/manual conversion answered (after the window showed it)
    conversion_shown = Signal(object)  # ConversionEvent, after the window showed it
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
        self._overrides = {k: SETTINGS_BY_NAME[k].validate(v) for k, v in (overrides or {}).items()}
        self.default_model = default_model
        self.timings = timings or Timings()
        self.model_info: ModelInfo | None = None
        self.kv: KvStatus | None = None
        self._state = UiState.NO_MODEL
        self._editing: int | None = None  # index of the user turn being edited
        self._reply: Reply | None = None  # the reply streaming now
        self._reply_markers: list[str] = []  # lines to put under the reply streaming, once it is added
        self._reply_text = ""
        self.reply_clock = ReplyClock()
        self.resume_note = ""
        self._shut_down: bool | None = None  # after shutdown_engine: whether everything ended in time
        self._losing_unsaved_ok = False  # the user chose to quit although turns are not saved
        self._resuming = False  # the chat on screen is being resumed (its snapshot, or re-read)
        self.ops = Operations(self)
        self.background = Background(self, self.ops)
        self.background.unhandled.connect(lambda what, err: self.show_error(f"{what} failed", str(err)))

        self.database = Database()  # the process's one connection to the conversation database
        self._build_ui()
        theme.apply(QApplication.instance(), self.setting("theme"))
        if not window_state.restore(self):  # first run: the transcript gets most of the width
            QTimer.singleShot(0, lambda: self.resizeDocks(
                [self.conversations_dock, self.memory_dock], list(FIRST_RUN_DOCK_WIDTHS),
                Qt.Orientation.Horizontal))  # once shown: before, the docks' size hints win
        self._start_worker(session)
        self.conversations = Conversations(self, self, self.setting("system_prompt"), self.timings.undo_ms)
        self._connect_conversations()
        self._idle_timer = QTimer(self)
        self._idle_timer.setSingleShot(True)
        self._idle_timer.setInterval(self.timings.idle_delay_ms)
        self._idle_timer.timeout.connect(self._convert_while_idle)
        self._sampler = QTimer(self)
        self._sampler.timeout.connect(self._sample_memory)
        self._sampler.start(self.timings.sample_interval_ms)
        self._set_state(UiState.NO_MODEL)
        self._sample_memory()
        self.show_chat(None)
        if reopen_last:
            self.conversations_panel.listed.connect(self._open_last_conversation)
        self.conversations.setup_crypto()  # then the history, opened with the scheme's key, is listed
        if self.settings.problems:
            QTimer.singleShot(0, lambda: self.show_error("Some settings were reset", "\n".join(
                self.settings.problems)))

    @property
    def conversation(self) -> Conversation:
        """The transcript on screen (owned by ``conversations``)."""
        return self.conversations.chat.conversation

    @property
    def idle_conversion_pending(self) -> bool:
        return self._idle_timer.isActive()

    # -- settings ---------------------------------------------------------------------------------

    def setting(self, name: str) -> Any:
        return self._overrides[name] if name in self._overrides else self.settings[name]

    def sampling(self) -> SamplingSettings:
        seed = self.setting("seed")
        return SamplingSettings(
            temperature=self.setting("temperature"),
            top_p=self.setting("top_p"),
            top_k=self.setting("top_k"),
            min_p=self.setting("min_p"),
            repeat_penalty=self.setting("repeat_penalty"),
            seed=None if seed < 0 else seed,
        )

    def reply_options(self) -> ReplyOptions:
        return ReplyOptions(self.setting("max_reply_tokens") or None, self.setting("context_full"))

    def apply_settings(self, changed: dict[str, Any]) -> None:
        """Take new values (e.g. from the dialog), save them off the GUI thread, reload if needed."""
        reload = False
        for name, value in changed.items():
            self._overrides.pop(name, None)
            if self.settings.set(name, value) and SETTINGS_BY_NAME[name].reloads_engine:
                reload = True
        self.save_settings()
        if "theme" in changed:
            theme.apply(QApplication.instance(), self.setting("theme"))
        if "snapshot_encryption" in changed:
            self.conversations.setup_crypto()
        if reload and self.model_info is not None and self._state is UiState.READY:
            self.open_model(self.model_info.path)

    def save_settings(self) -> None:
        snapshot = self.settings.copy()
        self.background.run(snapshot.save, on_error=lambda err: self.show_error(
            "Settings were not saved", f"{snapshot.path}: {err}"))

    # -- public actions ---------------------------------------------------------------------------

    @property
    def worker(self) -> EngineWorker:
        return self._worker

    @property
    def reply_request(self) -> Reply | None:
        """The reply streaming now, if any."""
        return self._reply

    @property
    def state(self) -> UiState:
        return self._state

    def open_model(self, path: Path) -> None:
        """Load ``path`` in the background; the current model, if any, stays until it has loaded."""
        self._set_state(UiState.LOADING)
        self.statusBar().showMessage(f"Loading {path.name}…")
        config = EngineConfig(
            model_path=str(path),
            n_ctx=self.setting("n_ctx"),
            kv_mode=self.setting("kv_mode"),
            n_threads=self.setting("n_threads"),
            n_gpu_layers=self.setting("n_gpu_layers"),
            flash_attn=self.setting("flash_attn"),
            rpc_servers=tuple(self.setting("rpc_servers")),
            rpc_layers=self.setting("rpc_layers"),
            context_budget_mb=self.setting("context_budget_mb"),
        )
        self._show_estimate(path, config)
        self.engine.submit(LoadModel(config), self._on_model_loaded, self._on_load_failed)

    def open_configured_model(self) -> None:
        """The model of the settings, else the default one."""
        path = self.setting("model_path") or (str(self.default_model) if self.default_model else "")
        if path:
            self.open_model(Path(path))
        else:
            self.statusBar().showMessage("Open a model (File > Open model…) to start chatting")

    def choose_another_model(self, message: str) -> None:
        """The model asked for at start cannot be opened: say why, then offer the file chooser (the
        window stays, with File > Open model and Recent, if the user cancels it)."""
        box = self.show_error("The model could not be opened", f"{message}. Choose another model.")
        box.finished.connect(lambda _result: self._choose_model())
        self.statusBar().showMessage("Open a model (File > Open model…) to start chatting")

    def send_text(self, text: str) -> None:
        self.input.setPlainText(text)
        self._send()

    def regenerate(self) -> None:
        """Replace the last reply with a new one (the cache keeps the prompt up to it)."""
        if self._state is not UiState.READY or not self._ends_with_reply():
            return
        self.conversation.take_back_reply()  # the new reply joins it as one more version
        self._rerender()
        self._request_reply()

    def show_version(self, step: int) -> None:
        """Page the last reply ``step`` versions back or on (1/3 ‹ ›): the chat continues from the
        version shown, which is saved as the reply."""
        if self._state is not UiState.READY or not self._ends_with_reply():
            return
        index = len(self.conversation) - 1
        number = self.conversation.version_shown(index) + step
        if 0 <= number < len(self.conversation.versions(index)):
            self.conversation.choose_version(number)
            self._rerender()
            self.conversations.persist(snapshot=False)

    def _update_versions_bar(self) -> None:
        index = len(self.conversation) - 1
        versions = self.conversation.versions(index) if self._ends_with_reply() else []
        self.versions_bar.setVisible(len(versions) > 1)
        if len(versions) > 1:
            number = self.conversation.version_shown(index)
            self.versions_label.setText(f"Reply {number + 1}/{len(versions)}")
            ready = self._state is UiState.READY
            self.previous_version.setEnabled(ready and number > 0)
            self.next_version.setEnabled(ready and number < len(versions) - 1)

    def edit_message(self, index: int) -> None:
        """Put a user turn back into the composer; sending replaces it and everything after it."""
        if self._state is not UiState.READY:
            return
        self._editing = index
        self.input.setPlainText(self.conversation.turns()[index]["content"])
        self.edit_label.setText(f"Editing message {index + 1}: sending replaces it and the turns after it.")
        self.edit_bar.show()
        self.input.setFocus()

    def cancel_edit(self) -> None:
        self._editing = None
        self.edit_bar.hide()

    def copy_last_reply(self) -> None:
        index = self.conversation.last_index("assistant")
        if index is not None:
            QGuiApplication.clipboard().setText(self.conversation.turns()[index]["content"])
            self.statusBar().showMessage("Reply copied", 3000)

    def convert_now(self) -> None:
        if self.model_info is not None and self.model_info.kv_mode.is_lazy:
            self.engine.submit(Convert(), self._on_converted, self._on_convert_failed)

    # -- UI ---------------------------------------------------------------------------------------

    def _build_versions_bar(self) -> None:
        """Under a regenerated reply: which version is shown, and the way to the others."""
        self.versions_bar = QFrame()
        self.versions_bar.setObjectName("versions-bar")
        self.versions_label = QLabel()
        self.previous_version = QPushButton("‹ Previous")
        self.previous_version.clicked.connect(lambda: self.show_version(-1))
        self.next_version = QPushButton("Next ›")
        self.next_version.clicked.connect(lambda: self.show_version(1))
        row = QHBoxLayout(self.versions_bar)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.versions_label)
        row.addWidget(self.previous_version)
        row.addWidget(self.next_version)
        row.addStretch()
        self.versions_bar.hide()

    def _build_ui(self) -> None:
        self.setWindowTitle(APP_TITLE)
        self.resize(1100, 700)
        self.setAcceptDrops(True)

        self.system_edit = QLineEdit()
        self.system_edit.setPlaceholderText("System prompt of this chat (optional)")
        self.system_edit.editingFinished.connect(self._system_prompt_edited)
        system_row = QHBoxLayout()
        system_row.addWidget(QLabel("System:"))
        system_row.addWidget(self.system_edit, 1)

        self.transcript = TranscriptView()
        self.transcript.edit_requested.connect(self.edit_message)
        self.transcript.regenerate_requested.connect(self.regenerate)
        self.transcript.code_copied.connect(lambda: self.statusBar().showMessage("Code copied", 3000))
        self.banner = ConversionBanner()
        self.banner.stop_requested.connect(lambda: self.conversations.cancel_resume())
        self.keyring_notice = NoticeBanner("keyring-banner")
        self.history_notice = NoticeBanner("history-banner")
        self.remote_notice = NoticeBanner("remote-banner")  # remote backends left out at the last load
        for notice in (self.keyring_notice, self.history_notice, self.remote_notice):
            _wrap_without_widening(notice.label)
            _wrap_without_widening(notice.details)

        self.edit_bar = QFrame()
        self.edit_label = QLabel()
        _wrap_without_widening(self.edit_label)
        _wrap_without_widening(self.banner.label)
        cancel_edit = QPushButton("Cancel edit")
        cancel_edit.clicked.connect(self.cancel_edit)
        edit_row = QHBoxLayout(self.edit_bar)
        edit_row.setContentsMargins(0, 0, 0, 0)
        edit_row.addWidget(self.edit_label, 1)
        edit_row.addWidget(cancel_edit)
        self.edit_bar.hide()
        self._build_versions_bar()

        self.input = ChatInput()
        self.input.submitted.connect(self._send)
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.send_button.clicked.connect(self._send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self._stop)
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
        self.memory_dock.setWidget(self.memory_panel)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.memory_dock)

        self.conversations_panel = ConversationsPanel()
        self.conversations_dock = QDockWidget("Conversations", self)
        self.conversations_dock.setObjectName("conversations-dock")
        self.conversations_dock.setWidget(self.conversations_panel)
        self.conversations_dock.setMinimumWidth(240)
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, self.conversations_dock)

        self.model_label = QLabel("No model loaded")
        self.statusBar().addPermanentWidget(self.model_label)
        self._build_actions()

    def _action(self, text: str, slot: Any, shortcut: Any = None, tip: str = "") -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(shortcut)
        if tip:
            action.setStatusTip(tip)
            action.setToolTip(tip)
        action.triggered.connect(slot)
        return action

    def _build_actions(self) -> None:
        K = QKeySequence
        self.open_action = self._action("&Open model…", self._choose_model, K.StandardKey.Open)
        self.info_action = self._action("Model &information…", self._show_model_info)
        self.new_chat_action = self._action("&New chat", self.new_chat, K.StandardKey.New)
        self.new_private_action = self._action("New &private chat", self.new_private_chat, K("Ctrl+Shift+N"),
                                               "A new chat that is never saved (untick Private to end it)")
        self.regenerate_action = self._action("&Regenerate", self.regenerate, K("Ctrl+R"),
                                              "Replace the last reply with a new one")
        self.edit_last_action = self._action("&Edit last message", self._edit_last, K("Ctrl+E"),
                                             "Edit your last message and resend it")
        self.copy_reply_action = self._action("&Copy last reply", self.copy_last_reply, K("Ctrl+Shift+C"))
        self.undo_delete_action = self._action("&Undo delete", lambda: self.conversations.undo_delete(),
                                               K.StandardKey.Undo, "Bring back the conversation deleted last")
        self.undo_delete_action.setEnabled(False)
        self.compact_action = self._action("Compact context &memory now", self.convert_now, None,
                                           "Convert the lazy KV cache to 8-bit now")
        self.settings_action = self._action("&Settings…", self._open_settings, K("Ctrl+,"))
        self.stop_action = self._action("&Stop generating", self._stop, K(Qt.Key.Key_Escape))
        self.search_action = self._action("&Search conversations", self._focus_search, K.StandardKey.Find)
        self.shortcuts_action = self._action("&Keyboard shortcuts", self._show_shortcuts, K("Ctrl+/"))
        quit_action = self._action("&Quit", self.close, K.StandardKey.Quit)

        file_menu = self.menuBar().addMenu("&File")
        file_menu.addAction(self.new_private_action)
        file_menu.addSeparator()
        file_menu.addAction(self.open_action)
        self.recent_menu = file_menu.addMenu("Open &recent")
        self.recent_menu.aboutToShow.connect(self._fill_recent_menu)
        file_menu.addAction(self.info_action)
        file_menu.addSeparator()
        file_menu.addAction(self.settings_action)
        file_menu.addSeparator()
        file_menu.addAction(quit_action)
        chat_menu = self.menuBar().addMenu("&Chat")
        for action in (self.new_chat_action, self.stop_action, self.regenerate_action, self.edit_last_action,
                       self.copy_reply_action, self.undo_delete_action, self.search_action,
                       self.compact_action):
            chat_menu.addAction(action)
        self.private_action = QAction("&Private chat (save nothing)", self)
        self.private_action.setCheckable(True)
        self.private_action.toggled.connect(lambda on: self.conversations.set_private(on))
        self.conversations_panel.new_requested.connect(self.new_chat)
        chat_menu.addSeparator()
        chat_menu.addAction(self.private_action)
        view_menu = self.menuBar().addMenu("&View")
        view_menu.addAction(self.conversations_dock.toggleViewAction())
        view_menu.addAction(self.memory_dock.toggleViewAction())
        self.menuBar().addMenu("&Help").addAction(self.shortcuts_action)

        toolbar = QToolBar("Main", self)
        toolbar.setObjectName("main-toolbar")
        toolbar.setMovable(False)
        for action in (self.new_chat_action, self.regenerate_action, self.compact_action,
                       self.settings_action):
            toolbar.addAction(action)
        toolbar.addAction(self.memory_dock.toggleViewAction())
        self.addToolBar(toolbar)
        self.input.setFocus()

    def _start_worker(self, session: EngineSession | None) -> None:
        self._thread = QThread(self)
        self._thread.setObjectName("lazykv-engine")
        self._worker = EngineWorker(self.database, session)
        self._worker.moveToThread(self._thread)
        self._thread.finished.connect(self._worker.deleteLater)
        self.shutdown_requested.connect(self._worker.shutdown)
        self._worker.kv_status.connect(self._on_kv_status)
        self._worker.conversion.connect(self._on_conversion)
        self.engine = EngineClient(self._worker, self.ops, self)
        self.engine.unhandled.connect(self._on_unhandled_failure)
        self._thread.start()

    def _on_unhandled_failure(self, request: Request, failure: Failure) -> None:
        self.show_error(f"{request.what} failed", failure.message, failure.details)

    def _connect_conversations(self) -> None:
        self.conversations.private_changed.connect(self._on_private_changed)
        self.conversations.undo_changed.connect(self._on_undo_changed)
        self.ops.changed.connect(lambda _: self._set_state(self._state))

    @Slot(str)
    def _on_undo_changed(self, title: str) -> None:
        self.undo_delete_action.setEnabled(bool(title))
        self.undo_delete_action.setText(f"&Undo delete of “{title}”" if title else "&Undo delete")

    @Slot(bool)
    def _on_private_changed(self, private: bool) -> None:
        """The one private flag (Conversations') shown by both of its controls, and the title."""
        for control in (self.private_action, self.conversations_panel.private_box):
            blocked = control.blockSignals(True)
            control.setChecked(private)
            control.blockSignals(blocked)
        self.update_title()

    def _set_state(self, state: UiState) -> None:
        self._state = state
        ready = state is UiState.READY
        idle = state in (UiState.NO_MODEL, UiState.READY)
        engine_free = idle and not self.engine.pending()  # e.g. no snapshot being saved, no compaction
        self.send_button.setEnabled(ready)
        self.stop_button.setEnabled(state is UiState.REPLYING)
        self.stop_action.setEnabled(state is UiState.REPLYING)
        self.open_action.setEnabled(engine_free)
        self.recent_menu.setEnabled(engine_free)
        self.new_chat_action.setEnabled(idle)
        self.new_private_action.setEnabled(idle)
        self.settings_action.setEnabled(engine_free)
        self.system_edit.setReadOnly(not idle)
        self.transcript.actions_enabled = ready
        self.regenerate_action.setEnabled(ready and self._ends_with_reply())
        self._update_versions_bar()
        self.edit_last_action.setEnabled(ready and self.conversation.last_index("user") is not None)
        self._update_compact_action(ready)
        self.info_action.setEnabled(self.model_info is not None)
        # deleting a conversation while its snapshot is written would orphan the file (issue 16)
        self.conversations_panel.set_saving(
            {r.conv_id for r in self.engine.pending() if isinstance(r, SaveSnapshot)})
        if state is not UiState.READY:
            self._idle_timer.stop()

    def _update_compact_action(self, ready: bool) -> None:
        """Enabled while a lazy cache in use can go one step down and no compaction is on its way (a
        second click must not take a ladder two steps down); it says to which step."""
        step = self.kv.next_rung if self.kv is not None and self.kv.n_cells_used > 0 else None
        self.compact_action.setEnabled(ready and step is not None and not self._compacting())
        if step is not None:
            tip = f"Compact the context memory to {step.words} now"
        elif self.kv is None or not self.kv.kv_mode.is_lazy:
            tip = "Only a lazy or ladder KV cache compacts (Settings > KV cache)"
        else:
            tip = "Nothing to compact: the context memory is empty or at its last step"
        self.compact_action.setStatusTip(tip)
        self.compact_action.setToolTip(tip)

    def _compacting(self) -> bool:
        """A compaction (manual or idle) is on its way to the engine."""
        return any(isinstance(r, Convert) for r in self.engine.pending())

    def _ends_with_reply(self) -> bool:
        n = len(self.conversation)
        return n > 0 and self.conversation.last_index("assistant") == n - 1

    def _idle_state(self) -> UiState:
        return UiState.READY if self.model_info is not None else UiState.NO_MODEL

    def _rerender(self) -> None:
        self.transcript.show_messages(self.conversation.shown(), self.conversation.markers(),
                                      self.conversation.stats())
        self._update_versions_bar()

    # -- slots: user ------------------------------------------------------------------------------

    @Slot()
    def _choose_model(self) -> None:
        start = self.model_info.path.parent if self.model_info else models_dir()
        dialog = QFileDialog(self, "Open model", str(start), "GGUF models (*.gguf);;All files (*)")
        dialog.setObjectName("model-chooser")
        dialog.setFileMode(QFileDialog.FileMode.ExistingFile)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.fileSelected.connect(lambda path: self.open_model(Path(path)))
        dialog.open()  # window-modal, the event loop runs on (a static getOpenFileName nests one)

    def _fill_recent_menu(self) -> None:
        self.recent_menu.clear()
        for path in self.settings["recent_models"]:
            action = self.recent_menu.addAction(Path(path).name)
            action.setToolTip(path)
            action.triggered.connect(lambda _=False, p=path: self.open_model(Path(p)))
        if not self.settings["recent_models"]:
            self.recent_menu.addAction("(none yet)").setEnabled(False)

    @Slot()
    def _show_model_info(self) -> None:
        if self.model_info is not None:
            dialog = ModelInfoDialog(self.model_info.meta, self)
            dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
            dialog.open()

    @Slot()
    def _open_settings(self) -> None:
        meta = self.model_info.meta if self.model_info else None
        dialog = SettingsDialog(self.settings.copy(self._overrides), meta, self,
                                keyring_works=not self.conversations.keyring_failed)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self.apply_settings(dialog.changed()))
        self.settings_dialog = dialog
        dialog.open()

    @Slot()
    def _system_prompt_edited(self) -> None:
        self.conversation.system_prompt = self.system_edit.text()

    @Slot()
    def _send(self) -> None:
        text = self.input.toPlainText().strip()
        if not text:
            return
        if self._state is not UiState.READY:
            if self._state is UiState.NO_MODEL:
                self.statusBar().showMessage("Open a model first (File > Open model…)", 5000)
            return
        if self._editing is not None:
            self.conversation.truncate(self._editing)
            self.cancel_edit()
            self._rerender()
        self.conversation.system_prompt = self.system_edit.text()
        self.conversation.add("user", text)
        self.input.clear()
        self.transcript.add_message("user", text)
        self.conversations.persist(snapshot=False)
        self._request_reply()

    def _request_reply(self) -> None:
        self._reply_markers, self._reply_text = [], ""
        self.reply_clock = ReplyClock()
        self.transcript.begin_reply()
        self._set_state(UiState.REPLYING)
        self.input.setFocus()  # a clicked Send button is disabled now: Qt would move focus elsewhere
        self.statusBar().showMessage("Generating…")
        self._reply = request = Reply(self.conversation.messages(), self.sampling(), self.reply_options())
        chat = self.conversations.chat
        self.engine.submit(
            request,
            lambda result: self._on_reply_finished(result) if chat is self.conversations.chat
            else self._reply_abandoned(),
            lambda failure: self._on_reply_failed(failure) if chat is self.conversations.chat
            else self._reply_abandoned(),
            self._on_token,
        )

    def _reply_abandoned(self) -> None:
        """The reply's chat was replaced meanwhile (e.g. deleted): its answer goes nowhere."""
        self._reply = None
        self.transcript.end_reply()
        self._set_state(self._idle_state())

    @Slot()
    def _edit_last(self) -> None:
        index = self.conversation.last_index("user")
        if index is not None:
            self.edit_message(index)

    @Slot()
    def _stop(self) -> None:
        """Stop the reply streaming now: its own token, so no other request is touched."""
        if self._reply is not None:
            self._reply.cancel.set()
            self.stop_button.setEnabled(False)
            self.stop_action.setEnabled(False)
            self.input.setFocus()  # not wherever Qt moves it from the disabled button
            self.statusBar().showMessage("Stopping…")

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
    def _focus_search(self) -> None:
        self.conversations_dock.show()
        self.conversations_panel.search.setFocus()
        self.conversations_panel.search.selectAll()

    @Slot()
    def _show_shortcuts(self) -> None:
        dialog = ShortcutsDialog(self.findChildren(QAction), self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()

    @Slot()
    def new_chat(self) -> None:
        if self._state not in (UiState.NO_MODEL, UiState.READY):
            return
        self.conversations.new_chat(self.settings["system_prompt"])
        self.statusBar().clearMessage()

    @Slot()
    def new_private_chat(self) -> None:
        """A new, empty chat with Private on: nothing of it is saved; unticking Private ends it."""
        if self._state not in (UiState.NO_MODEL, UiState.READY):
            return
        self.conversations.new_chat(self.settings["system_prompt"])
        self.conversations.set_private(True)
        self.statusBar().showMessage("New private chat: nothing of it is saved", 5000)

    def stop_reply(self) -> None:
        """Stop the reply streaming now, if any (its answer is then abandoned when its chat is gone)."""
        self._stop()

    def show_chat(self, title: str | None) -> None:
        """Show the chat on screen (Conversations changed it); a saved one's KV cache is resumed next."""
        self.cancel_edit()
        self.banner.close_task()  # a note of the chat shown before ("Resumed from the snapshot…")
        self.resume_note = ""
        self.system_edit.setText(self.conversation.system_prompt)
        self._rerender()
        self._set_state(self._state)
        if title is not None:
            self.statusBar().showMessage(f"Opened “{title}”", 3000)

    @Slot()
    def _convert_while_idle(self) -> None:
        wanted = wants_idle_conversion(self.kv) and self.setting("idle_conversion") and not self._compacting()
        if self._state is UiState.READY and wanted:
            self.statusBar().showMessage("Compacting context memory while idle…", 3000)
            self.engine.submit(Convert(), self._on_converted, self._on_convert_failed)

    # -- engine answers -----------------------------------------------------------------------------

    def _on_model_loaded(self, info: ModelInfo) -> None:
        first = self.model_info is None
        if not first and len(self.conversation):  # a reload: the cache is empty now
            label = (f"Context memory emptied here: {info.name} loaded with the {_KV_WORDS[info.kv_mode]} "
                     "cache; the next reply reads the conversation again")
            self._add_marker(label)
            self.transcript.mark_here(label)
        self.model_info = info
        self.model_label.setText(model_summary(info))
        self.memory_panel.set_model(info)
        self._show_unreachable(info)
        self.update_title()
        self.settings.add_recent_model(str(info.path))
        if "model_path" not in self._overrides and info.path != self.default_model:
            self.settings.set("model_path", str(info.path))
        self.save_settings()
        self._set_state(UiState.READY)
        self.statusBar().showMessage(f"Loaded {info.name}", 5000)
        if first:  # a chat opened before any model (at start-up, while it loaded) is resumed now
            self.conversations.resume_shown()
        self.model_loaded.emit(info)

    def _show_unreachable(self, info: ModelInfo) -> None:
        """Remote backends left out of this load: said once, with the way to change them."""
        if info.unreachable:
            self.remote_notice.show_choices(unreachable_text(info.unreachable),
                                            [("Settings…", self._open_settings)], UNREACHABLE_DETAILS)
        else:
            self.remote_notice.hide()

    def _on_load_failed(self, failure: Failure) -> None:
        self._set_state(self._idle_state())
        if not failure.cancelled:
            self.show_error("Could not load the model", failure.message, failure.details)

    def _on_token(self, piece: str) -> None:
        self._reply_text += piece
        self.reply_clock.token()
        self.transcript.append_to_reply(piece)

    def _on_reply_finished(self, result: ReplyResult) -> None:
        self._reply = None
        notes = []
        if result.dropped:
            n = sum(1 for m in result.dropped if m["role"] != "system")
            self.conversation.forget_oldest(n)
            notes.append(f"context full: the {n} oldest messages were dropped to make room")
        if ended := _how_it_ended(result, self.reply_options().max_tokens):
            notes.append(ended)
        note = "; ".join(notes)
        stats = self.reply_clock.stats()
        stats = replace(stats, note=note) if stats is not None else None
        if result.text:
            self.conversation.add("assistant", result.text)
            if stats is not None:
                self.conversation.set_stats(len(self.conversation) - 1, stats)
        for label in self._reply_markers:  # under the reply (under the user's message if it has none)
            self._add_marker(label)
        self.transcript.end_reply(note or None, stats.summary() if stats else None)
        self._set_state(UiState.READY)
        self.conversations.persist(snapshot=True)
        if notes:
            self.statusBar().showMessage(notes[-1].capitalize(), 8000)
        else:
            self.statusBar().showMessage(
                f"Prompt {result.n_prompt} tokens, {result.n_reused} reused from the cache", 5000
            )
        self._maybe_schedule_idle_conversion()
        self.reply_finished.emit(result)

    def _on_reply_failed(self, failure: Failure) -> None:
        """Stopped before anything was read: a reply with no text. Refused: take the turn back (drop the
        user's message from the transcript and the database, return it to the input)."""
        if failure.cancelled:
            self._on_reply_finished(ReplyResult("", FinishReason.CANCELLED, 0, 0))
            return
        self._reply = None
        if len(self.conversation) > 0 and self.conversation.last_index("user") == len(self.conversation) - 1:
            failed = self.conversation.pop()["content"]
            typed_since = self.input.toPlainText()
            self.input.setPlainText(f"{failed}\n{typed_since}" if typed_since else failed)
            self.conversations.forget_turn()
        self._rerender()
        self._set_state(self._idle_state())
        self.show_error("The reply failed", failure.message, failure.details)
        self.reply_failed.emit(failure)

    def _on_converted(self, converted: bool) -> None:
        self.converted.emit(converted)

    def _on_convert_failed(self, failure: Failure) -> None:
        """An idle or manual conversion failed: said as such; the conversation is not touched."""
        if not failure.cancelled:
            self.show_error("Compacting the context memory failed", failure.message, failure.details)

    @Slot(object)
    def _on_kv_status(self, status: KvStatus) -> None:
        self.kv = status
        self.memory_panel.set_status(status)
        self.context_meter.set_status(status)
        self._set_state(self._state)
        self._maybe_schedule_idle_conversion()

    @Slot(object)
    def _on_conversion(self, event: ConversionEvent) -> None:
        self.banner.on_event(event)
        if event.stage is ConversionStage.START and self.kv is not None:
            converting = replace(self.kv, phase=KvPhase.CONVERTING, n_cells_used=event.n_cells,
                                 target=event.target)
            self.memory_panel.set_status(converting)
            self.context_meter.set_status(converting)
        if event.stage is ConversionStage.END:
            in_reply = self._state is UiState.REPLYING and bool(self._reply_text)
            label = marker_label(event, during_reply=in_reply)
            if in_reply:
                self._reply_markers.append(label)
            else:  # idle, or while the prompt was read: a line under the last message
                self._add_marker(label)
            self.transcript.mark_here(label, before_reply=self._state is UiState.REPLYING and not in_reply)
            self.statusBar().showMessage(compacted_text(event), 10_000)
        self.conversion_shown.emit(event)

    def _add_marker(self, label: str) -> None:
        """A line under the last message (a marker at its end)."""
        if len(self.conversation):
            index = len(self.conversation) - 1
            self.conversation.add_marker(index, len(self.conversation.shown()[index]["content"]), label)

    def _maybe_schedule_idle_conversion(self) -> None:
        if (self._state is UiState.READY and self.setting("idle_conversion")
                and wants_idle_conversion(self.kv) and not self._idle_timer.isActive()):
            self._idle_timer.start()

    @Slot()
    def _sample_memory(self) -> None:
        self.memory_panel.sample(memory.process_rss())

    def _show_estimate(self, path: Path, config: EngineConfig) -> None:
        """The memory estimate of a model about to load (its header is read off the GUI thread)."""
        title = f"{path.name}, KV {config.kv_mode}"

        def done(meta: Any) -> None:
            budget = config.context_budget_mb * memory.MiB
            plan = memory.plan_context(meta, config.n_ctx, config.kv_mode, budget)
            offload = memory.Offload.of(config.rpc_servers, config.rpc_layers)
            self.memory_panel.set_estimate(f"{path.name}, ctx {plan.n_ctx}, KV {config.kv_mode}",
                                           memory.estimate(meta, plan.n_ctx, config.kv_mode, offload=offload),
                                           plan=plan)

        self.background.run(lambda: read_checked_meta(path), done,
                            lambda err: self.memory_panel.set_estimate(title, None, str(err)),
                            "Reading the model's header")

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

    # -- conversations ----------------------------------------------------------------------------

    def update_title(self) -> None:
        parts = [self.model_info.name] if self.model_info else []
        if self.conversations.private:
            parts.append("private")
        self.setWindowTitle(" — ".join([*parts, APP_TITLE]))

    def can_switch_conversation(self) -> bool:
        """Idle; re-reading a conversation (the one chosen replaces it); or loading the first model (the
        chat chosen is resumed once it has loaded). Not while a reply streams or a model reloads."""
        first_load = self._state is UiState.LOADING and self.model_info is None
        return self._state in (UiState.NO_MODEL, UiState.READY) or self._resuming or first_load

    def begin_resume(self) -> None:
        self._resuming = True
        self._set_state(UiState.LOADING)
        self.banner.show_progress("Resuming the conversation…", 0.0)

    def resume_progress(self, done: int, total: int) -> None:
        fraction = done / total if total else 1.0
        self.banner.show_progress(f"Re-reading the conversation… {done} of {total} tokens", fraction,
                                  can_stop=True)

    def end_resume(self, result: OpenResult | None, failure: Failure | None = None) -> None:
        """The resume answered: restored, rebuilt or empty; else stopped (the banner's Stop, or the chat
        was replaced) or failed."""
        self._resuming = False
        self._set_state(self._idle_state())
        if result is None:
            assert failure is not None
            self.banner.close_task()
            if failure.message and not failure.cancelled:
                self.show_error("The conversation could not be resumed", failure.message, failure.details)
            elif failure.message:
                self.resume_note = "Stopped re-reading; the next reply reads the rest of the conversation"
                self.statusBar().showMessage(self.resume_note, 10_000)
            return
        if result.how is OpenHow.RESTORED:
            text = f"Resumed from the snapshot: {result.n_tokens} tokens in {1000 * result.seconds:.0f} ms"
        elif result.how is OpenHow.REBUILT:
            text = (f"Re-read from the transcript ({result.n_tokens} tokens in {result.seconds:.1f} s) "
                    f"because {result.note}")
        else:
            text = "Empty conversation"
        self.resume_note = text
        self.banner.show_note(text, details=result.details)
        self.statusBar().showMessage(text, 10_000)

    # -- drag and drop, shutdown ------------------------------------------------------------------

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if _dropped_model(event) is not None and self._state in (UiState.NO_MODEL, UiState.READY):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        path = _dropped_model(event)
        if path is not None:
            event.acceptProposedAction()
            self.open_model(path)

    @Slot()
    def shutdown_engine(self) -> bool:
        """Hide the window, stop what the engine does, drop what is queued, free the model, and wait
        for the engine's thread at most ``timings.shutdown_deadline_ms``. Pending disk writes finish
        too. True when everything ended in time; safe to call more than once.

        The one place the GUI thread waits on the engine: at exit, with the window already gone."""
        if self._shut_down is not None:
            return self._shut_down
        self._shut_down = False
        self.hide()
        self._sampler.stop()
        self._idle_timer.stop()
        self._keep_cut_reply()
        waiting = self.ops.labels()
        if waiting:
            console.say(f"finishing before exit: {', '.join(waiting)}")
        self._worker.close()
        self.engine.close()
        deadline = QDeadlineTimer(self.timings.shutdown_deadline_ms)
        disk_done = self.background.wait(max(0, deadline.remainingTime()))
        engine_done = not self._thread.isRunning()
        if not engine_done:
            self.shutdown_requested.emit()
            engine_done = self._thread.wait(deadline)
        if not engine_done:
            console.say("the engine did not stop in time; exiting without it")
        database_done = self.database.close(max(500, deadline.remainingTime()) / 1000)
        self._shut_down = disk_done and engine_done and database_done
        return self._shut_down

    def _keep_cut_reply(self) -> None:
        """Quitting while a reply streams: what it had written is kept and saved, with a line saying
        that closing the app stopped it (its answer will never come)."""
        if self._reply is None or not self._reply_text:
            return
        self._reply = None
        stats = self.reply_clock.stats()
        note = "Reply stopped: the app was closed"
        self.conversation.add("assistant", self._reply_text)
        if stats is not None:
            self.conversation.set_stats(len(self.conversation) - 1, replace(stats, note=note))
        self.transcript.end_reply(note, stats.summary() if stats else None)
        self.conversations.persist(snapshot=False)

    def closeEvent(self, event: QCloseEvent) -> None:
        if self._asked_before_losing_turns():
            event.ignore()
            return
        window_state.save(self)
        self._remember_last_conversation()
        self.shutdown_engine()
        super().closeEvent(event)

    def _remember_last_conversation(self) -> None:
        """The next start opens the chat on screen now (a private one leaves no trace: the newest then)."""
        current = None if self.conversations.private else self.conversations.current
        if self.settings.set("last_conversation", current or 0):
            self.save_settings()  # shutdown_engine waits for it

    def _asked_before_losing_turns(self) -> bool:
        """Turns that wait for the history to open would be lost by quitting: ask first (window-modal,
        the event loop runs on). True while the question stands."""
        unsaved = self.conversations.unsaved_turns()
        if not unsaved or self._losing_unsaved_ok or self._shut_down is not None:
            return False
        if self.findChild(QMessageBox, "unsaved-box") is None:
            self._ask_before_losing_turns(unsaved)
        return True

    def _ask_before_losing_turns(self, unsaved: int) -> None:
        messages, they, them = ("1 message you typed is", "it", "it") if unsaved == 1 else \
            (f"{unsaved} messages you typed are", "they", "them")
        text = (f"{messages} not saved: {self.conversations.why_unsaved()}. If you quit now, {they} will "
                "be lost.")
        box = QMessageBox(QMessageBox.Icon.Warning, APP_TITLE, text, QMessageBox.StandardButton.NoButton,
                          self)
        box.setInformativeText(f"Keep the window open and {they} will be saved as soon as the history opens.")
        box.setObjectName("unsaved-box")
        lose = box.addButton(f"Quit and lose {them}", QMessageBox.ButtonRole.DestructiveRole)
        box.setDefaultButton(box.addButton("Keep the window open", QMessageBox.ButtonRole.RejectRole))
        lose.clicked.connect(self._quit_losing_turns)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()

    def _quit_losing_turns(self) -> None:
        self._losing_unsaved_ok = True
        console.say(f"quit with {self.conversations.unsaved_turns()} messages not saved "
                    f"({self.conversations.why_unsaved()})")
        self.close()


def _wrap_without_widening(label: QLabel) -> None:
    """A label for notes of any length: wraps at the window's width instead of asking for more."""
    label.setWordWrap(True)
    label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
    label.setMinimumWidth(0)


def _dropped_model(event: QDragEnterEvent | QDropEvent) -> Path | None:
    urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
    paths = [Path(u.toLocalFile()) for u in urls if u.isLocalFile()]
    return paths[0] if len(paths) == 1 and paths[0].suffix.lower() == ".gguf" else None


def model_summary(info: ModelInfo) -> str:
    """One status-bar line, e.g. 'SmolLM2-135M-Instruct.Q4_1 · llama · 135M params · ctx 4096 · KV lazy'."""
    return (
        f"{info.name} · {info.architecture} · {_human_count(info.n_params)} params · "
        f"ctx {info.n_ctx} · KV {info.kv_mode} · {info.n_threads} threads"
    )


def _human_count(n: int) -> str:
    for divisor, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= divisor:
            return f"{n / divisor:.3g}{suffix}"
    return str(n)


_KV_WORDS = {KvMode.F16: "16-bit", KvMode.Q8_0: "8-bit", KvMode.LAZY: "lazy (16-bit, then 8-bit)",
             KvMode.LADDER: "ladder (16-bit, then 8-bit, then 4-bit)"}


def _how_it_ended(result: ReplyResult, max_tokens: int | None) -> str:
    """The line under a reply that did not end by itself ("" when it did)."""
    if result.cancelled:
        return "Reply stopped"
    if result.finish_reason is FinishReason.LENGTH:
        if max_tokens:  # the prompt was fitted to leave room for them: the limit was reached
            return f"Reply stopped at the length limit ({max_tokens} tokens; Settings > Max reply tokens)"
        return "Reply stopped: the context is full"
    return ""
