"""Regenerate keeps the alternatives (issue 12): the user pages between replies (1/3) and the chat
continues from the one shown; they are saved and come back with the conversation."""

from __future__ import annotations

from pytestqt.qtbot import QtBot

from lazykv.core.errors import EngineError
from lazykv.qt.main_window import MainWindow
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import WAIT_MS, chat, error_box, held, settle, stored


def _replied(qtbot: QtBot, w: MainWindow, fake: FakeSession, text: str, *replies: str) -> MainWindow:
    """``w`` after ``text`` got the first of ``replies``, then was regenerated as each of the others."""
    fake.reply = (replies[0],)
    chat(qtbot, w, text)
    assert not w.versions_bar.isVisible()  # one reply: nothing to page
    for reply in replies[1:]:
        _regenerate(qtbot, w, fake, reply)
    return w


def _regenerate(qtbot: QtBot, w: MainWindow, fake: FakeSession, reply: str) -> None:
    fake.reply = (reply,)
    with qtbot.waitSignal(w.reply_finished, timeout=WAIT_MS):
        w.chat.regenerate()
    settle(qtbot, w)


def _reopened(qtbot: QtBot, w: MainWindow) -> None:
    """The conversation on screen, saved, left for a new chat and opened again."""
    settle(qtbot, w)
    conv_id = w.conversations.current
    w.chat.new_chat()
    settle(qtbot, w)
    with qtbot.waitSignal(w.conversations.opened, timeout=WAIT_MS):
        w.conversations.open(conv_id)


def _last(w: MainWindow) -> str:
    return w.conversation.turns()[-1]["content"]


def test_regenerated_replies_can_be_paged_and_the_chat_goes_on_from_the_one_shown(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = _replied(qtbot, fake_window(), fake, "Name a colour.", "Red.", "Blue.", "Green.")
    assert w.versions_bar.isVisible() and w.versions_label.text() == "Reply 3/3"
    assert not w.next_version.isEnabled() and w.previous_version.isEnabled()
    w.previous_version.click()
    w.previous_version.click()
    assert _last(w) == "Red." and w.versions_label.text() == "Reply 1/3"
    assert not w.previous_version.isEnabled()
    w.next_version.click()
    assert _last(w) == "Blue." and w.versions_label.text() == "Reply 2/3"
    settle(qtbot, w)
    assert stored(w)[0][1][-1]["content"] == "Blue."  # the version shown is the reply saved
    fake.reply = ("Because.",)
    chat(qtbot, w, "Why?")  # continues from the one chosen
    assert [t["content"] for t in w.conversation.turns()] == ["Name a colour.", "Blue.", "Why?", "Because."]
    assert not w.versions_bar.isVisible()  # the last reply has one version
    _reopened(qtbot, w)
    assert w.conversation.versions(1) == ["Red.", "Blue.", "Green."]  # kept with the conversation
    assert w.conversation.version_shown(1) == 1


def test_paging_back_to_the_last_reply_after_reopening(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = _replied(qtbot, fake_window(), fake, "Count.", "One.", "Two.")
    w.previous_version.click()
    _reopened(qtbot, w)
    qtbot.waitUntil(w.versions_bar.isVisible, timeout=WAIT_MS)
    assert w.versions_label.text() == "Reply 1/2" and _last(w) == "One."
    w.next_version.click()
    assert _last(w) == "Two."
    settle(qtbot, w)
    assert stored(w)[0][1][-1]["content"] == "Two."


def test_a_regenerate_stopped_before_its_first_word_keeps_every_reply(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    """Issue 24, point 2: the turn was saved without any reply, the earlier replies were gone."""
    w = _replied(qtbot, fake_window(), fake, "Name a colour.", "Red.", "Blue.")
    stats, markers = w.conversation.stats(), w.conversation.markers()
    held(qtbot, fake, w.chat.regenerate)  # held while the prompt is read: no word yet
    with qtbot.waitSignal(w.reply_finished, timeout=WAIT_MS) as finished:
        w.chat.stop_reply()
        fake.release()
    settle(qtbot, w)
    assert finished.args[0].cancelled
    assert [t["content"] for t in w.conversation.turns()] == ["Name a colour.", "Blue."]
    assert w.conversation.versions(1) == ["Red.", "Blue."] and w.conversation.version_shown(1) == 1
    assert w.conversation.stats() == stats and w.conversation.markers() == markers
    assert w.versions_label.text() == "Reply 2/2" and w.regenerate_action.isEnabled()
    assert "the earlier reply is kept" in w.statusBar().currentMessage()
    assert w.transcript.message_count() == 2 and "Blue." in w.transcript.toPlainText()
    record = w.database.call(lambda store: store.conversation(w.conversations.current))
    assert [m["content"] for m in record.messages] == ["Name a colour.", "Blue."]
    assert record.versions == {1: ["Red.", "Blue."]}


def test_a_failed_regenerate_keeps_the_conversation_and_says_why(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    """Issue 24, point 2: the failure took the user's turn back, and the conversation of one exchange
    was deleted with it."""
    w = fake_window()
    chat(qtbot, w, "Hello")
    fake.reply_error = EngineError("The engine could not read the prompt.")
    with qtbot.waitSignal(w.reply_failed, timeout=WAIT_MS):
        w.chat.regenerate()
    settle(qtbot, w)
    assert [t["content"] for t in w.conversation.turns()] == ["Hello", "Fake reply text."]
    assert w.input.toPlainText() == ""  # nothing was taken back into the input box
    assert [messages for _, messages in stored(w)] == [[{"role": "user", "content": "Hello"},
                                                        {"role": "assistant", "content": "Fake reply text."}]]
    box = error_box(w)
    assert box is not None and "No new reply was written" in box.text()
    assert "The engine could not read the prompt." in box.text() and "The earlier reply is kept" in box.text()
    box.accept()
    fake.reply_error, fake.reply = None, ("Again.",)
    with qtbot.waitSignal(w.reply_finished, timeout=WAIT_MS):
        w.chat.regenerate()
    settle(qtbot, w)
    assert w.conversation.versions(1) == ["Fake reply text.", "Again."]
