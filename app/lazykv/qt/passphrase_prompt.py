"""The passphrase question: a window-modal text prompt that stays open while its answer is checked off the
GUI thread and says in itself why an answer was refused (a line in the error colour, focus back in the
field with the refused text selected, so typing replaces it). No second window comes up for a wrong
passphrase: the one message is in the prompt, before the retry (issue 45, defect 2)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QBoxLayout, QDialog, QDialogButtonBox, QInputDialog, QLabel, QLineEdit, QWidget

from lazykv.core.engine.memory import Fit
from lazykv.qt.memory_panel import FIT_COLORS

FIELD_MIN_WIDTH = 400  # px: the field of a text question (rename, passphrase)
ERROR_COLOUR = FIT_COLORS[Fit.RED]  # as the Settings page says what is wrong under an editor
CHECKING = "Checking the passphrase…"


class PromptState:
    """Whether a prompt has closed, kept apart from the widget (deleted on close) for the answers of a
    check that come after it: a prompt cancelled while its check ran takes no answer."""

    closed = False


class PassphrasePrompt(QInputDialog):
    """A passphrase field, its question, and a line under it for what went wrong. OK does not close it:
    ``submitted`` gives the text to check, and the checker answers with ``refuse(message)`` (the prompt
    stays, the message shown) or ``finish()`` (it closes). Cancel closes it at once (``rejected``)."""

    submitted = Signal(str)

    def __init__(self, parent: QWidget, name: str, title: str, label: str) -> None:
        super().__init__(parent)
        self.setObjectName(name)
        self.setWindowTitle(title)
        self.setLabelText(label)
        self.setTextEchoMode(QLineEdit.EchoMode.Password)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.state = PromptState()
        self.checking = False
        self.message = QLabel(self)
        self.message.setObjectName("passphrase-message")
        self.message.setWordWrap(True)
        self.message.setTextFormat(Qt.TextFormat.PlainText)
        self.message.hide()

    def open(self) -> None:
        super().open()  # QInputDialog lays itself out when first shown: the message goes above its buttons
        layout, buttons = self.layout(), self.findChild(QDialogButtonBox)
        if isinstance(layout, QBoxLayout) and buttons is not None and layout.indexOf(self.message) < 0:
            layout.insertWidget(layout.indexOf(buttons), self.message)
        self.field().setMinimumWidth(FIELD_MIN_WIDTH)

    def field(self) -> QLineEdit:
        field = self.findChild(QLineEdit)
        assert field is not None  # made by setTextEchoMode
        return field

    def ok_button(self) -> QWidget | None:
        buttons = self.findChild(QDialogButtonBox)
        return buttons.button(QDialogButtonBox.StandardButton.Ok) if buttons is not None else None

    def done(self, result: int) -> None:
        """OK (or Enter) hands the text to its checker and keeps the prompt open; Cancel, Esc or the
        title bar's close button close it."""
        if result != QDialog.DialogCode.Accepted.value:
            self.state.closed = True
            super().done(result)
            return
        if self.checking:
            return
        self._checking(True)
        self._say(CHECKING, error=False)
        self.submitted.emit(self.textValue())

    def refuse(self, message: str) -> None:
        """The answer was not accepted: say why here, and ask again with the field's text selected."""
        if self.state.closed:
            return
        self._checking(False)
        self._say(message, error=True)
        field = self.field()
        field.setFocus(Qt.FocusReason.OtherFocusReason)
        field.selectAll()

    def finish(self) -> None:
        """The answer was taken: the prompt closes."""
        if self.state.closed:
            return
        self.state.closed = True
        self._checking(False)
        super().done(QDialog.DialogCode.Accepted.value)

    def _checking(self, on: bool) -> None:
        self.checking = on
        self.field().setReadOnly(on)
        ok = self.ok_button()
        if ok is not None:
            ok.setEnabled(not on)

    def _say(self, text: str, error: bool) -> None:
        self.message.setStyleSheet(f"color: {ERROR_COLOUR}" if error else "")
        self.message.setText(text)
        self.message.setVisible(bool(text))
