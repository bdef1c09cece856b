"""Help > About: the app's version, the engine's, and the backend the engine was built for (CPU or GPU).

The engine's facts come from core (``engine_check``, ``devices``), asked once on the background thread:
the dialog opens at once and fills them in when they come.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6 import __version__ as PYSIDE_VERSION  # noqa: N812 - a constant
from PySide6.QtCore import Qt, qVersion
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLabel, QVBoxLayout, QWidget

from lazykv import __version__
from lazykv.qt.background import Background
from lazykv.qt.ui_state import APP_TITLE

ASKING = "asking the engine…"


@dataclass(frozen=True)
class EngineFacts:
    version: str  # e.g. 0.3.36+lazykv.1a2b3c4d5e, or why the engine cannot be used
    backend: str  # "CPU build" or "GPU build (CUDA)"


def engine_facts() -> EngineFacts:
    """The engine's version and its build (off the GUI thread: the first call may load the engine)."""
    from lazykv.core.engine.engine_check import EngineMissingError, check_engine

    try:
        version = check_engine().version
    except EngineMissingError as err:
        return EngineFacts(f"not usable: {err}", "unknown (the engine cannot be loaded)")
    from lazykv.core.engine.devices import gpu_build  # imports llama_cpp, vouched for by check_engine

    build = gpu_build()
    return EngineFacts(version, f"GPU build ({build})" if build else "CPU build")


class AboutDialog(QDialog):
    """Made once per window; the engine's facts are asked the first time it opens."""

    def __init__(self, background: Background, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"About {APP_TITLE}")
        self.setObjectName("about-dialog")
        self._background = background
        self._asked = False
        title = QLabel(f"<b>{APP_TITLE}</b>")
        title.setTextFormat(Qt.TextFormat.RichText)
        summary = QLabel("Local chat over a patched llama.cpp whose KV cache starts at 16-bit and compacts "
                         "itself when the context fills.")
        summary.setWordWrap(True)
        self.app_label = QLabel(__version__)
        self.engine_label = QLabel(ASKING)
        self.backend_label = QLabel(ASKING)
        self.qt_label = QLabel(f"Qt {qVersion()}, PySide6 {PYSIDE_VERSION}")
        form = QFormLayout()
        form.addRow("Version:", self.app_label)
        form.addRow("Engine:", self.engine_label)
        form.addRow("Backend:", self.backend_label)
        form.addRow("Toolkit:", self.qt_label)
        for label in (self.app_label, self.engine_label, self.backend_label, self.qt_label):
            label.setTextFormat(Qt.TextFormat.PlainText)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            label.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(title)
        layout.addWidget(summary)
        layout.addLayout(form)
        layout.addWidget(buttons)

    def open(self) -> None:
        super().open()
        if not self._asked:
            self._asked = True
            self._background.run(engine_facts, self.show_facts, self._show_failure,
                                 what="Reading the engine's version")

    def show_facts(self, facts: EngineFacts) -> None:
        self.engine_label.setText(facts.version)
        self.backend_label.setText(facts.backend)

    def _show_failure(self, err: Exception) -> None:
        self._asked = False  # asked again at the next opening
        self.engine_label.setText(f"could not be read: {err}")
        self.backend_label.setText("unknown")
