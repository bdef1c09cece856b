"""Model loading, for the window: open a model (chooser, recent, drop), its memory estimate, and
what the window shows once the engine has loaded it or could not. ``ModelLoading`` sees the window
only through ``ModelLoadingHost``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import (
    QFileDialog,
    QMenu,
    QMessageBox,
    QWidget,
)

from lazykv.core.chat.conversation import Conversation
from lazykv.core.engine import devices, planner
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.model_load import read_checked_meta
from lazykv.core.engine.remote import UNREACHABLE_DETAILS, unreachable_text
from lazykv.core.engine.types import ModelInfo
from lazykv.core.models.defaults import models_folder
from lazykv.core.settings import Settings, load_spec
from lazykv.qt.background import Background
from lazykv.qt.elided_label import ElidedLabel, StatusBar
from lazykv.qt.memory_panel import MemoryPanel
from lazykv.qt.model_info_dialog import ModelInfoDialog
from lazykv.qt.models_dialog import ModelsDialog
from lazykv.qt.notice_banner import NoticeBanner
from lazykv.qt.operations import EngineClient
from lazykv.qt.transcript import TranscriptView
from lazykv.qt.ui_state import UiState
from lazykv.qt.worker import (
    Failure,
    LoadModel,
)

if TYPE_CHECKING:
    from lazykv.qt.chat_flow import ChatFlow
    from lazykv.qt.conversations import Conversations


class ModelLoadingHost(Protocol):
    """What model loading uses of its window: the settings, the engine, the widgets that show a model."""

    settings: Settings
    overrides: dict[str, Any]  # the command line's, for this session
    default_model: Path | None
    model_info: ModelInfo | None  # set here once a model has loaded
    engine: EngineClient
    background: Background
    conversations: Conversations
    chat: ChatFlow
    transcript: TranscriptView
    memory_panel: MemoryPanel
    model_label: ElidedLabel
    remote_notice: NoticeBanner
    demo_notice: NoticeBanner
    recent_menu: QMenu

    @property
    def conversation(self) -> Conversation: ...
    @property
    def state(self) -> UiState: ...
    def setting(self, name: str) -> Any: ...
    def statusBar(self) -> StatusBar: ...  # noqa: N802 - Qt's name
    def set_state(self, state: UiState) -> None: ...
    def idle_state(self) -> UiState: ...
    def show_error(self, title: str, message: str, details: str = "") -> QMessageBox: ...
    def update_title(self) -> None: ...
    def save_settings(self) -> None: ...
    def open_settings(self) -> None: ...


class ModelLoading(QObject):
    """Opens models for the window (``host``; its dialogs are ``dialog_parent``'s) and shows what loaded:
    ``model_loaded`` once the window has taken it."""

    model_loaded = Signal(object)  # ModelInfo, after the window took it

    def __init__(self, host: ModelLoadingHost, dialog_parent: QWidget) -> None:
        super().__init__(dialog_parent)
        self.host = host
        self._dialogs = dialog_parent
        self.models_dialog: ModelsDialog | None = None  # File > Models…, made when first opened

    def open_model(self, path: Path) -> None:
        """Load ``path`` in the background; the current model, if any, stays until it has loaded."""
        self.host.set_state(UiState.LOADING)
        self.host.statusBar().showMessage(f"Loading {path.name}…")
        spec = load_spec({**self.host.settings.values(), **self.host.overrides}, path)
        self._show_estimate(spec)
        self.host.engine.submit(LoadModel(spec), self._on_model_loaded, self._on_load_failed)

    def open_configured_model(self) -> None:
        """The model of the settings, else the default one."""
        default = self.host.default_model
        path = self.host.setting("model_path") or (str(default) if default else "")
        if path:
            self.open_model(Path(path))
        else:
            self.host.statusBar().showMessage("Open a model (File > Open model…) to start chatting")

    def choose_another_model(self, message: str) -> None:
        """The model asked for at start cannot be opened: say why, then offer the file chooser (the
        window stays, with File > Open model and Recent, if the user cancels it)."""
        box = self.host.show_error("The model could not be opened", f"{message}. Choose another model.")
        box.finished.connect(lambda _result: self.choose_model())
        self.host.statusBar().showMessage("Open a model (File > Open model…) to start chatting")

    def choose_model(self) -> None:
        start = self.host.model_info.path.parent if self.host.model_info else models_folder()
        dialog = QFileDialog(self._dialogs, "Open model", str(start), "GGUF models (*.gguf);;All files (*)")
        dialog.setObjectName("model-chooser")
        dialog.setFileMode(QFileDialog.FileMode.ExistingFile)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.fileSelected.connect(lambda path: self.open_model(Path(path)))
        dialog.open()  # window-modal, the event loop runs on (a static getOpenFileName nests one)

    def fill_recent_menu(self) -> None:
        self.host.recent_menu.clear()
        for path in self.host.settings["recent_models"]:
            action = self.host.recent_menu.addAction(Path(path).name)
            action.setToolTip(path)
            action.triggered.connect(lambda _=False, p=path: self.open_model(Path(p)))
        if not self.host.settings["recent_models"]:
            self.host.recent_menu.addAction("(none yet)").setEnabled(False)

    def show_model_info(self) -> None:
        if self.host.model_info is not None:
            info = self.host.model_info
            dialog = ModelInfoDialog(info.meta, self._dialogs, info.plan, info.plan_note, info.chat_template)
            dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
            dialog.open()

    def _show_estimate(self, spec: LoadSpec) -> None:
        """The memory estimate of a model about to load (its header is read off the GUI thread)."""
        path = spec.model
        title = f"{path.name}, KV {spec.kv_mode}"

        def done(found: tuple[Any, tuple[planner.Device, ...]]) -> None:
            meta, gpus = found
            plan = spec.context(meta)
            self.host.memory_panel.set_estimate(f"{path.name}, ctx {plan.n_ctx}, KV {spec.kv_mode}",
                                           spec.estimate(meta, gpus), plan=plan)

        def read() -> tuple[Any, tuple[planner.Device, ...]]:
            return read_checked_meta(path), tuple(devices.local_gpus())

        self.host.background.run(read, done,
                            lambda err: self.host.memory_panel.set_estimate(title, None, str(err)),
                            "Reading the model's header")

    def _on_model_loaded(self, info: ModelInfo) -> None:
        first = self.host.model_info is None
        self.host.model_info = info  # (before the line below is saved: the chat is now held in this one)
        if not first and len(self.host.conversation):  # a reload: the cache is empty now
            label = (f"Context memory emptied here: {info.name} loaded with the {info.kv_mode.words} "
                     "cache; the next reply reads the conversation again")
            if self.host.chat.add_marker(label):
                self.host.transcript.mark_here(label)
        self.host.model_label.setText(model_summary(info))
        self.host.memory_panel.set_model(info)
        self._show_unreachable(info)
        self._show_demo_note(info)
        self.host.update_title()
        self.host.settings.add_recent_model(str(info.path))
        if "model_path" not in self.host.overrides and info.path != self.host.default_model:
            self.host.settings.set("model_path", str(info.path))
        self.host.save_settings()
        self.host.set_state(UiState.READY)
        self.host.statusBar().showMessage(f"Loaded {info.name}", 5000)
        if first:  # a chat opened before any model (at start-up, while it loaded) is resumed now
            self.host.conversations.resume_shown()
        self.model_loaded.emit(info)

    def _show_unreachable(self, info: ModelInfo) -> None:
        """Remote backends left out of this load: said once, with the way to change them."""
        if info.unreachable:
            self.host.remote_notice.show_choices(unreachable_text(info.unreachable),
                                            [("Settings…", self.host.open_settings)], UNREACHABLE_DETAILS)
        else:
            self.host.remote_notice.hide()

    def _show_demo_note(self, info: ModelInfo) -> None:
        """The demo model cannot hold a useful conversation: say so, and where a real one is found."""
        if self.host.default_model is not None and Path(info.path) == self.host.default_model:
            self.host.demo_notice.show_choices(DEMO_NOTE, [("Models…", self.open_models)])
        else:
            self.host.demo_notice.hide()

    def open_models(self) -> None:
        """File > Models…: one page for the window's life, so a download goes on while it is closed."""
        if self.models_dialog is None:
            self.models_dialog = ModelsDialog(self.host.settings, self._dialogs)
            self.models_dialog.model_chosen.connect(self._load_chosen_model)
        self.models_dialog.show()
        self.models_dialog.raise_()
        self.models_dialog.activateWindow()

    def _load_chosen_model(self, path: Path) -> None:
        """The Models page's Load: through the same path as File > Open, once the engine is free."""
        if self.host.state not in (UiState.NO_MODEL, UiState.READY) or self.host.engine.pending():
            self.host.statusBar().showMessage("The model loads once the reply has finished: wait or Stop, "
                                              "then Load again", 8000)
            self.open_models()
            return
        self.open_model(path)

    def stop_downloads(self) -> None:
        """Quitting: a download in progress stops (the next one of the same file goes on from there)."""
        if self.models_dialog is not None:
            self.models_dialog.shutdown()

    def _on_load_failed(self, failure: Failure) -> None:
        self.host.set_state(self.host.idle_state())
        if not failure.cancelled:
            self.host.show_error("Could not load the model", failure.message, failure.details)

    def engine_busy(self) -> str:
        """Why no model can be opened now ("" when one can): the check behind File > Open model, the
        recent models and a dropped file alike."""
        if self.host.state is UiState.REPLYING:
            return "a reply is being written: stop it or let it finish"
        if self.host.state is UiState.LOADING:
            return "the engine is loading a model or re-reading a conversation: wait until it is done"
        if self.host.engine.pending():
            return "the engine is busy (saving a snapshot or compacting the context memory): wait a moment"
        return ""

    def drag_enter(self, event: QDragEnterEvent) -> None:
        """A file dragged over the window: taken when it is one model and the engine is free."""
        if _dropped_model(event) is not None and not self.engine_busy():
            event.acceptProposedAction()

    def drop(self, event: QDropEvent) -> None:
        """A dropped .gguf file opens, unless the engine is busy: then it is refused, and said why (a
        drag that entered while the engine was free can end after a reply began)."""
        path = _dropped_model(event)
        if path is None:
            return
        if busy := self.engine_busy():
            event.ignore()
            self.host.statusBar().showMessage(f"{path.name} was not opened: {busy}, then drop it again.",
                                              10_000)
            return
        event.acceptProposedAction()
        self.open_model(path)


def _dropped_model(event: QDragEnterEvent | QDropEvent) -> Path | None:
    urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
    paths = [Path(u.toLocalFile()) for u in urls if u.isLocalFile()]
    return paths[0] if len(paths) == 1 and paths[0].suffix.lower() == ".gguf" else None


def model_summary(info: ModelInfo) -> str:
    """One status-bar line, e.g. 'SmolLM2-135M-Instruct.Q4_1 · llama · 135M params · ctx 4096 · KV lazy';
    a chat format not from the model file is named at the end."""
    template = info.chat_template
    return (
        f"{info.name} · {info.architecture} · {_human_count(info.n_params)} params · "
        f"ctx {info.n_ctx} · KV {info.kv_mode} · {info.n_threads} threads"
    ) + (f" · {template.short}" if template is not None and not template.from_file else "")


def _human_count(n: int) -> str:
    for divisor, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= divisor:
            return f"{n / divisor:.3g}{suffix}"
    return str(n)

DEMO_NOTE = ("This is a small demo model: it shows the app working but cannot hold a useful conversation. "
             "Models… (Ctrl+M) finds the models already on this computer, or downloads one that fits.")
