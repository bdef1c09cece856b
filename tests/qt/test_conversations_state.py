"""Saved conversations on the fake engine: one owner per piece of state, and issue 17's GUI races."""

from __future__ import annotations

import threading

from pytestqt.qtbot import QtBot

from lazykv.core.history.records import ConversationSummary
from lazykv.qt.conversations_panel import ConversationsPanel
from lazykv.qt.main_window import UiState
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import (
    WAIT_MS,
    chat,
    end_private,
    error_box,
    held,
    reopening_held,
    saved_then_new_chat,
    settle,
    stored,
)


def block_the_database(w: object) -> threading.Event:
    """Hold the window's database thread (as a slow disk or another writer would) until set."""
    gate = threading.Event()
    w.background.run(lambda: gate.wait(5), what="A slow disk")  # type: ignore[attr-defined]
    return gate


def test_a_slow_first_write_never_duplicates_the_conversation(qtbot: QtBot, fake_window: FakeWindow) -> None:
    """Issue 17.2: the user's turn and the reply are both saved while the first write still waits."""
    w = fake_window()
    gate = block_the_database(w)
    with qtbot.waitSignal(w.reply_finished, timeout=WAIT_MS):
        w.chat.send_text("First message")
    gate.set()
    settle(qtbot, w)
    [(title, messages)] = stored()
    assert title == "First message" and len(messages) == 2
    assert w.conversations_panel.ids() == [w.conversations.current]


