"""Regenerate, edit and resend, copy, system prompt, context-full policy, model info, drag and drop.

All on the fake engine."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent, QGuiApplication
from PySide6.QtWidgets import QLabel
from pytestqt.qtbot import QtBot

from lazykv.core.kinds import KvMode
from lazykv.qt.main_window import MainWindow, UiState
from lazykv.qt.model_info_dialog import ModelInfoDialog
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import WAIT_MS, chat, error_box, held, settle
from tests.support.synthetic_gguf import write_llama_gguf


def menu_action(w: MainWindow, index: int, text: str):  # noqa: ANN201 - QAction
    return next(a for a in w.transcript.message_menu(index).actions() if a.text() == text)


def test_regenerate_replaces_the_last_reply(qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window()
    chat(qtbot, w, "Name a colour.")
    assert w.regenerate_action.isEnabled()
    with qtbot.waitSignal(w.reply_finished, timeout=WAIT_MS) as again:
        menu_action(w, 1, "Regenerate").trigger()
    assert [t["role"] for t in w.conversation.turns()] == ["user", "assistant"]
    assert w.transcript.message_count() == 2
    assert again.args[0].n_reused == again.args[0].n_prompt  # the prompt was in the cache already


def test_edit_and_resend_replaces_the_turn_and_what_follows(qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window()
    chat(qtbot, w, "First question")
    chat(qtbot, w, "Second question")
    menu_action(w, 0, "Edit and resend…").trigger()
    assert w.input.toPlainText() == "First question" and w.edit_bar.isVisible()
    chat(qtbot, w, "Other question")
    assert [t["content"] for t in w.conversation.turns()] == ["Other question", "Fake reply text."]
    assert not w.edit_bar.isVisible() and "Second question" not in w.transcript.toPlainText()


def test_cancelled_edit_keeps_everything(qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window()
    chat(qtbot, w, "Hello")
    w.chat.edit_message(0)
    w.chat.cancel_edit()
    assert len(w.conversation) == 2 and not w.edit_bar.isVisible()


def test_copy_message_and_last_reply(qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window()
    chat(qtbot, w, "Say hi")
    menu_action(w, 0, "Copy message").trigger()
    assert QGuiApplication.clipboard().text() == "Say hi"
    w.copy_reply_action.trigger()
    assert QGuiApplication.clipboard().text() == "Fake reply text."


def test_system_prompt_is_sent_first(qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window()
    w.system_edit.setText("You are a pirate.")
    w.system_edit.editingFinished.emit()
    chat(qtbot, w, "Hello")
    assert w.chat.reply_request is None
    assert w.conversation.messages()[0] == {"role": "system", "content": "You are a pirate."}


def test_drop_oldest_policy_tells_the_user_what_was_dropped(qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window(context_full="drop_oldest", max_reply_tokens=8)
    results = [chat(qtbot, w, f"Message {i}: " + "more " * 50) for i in range(5)]
    assert any(r.dropped for r in results)
    assert "oldest messages were dropped" in w.transcript.toPlainText()
    assert w.conversation.first_sent > 0 and len(w.conversation.turns()) == 10  # still shown


def test_model_information_shows_metadata_and_kv_support(qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window()
    w.info_action.trigger()
    dialog = w.findChild(ModelInfoDialog)
    assert dialog is not None and dialog.isVisible()
    text = " | ".join(label.text() for label in dialog.findChildren(QLabel))
    for expected in ("llama", "Trained context", "128 / 128", "f16, q8_0, lazy q8_0 and ladder"):
        assert expected in text
    dialog.reject()


def test_dropping_a_gguf_file_opens_it_and_other_files_are_ignored(
    qtbot: QtBot, fake_window: FakeWindow, tmp_path: Path
) -> None:
    w = fake_window()

    def drop(path: Path) -> None:
        mime = QMimeData()
        mime.setUrls([QUrl.fromLocalFile(str(path))])
        w.dropEvent(QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                               Qt.KeyboardModifier.NoModifier))

    drop(tmp_path / "notes.txt")
    assert w.state is UiState.READY
    other = write_llama_gguf(tmp_path / "other.gguf")
    with qtbot.waitSignal(w.model_loaded, timeout=WAIT_MS) as loaded:
        drop(other)
    assert loaded.args[0].path == other and w.settings["recent_models"][0] == str(other)
    w.recent_menu.aboutToShow.emit()
    assert [a.text() for a in w.recent_menu.actions()][:2] == ["other.gguf", "fake.gguf"]


def test_a_model_dropped_during_a_reply_is_not_loaded_and_the_user_is_told_why(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession, tmp_path: Path
) -> None:
    """Issue 24, point 8: the drop bypassed the check that the engine is free."""
    w = fake_window()
    other = write_llama_gguf(tmp_path / "other.gguf")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(other))])
    held(qtbot, fake, lambda: w.chat.send_text("Hello"))
    assert w.state is UiState.REPLYING
    drop = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                      Qt.KeyboardModifier.NoModifier)
    w.dropEvent(drop)
    assert not drop.isAccepted() and w.state is UiState.REPLYING
    assert w.statusBar().currentMessage() == ("other.gguf was not opened: a reply is being written: stop it "
                                              "or let it finish, then drop it again.")
    fake.release()
    qtbot.waitUntil(lambda: w.state is UiState.READY, timeout=WAIT_MS)
    settle(qtbot, w)
    assert fake.calls.count("load") == 1 and w.model_info is not None
    assert w.model_info.path.name == "fake.gguf"
    assert w.conversation.turns()[-1]["content"] == "Fake reply text."


def test_a_bad_model_file_is_reported_and_the_loaded_model_stays(
    qtbot: QtBot, fake_window: FakeWindow, tmp_path: Path
) -> None:
    w = fake_window()
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a model at all")
    qtbot.keyClicks(w.input, "half-typed message")
    w.loading.open_model(bad)
    assert w.state is UiState.LOADING and not w.send_button.isEnabled()
    qtbot.waitUntil(lambda: error_box(w) is not None, timeout=WAIT_MS)
    assert "not a GGUF model file" in error_box(w).text() and "magic" not in error_box(w).text()
    assert "magic" in error_box(w).detailedText()  # on demand
    assert w.input.toPlainText() == "half-typed message"
    assert w.state is UiState.READY and w.model_info is not None and w.model_info.kv_mode is KvMode.LAZY


def test_shift_enter_inserts_a_newline_instead_of_sending(qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window()
    qtbot.keyClicks(w.input, "first line")
    qtbot.keyClick(w.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(w.input, "second line")
    assert w.input.toPlainText() == "first line\nsecond line"
    assert w.state is UiState.READY and w.conversation.messages() == []
