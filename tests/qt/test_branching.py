"""Branch from here (issue 47) on the fake engine: a message's menu makes a linked branch of the chat on
screen, which opens at once from the parent's cache (nothing re-read) while the parent stays as it was;
the list shows it under its parent, search finds it, and deleting the parent keeps it."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMenu
from pytestqt.qtbot import QtBot

from lazykv.qt.conversations_panel import DEPTH_ROLE, SEARCH_DELAY_MS, SUMMARY_ROLE
from lazykv.qt.main_window import MainWindow
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import WAIT_MS, chat, settle, stored


def trigger(menu: QMenu, text: str) -> None:
    action = next(a for a in menu.actions() if a.text() == text)
    assert action.isEnabled()
    action.trigger()


def rows(w: MainWindow) -> list[tuple[str, int, str]]:
    """The list as shown: (title, depth, text) per row."""
    items = [w.conversations_panel.list.item(i) for i in range(w.conversations_panel.list.count())]
    return [(i.data(SUMMARY_ROLE).title, i.data(DEPTH_ROLE) or 0, i.text()) for i in items]


def two_exchanges(qtbot: QtBot, w: MainWindow) -> int:
    chat(qtbot, w, "Tell me about otters")
    chat(qtbot, w, "And beavers?")
    parent = w.conversations.current
    assert parent is not None and len(w.conversation) == 4
    return parent


def branch_at(qtbot: QtBot, w: MainWindow, index: int) -> None:
    with qtbot.waitSignal(w.conversations.snapshot_saved, timeout=WAIT_MS):
        trigger(w.transcript.message_menu(index), "Branch from here")
    settle(qtbot, w)


def test_branch_from_a_middle_message_opens_from_the_parents_cache_and_leaves_the_parent(
        qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession) -> None:
    w = fake_window(system_prompt="Be brief.")
    parent = two_exchanges(qtbot, w)
    before = stored(w)
    fake.calls.clear()
    branch_at(qtbot, w, 1)  # the first reply
    branch = w.conversations.current
    assert branch not in (None, parent)
    assert [m["content"] for m in w.conversation.turns()] == ["Tell me about otters", "Fake reply text."]
    assert w.conversation.system_prompt == "Be brief."
    assert "rebuild" not in fake.calls and "keep-prefix" in fake.calls  # the parent's cache, not re-read
    assert w.chat.resume_note.startswith("Branched from “Tell me about otters” at message 2")
    assert w.conversations_panel.selected_id() == branch
    assert dict(stored(w))["Tell me about otters (branch)"] == w.conversation.turns()
    assert [row for row in stored(w) if row[0] == "Tell me about otters"] == before  # parent unchanged
    # the tree: the branch right under its parent, indented, saying where it came from
    shown = rows(w)
    assert [(title, depth) for title, depth, _ in shown] == [("Tell me about otters", 0),
                                                            ("Tell me about otters (branch)", 1)]
    assert "↳ branched from “Tell me about otters” at message 2" in shown[1][2]
    # the branch goes on by itself; the parent still holds its four messages
    chat(qtbot, w, "What about seals?")
    assert len(w.conversation) == 4 and w.conversation.turns()[2]["content"] == "What about seals?"
    assert [row for row in stored(w) if row[0] == "Tell me about otters"] == before


def test_the_keys_branch_from_the_last_message_and_a_private_chat_says_why_not(
        qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window()
    parent = two_exchanges(qtbot, w)
    with qtbot.waitSignal(w.conversations.snapshot_saved, timeout=WAIT_MS):
        w.branch_action.trigger()
    settle(qtbot, w)
    assert w.conversations.current != parent and len(w.conversation) == 4
    w.new_private_action.trigger()
    settle(qtbot, w)
    chat(qtbot, w, "Secret")
    assert not w.branch_action.isEnabled()
    n = len(stored(w))
    w.branching.branch_from(0)
    settle(qtbot, w)
    assert "private chat is not saved" in w.statusBar().currentMessage() and len(stored(w)) == n


def test_search_finds_a_branch_and_deleting_the_parent_keeps_it(qtbot: QtBot,
                                                                fake_window: FakeWindow) -> None:
    w = fake_window()
    parent = two_exchanges(qtbot, w)
    branch_at(qtbot, w, 1)
    branch = w.conversations.current
    w.conversations_panel.search.setText("otters")
    qtbot.wait(SEARCH_DELAY_MS + 50)
    settle(qtbot, w)
    qtbot.waitUntil(lambda: len(rows(w)) == 2, timeout=WAIT_MS)
    assert any("↳ branched from" in text for _, _, text in rows(w))
    w.conversations_panel.search.setText("")
    qtbot.wait(SEARCH_DELAY_MS + 50)
    settle(qtbot, w)
    w.conversations.delete(parent)
    settle(qtbot, w)
    assert [(title, depth) for title, depth, _ in rows(w)] == [("Tell me about otters (branch)", 0)]
    assert "“Tell me about otters” (deleted) at message 2" in rows(w)[0][2]
    assert w.conversations.current == branch and len(w.conversation) == 2
    w.conversations.undo_delete()  # the parent back: the branch under it again
    settle(qtbot, w)
    qtbot.waitUntil(lambda: [d for _, d, _ in rows(w)] == [0, 1], timeout=WAIT_MS)
    assert "(deleted)" not in rows(w)[1][2]
    assert w.conversations_panel.list.item(1).data(Qt.ItemDataRole.UserRole) == branch
