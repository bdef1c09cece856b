"""Model loading, for the window: open a model (chooser, recent, drop), its memory estimate, and
what the window shows once the engine has loaded it or could not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import (
    QFileDialog,
)

from lazykv.core.engine import devices, planner
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.model_load import read_checked_meta
from lazykv.core.engine.remote import UNREACHABLE_DETAILS, unreachable_text
from lazykv.core.engine.types import ModelInfo
from lazykv.core.models.defaults import models_folder
from lazykv.core.settings import load_spec
from lazykv.qt.model_info_dialog import ModelInfoDialog
from lazykv.qt.models_dialog import ModelsDialog
from lazykv.qt.ui_state import UiState
from lazykv.qt.worker import (
    Failure,
    LoadModel,
)


class ModelLoading:
    """The model-loading part of ``MainWindow`` (mixed into it: it uses the window's widgets, engine
    client and settings)."""

    def open_model(self, path: Path) -> None:
        """Load ``path`` in the background; the current model, if any, stays until it has loaded."""
        self._set_state(UiState.LOADING)
        self.statusBar().showMessage(f"Loading {path.name}…")
        spec = load_spec({**self.settings.values(), **self._overrides}, path)
        self._show_estimate(spec)
        self.engine.submit(LoadModel(spec), self._on_model_loaded, self._on_load_failed)

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

    def _choose_model(self) -> None:
        start = self.model_info.path.parent if self.model_info else models_folder()
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

    def _show_model_info(self) -> None:
        if self.model_info is not None:
            info = self.model_info
            dialog = ModelInfoDialog(info.meta, self, info.plan, info.plan_note, info.chat_template)
            dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
            dialog.open()

    def _show_estimate(self, spec: LoadSpec) -> None:
        """The memory estimate of a model about to load (its header is read off the GUI thread)."""
        path = spec.model
        title = f"{path.name}, KV {spec.kv_mode}"

        def done(found: tuple[Any, tuple[planner.Device, ...]]) -> None:
            meta, gpus = found
            plan = spec.context(meta)
            self.memory_panel.set_estimate(f"{path.name}, ctx {plan.n_ctx}, KV {spec.kv_mode}",
                                           spec.estimate(meta, gpus), plan=plan)

        def read() -> tuple[Any, tuple[planner.Device, ...]]:
            return read_checked_meta(path), tuple(devices.local_gpus())

        self.background.run(read, done,
                            lambda err: self.memory_panel.set_estimate(title, None, str(err)),
                            "Reading the model's header")

    def _on_model_loaded(self, info: ModelInfo) -> None:
        first = self.model_info is None
        if not first and len(self.conversation):  # a reload: the cache is empty now
            label = (f"Context memory emptied here: {info.name} loaded with the {info.kv_mode.words} "
                     "cache; the next reply reads the conversation again")
            self._add_marker(label)
            self.transcript.mark_here(label)
        self.model_info = info
        self.model_label.setText(model_summary(info))
        self.memory_panel.set_model(info)
        self._show_unreachable(info)
        self._show_demo_note(info)
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

    def _show_demo_note(self, info: ModelInfo) -> None:
        """The demo model cannot hold a useful conversation: say so, and where a real one is found."""
        if self.default_model is not None and Path(info.path) == self.default_model:
            self.demo_notice.show_choices(DEMO_NOTE, [("Models…", self.open_models)])
        else:
            self.demo_notice.hide()

    def open_models(self) -> None:
        """File > Models…: one page for the window's life, so a download goes on while it is closed."""
        if self._models_dialog is None:
            self._models_dialog = ModelsDialog(self.settings, self)
            self._models_dialog.model_chosen.connect(self._load_chosen_model)
        self._models_dialog.show()
        self._models_dialog.raise_()
        self._models_dialog.activateWindow()

    def _load_chosen_model(self, path: Path) -> None:
        """The Models page's Load: through the same path as File > Open, once the engine is free."""
        if self._state not in (UiState.NO_MODEL, UiState.READY) or self.engine.pending():
            self.statusBar().showMessage("The model loads once the reply has finished: wait or Stop, then "
                                         "Load again", 8000)
            self.open_models()
            return
        self.open_model(path)

    def stop_downloads(self) -> None:
        """Quitting: a download in progress stops (the next one of the same file goes on from there)."""
        if self._models_dialog is not None:
            self._models_dialog.shutdown()

    def _on_load_failed(self, failure: Failure) -> None:
        self._set_state(self._idle_state())
        if not failure.cancelled:
            self.show_error("Could not load the model", failure.message, failure.details)

    def engine_busy(self) -> str:
        """Why no model can be opened now ("" when one can): the check behind File > Open model, the
        recent models and a dropped file alike."""
        if self._state is UiState.REPLYING:
            return "a reply is being written: stop it or let it finish"
        if self._state is UiState.LOADING:
            return "the engine is loading a model or re-reading a conversation: wait until it is done"
        if self.engine.pending():
            return "the engine is busy (saving a snapshot or compacting the context memory): wait a moment"
        return ""

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if _dropped_model(event) is not None and not self.engine_busy():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        """A dropped .gguf file opens, unless the engine is busy: then it is refused, and said why (a
        drag that entered while the engine was free can end after a reply began)."""
        path = _dropped_model(event)
        if path is None:
            return
        if busy := self.engine_busy():
            event.ignore()
            self.statusBar().showMessage(f"{path.name} was not opened: {busy}, then drop it again.", 10_000)
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
