"""A one-line label that shortens its text with "…" to the width it is given (the whole text in its
tooltip): a status-bar text that never runs into the one beside it, nor widens the window; and the
window's status bar, whose messages are shortened the same way."""

from __future__ import annotations

from PySide6.QtCore import QRect, QSize, Qt, QTimer
from PySide6.QtGui import QPainter, QPaintEvent, QResizeEvent
from PySide6.QtWidgets import QLabel, QSizeGrip, QSizePolicy, QStatusBar, QStyle, QStyleOption, QWidget

MIN_CHARS = 12  # the narrowest it gets: about this many characters
NOTICE_SHARE = 4  # the status bar's notice takes at most this part of its width


class ElidedLabel(QLabel):
    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(text, parent)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self.setToolTip(text)

    def setText(self, text: str) -> None:  # noqa: N802 - Qt's name
        super().setText(text)
        self.setToolTip(text)

    def shown_text(self) -> str:
        """The text as drawn: elided to the label's width."""
        width = self.contentsRect().width()
        return self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, width)

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        hint = super().minimumSizeHint()
        return QSize(min(hint.width(), self.fontMetrics().averageCharWidth() * MIN_CHARS), hint.height())

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 - Qt's name
        painter = QPainter(self)
        painter.drawText(self.contentsRect(), int(self.alignment()), self.shown_text())


class StatusBar(QStatusBar):
    """The window's status bar: a message longer than its room is shortened with "…" (the whole of it
    in the tooltip) instead of cut off mid-word, and a notice of its own (``show_notice``, e.g. a
    snapshot saved) beside the messages, so that it never replaces one that is being read."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.notice = ElidedLabel()
        self.notice.setObjectName("status-notice")
        self.notice.hide()
        self.addPermanentWidget(self.notice)  # the first permanent widget: next to the messages
        self._notice_timer = QTimer(self)
        self._notice_timer.setSingleShot(True)
        self._notice_timer.timeout.connect(self.notice.hide)
        self.messageChanged.connect(self.setToolTip)

    def show_notice(self, text: str, ms: int) -> None:
        """``text`` beside the messages for ``ms`` milliseconds."""
        self.notice.setText(text)
        self.notice.show()
        self._notice_timer.start(ms)

    def message_rect(self) -> QRect:
        """Where the message is drawn: as QStatusBar's own, up to the first permanent widget shown (the
        other widgets are hidden while a message is) and the size grip."""
        right = min([self.width() - 12, *(w.x() - 2 for w in self._shown_widgets()),
                     *(g.x() for g in self.findChildren(QSizeGrip) if g.isVisible())])
        return QRect(6, 0, max(0, right - 6), self.height())

    def shown_message(self) -> str:
        """The message as drawn: shortened with "…" to its room."""
        text = " ".join(self.currentMessage().splitlines())
        return self.fontMetrics().elidedText(text, Qt.TextElideMode.ElideRight, self.message_rect().width())

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt's name
        self.notice.setMaximumWidth(max(self.notice.minimumSizeHint().width(), self.width() // NOTICE_SHARE))
        super().resizeEvent(event)

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 - Qt's name
        """As QStatusBar's own (the panel, the frames of the widgets shown), but the message shortened."""
        if not self.currentMessage():
            super().paintEvent(event)
            return
        painter = QPainter(self)
        style = self.style()
        option = QStyleOption()
        option.initFrom(self)
        style.drawPrimitive(QStyle.PrimitiveElement.PE_PanelStatusBar, option, painter, self)
        for widget in self._shown_widgets():
            frame = QStyleOption()
            frame.rect = widget.geometry().adjusted(-2, -1, 2, 1)
            frame.palette = self.palette()
            frame.state = QStyle.StateFlag.State_None
            style.drawPrimitive(QStyle.PrimitiveElement.PE_FrameStatusBarItem, frame, painter, widget)
        painter.setPen(self.palette().windowText().color())
        flags = Qt.AlignmentFlag.AlignLeading | Qt.AlignmentFlag.AlignVCenter | Qt.TextFlag.TextSingleLine
        painter.drawText(self.message_rect(), int(flags), self.shown_message())

    def _shown_widgets(self) -> list[QWidget]:
        """The widgets shown beside a message: the permanent ones (Qt hides the others meanwhile)."""
        return [child for child in self.children() if isinstance(child, QWidget) and child.isVisible()
                and not child.isWindow() and not isinstance(child, QSizeGrip)]
