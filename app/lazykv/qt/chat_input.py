"""The message editor: Enter sends, Shift+Enter starts a new line."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget

VISIBLE_LINES = 3  # the box's height when empty or short
MAX_LINES = 12  # it grows with the text up to this many lines, then scrolls


class ChatInput(QPlainTextEdit):
    submitted = Signal()
    escaped = Signal()  # Esc pressed while no reply streams (Stop takes Esc then)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setPlaceholderText("Type a message (Enter to send, Shift+Enter for a new line)")
        self.setTabChangesFocus(True)
        self.document().documentLayout().documentSizeChanged.connect(lambda _size: self._fit_height())
        self._fit_height()

    def _fit_height(self) -> None:
        """As many lines high as the text has (wrapped), from VISIBLE_LINES up to MAX_LINES."""
        margins = self.contentsMargins()
        frame = 2 * (self.frameWidth() + int(self.document().documentMargin()))
        lines = int(self.document().documentLayout().documentSize().height())  # in lines, for a plain text
        lines = max(VISIBLE_LINES, min(MAX_LINES, lines))
        extra = frame + margins.top() + margins.bottom()
        self.setFixedHeight(lines * self.fontMetrics().lineSpacing() + extra)

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