def test_deleting_a_conversation_while_it_opens_leaves_nothing_on_screen(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    """Issue 17.4: delete while its transcript is re-read; then a new chat saves without an error."""
    w = fake_window()
    old = reopening_held(qtbot, w, fake, "Old conversation " + "long " * 20)
    assert w.state is UiState.LOADING and "Old conversation" in w.transcript.toPlainText()
    w.conversations.delete(old)
    assert w.transcript.toPlainText().strip() == "" and w.conversations.current is None
    fake.release()
    settle(qtbot, w)
    assert w.state is UiState.READY and error_box(w) is None
    assert old not in w.conversations_panel.ids()
    chat(qtbot, w, "A new one")
    assert error_box(w) is None
    assert [title for title, _ in stored()] == ["A new one"]


def test_a_conversation_deleted_before_it_was_read_is_not_shown(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    w = fake_window()
    old = saved_then_new_chat(qtbot, w, "Soon gone")
    gate = block_the_database(w)
    w.conversations.open(old)
    w.conversations.delete(old)
    gate.set()
    settle(qtbot, w)
    assert w.conversations.current is None and "Soon gone" not in w.transcript.toPlainText()
    assert error_box(w) is None


def test_turning_private_off_saves_from_that_point_only(qtbot: QtBot, fake_window: FakeWindow) -> None:
    """Issue 17.11: the turns typed while private are never written, not even by a later save. Issue 30:
    unticking ends the private chat, so the screen shows what is saved (and what the model sees)."""
    w = fake_window()
    w.private_action.setChecked(True)
    chat(qtbot, w, "A secret")
    assert stored() == []
    w.private_action.setChecked(False)
    end_private(qtbot, w, "discard")  # asked first (issue 45.6)
    chat(qtbot, w, "Public from here")
    [(title, messages)] = stored()
    assert title == "Public from here"
    assert [m["content"] for m in messages] == ["Public from here", "Fake reply text."]
    assert [m["content"] for m in w.conversation.turns()] == ["Public from here", "Fake reply text."]


def test_private_mode_saves_nothing_and_its_two_controls_agree(qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window()
    w.conversations_panel.private_box.setChecked(True)
    assert w.private_action.isChecked() and w.conversations.private and "private" in w.windowTitle()
    chat(qtbot, w, "Nothing saved")
    assert stored() == [] and w.conversations_panel.list.count() == 0
    w.private_action.setChecked(False)
    end_private(qtbot, w, "discard")  # asked first (issue 45.6)
    assert not w.conversations_panel.private_box.isChecked() and "private" not in w.windowTitle()


def test_a_turn_updates_its_row_in_place_and_keeps_the_list(qtbot: QtBot, fake_window: FakeWindow) -> None:
    """No rebuild of the list per save: the other rows are the same items, the scroll position stays."""
    w = fake_window()
    for i in range(30):
        w.chat.new_chat()
        chat(qtbot, w, f"Conversation {i}")
    panel = w.conversations_panel
    assert panel.list.count() == 30
    panel.list.scrollToBottom()
    scrolled = panel.list.verticalScrollBar().value()
    assert scrolled > 0
    others = [panel.list.item(i) for i in range(1, 30)]
    chat(qtbot, w, "One more turn")
    assert [panel.list.item(i) for i in range(1, 30)] == others
    assert panel.list.verticalScrollBar().value() == scrolled
    assert "4 messages" in panel.list.item(0).text()


def test_search_rename_delete_and_undo(qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window()
    chat(qtbot, w, "Tell me about giraffes.")
    giraffes = w.conversations.current
    w.chat.new_chat()
    chat(qtbot, w, "Tell me about volcanoes.")
    panel = w.conversations_panel
    assert [panel.list.item(i).text().split("\n")[0] for i in range(2)] == [
        "Tell me about volcanoes.", "Tell me about giraffes."]
    w.conversations.refresh("giraff")
    qtbot.waitUntil(lambda: panel.ids() == [giraffes], timeout=WAIT_MS)
    w.conversations.refresh("")
    qtbot.waitUntil(lambda: len(panel.ids()) == 2, timeout=WAIT_MS)
    w.conversations.rename(giraffes, "Tall animals")
    qtbot.waitUntil(lambda: any("Tall animals" in panel.list.item(i).text() for i in range(2)),
                    timeout=WAIT_MS)
    w.conversations.delete(giraffes)
    settle(qtbot, w)
    assert giraffes not in panel.ids() and w.conversations.undo_button.isVisible()
    w.conversations.undo_button.click()
    qtbot.waitUntil(lambda: giraffes in panel.ids(), timeout=WAIT_MS)


def test_reopening_rebuilds_and_the_banner_can_stop_it(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = fake_window()
    conv = reopening_held(qtbot, w, fake, "Read me again " + "word " * 40)
    fake.release()
    with qtbot.waitSignal(w.conversations.opened, timeout=WAIT_MS) as opened:
        pass
    result = opened.args[1]
    assert result.how == "rebuilt" and "the test refuses the snapshot" in result.details
    note = w.chat.resume_note
    assert result.note in note and "the test refuses" not in note  # one plain line
    w.chat.new_chat()
    held(qtbot, fake, lambda: w.conversations.open(conv))
    qtbot.waitUntil(lambda: w.banner.stop_button.isVisible(), timeout=WAIT_MS)
    w.banner.stop_button.click()
    qtbot.waitUntil(lambda: w.state is UiState.READY, timeout=WAIT_MS)
    assert "Stopped re-reading" in w.chat.resume_note and error_box(w) is None
    fake.release()
    assert chat(qtbot, w, "Go on").text


def test_dropping_the_key_leaves_no_key_for_reading_either(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    w = fake_window(snapshot_encryption="keyring")
    qtbot.waitUntil(lambda: w.conversations.snapshots_on, timeout=WAIT_MS)
    with qtbot.waitSignal(w.conversations.snapshot_saved, timeout=WAIT_MS):
        w.chat.send_text("Encrypted")
    conv = w.conversations.current
    w.chat.new_chat()
    w.conversations.prompts.use_passphrase("")  # "no passphrase": snapshots are neither written nor read now
    with qtbot.waitSignal(w.conversations.opened, timeout=WAIT_MS) as opened:
        w.conversations.open(conv)
    assert opened.args[1].how == "rebuilt" and "keyring key" in w.chat.resume_note


def test_a_row_with_an_impossible_date_never_hides_the_others(qtbot: QtBot) -> None:
    """Issue 17.5, the list's side: one bad row is shown as such, the others as usual."""
    panel = ConversationsPanel()
    qtbot.addWidget(panel)
    panel.set_conversations([ConversationSummary(1, "Poisoned", 0.0, 1e12, 2),
                             ConversationSummary(2, "Fine", 0.0, 1.7e9, 4)], None)
    assert panel.ids() == [1, 2]
    assert "date unknown" in panel.list.item(0).text() and "4 messages" in panel.list.item(1).text()
