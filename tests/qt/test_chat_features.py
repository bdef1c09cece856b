"""Regenerate, edit-and-resend, copy, system prompt, context-full policy, model info, drag and drop."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent, QGuiApplication
from PySide6.QtWidgets import QLabel, QMessageBox
from pytestqt.qtbot import QtBot

from lazykv.qt.main_window import MainWindow, UiState
from lazykv.qt.model_info_dialog import ModelInfoDialog
from tests.qt.test_main_window import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, Relay, open_window


@pytest.fixture
def window(qtbot: QtBot, smollm2_path: Path) -> Iterator[MainWindow]:
    w = open_window(qtbot, smollm2_path, max_reply_tokens=12)
    yield w
    w.close()


def chat(qtbot: QtBot, w: MainWindow, text: str | None = None, action: object = None) -> object:
    """Send ``text`` (or trigger ``action``) and wait for the reply; return its ReplyResult."""
    finished = Relay(w.worker.reply_finished)
    with qtbot.waitSignal(finished.fired, timeout=REPLY_TIMEOUT_MS):
        if text is not None:
            w.send_text(text)
        else:
            action()  # type: ignore[operator]
    return finished.calls[-1][0]


def menu_action(w: MainWindow, index: int, text: str):  # noqa: ANN201 - QAction
    return next(a for a in w.transcript.message_menu(index).actions() if a.text() == text)


def test_regenerate_replaces_the_last_reply_reusing_the_cached_prompt(
    qtbot: QtBot, window: MainWindow
) -> None:
    first = chat(qtbot, window, "Name a colour.")
    assert window.regenerate_action.isEnabled()
    second = chat(qtbot, window, action=menu_action(window, 1, "Regenerate").trigger)
    assert [t["role"] for t in window.conversation.turns()] == ["user", "assistant"]
    assert window.conversation.turns()[1]["content"] == second.text
    assert window.transcript.message_count() == 2
    assert second.text == first.text  # greedy: the same reply again
    assert second.n_reused >= second.n_prompt - 1  # nothing re-read but the last prompt token


def test_edit_and_resend_replaces_the_turn_and_reuses_the_common_prefix(
    qtbot: QtBot, window: MainWindow
) -> None:
    chat(qtbot, window, "What is the capital of France?")
    chat(qtbot, window, "And of Italy?")
    menu_action(window, 0, "Edit and resend…").trigger()
    assert window.input.toPlainText() == "What is the capital of France?"
    assert window.edit_bar.isVisible()
    window.input.setPlainText("What is the capital of Spain?")
    result = chat(qtbot, window, action=window._send)
    turns = window.conversation.turns()
    assert [t["content"] for t in turns] == ["What is the capital of Spain?", result.text]
    assert not window.edit_bar.isVisible()
    assert "Italy" not in window.transcript.toPlainText()
    assert 0 < result.n_reused < result.n_prompt  # the template and "What is the capital of" stayed cached


def test_cancelled_edit_keeps_everything(qtbot: QtBot, window: MainWindow) -> None:
    chat(qtbot, window, "Hello")
    window.edit_message(0)
    window.cancel_edit()
    window.input.clear()
    assert len(window.conversation) == 2 and not window.edit_bar.isVisible()


def test_copy_message_and_last_reply(qtbot: QtBot, window: MainWindow) -> None:
    result = chat(qtbot, window, "Say hi")
    menu_action(window, 0, "Copy message").trigger()
    assert QGuiApplication.clipboard().text() == "Say hi"
    window.copy_reply_action.trigger()
    assert QGuiApplication.clipboard().text() == result.text


def test_system_prompt_is_sent_first(qtbot: QtBot, window: MainWindow) -> None:
    window.system_edit.setText("You are a pirate.")
    window.system_edit.editingFinished.emit()
    sent = Relay(window.send_requested)
    chat(qtbot, window, "Hello")
    messages = sent.calls[0][0]
    assert messages[0] == {"role": "system", "content": "You are a pirate."}
    assert messages[1] == {"role": "user", "content": "Hello"}


def test_drop_oldest_policy_tells_the_user_what_was_dropped(qtbot: QtBot, smollm2_path: Path) -> None:
    w = open_window(qtbot, smollm2_path, n_ctx=256, context_full="drop_oldest", max_reply_tokens=8)
    try:
        results = [chat(qtbot, w, f"Message {i}: " + "please tell me more about it " * 8) for i in range(4)]
        assert any(r.dropped for r in results)
        assert "oldest messages were dropped" in w.transcript.toPlainText()
        assert w.conversation.first_sent > 0
        assert w.conversation.messages()[0]["content"].startswith("Message ")
        assert len(w.conversation.turns()) == 8  # still shown
    finally:
        w.close()


def test_model_information_shows_metadata_and_kv_support(qtbot: QtBot, window: MainWindow) -> None:
    window.info_action.trigger()
    dialog = window.findChild(ModelInfoDialog)
    assert dialog is not None and dialog.isVisible()
    text = " | ".join(label.text() for label in dialog.findChildren(QLabel))
    for expected in ("llama", "Trained context", "8,192 tokens", "64 / 64", "f16, q8_0 and lazy q8_0"):
        assert expected in text
    dialog.reject()


def test_dropping_a_gguf_file_opens_it_and_other_files_are_ignored(
    qtbot: QtBot, window: MainWindow, gemma3_path: Path, tmp_path: Path
) -> None:
    def drop(path: Path) -> None:
        mime = QMimeData()
        mime.setUrls([QUrl.fromLocalFile(str(path))])
        event = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                           Qt.KeyboardModifier.NoModifier)
        window.dropEvent(event)

    drop(tmp_path / "notes.txt")
    assert window.state is UiState.READY
    loaded = Relay(window.worker.model_loaded)
    with qtbot.waitSignal(loaded.fired, timeout=LOAD_TIMEOUT_MS):
        drop(gemma3_path)
    assert loaded.calls[0][0].architecture == "gemma3"
    assert str(gemma3_path) == window.settings["recent_models"][0]
    window._fill_recent_menu()
    recent = [a.text() for a in window.recent_menu.actions()][:2]
    assert recent == [gemma3_path.name, "SmolLM2-135M-Instruct.Q4_1.gguf"]


def test_kv_mode_the_model_cannot_run_is_refused_with_the_reason(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    from tests.support.synthetic_gguf import SyntheticShape, write_llama_gguf

    odd = write_llama_gguf(tmp_path / "odd-heads.gguf", SyntheticShape(head_dim=80))
    failed = Relay(window.worker.load_failed)
    with qtbot.waitSignal(failed.fired, timeout=LOAD_TIMEOUT_MS):
        window.open_model(odd)
    assert "head size 80 not a multiple of 32" in failed.calls[0][0]
    window.findChild(QMessageBox, "error-box").accept()
    assert window.state is UiState.READY and window.model_info.path.name.startswith("SmolLM2")
