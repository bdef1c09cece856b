"""The transcript: one framed block per message, the reply growing as it streams, markers inline.

Right-click a message to copy it, edit and resend a message of yours, or regenerate the
last reply; the view only asks (signals), the window decides.
"""

from __future__ import annotations

from collections.abc import Iterable

from PySide6.QtCore import QPoint, Signal, Slot
from PySide6.QtGui import (
    QColor,
    QContextMenuEvent,
    QFont,
    QGuiApplication,
    QTextCharFormat,
    QTextCursor,
    QTextFrame,
    QTextFrameFormat,
)
from PySide6.QtWidgets import QMenu, QTextBrowser, QWidget

from lazykv.core.conversation import Marker

ROLE_LABELS = {"user": "You", "assistant": "Assistant", "system": "System"}
# fixed colours, readable on either a light or a dark system palette
_BACKGROUNDS = {"user": "#e3edfd", "assistant": "#f3f4f6", "system": "#fff7e0"}
_TEXT = QColor("#1f2328")
_MUTED = QColor("#6b7280")
_MARKER = QColor("#9a6700")


class TranscriptView(QTextBrowser):
    edit_requested = Signal(int)  # index of a user turn
    regenerate_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.document().setDocumentMargin(10)
        self.setStyleSheet("QTextBrowser { background: white; }")
        self.setOpenExternalLinks(True)
        self._frames: list[QTextFrame] = []
        self._texts: list[str] = []
        self._roles: list[str] = []
        self._reply: QTextCursor | None = None
        self.actions_enabled = True

    def add_message(self, role: str, text: str, markers: Iterable[Marker] = ()) -> None:
        cursor = self._new_message(role)
        index = len(self._frames) - 1
        done = 0
        for marker in sorted(markers, key=lambda m: m.offset):
            self._insert_text(cursor, text[done:marker.offset])
            self._insert_marker(cursor, marker.label)
            done = marker.offset
        self._insert_text(cursor, text[done:])
        self._texts[index] = text

    def show_messages(self, messages: Iterable[dict[str, str]], markers: Iterable[Marker] = ()) -> None:
        """Replace the whole transcript, e.g. after a turn was taken back or edited."""
        self.clear()
        self._frames, self._texts, self._roles = [], [], []
        self._reply = None
        markers = list(markers)
        for i, message in enumerate(messages):
            mine = [m for m in markers if m.message_index == i]
            self.add_message(message["role"], message["content"], mine)

    def message_count(self) -> int:
        return len(self._frames)

    def begin_reply(self) -> None:
        self._reply = self._new_message("assistant")

    @Slot(str)
    def append_to_reply(self, piece: str) -> None:
        if self._reply is not None:
            self._insert_text(self._reply, piece)
            self._texts[-1] += piece

    def mark_here(self, label: str) -> None:
        """A marker at the end of the reply being streamed, else after the last message."""
        cursor = self._reply
        if cursor is None and self._frames:
            cursor = self._frames[-1].lastCursorPosition()
        if cursor is not None:
            self._insert_marker(cursor, label)

    def end_reply(self, note: str | None = None) -> None:
        """Close the streaming reply, with ``note`` (e.g. "stopped") shown under it."""
        if self._reply is not None and note:
            fmt = _char_format(_MUTED, italic=True, point_size_delta=-1)
            if self._reply.block().length() > 1:
                self._reply.insertBlock()
            self._insert_text(self._reply, note, fmt)
        self._reply = None

    def message_at(self, pos: QPoint) -> int | None:
        """Index of the message under a viewport position."""
        frame = self.cursorForPosition(pos).currentFrame()
        while frame is not None:
            for i, f in enumerate(self._frames):
                if f == frame:
                    return i
            frame = frame.parentFrame()
        return None

    def message_menu(self, index: int) -> QMenu:
        """The actions for one message (also used by tests and keyboard users)."""
        menu = QMenu(self)
        copy = menu.addAction("Copy message")
        copy.triggered.connect(lambda: QGuiApplication.clipboard().setText(self._texts[index]))
        role = self._roles[index]
        if role == "user":
            edit = menu.addAction("Edit and resend…")
            edit.setEnabled(self.actions_enabled)
            edit.triggered.connect(lambda: self.edit_requested.emit(index))
        if role == "assistant" and index == len(self._frames) - 1:
            regen = menu.addAction("Regenerate")
            regen.setEnabled(self.actions_enabled)
            regen.triggered.connect(self.regenerate_requested.emit)
        return menu

    def message_text(self, index: int) -> str:
        return self._texts[index]

    def contextMenuEvent(self, event: QContextMenuEvent) -> None:
        index = self.message_at(event.pos())
        if index is None:
            super().contextMenuEvent(event)
            return
        menu = self.message_menu(index)
        menu.addSeparator()
        menu.addActions(self.createStandardContextMenu().actions())
        menu.exec(event.globalPos())

    def _new_message(self, role: str) -> QTextCursor:
        """Append a frame for a message under its role label; return a cursor inside it."""
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        frame_format = QTextFrameFormat()
        frame_format.setBackground(QColor(_BACKGROUNDS.get(role, "#ffffff")))
        frame_format.setPadding(8)
        frame_format.setBorder(0)
        frame_format.setBottomMargin(6)
        frame = cursor.insertFrame(frame_format)
        self._frames.append(frame)
        self._texts.append("")
        self._roles.append(role)
        cursor.insertText(ROLE_LABELS.get(role, role), _char_format(_MUTED, bold=True, point_size_delta=-1))
        cursor.insertBlock()
        cursor.setCharFormat(_char_format(_TEXT))
        return cursor

    def _insert_marker(self, cursor: QTextCursor, label: str) -> None:
        fmt = _char_format(_MARKER, italic=True, point_size_delta=-1)
        fmt.setBackground(QColor("#fff8c5"))
        self._insert_text(cursor, f" ⟨{label}⟩ ", fmt)

    def _insert_text(self, cursor: QTextCursor, text: str, fmt: QTextCharFormat | None = None) -> None:
        if not text:
            return
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
