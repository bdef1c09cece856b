"""MainWindow with its real engine worker thread and the real SmolLM2 model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, Qt, Signal, SignalInstance
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from lazykv.core.settings import Settings
from lazykv.qt.main_window import MainWindow, UiState

LOAD_TIMEOUT_MS = 30_000
REPLY_TIMEOUT_MS = 60_000


class Relay(QObject):
    """Re-emit a worker signal on the GUI thread, after the window's own handlers have run.

    A plain callable connected to a worker signal (as qtbot.waitSignal would connect) runs on
    the worker's thread, possibly before the window has seen the signal. A QObject living on
    the GUI thread receives it queued, in connection order, so after the window's handler.
    """

    fired = Signal(object)  # the relayed signal's arguments, as a tuple

    def __init__(self, signal: SignalInstance) -> None:
        super().__init__()
        self.calls: list[tuple[object, ...]] = []
        signal.connect(self._relay)

    def _relay(self, *args: object) -> None:
        self.calls.append(args)
        self.fired.emit(args)


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
    loaded = Relay(w.worker.model_loaded)
    with qtbot.waitSignal(loaded.fired, timeout=LOAD_TIMEOUT_MS):
        w.open_model(model)
    return w


@pytest.fixture
def window(qtbot: QtBot, smollm2_path: Path) -> Iterator[MainWindow]:
    w = open_window(qtbot, smollm2_path)
    yield w
    w.close()


def type_and_press_enter(qtbot: QtBot, w: MainWindow, text: str) -> None:
    qtbot.keyClicks(w.input, text)
    qtbot.keyClick(w.input, Qt.Key.Key_Return)


def test_loaded_model_shows_in_status_bar(window: MainWindow) -> None:
    assert window.state is UiState.READY
    assert "SmolLM2-135M-Instruct.Q4_1" in window.model_label.text()
    assert "llama" in window.model_label.text()
    assert "SmolLM2-135M-Instruct.Q4_1" in window.windowTitle()
    assert window.send_button.isEnabled() and not window.stop_button.isEnabled()


def test_send_streams_reply_into_transcript(qtbot: QtBot, window: MainWindow) -> None:
    tokens = Relay(window.worker.token)
    finished = Relay(window.worker.reply_finished)
    with qtbot.waitSignal(finished.fired, timeout=REPLY_TIMEOUT_MS):
        type_and_press_enter(qtbot, window, "Hello! Who are you?")
        assert window.state is UiState.REPLYING
        assert window.stop_button.isEnabled() and not window.send_button.isEnabled()
        assert window.input.toPlainText() == ""
    [(result,)] = finished.calls
    reply = result.text
    assert not result.cancelled
    assert reply.strip() and len(tokens.calls) > 1
    assert "".join(piece for (piece,) in tokens.calls) == reply
    transcript = window.transcript.toPlainText()
    assert "Hello! Who are you?" in transcript
    assert reply in transcript
    assert window.conversation.messages() == [
        {"role": "user", "content": "Hello! Who are you?"},
        {"role": "assistant", "content": reply},
    ]
    assert window.state is UiState.READY
    assert window.send_button.isEnabled() and not window.stop_button.isEnabled()


def test_stop_mid_reply_ends_it_and_reenables_send(qtbot: QtBot, window: MainWindow) -> None:
    window.settings.set("max_reply_tokens", 400)
    tokens = Relay(window.worker.token)
    finished = Relay(window.worker.reply_finished)
    with qtbot.waitSignal(tokens.fired, timeout=REPLY_TIMEOUT_MS):
        type_and_press_enter(qtbot, window, "Write a very long story about a dragon and a knight.")
    with qtbot.waitSignal(finished.fired, timeout=REPLY_TIMEOUT_MS):
        qtbot.mouseClick(window.stop_button, Qt.MouseButton.LeftButton)
        assert not window.stop_button.isEnabled()
    [(result,)] = finished.calls
    reply = result.text
    assert result.cancelled
    assert len(tokens.calls) < 400
    assert window.state is UiState.READY
    assert window.send_button.isEnabled() and not window.stop_button.isEnabled()
    assert window.transcript.toPlainText().rstrip().endswith("stopped")
    assert window.conversation.messages()[-1] == {"role": "assistant", "content": reply}

    window.settings.set("max_reply_tokens", 8)
    with qtbot.waitSignal(finished.fired, timeout=REPLY_TIMEOUT_MS):
        type_and_press_enter(qtbot, window, "Thanks!")
    (result,) = finished.calls[-1]
    assert result.text.strip() and not result.cancelled


def test_bad_model_file_shows_error_and_keeps_typed_text(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a model at all")
    qtbot.keyClicks(window.input, "half-typed message")
    load_failed = Relay(window.worker.load_failed)
    with qtbot.waitSignal(load_failed.fired, timeout=LOAD_TIMEOUT_MS):
        window.open_model(bad)
        assert window.state is UiState.LOADING and not window.send_button.isEnabled()
    box = window.findChild(QMessageBox, "error-box")
    assert box is not None and box.isVisible()
    assert "not a GGUF model file" in box.text()
    assert "not a GGUF model file" in window.statusBar().currentMessage()
    assert window.input.toPlainText() == "half-typed message"
    box.accept()

    assert window.state is UiState.READY
    assert "SmolLM2-135M-Instruct.Q4_1" in window.model_label.text()
    finished = Relay(window.worker.reply_finished)
    with qtbot.waitSignal(finished.fired, timeout=REPLY_TIMEOUT_MS):
        qtbot.keyClick(window.input, Qt.Key.Key_Return)
    assert finished.calls[0][0].text.strip()
    assert "half-typed message" in window.transcript.toPlainText()


def test_failed_reply_returns_the_message_to_the_input(qtbot: QtBot, window: MainWindow) -> None:
    too_long = "word " * 2048
    failed = Relay(window.worker.failed)
    with qtbot.waitSignal(failed.fired, timeout=REPLY_TIMEOUT_MS):
        window.input.setPlainText(too_long)
        qtbot.keyClick(window.input, Qt.Key.Key_Return)
    assert "no longer fits the context of 1024 tokens" in failed.calls[0][0]
    assert window.input.toPlainText() == too_long.strip()
    assert window.conversation.messages() == []
    assert "word word" not in window.transcript.toPlainText()
    assert window.state is UiState.READY
    window.findChild(QMessageBox, "error-box").accept()


def test_shift_enter_inserts_a_newline_instead_of_sending(qtbot: QtBot, window: MainWindow) -> None:
    qtbot.keyClicks(window.input, "first line")
    qtbot.keyClick(window.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(window.input, "second line")
    assert window.input.toPlainText() == "first line\nsecond line"
    assert window.state is UiState.READY and window.conversation.messages() == []
