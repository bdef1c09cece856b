"""What a desktop user expects from the window (on the fake engine): Esc stops and gives the message
box the focus back, shortcuts listed in Help, the context indicator, per-reply figures, the layout
remembered and never wider than the screen, the last chat reopened, metadata and titles never markup."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QLabel
from pytestqt.qtbot import QtBot

from lazykv.core.engine.model_meta import read_model_meta
from lazykv.core.history.records import ConversationSummary
from lazykv.core.settings import Settings
from lazykv.qt import window_state
from lazykv.qt.conversations_panel import ConversationsPanel
from lazykv.qt.main_window import MainWindow, UiState
from lazykv.qt.model_info_dialog import ModelInfoDialog
from lazykv.qt.settings_dialog import SettingsDialog
from lazykv.qt.shortcuts_dialog import ShortcutsDialog
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import FAST, WAIT_MS, chat, settle


@pytest.fixture
def window(qtbot: QtBot, fake_window: FakeWindow) -> MainWindow:
    w = fake_window()
    w.activateWindow()
    qtbot.waitActive(w)
    return w


def test_escape_stops_the_reply_and_focus_returns_to_the_message_box(
    qtbot: QtBot, window: MainWindow, fake: FakeSession
) -> None:
    fake.hold()
    window.input.setPlainText("Write a very long story about a dragon.")
    qtbot.mouseClick(window.send_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(fake.waiting.is_set, timeout=WAIT_MS)
    assert window.state is UiState.REPLYING
    assert QApplication.focusWidget() is window.input  # not where the disabled Send button sent it
    window.stop_button.setFocus()  # as if the user had tabbed there
    with qtbot.waitSignal(window.reply_finished, timeout=WAIT_MS) as finished:
        qtbot.keyClick(window.stop_button, Qt.Key.Key_Escape)
    fake.release()
    assert finished.args[0].cancelled
    assert QApplication.focusWidget() is window.input
    qtbot.keyClicks(QApplication.focusWidget(), "next")
    assert window.input.toPlainText() == "next"
    assert window.conversations_panel.search.text() == ""


def test_context_indicator_shows_used_and_capacity(qtbot: QtBot, window: MainWindow) -> None:
    chat(qtbot, window, "Hello!")
    qtbot.waitUntil(lambda: window.kv is not None and window.kv.n_cells_used > 0)
    text = window.context_meter.label.text()
    assert f"/ {window.kv.n_cells_total:,} tokens" in text and "16-bit" in text
    assert f"Context {window.kv.n_cells_used:,}" in text


def test_help_lists_the_keyboard_shortcuts(qtbot: QtBot, window: MainWindow) -> None:
    window.shortcuts_action.trigger()
    dialog = window.findChild(ShortcutsDialog)
    assert dialog is not None and dialog.isVisible()
    table = dialog.table
    rows = {table.item(r, 0).text(): table.item(r, 1).text() for r in range(table.rowCount())}
    assert rows["Stop generating"] == "Esc"
    assert rows["New chat"] and rows["Settings"] and rows["Search conversations"]
    assert rows["Rename conversation"] == "F2"  # the window's, from the message box too (issue 30)
    assert rows["Delete the selected conversation"] == "Del"
    dialog.reject()


def test_search_shortcut_focuses_the_search_box(qtbot: QtBot, window: MainWindow) -> None:
    window.search_action.trigger()
    assert QApplication.focusWidget() is window.conversations_panel.search


def test_delete_acts_on_the_selected_conversation(qtbot: QtBot) -> None:
    """(F2 is the window's: tests/qt/test_screen_state.py)"""
    panel = ConversationsPanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.activateWindow()
    qtbot.waitActive(panel)
    panel.set_conversations([ConversationSummary(7, "Trip", 1.7e9, 1.7e9, 2)], 7)
    panel.list.setFocus()
    qtbot.waitUntil(panel.list.hasFocus)
    with qtbot.waitSignal(panel.delete_requested) as deleted:
        qtbot.keyClick(panel.list, Qt.Key.Key_Delete)
    assert deleted.args == [7]


def test_window_layout_is_remembered(qtbot: QtBot) -> None:
    first = MainWindow(Settings(), timings=FAST)
    qtbot.addWidget(first)
    first.show()
    first.resize(760, 500)
    first.memory_dock.hide()
    first.close()
    assert window_state.state_file().exists()

    second = MainWindow(Settings(), timings=FAST)
    qtbot.addWidget(second)
    second.show()
    assert (second.width(), second.height()) == (760, 500)
    assert not second.memory_dock.isVisible()
    second.close()


def test_long_notes_never_widen_the_window(qtbot: QtBot) -> None:
    w = MainWindow(Settings(), timings=FAST)
    qtbot.addWidget(w)
    w.show()
    screen = w.screen().availableGeometry().width()
    narrowest = w.minimumSizeHint().width()
    assert narrowest <= screen
    long_note = "Re-read from the transcript because the snapshot was saved with another layout " * 8
    w.banner.show_note(long_note)
    w.edit_label.setText("Editing message 3: " + "a very long first line of that message " * 10)
    w.edit_bar.show()
    w.model_label.setText("A-model-with-a-very-long-file-name-from-a-hub " * 6 + "· llama · ctx 4096")
    w.statusBar().showMessage("Re-read from the transcript because " + "of a long reason " * 20)
    QApplication.sendPostedEvents()  # the layout requests the new texts posted, handled now
    assert w.minimumSizeHint().width() == narrowest and w.width() <= screen
    w.close()


def test_gguf_name_with_markup_is_shown_as_text(qtbot: QtBot, fake_model: Path) -> None:
    meta = read_model_meta(fake_model)
    meta = type(meta)(**{**meta.__dict__, "name": "<b>Bold</b><img src='x'>"})
    info = ModelInfoDialog(meta)
    qtbot.addWidget(info)
    texts = [label.text() for label in info.findChildren(QLabel)]
    labels = [label for label in info.findChildren(QLabel) if label.text() == meta.name]
    assert labels and all(label.textFormat() == Qt.TextFormat.PlainText for label in labels), texts
    named = type(meta)(**{**meta.__dict__, "path": meta.path.with_name("<b>Bold<i>.gguf")})
    dialog = SettingsDialog(Settings(), named)  # Settings names the model by its file (issue 30)
    qtbot.addWidget(dialog)
    assert "&lt;b&gt;Bold&lt;i&gt;.gguf" in dialog.estimate_label.text()


def test_imported_title_tooltip_is_text(qtbot: QtBot) -> None:
    panel = ConversationsPanel()
    qtbot.addWidget(panel)
    panel.set_conversations([ConversationSummary(1, "<b>x</b><img src='y'>", 1.7e9, 1.7e9, 2)], None)
    assert "&lt;b&gt;x&lt;/b&gt;" in panel.list.item(0).toolTip()


def test_the_app_reopens_the_last_conversation_at_its_end(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    first = fake_window()
    fake.reply = ("A long answer, line after line.\n\n" * 12,)
    for text in ["Name a colour.", "Name a fruit.", "Name a country."]:
        chat(qtbot, first, text)
    first.close()

    w = MainWindow(Settings(), session=fake, timings=FAST, reopen_last=True)  # type: ignore[arg-type]
    qtbot.addWidget(w)
    w.resize(800, 300)
    w.show()
    qtbot.waitUntil(lambda: w.transcript.message_count() == 6, timeout=WAIT_MS)
    assert w.conversation.turns()[-2]["content"] == "Name a country."
    assert w.conversations.current is not None
    bar = w.transcript.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())
    settle(qtbot, w)
    w.close()


def test_each_reply_shows_time_to_first_token_and_speed(qtbot: QtBot, window: MainWindow) -> None:
    chat(qtbot, window, "Say hello.")
    clock = window.chat.reply_clock
    assert clock.n_tokens > 1 and 0 < clock.time_to_first_token < 30 and clock.tokens_per_second > 0
    text = " ".join(window.transcript.toPlainText().split())
    assert f"{clock.time_to_first_token:.2f} s to first token · {clock.tokens_per_second:.1f} tokens/s" \
        in text


def test_on_first_run_the_transcript_gets_most_of_the_width(qtbot: QtBot) -> None:
    w = MainWindow(Settings(), timings=FAST)
    qtbot.addWidget(w)
    w.show()  # the default size, 1100 px wide
    qtbot.waitExposed(w)
    docks = (w.memory_dock.width(), w.conversations_dock.width())
    assert w.transcript.width() > max(docks), docks
    w.close()
