"""The context-usage indicator next to the message box: tokens used / capacity and how they are stored.

The memory panel has the details; this is the one line a user glances at before a long paste.
"""

from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QSizePolicy, QWidget

from lazykv.core.engine.types import KvStatus
from lazykv.qt.kv_words import meter_line, rungs_sentence

FULL_WARNING = 0.9  # from this fill on the bar turns red


class ContextMeter(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bar = QProgressBar()
        self.bar.setTextVisible(False)
        self.bar.setFixedSize(90, 8)
        self.label = QLabel("no model")
        # the line grows with the ladder's rungs: it takes the room there is (the tooltip says it all)
        # instead of setting the window's minimum width
        self.label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.bar)
        layout.addWidget(self.label, 1)
        self.setObjectName("context-meter")

    def set_status(self, status: KvStatus | None) -> None:
        if status is None:
            self.bar.setValue(0)
            self.label.setText("no model")
            self.setToolTip("")
            return
        capacity = max(1, status.n_cells_total)
        used = min(status.n_cells_used, capacity)
        self.bar.setRange(0, capacity)
        self.bar.setValue(used)
        full = used / capacity >= FULL_WARNING
        self.bar.setStyleSheet("QProgressBar::chunk { background: #cf222e; }" if full else "")
        self.label.setText(meter_line(status))
        self.setToolTip(
            f"The conversation fills {used:,} of the {capacity:,} tokens the model can see at once "
            f"({100 * used / capacity:.0f} %). {rungs_sentence(status)}"
            " When it is full, the oldest messages are left out or the reply stops (Settings)."
        )
