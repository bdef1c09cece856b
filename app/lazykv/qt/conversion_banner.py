"""The non-modal indicator of a lazy-cache conversion: progress while it runs, its duration after."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QProgressBar, QWidget

from lazykv.core.engine import ConversionEvent

SHOW_DONE_MS = 2500  # the finished note stays this long (a conversion itself often takes < 100 ms)


class ConversionBanner(QFrame):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("conversion-banner")
        self.setStyleSheet(
            "#conversion-banner { background: #fff8c5; border: 1px solid #d4a72c; border-radius: 4px; }"
        )
        self.label = QLabel()
        self.bar = QProgressBar()
        self.bar.setRange(0, 100)
        self.bar.setMaximumWidth(220)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 4)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.bar)
        self._hide_timer = QTimer(self)
        self._hide_timer.setSingleShot(True)
        self._hide_timer.timeout.connect(self.hide)
        self.hide()

    def show_progress(self, text: str, fraction: float) -> None:
        """Any other long engine task (e.g. re-reading a conversation)."""
        self._hide_timer.stop()
        self.bar.show()
        self.bar.setValue(round(100 * fraction))
        self.label.setText(text)
        self.show()

    def show_note(self, text: str, ms: int = 2 * SHOW_DONE_MS) -> None:
        self.bar.hide()
        self.label.setText(text)
        self.show()
        self._hide_timer.start(ms)

    def on_event(self, event: ConversionEvent) -> None:
        self.bar.show()
        percent = round(100 * event.fraction)
        if event.stage == "end":
            self.bar.setValue(100)
            self.label.setText(
                f"Context memory compacted to 8-bit in {1000 * event.duration_s:.0f} ms "
                f"at token {event.n_cells}"
            )
            self._hide_timer.start(SHOW_DONE_MS)
        else:
            self._hide_timer.stop()
            self.bar.setValue(percent)
            self.label.setText(f"Compacting context memory to 8-bit… {percent}%")
        self.show()
