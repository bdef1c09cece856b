"""The chat window: transcript, message input, Send/Stop, and the engine worker's thread."""

from __future__ import annotations

import enum
import html
from pathlib import Path

from PySide6.QtCore import Qt, QThread, Signal, Slot
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from lazykv.core.conversation import Conversation
from lazykv.core.engine import ModelInfo, SamplingSettings
from lazykv.core.model_fetch import models_dir
from lazykv.qt.chat_input import ChatInput
from lazykv.qt.transcript import TranscriptView
from lazykv.qt.worker import EngineWorker

APP_TITLE = "LazyKV Chat"


class UiState(enum.Enum):
    NO_MODEL = enum.auto()
    LOADING = enum.auto()
    READY = enum.auto()
    REPLYING = enum.auto()


class MainWindow(QMainWindow):
    """Drives an EngineWorker on its own QThread through queued signals; never waits on it."""

    load_requested = Signal(str, int, str)  # path, n_ctx, kv_mode
    send_requested = Signal(object, object, object)  # messages, SamplingSettings, max_tokens
    shutdown_requested = Signal()

    def __init__(
        self,
        n_ctx: int = 4096,
        kv_mode: str = "f16",
        sampling: SamplingSettings | None = None,
        max_reply_tokens: int | None = None,
    ) -> None:
        super().__init__()
        self.n_ctx = n_ctx
        self.kv_mode = kv_mode
        self.sampling = sampling or SamplingSettings()
        self.max_reply_tokens = max_reply_tokens
        self.conversation = Conversation()
        self._model_info: ModelInfo | None = None
        self._state = UiState.NO_MODEL

        self._build_ui()
        self._start_worker()
        self._set_state(UiState.NO_MODEL)

    @property
    def worker(self) -> EngineWorker:
        return self._worker

    @property
    def state(self) -> UiState:
        return self._state

    def open_model(self, path: Path) -> None:
        """Load ``path`` in the background; the current model, if any, stays until it has loaded."""
        self._set_state(UiState.LOADING)
        self.statusBar().showMessage(f"Loading {path.name}…")
        self.load_requested.emit(str(path), self.n_ctx, self.kv_mode)

    def _build_ui(self) -> None:
        self.setWindowTitle(APP_TITLE)
        self.resize(900, 640)

        self.transcript = TranscriptView()
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
        layout.addWidget(self.transcript, 1)
        layout.addLayout(composer)
        central = QWidget()
        central.setLayout(layout)
        self.setCentralWidget(central)

        self.model_label = QLabel("No model loaded")
        self.statusBar().addPermanentWidget(self.model_label)

        file_menu = self.menuBar().addMenu("&File")
        self.open_action = QAction("&Open model…", self)
        self.open_action.setShortcut(QKeySequence.StandardKey.Open)
        self.open_action.triggered.connect(self._choose_model)
        file_menu.addAction(self.open_action)
        file_menu.addSeparator()
        quit_action = QAction("&Quit", self)
        quit_action.setShortcut(QKeySequence.StandardKey.Quit)
        quit_action.triggered.connect(self.close)
        file_menu.addAction(quit_action)

        chat_menu = self.menuBar().addMenu("&Chat")
        self.new_chat_action = QAction("&New chat", self)
        self.new_chat_action.setShortcut(QKeySequence.StandardKey.New)
        self.new_chat_action.triggered.connect(self._new_chat)
        chat_menu.addAction(self.new_chat_action)

        self.input.setFocus()

    def _start_worker(self) -> None:
        self._thread = QThread(self)
        self._thread.setObjectName("lazykv-engine")
        self._worker = EngineWorker()
        self._worker.moveToThread(self._thread)
        self._thread.finished.connect(self._worker.deleteLater)

        self.load_requested.connect(self._worker.load_model)
        self.send_requested.connect(self._worker.send)
        self.shutdown_requested.connect(self._worker.shutdown)
        self._worker.model_loaded.connect(self._on_model_loaded)
        self._worker.load_failed.connect(self._on_load_failed)
        self._worker.token.connect(self.transcript.append_to_reply)
        self._worker.reply_finished.connect(self._on_reply_finished)
        self._worker.failed.connect(self._on_reply_failed)
        self._thread.start()

    def _set_state(self, state: UiState) -> None:
        self._state = state
        idle = state in (UiState.NO_MODEL, UiState.READY)
        self.send_button.setEnabled(state is UiState.READY)
        self.stop_button.setEnabled(state is UiState.REPLYING)
        self.open_action.setEnabled(idle)
        self.new_chat_action.setEnabled(idle)

    def _idle_state(self) -> UiState:
        return UiState.READY if self._model_info is not None else UiState.NO_MODEL

    @Slot()
    def _choose_model(self) -> None:
        start = self._model_info.path.parent if self._model_info else models_dir()
        path, _ = QFileDialog.getOpenFileName(
            self, "Open model", str(start), "GGUF models (*.gguf);;All files (*)"
        )
        if path:
            self.open_model(Path(path))

    @Slot()
    def _send(self) -> None:
        text = self.input.toPlainText().strip()
        if not text:
            return
        if self._state is not UiState.READY:
            if self._state is UiState.NO_MODEL:
                self.statusBar().showMessage("Open a model first (File > Open model…)", 5000)
            return
        self.conversation.add("user", text)
        self.input.clear()
        self.transcript.add_message("user", text)
        self.transcript.begin_reply()
        self._set_state(UiState.REPLYING)
        self.statusBar().showMessage("Generating…")
        self.send_requested.emit(self.conversation.messages(), self.sampling, self.max_reply_tokens)

    @Slot()
    def _stop(self) -> None:
        if self._state is UiState.REPLYING:
            self._worker.cancel()
            self.stop_button.setEnabled(False)
            self.statusBar().showMessage("Stopping…")

    @Slot()
    def _new_chat(self) -> None:
        self.conversation.clear()
        self.transcript.show_messages([])
        self.statusBar().clearMessage()

    @Slot(object)
    def _on_model_loaded(self, info: ModelInfo) -> None:
        self._model_info = info
        self.model_label.setText(model_summary(info))
        self.setWindowTitle(f"{info.name} — {APP_TITLE}")
        self._set_state(UiState.READY)
        self.statusBar().showMessage(f"Loaded {info.name}", 5000)

    @Slot(str)
    def _on_load_failed(self, message: str) -> None:
        self._set_state(self._idle_state())
        self._show_error("Could not load the model", message)

    @Slot(str, bool)
    def _on_reply_finished(self, text: str, cancelled: bool) -> None:
        if text:
            self.conversation.add("assistant", text)
        self.transcript.end_reply("stopped" if cancelled else None)
        self._set_state(UiState.READY)
        if cancelled:
            self.statusBar().showMessage("Reply stopped", 5000)
        else:
            self.statusBar().clearMessage()

    @Slot(str)
    def _on_reply_failed(self, message: str) -> None:
        """Take the turn back: drop the user's message from the transcript, return it to the input."""
        failed = self.conversation.pop()["content"]
        self.transcript.show_messages(self.conversation.messages())
        typed_since = self.input.toPlainText()
        self.input.setPlainText(f"{failed}\n{typed_since}" if typed_since else failed)
        self._set_state(self._idle_state())
        self._show_error("The reply failed", message)

    def _show_error(self, title: str, message: str) -> None:
        """Status bar plus a window-modal box that does not block the event loop."""
        self.statusBar().showMessage(message)
        box = QMessageBox(QMessageBox.Icon.Warning, APP_TITLE, "", QMessageBox.StandardButton.Ok, self)
        box.setTextFormat(Qt.TextFormat.RichText)
        box.setText(f"<b>{html.escape(title)}</b><p>{html.escape(message)}</p>")
        box.setObjectName("error-box")
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()

    @Slot()
    def shutdown_engine(self) -> None:
        """Stop any reply, free the model on the worker thread and wait for that thread to end.

        The one place the GUI thread waits on the engine: at exit, for at most one token or
        a model load in progress. Safe to call more than once.
        """
        if not self._thread.isRunning():
            return
        if self._state is UiState.REPLYING:
            self._worker.cancel()
        self.shutdown_requested.emit()
        self._thread.wait()

    def closeEvent(self, event: QCloseEvent) -> None:
        self.shutdown_engine()
        super().closeEvent(event)


def model_summary(info: ModelInfo) -> str:
    """One status-bar line, e.g. 'SmolLM2-135M-Instruct.Q4_1 · llama · 135M params · ctx 4096 · KV f16'."""
    return (
        f"{info.name} · {info.architecture} · {_human_count(info.n_params)} params · "
        f"ctx {info.n_ctx} · KV {info.kv_mode}"
    )


def _human_count(n: int) -> str:
    for divisor, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= divisor:
            return f"{n / divisor:.3g}{suffix}"
    return str(n)
