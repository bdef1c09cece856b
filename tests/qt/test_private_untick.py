"""Issue 45, defect 6: unticking Private with a private chat on screen asks first (Save it as a new chat /
Discard / Cancel) instead of throwing the chat away, and the keyboard focus goes back to the message box
whatever the answer, so a space typed next is text and never toggles Private (which ended chats)."""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from lazykv.qt.main_window import MainWindow
from tests.qt.conftest import FakeWindow
from tests.qt.helpers import WAIT_MS, chat, end_private, error_box, settle, stored


def click_private(w: MainWindow) -> None:
    """A mouse click on the Private box's tick, as a user unticks it (a click also gives it focus)."""
    box = w.conversations_panel.private_box
    QTest.mouseClick(box, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier,
                     QPoint(8, box.height() // 2))


def question(w: MainWindow) -> QMessageBox | None:
    """"End the private chat?", while it is shown."""
    return next((b for b in w.findChildren(QMessageBox, "end-private-box") if b.isVisible()), None)


def private_chat(qtbot: QtBot, w: MainWindow, text: str = "A private question") -> None:
    w.new_private_action.trigger()
    settle(qtbot, w)
    chat(qtbot, w, text)
    assert w.conversations.private and stored() == []


def test_unticking_asks_and_cancel_keeps_the_chat_private(qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window()
    private_chat(qtbot, w)
    click_private(w)
    qtbot.waitUntil(lambda: question(w) is not None, timeout=WAIT_MS)
    box = question(w)
    assert box is not None and "never saved" in box.text()
    assert [b.text() for b in box.buttons()].count("Discard") == 1
    # until it is answered nothing changed: still private, both controls ticked, the chat on screen
    assert w.conversations.private and w.conversations_panel.private_box.isChecked()
    assert w.private_action.isChecked() and len(w.conversation) == 2
    QTest.keyClick(box, Qt.Key.Key_Escape)  # Cancel
    qtbot.waitUntil(lambda: question(w) is None, timeout=WAIT_MS)
    settle(qtbot, w)
    assert w.conversations.private and w.conversations_panel.private_box.isChecked()
    assert [m["content"] for m in w.conversation.turns()] == ["A private question", "Fake reply text."]
    assert stored() == [] and error_box(w) is None
    assert w.focusWidget() is w.input
    QTest.keyClick(w.focusWidget(), Qt.Key.Key_Space)  # typed next: text, not a click on the box
    assert w.conversations.private and w.input.toPlainText() == " "


def test_save_stores_the_private_chat_as_a_new_conversation(qtbot: QtBot, fake_window: FakeWindow) -> None:
    """A saved chat goes on privately, then Private is unticked and Save chosen: the whole chat on screen
    becomes a new conversation (its transcript and its snapshot), the first one keeps its saved turns only,
    and the chat goes on saved as usual."""
    w = fake_window()
    chat(qtbot, w, "A saved question")
    first = w.conversations.current
    click_private(w)
    assert w.conversations.private and w.focusWidget() is w.input  # ticking hands the focus back too
    chat(qtbot, w, "A private question")
    click_private(w)
    with qtbot.waitSignal(w.conversations.snapshot_saved, timeout=WAIT_MS) as saved:
        end_private(qtbot, w, "save")
    settle(qtbot, w)
    whole = ["A saved question", "Fake reply text.", "A private question", "Fake reply text."]
    assert not w.conversations.private and not w.conversations_panel.private_box.isChecked()
    assert w.conversations.current not in (None, first) and saved.args[0] == w.conversations.current
    assert [m["content"] for m in w.conversation.turns()] == whole  # the chat on screen is kept
    assert contents() == [whole[:2], whole]  # both titled by their first question
    assert w.conversations_panel.selected_id() == w.conversations.current
    assert w.focusWidget() is w.input and error_box(w) is None
    chat(qtbot, w, "Saved as usual")
    assert contents() == [whole[:2], [*whole, "Saved as usual", "Fake reply text."]]


def contents() -> list[list[str]]:
    """Every saved conversation's message texts, shortest first."""
    return sorted(([m["content"] for m in messages] for _, messages in stored()), key=len)


def test_discard_drops_the_private_chat(qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window()
    private_chat(qtbot, w)
    click_private(w)
    end_private(qtbot, w, "discard")
    settle(qtbot, w)
    assert not w.conversations.private and len(w.conversation) == 0 and stored() == []
    assert "not saved" in w.statusBar().currentMessage()
    assert w.focusWidget() is w.input
    QTest.keyClick(w.focusWidget(), Qt.Key.Key_Space)
    assert not w.conversations.private and w.input.toPlainText() == " "


def test_unticking_without_private_turns_asks_nothing(qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window()
    chat(qtbot, w, "A saved question")
    click_private(w)
    click_private(w)
    assert not w.conversations.private and question(w) is None and w.focusWidget() is w.input
    chat(qtbot, w, "Still saved")
    assert [len(m) for _, m in stored()] == [4]
