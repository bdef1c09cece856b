"""The message editor: Enter sends, Shift+Enter starts a new line."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget

VISIBLE_LINES = 3


class ChatInput(QPlainTextEdit):
    submitted = Signal()
    escaped = Signal()  # Esc pressed while no reply streams (Stop takes Esc then)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setPlaceholderText("Type a message (Enter to send, Shift+Enter for a new line)")
        self.setTabChangesFocus(True)
        margins = self.contentsMargins()
        frame = 2 * (self.frameWidth() + int(self.document().documentMargin()))
        self.setFixedHeight(
            VISIBLE_LINES * self.fontMetrics().lineSpacing() + frame + margins.top() + margins.bottom()
        )

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() == Qt.Key.Key_Escape:
            self.escaped.emit()
            event.accept()
            return
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            if event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
                # a plain newline: QPlainTextEdit would insert U+2028 for Shift+Enter
                self.insertPlainText("\n")
            else:
                self.submitted.emit()
            event.accept()
            return
        super().keyPressEvent(event)
