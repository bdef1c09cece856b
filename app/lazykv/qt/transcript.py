"""The transcript: one framed block per message, the assistant's reply growing as it streams."""

from __future__ import annotations

from collections.abc import Iterable

from PySide6.QtCore import Slot
from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextCursor, QTextFrameFormat
from PySide6.QtWidgets import QTextBrowser, QWidget

ROLE_LABELS = {"user": "You", "assistant": "Assistant", "system": "System"}
# fixed colours, readable on either a light or a dark system palette
_BACKGROUNDS = {"user": "#e3edfd", "assistant": "#f3f4f6", "system": "#fff7e0"}
_TEXT = QColor("#1f2328")
_MUTED = QColor("#6b7280")


class TranscriptView(QTextBrowser):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.document().setDocumentMargin(10)
        self.setStyleSheet("QTextBrowser { background: white; }")
        self._reply: QTextCursor | None = None

    def add_message(self, role: str, text: str) -> None:
        self._insert_text(self._new_message(role), text)

    def show_messages(self, messages: Iterable[dict[str, str]]) -> None:
        """Replace the whole transcript, e.g. after a failed turn was taken back."""
        self.clear()
        self._reply = None
        for message in messages:
            self.add_message(message["role"], message["content"])

    def begin_reply(self) -> None:
        self._reply = self._new_message("assistant")

    @Slot(str)
    def append_to_reply(self, piece: str) -> None:
        if self._reply is not None:
            self._insert_text(self._reply, piece)

    def end_reply(self, note: str | None = None) -> None:
        """Close the streaming reply, with ``note`` (e.g. "stopped") shown under it."""
        if self._reply is not None and note:
            fmt = _char_format(_MUTED, italic=True, point_size_delta=-1)
            if self._reply.block().length() > 1:
                self._reply.insertBlock()
            self._insert_text(self._reply, note, fmt)
        self._reply = None

    def _new_message(self, role: str) -> QTextCursor:
        """Append a frame for a message under its role label; return a cursor inside it."""
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        frame = QTextFrameFormat()
        frame.setBackground(QColor(_BACKGROUNDS.get(role, "#ffffff")))
        frame.setPadding(8)
        frame.setBorder(0)
        cursor.insertFrame(frame)
        cursor.insertText(ROLE_LABELS.get(role, role), _char_format(_MUTED, bold=True, point_size_delta=-1))
        cursor.insertBlock()
        cursor.setCharFormat(_char_format(_TEXT))
        return cursor

    def _insert_text(self, cursor: QTextCursor, text: str, fmt: QTextCharFormat | None = None) -> None:
        bar = self.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        cursor.insertText(text, fmt or _char_format(_TEXT))
        if at_bottom:
            bar.setValue(bar.maximum())


def _char_format(
    color: QColor, *, bold: bool = False, italic: bool = False, point_size_delta: int = 0
) -> QTextCharFormat:
    fmt = QTextCharFormat()
    fmt.setForeground(color)
    fmt.setFontWeight(QFont.Weight.Bold if bold else QFont.Weight.Normal)
    fmt.setFontItalic(italic)
    if point_size_delta:
        fmt.setFontPointSize(QFont().pointSizeF() + point_size_delta)
    return fmt
