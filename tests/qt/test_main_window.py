"""End to end: the window with its real engine worker and the real SmolLM2 model (slow).

The window's logic is tested on the fake engine (test_requests, test_chat_features, ...);
these few tests check that the real engine behaves as the fake one claims.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from lazykv.core.settings import Settings
from lazykv.qt.main_window import MainWindow, UiState
from tests.qt.helpers import error_box

LOAD_TIMEOUT_MS = 30_000
REPLY_TIMEOUT_MS = 60_000
TEST_SETTINGS = {
    "n_ctx": 1024, "temperature": 0.0, "seed": 1, "max_reply_tokens": 24, "idle_conversion": False
}


def open_window(qtbot: QtBot, model: Path, **values: object) -> MainWindow:
    """A window on fresh settings (the test's own config dir) with ``model`` loaded."""
    settings = Settings()
    for name, value in {**TEST_SETTINGS, **values}.items():
        settings.set(name, value)
    w = MainWindow(settings)
    qtbot.addWidget(w)
    w.show()
    with qtbot.waitSignal(w.model_loaded, timeout=LOAD_TIMEOUT_MS):
        w.loading.open_model(model)
    return w


def chat(qtbot: QtBot, w: MainWindow, text: str) -> object:
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        w.chat.send_text(text)
    return finished.args[0]


@pytest.fixture
def window(qtbot: QtBot, smollm2_path: Path) -> Iterator[MainWindow]:
    w = open_window(qtbot, smollm2_path)
    yield w
    w.close()


def test_chat_stop_and_chat_again(qtbot: QtBot, window: MainWindow) -> None:
    """A streamed reply; Stop mid-reply; the next reply is whole (no Stop leaks into it)."""
    pieces: list[str] = []
    window.worker.progress.connect(lambda _request, piece: pieces.append(piece))
    with qtbot.waitSignal(window.reply_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        qtbot.keyClicks(window.input, "Hello! Who are you?")
        qtbot.keyClick(window.input, Qt.Key.Key_Return)
        assert window.state is UiState.REPLYING and window.stop_button.isEnabled()
    result = finished.args[0]
    assert result.text.strip() and not result.cancelled and len(pieces) > 1
    assert result.text in window.transcript.toPlainText()

    window.settings.set("max_reply_tokens", 400)
    before = len(pieces)
    with qtbot.waitSignal(window.reply_finished, timeout=REPLY_TIMEOUT_MS) as stopped:
        window.chat.send_text("Write a very long story about a dragon and a knight.")
        qtbot.waitUntil(lambda: len(pieces) > before, timeout=REPLY_TIMEOUT_MS)
        window.stop_button.click()
    assert stopped.args[0].cancelled
    assert window.transcript.toPlainText().rstrip().endswith("stopped")

    window.settings.set("max_reply_tokens", 8)
    again = chat(qtbot, window, "Thanks!")
    assert again.text.strip() and not again.cancelled
    assert window.state is UiState.READY and window.send_button.isEnabled()


def test_a_message_over_the_context_goes_back_to_the_input(qtbot: QtBot, window: MainWindow) -> None:
    too_long = "word " * 2048
    with qtbot.waitSignal(window.reply_failed, timeout=REPLY_TIMEOUT_MS) as failed:
        window.chat.send_text(too_long)
    assert "no longer fits the context of 1024 tokens" in failed.args[0].message
    assert window.input.toPlainText() == too_long.strip()
    assert window.conversation.messages() == [] and "word word" not in window.transcript.toPlainText()
    assert window.state is UiState.READY
    error_box(window).accept()


def test_edit_and_resend_reuses_the_common_prefix(qtbot: QtBot, window: MainWindow) -> None:
    chat(qtbot, window, "What is the capital of France?")
    chat(qtbot, window, "And of Italy?")
    window.chat.edit_message(0)
    window.input.setPlainText("What is the capital of Spain?")
    result = chat(qtbot, window, window.input.toPlainText())
    turns = [t["content"] for t in window.conversation.turns()]
    assert turns == ["What is the capital of Spain?", result.text]
    assert "Italy" not in window.transcript.toPlainText()
    assert 0 < result.n_reused < result.n_prompt  # the template and "What is the capital of" stayed cached
