"""One selection owns what is on screen (issue 45, defect 1): the conversation list's current row, changed
by any means (a click, the arrow keys, a program), opens that chat, superseding a re-read in flight; the
list never shows a chat other than the one on screen. On the fake engine; the real one under xcb is
tests/test_selection_xcb.py."""

from __future__ import annotations

import threading

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from lazykv.qt.main_window import MainWindow
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import WAIT_MS, chat, held, reopening_held, saved_then_new_chat, settle, stored


def _highlighted(w: MainWindow) -> list[int]:
    panel = w.conversations_panel
    return [panel.ids()[index.row()] for index in panel.list.selectedIndexes()]


def _row_of(w: MainWindow, conv_id: int) -> int:
    return w.conversations_panel.ids().index(conv_id)


def _settled_on(qtbot: QtBot, w: MainWindow, conv_id: int) -> None:
    qtbot.waitUntil(lambda: w.conversations.current == conv_id and w.conversations.resume is None
                    and w.state.name == "READY", timeout=WAIT_MS)
    settle(qtbot, w)


def test_the_down_key_during_a_reread_opens_the_chat_it_moves_to(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    """The list's highlight moved to the next chat while the transcript, the context bar and the memory
    panel stayed on the one being re-read, and a message then went to that one."""
    w = fake_window()
    short = saved_then_new_chat(qtbot, w, "The short chat")
    long = reopening_held(qtbot, w, fake, "The long chat that is being re read now")
    panel = w.conversations_panel
    assert w.conversations.current == long and panel.ids() == [long, short]
    qtbot.waitUntil(lambda: "Re-reading the conversation" in w.banner.label.text(), timeout=WAIT_MS)

    panel.list.setFocus()
    qtbot.keyClick(panel.list, Qt.Key.Key_Down)
    fake.release()
    _settled_on(qtbot, w, short)

    assert panel.selected_id() == short and _highlighted(w) == [short]
    assert "The short chat" in w.transcript.toPlainText() and "re read" not in w.transcript.toPlainText()
    n_tokens = fake.count_tokens(w.conversation.messages())  # the context bar follows the short chat
    qtbot.waitUntil(lambda: w.kv is not None and w.kv.n_cells_used == n_tokens, timeout=WAIT_MS)
    assert f"Context {n_tokens:,} /" in w.context_meter.label.text()
    chat(qtbot, w, "Which chat is this?")
    saved = {title: [m["content"] for m in messages] for title, messages in stored(w)}
    assert saved["The short chat"][-2] == "Which chat is this?"
    assert "Which chat is this?" not in saved["The long chat that is being re read now"]


def test_a_row_made_current_by_a_program_opens_it(qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window()
    first = saved_then_new_chat(qtbot, w, "The first chat")
    second = saved_then_new_chat(qtbot, w, "The second chat")
    w.conversations_panel.list.setCurrentRow(_row_of(w, first))
    _settled_on(qtbot, w, first)
    w.conversations_panel.list.setCurrentRow(_row_of(w, second))
    _settled_on(qtbot, w, second)
    assert _highlighted(w) == [second] and "The second chat" in w.transcript.toPlainText()


def test_keys_and_clicks_while_a_reply_streams_leave_the_list_on_the_chat_on_screen(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    """Refused (a reply is being written): the row goes back to the chat on screen once the key or the
    click is handled, highlight included (a click selects its row after the current one changed)."""
    w = fake_window()
    other = saved_then_new_chat(qtbot, w, "The other chat")
    chat(qtbot, w, "This chat")
    current = w.conversations.current
    panel = w.conversations_panel
    assert panel.ids() == [current, other]
    held(qtbot, fake, lambda: w.chat.send_text("A reply that takes a while"))

    panel.list.setFocus()
    qtbot.keyClick(panel.list, Qt.Key.Key_Down)
    qtbot.waitUntil(lambda: "reply has ended" in w.statusBar().currentMessage(), timeout=WAIT_MS)
    assert panel.selected_id() == current and _highlighted(w) == [current]
    w.statusBar().clearMessage()
    item = panel.list.item(_row_of(w, other))
    qtbot.mouseClick(panel.list.viewport(), Qt.MouseButton.LeftButton,
                     pos=panel.list.visualItemRect(item).center())
    qtbot.waitUntil(lambda: "reply has ended" in w.statusBar().currentMessage(), timeout=WAIT_MS)
    assert panel.selected_id() == current and _highlighted(w) == [current]

    fake.release()
    qtbot.waitUntil(lambda: w.state.name == "READY", timeout=WAIT_MS)
    settle(qtbot, w)
    assert w.conversations.current == current and "This chat" in w.transcript.toPlainText()


def test_rows_the_window_moves_or_removes_open_nothing(qtbot: QtBot, fake_window: FakeWindow) -> None:
    """A saved turn moves the chat on screen's row to the top (taken out and put back: Qt makes another
    row current meanwhile), a delete removes a row: neither opens another chat."""
    w = fake_window()
    older = saved_then_new_chat(qtbot, w, "The older chat")
    newer = saved_then_new_chat(qtbot, w, "The newer chat")
    panel = w.conversations_panel
    panel.list.setCurrentRow(_row_of(w, older))
    _settled_on(qtbot, w, older)
    asked: list[int] = []
    panel.open_requested.connect(asked.append)

    chat(qtbot, w, "One more turn")
    assert panel.ids() == [older, newer] and panel.selected_id() == older and _highlighted(w) == [older]
    w.conversations.delete(newer)
    settle(qtbot, w)
    qtbot.wait(20)  # an open asked by the list comes once the event loop turns
    assert asked == [] and w.conversations.current == older and panel.selected_id() == older
    assert panel.ids() == [older]


def test_a_message_sent_while_the_chosen_chat_is_read_goes_nowhere_else(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    """While the chat chosen in the list is read from the database (a long one takes a while) the list
    shows it and the screen still the one before: a message sent then is kept in the box, not sent to the
    chat the list no longer shows; once the chosen chat shows, it goes there."""
    w = fake_window()
    chosen = saved_then_new_chat(qtbot, w, "The chosen chat")
    chat(qtbot, w, "The chat on screen")
    left = w.conversations.current
    gate = threading.Event()
    w.database.submit(lambda _store: gate.wait(WAIT_MS / 1000))  # the database is busy for a while
    w.conversations_panel.list.setCurrentRow(_row_of(w, chosen))
    qtbot.waitUntil(lambda: w.conversations.opening == chosen, timeout=WAIT_MS)
    w.chat.send_text("Which chat is this?")
    assert w.input.toPlainText() == "Which chat is this?" and w.chat.reply_request is None
    assert "“The chosen chat” is opening" in w.statusBar().currentMessage()
    gate.set()
    _settled_on(qtbot, w, chosen)
    with qtbot.waitSignal(w.reply_finished, timeout=WAIT_MS):
        w.send_button.click()
    settle(qtbot, w)
    saved = {title: [m["content"] for m in messages] for title, messages in stored(w)}
    assert saved["The chosen chat"][-2] == "Which chat is this?"
    assert "Which chat is this?" not in saved["The chat on screen"] and left != chosen
