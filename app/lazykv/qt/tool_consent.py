"""Asking before a tool runs: which server, which tool, what it says it does, the exact arguments.

The arguments are shown as plain text (pretty JSON in a read-only editor, never rich text), so what a
model put in them is what the user reads. Deny is the default button and Escape; the dialog is opened
with ``open()`` and answers once through ``decided`` (a ``Decision`` value).
"""

from __future__ import annotations

import json
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from lazykv.core.tools.consent import Decision
from lazykv.core.tools.mcp_hub import ToolSpec


def arguments_text(arguments: Any) -> str:
    """The arguments as the user reads them: indented JSON, its text unescaped."""
    try:
        return json.dumps(arguments, indent=2, ensure_ascii=False, sort_keys=False)
    except (TypeError, ValueError):
        return repr(arguments)


def _plain_label(text: str, name: str) -> QLabel:
    label = QLabel(text)
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    label.setObjectName(name)
    return label


class ToolConsentDialog(QDialog):
    """Allow once / Always allow this tool / Deny for one call; closing it is a Deny."""

    decided = Signal(str)

    def __init__(self, parent: QWidget | None, spec: ToolSpec, arguments: dict) -> None:
        super().__init__(parent)
        self.setObjectName("tool-consent")
        self.setWindowTitle("Run a tool?")
        self.spec = spec
        self._answered = False

        intro = _plain_label(f"The model asks to run the tool \u201c{spec.name}\u201d of the MCP server "
                             f"\u201c{spec.server}\u201d. It runs only if you allow it.",
                             "tool-consent-intro")
        form = QFormLayout()
        form.addRow("Server:", _plain_label(spec.server, "tool-consent-server"))
        form.addRow("Tool:", _plain_label(spec.name, "tool-consent-tool"))
        description = _plain_label(spec.description or "(none given)", "tool-consent-description")
        form.addRow("Description:", description)
        self.arguments = QPlainTextEdit(arguments_text(arguments))
        self.arguments.setObjectName("tool-consent-arguments")
        self.arguments.setReadOnly(True)
        self.arguments.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.arguments.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)

        buttons = QDialogButtonBox()
        self.allow_once = QPushButton("Allow once")
        self.always = QPushButton("Always allow this tool")
        self.deny = QPushButton("Deny")
        for button, decision, role in (
                (self.allow_once, Decision.ALLOW_ONCE, QDialogButtonBox.ButtonRole.AcceptRole),
                (self.always, Decision.ALWAYS, QDialogButtonBox.ButtonRole.AcceptRole),
                (self.deny, Decision.DENY, QDialogButtonBox.ButtonRole.RejectRole)):
            button.setAutoDefault(False)
            buttons.addButton(button, role)
            button.clicked.connect(lambda _=False, d=decision: self._answer(d))
        self.deny.setDefault(True)
        self.always.setToolTip("Run this tool without asking from now on; Settings > Tools can take it back.")

        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addLayout(form)
        layout.addWidget(QLabel("Arguments:"))
        layout.addWidget(self.arguments, 1)
        layout.addWidget(buttons)
        self.resize(520, 380)
        self.deny.setFocus()

    def reject(self) -> None:
        """Escape or the window's close button: Deny."""
        self._answer(Decision.DENY)

    def _answer(self, decision: Decision) -> None:
        if self._answered:
            return
        self._answered = True
        self.decided.emit(decision.value)
        if decision is Decision.DENY:
            super().reject()
        else:
            self.accept()
