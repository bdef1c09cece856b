"""The consent dialog: each button answers its decision once; the arguments are plain text."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel
from pytestqt.qtbot import QtBot

from lazykv.core.tools.consent import Decision
from lazykv.core.tools.mcp_hub import ToolSpec
from lazykv.qt.tool_consent import ToolConsentDialog

SPEC = ToolSpec("files", "write_file", "Write a file.", {"type": "object"})


def _dialog(qtbot: QtBot, arguments: dict) -> tuple[ToolConsentDialog, list[str]]:
    dialog = ToolConsentDialog(None, SPEC, arguments)
    qtbot.addWidget(dialog)
    decisions: list[str] = []
    dialog.decided.connect(decisions.append)
    dialog.open()
    qtbot.waitExposed(dialog)
    return dialog, decisions


@pytest.mark.parametrize(("button", "decision"), [
    ("allow_once", Decision.ALLOW_ONCE), ("always", Decision.ALWAYS), ("deny", Decision.DENY)])
def test_buttons_emit_their_decision_once(qtbot: QtBot, button: str, decision: Decision) -> None:
    dialog, decisions = _dialog(qtbot, {"path": "/tmp/x"})
    getattr(dialog, button).click()
    dialog.deny.click()  # a second answer is ignored
    assert decisions == [decision.value]
    assert not dialog.isVisible()


def test_escape_denies_and_deny_is_the_default(qtbot: QtBot) -> None:
    dialog, decisions = _dialog(qtbot, {})
    assert dialog.deny.isDefault() and not dialog.allow_once.isDefault() and not dialog.always.isDefault()
    qtbot.keyClick(dialog, Qt.Key.Key_Escape)
    assert decisions == [Decision.DENY.value]


def test_arguments_and_names_are_plain_text(qtbot: QtBot) -> None:
    html = "<b>bold</b><img src='file:///etc/passwd'>"
    dialog, _ = _dialog(qtbot, {"content": html, "note": "caf\u00e9"})
    text = dialog.arguments.toPlainText()
    assert html in text and "caf\u00e9" in text and '"content"' in text
    assert dialog.arguments.isReadOnly()
    labels = [dialog.findChild(QLabel, n) for n in ("tool-consent-server", "tool-consent-tool",
                                                     "tool-consent-description", "tool-consent-intro")]
    assert all(label.textFormat() == Qt.TextFormat.PlainText for label in labels)
    assert labels[0].text() == "files" and labels[1].text() == "write_file"
