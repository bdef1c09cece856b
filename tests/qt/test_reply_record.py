"""What is recorded with a reply and shown again when its conversation is reopened (its figures, how it
ended), where a compaction is shown, and what a new chat starts with (an empty 16-bit cache)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pytestqt.qtbot import QtBot

from lazykv.core.engine.engine import FinishReason
from lazykv.core.history.store import Store
from lazykv.core.kinds import KvPhase
from lazykv.qt.transcript import TranscriptView
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import WAIT_MS, chat, settle, stored
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
    w.chat.new_chat()
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
    # the status that follows the conversion is its own request: wait for it, not for a fixed moment
    qtbot.waitUntil(lambda: w.kv is not None and w.kv.phase is KvPhase.Q8_0, timeout=WAIT_MS)
    settle(qtbot, w)
    assert "8-bit" in w.context_meter.label.text()
    w.chat.new_chat()
    qtbot.waitUntil(lambda: w.kv.phase is KvPhase.F16 and w.kv.n_cells_used == 0, timeout=WAIT_MS)
    settle(qtbot, w)
    assert "16-bit" in w.context_meter.label.text() and w.memory_panel.phase_label.text().startswith("16-bit")


def test_with_the_real_engine_a_new_chat_after_a_compaction_is_16_bit_again(
    qtbot: QtBot, smollm2_path: Path
) -> None:
    w = open_window(qtbot, smollm2_path, max_reply_tokens=8)
    try:
        with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS):
            w.chat.send_text(LONG_MESSAGE)  # crosses the f16 view: compacted to 8-bit while it is read
        qtbot.waitUntil(lambda: w.kv is not None and w.kv.phase is KvPhase.Q8_0, timeout=WAIT_MS)
        settle(qtbot, w)
        w.chat.new_chat()
        qtbot.waitUntil(lambda: w.kv.phase is KvPhase.F16 and w.kv.n_cells_used == 0, timeout=WAIT_MS)
        assert "16-bit" in w.context_meter.label.text()
        assert "/ 512 (f16 view)" in w.memory_panel.cells_bar.format()
        with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS):
            w.chat.send_text("Name a colour.")
        qtbot.waitUntil(lambda: 0 < w.kv.n_cells_used < 512, timeout=WAIT_MS)
        assert w.kv.phase is KvPhase.F16
        settle(qtbot, w)
    finally:
        w.close()


def test_a_reply_cut_off_says_why_under_it_and_again_when_reopened(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = fake_window(max_reply_tokens=8)
    fake.finish_reason = FinishReason.LENGTH
    chat(qtbot, w, "Tell me a long story.")
    limit = "Reply stopped at the length limit (8 tokens; Settings > Max reply tokens)"
    assert _text(w).endswith(limit)
    w.settings.set("max_reply_tokens", 0)
    chat(qtbot, w, "Go on.")
    assert _text(w).endswith("Reply stopped: the context is full")
    conv_id = w.conversations.current
    w.chat.new_chat()
    settle(qtbot, w)
    w.conversations.open(conv_id)
    qtbot.waitUntil(lambda: w.transcript.message_count() == 4, timeout=WAIT_MS)
    settle(qtbot, w)
    text = _text(w)
    assert text.index(limit) < text.index("Go on.") < text.index("Reply stopped: the context is full")


def test_a_compaction_during_a_reply_is_a_line_under_it_never_inside_a_sentence(qtbot: QtBot) -> None:
    view = TranscriptView()
    qtbot.addWidget(view)
    view.add_message("user", "Tell me.")
    view.begin_reply()
    view.mark_here("Context compacted to 8-bit here (at token 500)", before_reply=True)  # prompt read
    view.append_to_reply("The first half of a sentence")
    view.mark_here("Context compacted to 8-bit during this reply (at token 900)")
    view.append_to_reply(" and its second half.")
    view.end_reply("Reply stopped")
    lines = [line for line in view.toPlainText().splitlines() if line.strip()]
    assert lines == ["You", "Tell me.", "Context compacted to 8-bit here (at token 500)", "Assistant",
                     "The first half of a sentence and its second half.",
                     "Context compacted to 8-bit during this reply (at token 900)", "Reply stopped"]


def test_a_reply_cut_by_quitting_is_kept_with_a_line_saying_so(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = fake_window()
    chat(qtbot, w, "Start here.")

    def half_then_held() -> Iterator[str]:
        yield "Half of "
        fake.hold()  # the next piece waits in the engine: the app is closed mid-reply
        yield "a reply never seen"

    fake.reply = half_then_held()  # type: ignore[assignment]
    w.chat.send_text("Then this.")
    qtbot.waitUntil(fake.waiting.is_set, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: "Half of" in w.transcript.toPlainText(), timeout=WAIT_MS)
    w.close()
    fake.release()
    [(_, messages)] = stored()
    assert [m["content"] for m in messages][-2:] == ["Then this.", "Half of "]
    store = Store()
    try:
        [summary] = store.list_conversations()
        stats = store.conversation(summary.id).stats
    finally:
        store.close()
    assert stats[3].note == "Reply stopped: the app was closed"


def test_switching_to_a_16_bit_cache_says_so_under_the_compaction_it_follows(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    w = fake_window()
    chat(qtbot, w, "Fill it")
    with qtbot.waitSignal(w.converted, timeout=WAIT_MS):
        w.compact_action.trigger()
    settle(qtbot, w)
    with qtbot.waitSignal(w.model_loaded, timeout=WAIT_MS):
        w.apply_settings({"kv_mode": "f16"})
    settle(qtbot, w)
    text = _text(w)
    reloaded = "Context memory emptied here: fake loaded with the 16-bit cache; the next reply reads"
    assert text.index("Context compacted to 8-bit here") < text.index(reloaded)
    assert [m.label for m in w.conversation.markers()][-1].startswith("Context memory emptied here")
