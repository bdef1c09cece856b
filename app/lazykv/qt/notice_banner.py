"""A non-modal notice: a plain sentence with choices as buttons instead of a modal question (the
chat goes on meanwhile), and the look the window's banners share: colours from the theme
(``theme.banner_colours``), followed when it changes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtCore import QEvent, QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from lazykv.qt.theme import BannerColours, banner_colours


class Banner(QFrame):
    """A strip across the chat in the theme's banner colours (light or dark, as the window is)."""

    def __init__(self, name: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName(name)
        self._colours: BannerColours | None = None
        self._restyle()

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._restyle()

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        """As tall as its wrapped sentence at its width: a window's minimum size leaves out a height
        that depends on the width, and a banner shown in a small window would cover the chat."""
        hint = super().minimumSizeHint()
        if self.isVisible() and self.width() > 0 and self.hasHeightForWidth():
            hint.setHeight(max(hint.height(), self.heightForWidth(self.width())))
        return hint

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self.updateGeometry()  # its minimum height changed with its width

    def _restyle(self) -> None:
        # the application's palette: the theme's (the frame's own is coloured by its style sheet)
        colours = banner_colours(QApplication.palette())
        if colours == self._colours:
            return
        self._colours = colours
        name = self.objectName()
        self.setStyleSheet(
            f"#{name} {{ background: {colours.background}; border: 1px solid {colours.border}; "
            f"border-radius: 4px; }}"
            f"#{name} QLabel {{ color: {colours.text}; }}"
        )


def wrap_without_widening(label: QLabel) -> None:
    """A label for notes of any length: wraps at the window's width instead of asking for more."""
    label.setWordWrap(True)
    label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
    label.setMinimumWidth(0)


Choice = tuple[str, Callable[[], None]]  # a button's text, what it does


class NoticeBanner(Banner):
    """A plain sentence with choices as buttons, instead of a modal question: nothing waits for it.

    A choice hides the banner, then runs; "Details" shows the technical text under the sentence;
    "Dismiss" hides it and chooses nothing."""

    def __init__(self, name: str, parent: QWidget | None = None) -> None:
        super().__init__(name, parent)
        self.label = QLabel()
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.details = QLabel()
        self.details.setTextFormat(Qt.TextFormat.PlainText)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        wrap_without_widening(self.label)
        wrap_without_widening(self.details)
        self.details_button = QPushButton("Details")
        self.details_button.setCheckable(True)
        self.details_button.toggled.connect(self.details.setVisible)
        dismiss = QPushButton("Dismiss")
        dismiss.clicked.connect(self.hide)
        self._buttons = QHBoxLayout()
        self._buttons.addStretch()
        row = QHBoxLayout()
        row.addLayout(self._buttons)
        row.addWidget(self.details_button)
        row.addWidget(dismiss)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 4)
        layout.addWidget(self.label)
        layout.addWidget(self.details)
        layout.addLayout(row)
        self.hide()

    def show_choices(self, text: str, choices: Sequence[Choice], details: str = "") -> None:
        while self._buttons.count() > 1:  # the stretch stays
            item = self._buttons.takeAt(1)
            if item.widget() is not None:
                item.widget().deleteLater()
        for label, action in choices:
            button = QPushButton(label)
            button.clicked.connect(lambda _=False, run=action: self._choose(run))
            self._buttons.addWidget(button)
        self.label.setText(text)
        self.details.setText(details)
        self.details_button.setChecked(False)
        self.details_button.setVisible(bool(details))
        self.details.hide()
        self.show()

    def choices(self) -> list[QPushButton]:
        return [self._buttons.itemAt(i).widget() for i in range(1, self._buttons.count())]

    def _choose(self, action: Callable[[], None]) -> None:
        self.hide()
        action()
