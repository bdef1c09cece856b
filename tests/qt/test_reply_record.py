"""What is recorded with a reply and shown again when its conversation is reopened: its figures."""

from __future__ import annotations

from pytestqt.qtbot import QtBot

from tests.qt.conftest import FakeWindow
from tests.qt.helpers import WAIT_MS, chat, settle


def _text(w) -> str:  # noqa: ANN001 - a MainWindow
    return " ".join(w.transcript.toPlainText().split())


def test_a_replys_figures_are_stored_and_shown_again_when_reopened(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    w = fake_window()
    chat(qtbot, w, "Name a colour.")
    chat(qtbot, w, "Name a fruit.")
    stats = w.conversation.stats()
    assert sorted(stats) == [1, 3] and all(s.n_tokens > 0 for s in stats.values())
    conv_id = w.conversations.current
    w.new_chat()
    settle(qtbot, w)
    assert "to first token" not in _text(w)
    w.conversations.open(conv_id)
    qtbot.waitUntil(lambda: w.transcript.message_count() == 4, timeout=WAIT_MS)
    settle(qtbot, w)
    assert w.conversation.stats() == stats
    for figures in stats.values():
        assert figures.summary() in _text(w)
