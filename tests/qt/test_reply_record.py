"""What is recorded with a reply and shown again when its conversation is reopened (its figures), and
what a new chat starts with (an empty cache in the 16-bit phase)."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from lazykv.core.kinds import KvPhase
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import WAIT_MS, chat, settle
from tests.qt.test_lazy_ui import LONG_MESSAGE
from tests.qt.test_main_window import REPLY_TIMEOUT_MS, open_window


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


def test_a_new_chat_after_a_compaction_starts_with_an_empty_16_bit_cache(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = fake_window()
    chat(qtbot, w, "Fill it")
    with qtbot.waitSignal(w.converted, timeout=WAIT_MS):
        w.compact_action.trigger()
    settle(qtbot, w)
    assert w.kv is not None and w.kv.phase is KvPhase.Q8_0 and "8-bit" in w.context_meter.label.text()
    w.new_chat()
    settle(qtbot, w)
    assert w.kv.phase is KvPhase.F16 and w.kv.n_cells_used == 0
    assert "16-bit" in w.context_meter.label.text() and w.memory_panel.phase_label.text().startswith("f16")


def test_with_the_real_engine_a_new_chat_after_a_compaction_is_16_bit_again(
    qtbot: QtBot, smollm2_path: Path
) -> None:
    w = open_window(qtbot, smollm2_path, max_reply_tokens=8)
    try:
        with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS):
            w.send_text(LONG_MESSAGE)  # crosses the f16 view: compacted to 8-bit while it is read
        qtbot.waitUntil(lambda: w.kv is not None and w.kv.phase is KvPhase.Q8_0, timeout=WAIT_MS)
        settle(qtbot, w)
        w.new_chat()
        qtbot.waitUntil(lambda: w.kv.phase is KvPhase.F16 and w.kv.n_cells_used == 0, timeout=WAIT_MS)
        assert "16-bit" in w.context_meter.label.text()
        assert "/ 512 (f16 view)" in w.memory_panel.cells_bar.format()
        with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS):
            w.send_text("Name a colour.")
        qtbot.waitUntil(lambda: 0 < w.kv.n_cells_used < 512, timeout=WAIT_MS)
        assert w.kv.phase is KvPhase.F16
        settle(qtbot, w)
    finally:
        w.close()
