"""The friction a user of other chat apps notices (issue 30): scrolling on send, a growing message box,
a rename dialog that fits its title, plain start-up words, one name for the model, visible check
boxes in the dark theme, a rename that keeps the list's order, Copy last reply only with a reply."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QApplication, QCheckBox, QInputDialog, QLineEdit, QPushButton
from pytestqt.qtbot import QtBot

from lazykv.core.engine.model_meta import read_model_meta
from lazykv.core.history.store import Store
from lazykv.core.kinds import FinishReason
from lazykv.core.settings import Settings
from lazykv.qt import theme
from lazykv.qt.chat_input import MAX_LINES, ChatInput
from lazykv.qt.settings_dialog import SettingsDialog
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import WAIT_MS, chat, error_box, settle, stored
from tests.support.history import append_message, create_conversation


def test_sending_after_scrolling_up_brings_the_end_into_sight(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = fake_window()
    w.resize(900, 500)
    for i in range(12):
        chat(qtbot, w, f"Question {i}")
    bar = w.transcript.verticalScrollBar()
    assert bar.maximum() > 0
    bar.setValue(0)
    assert not w.transcript.following()
    chat(qtbot, w, "One more")
    assert w.transcript.following() and bar.value() == bar.maximum()


def test_the_message_box_grows_with_its_text_up_to_a_limit(qtbot: QtBot) -> None:
    box = ChatInput()
    qtbot.addWidget(box)
    box.resize(400, box.height())
    box.show()
    empty = box.height()
    box.setPlainText("\n".join(f"line {i}" for i in range(6)))
    six = box.height()
    assert six > empty
    box.setPlainText("\n".join(f"line {i}" for i in range(40)))
    line = box.fontMetrics().lineSpacing()
    assert box.height() == six + (MAX_LINES - 6) * line  # then it scrolls
    box.clear()
    assert box.height() == empty


def test_the_rename_dialog_shows_its_title_and_the_whole_name(qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window()
    title = "A conversation about the lighthouses of the northern cape"
    chat(qtbot, w, title)
    w.conversations.ask_rename(w.conversations.current)
    dialog = w.findChild(QInputDialog, "rename-dialog")
    assert dialog is not None
    qtbot.waitExposed(dialog)
    field = dialog.findChild(QLineEdit)
    wide = dialog.fontMetrics().horizontalAdvance("Rename conversation") + 120  # the title bar's share
    qtbot.waitUntil(lambda: dialog.width() >= wide)
    assert field.width() >= field.fontMetrics().horizontalAdvance(title)
    dialog.reject()


def test_a_rename_keeps_the_conversation_s_place_in_the_list() -> None:
    store = Store()
    try:
        older = create_conversation(store, "Older")
        append_message(store, older, "user", "first")
        newer = create_conversation(store, "Newer")
        append_message(store, newer, "user", "second")
        store.rename(older, "Older, renamed")
        assert [s.title for s in store.list_conversations()] == ["Newer", "Older, renamed"]
    finally:
        store.close()


def test_copy_last_reply_is_offered_only_when_there_is_one(qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window()
    assert not w.copy_reply_action.isEnabled()
    chat(qtbot, w, "Hello")
    assert w.copy_reply_action.isEnabled()
    w.chat.new_chat()
    settle(qtbot, w)
    assert not w.copy_reply_action.isEnabled()


def test_settings_names_the_model_by_its_file_as_everywhere_else(qtbot: QtBot, fake_model: Path) -> None:
    meta = read_model_meta(fake_model)
    dialog = SettingsDialog(Settings(), meta)
    qtbot.addWidget(dialog)
    assert f"<b>{fake_model.name}</b>" in dialog.estimate_label.text()


def _indicator_contrast(qtbot: QtBot) -> int:
    box = QCheckBox("Private (save nothing)")
    qtbot.addWidget(box)
    box.resize(box.sizeHint())
    image: QImage = box.grab().toImage()
    background = QColor(box.palette().color(box.backgroundRole())).lightness()
    left = range(min(18, image.width()))  # the indicator, left of the text
    rows = range(image.height())
    return max(abs(image.pixelColor(x, y).lightness() - background) for x in left for y in rows)


def test_check_boxes_stand_out_in_the_dark_theme(qtbot: QtBot) -> None:
    app = QApplication.instance()
    try:
        theme.apply(app, "dark")
        assert _indicator_contrast(qtbot) >= 80
    finally:
        theme.apply(app, "system")
    assert app.styleSheet() == ""


def test_messages_dropped_to_fit_the_context_are_greyed_and_say_so(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    w = fake_window(context_full="drop_oldest", max_reply_tokens=8)
    for i in range(5):
        chat(qtbot, w, f"Message {i}: " + "more " * 50)
    dropped = w.conversation.first_sent
    assert dropped > 0 and w.transcript.left_out() == dropped
    text = w.transcript.toPlainText()
    assert text.count("left out of the context") == dropped
    w.chat.new_chat()
    settle(qtbot, w)
    assert w.transcript.left_out() == 0


def test_a_full_context_offers_to_drop_the_oldest_turns_and_retry(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    w = fake_window(context_full="stop", max_reply_tokens=8)
    for i in range(5):
        w.chat.send_text(f"Message {i}: " + "more " * 50)
        qtbot.waitUntil(lambda: w.state.name == "READY", timeout=WAIT_MS)
        settle(qtbot, w)
        if error_box(w) is not None:
            break
    box = error_box(w)
    assert box is not None and "Message" in w.input.toPlainText()  # the turn is back in the box
    retry = box.findChild(QPushButton, "drop-oldest-retry")
    assert retry is not None
    with qtbot.waitSignal(w.reply_finished, timeout=WAIT_MS) as finished:
        retry.click()
    assert finished.args[0].dropped and w.conversation.first_sent > 0
    assert w.setting("context_full") == "stop"  # for that reply only
    assert w.chat.reply_options().context_full == "stop"


def test_a_reply_cut_off_can_be_continued_where_it_stopped(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = fake_window(max_reply_tokens=8)
    fake.reply, fake.finish_reason = ("Red", " is"), FinishReason.LENGTH
    chat(qtbot, w, "Name a colour and say why.")
    assert w.continue_action.isEnabled()
    fake.reply, fake.finish_reason = (" warm", " and bright."), FinishReason.STOP
    with qtbot.waitSignal(w.reply_finished, timeout=WAIT_MS):
        w.continue_action.trigger()
    settle(qtbot, w)
    assert fake.calls.count("continue") == 1
    assert w.conversation.turns()[-1]["content"] == "Red is warm and bright."
    assert w.conversation.versions(1) == ["Red is warm and bright."]  # in place: no second version
    assert "Red is warm and bright." in w.transcript.toPlainText()
    assert not w.continue_action.isEnabled()  # it ended by itself
    assert stored(w)[0][1][-1]["content"] == "Red is warm and bright."
