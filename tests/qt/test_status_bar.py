"""The status bar and the lines about the context memory say what is true and stay readable (issue 45,
defect 8): the reply's prompt figure is not replaced by the snapshot's notice, a long message is
shortened with "…", "Compacted" counts the chat on screen's own steps, and a chat resumed from its
snapshot gets no line saying that it did not fit. On the fake engine; the last test on the real one."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QImage, QPainter
from pytestqt.qtbot import QtBot

from lazykv.core.engine.types import KvRestoreError, StepEvent
from lazykv.core.kinds import KvMode, KvPhase, StepStage
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import WAIT_MS, chat, saved_then_new_chat, settle
from tests.qt.test_main_window import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, open_window


def test_the_prompt_figure_stays_while_the_snapshot_notice_shows_beside_it(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    """"Prompt N tokens, M reused from the cache" was replaced within 100 ms by "Saved: snapshot…"."""
    w = fake_window()
    with qtbot.waitSignal(w.conversations.snapshot_saved, timeout=WAIT_MS):
        chat(qtbot, w, "Hello there")
    settle(qtbot, w)
    bar = w.statusBar()
    assert bar.currentMessage().startswith("Prompt ") and "reused from the cache" in bar.currentMessage()
    notice = bar.findChild(type(w.model_label), "status-notice")
    assert notice is not None and notice.isVisible() and notice.text().startswith("Saved: snapshot of ")
    assert notice.geometry().right() < w.model_label.geometry().left()  # beside it, apart from the model's


def test_a_long_message_is_shortened_with_an_ellipsis_and_whole_in_the_tooltip(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    w = fake_window()
    w.resize(700, 500)
    bar = w.statusBar()
    text = "Re-read from the transcript (4,096 tokens in 12.3 s) because " + "the snapshot was refused " * 8
    bar.showMessage(text)
    qtbot.wait(20)
    shown = bar.shown_message()
    assert shown.endswith("…") and text.startswith(shown[:-1].rstrip()), shown
    rect = bar.message_rect()
    assert bar.fontMetrics().horizontalAdvance(shown) <= rect.width()
    assert rect.right() < w.model_label.geometry().left()
    # drawn as that and nothing else (not the whole text cut at the edge, under it)
    drawn = bar.grab().toImage().copy(rect)
    alone = QImage(drawn.size(), drawn.format())
    alone.fill(drawn.pixelColor(0, 0))
    painter = QPainter(alone)
    painter.setFont(bar.font())
    painter.setPen(bar.palette().windowText().color())
    painter.drawText(alone.rect(), int(Qt.AlignmentFlag.AlignLeading | Qt.AlignmentFlag.AlignVCenter), shown)
    painter.end()
    assert drawn == alone
    assert bar.toolTip() == text
    bar.showMessage("Short")
    assert bar.shown_message() == "Short"


def _clear_keeping_count(fake: FakeSession) -> None:
    """As the real engine: a context counts its conversions for its whole life, an empty cache too."""
    def clear() -> None:
        n = fake._kv.n_steps
        fake._kv = fake._empty_kv()
        fake._kv.n_steps = n

    fake.clear_kv = clear  # type: ignore[method-assign]


def test_compacted_counts_the_chat_on_screen_only(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    """"Compacted 2×" carried over to a new, empty chat."""
    w = fake_window(kv_mode=KvMode.LADDER)
    _clear_keeping_count(fake)
    chat(qtbot, w, "Hello there")
    for n in (1, 2):
        with qtbot.waitSignal(w.converted, timeout=WAIT_MS):
            w.chat.convert_now()
        settle(qtbot, w)
        qtbot.waitUntil(lambda n=n: w.memory_panel.conversion_label.text().startswith(f"{n}×"),
                        timeout=WAIT_MS)
    w.chat.new_chat()
    settle(qtbot, w)
    qtbot.waitUntil(lambda: w.kv is not None and w.kv.n_cells_used == 0, timeout=WAIT_MS)
    assert w.kv.n_steps == 2  # the engine's own count goes on
    assert w.memory_panel.conversion_label.text() == "none yet"
    chat(qtbot, w, "A new chat")
    with qtbot.waitSignal(w.converted, timeout=WAIT_MS):
        w.chat.convert_now()
    settle(qtbot, w)
    qtbot.waitUntil(lambda: w.memory_panel.conversion_label.text().startswith("1×"), timeout=WAIT_MS)


def _stepping_down_first(fake: FakeSession, method: str, to: Sequence[KvPhase]) -> None:
    """The fake's ``method`` first takes the empty cache down to the rungs ``to``, reporting each step as
    the real engine does (a restore into the rung its snapshot was saved at; a re-read that does not fit
    the first rung)."""
    original = getattr(fake, method)

    def stepping(*args: object, **kwargs: object) -> object:
        for target in to:
            assert fake._listener is not None
            for stage in (StepStage.START, StepStage.END):
                fake._listener(StepEvent(stage, int(stage is StepStage.END), 1, 0, 0.01, target))
        result = original(*args, **kwargs)
        fake._kv.phase = fake._kv.target = to[-1]
        return result

    setattr(fake, method, stepping)


def test_a_chat_resumed_from_its_snapshot_keeps_true_lines(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    """After a relaunch the chat resumed from its snapshot, and the line under it said that the context
    memory "went to 4-bit before the conversation was read"."""
    w = fake_window(kv_mode=KvMode.LADDER)
    conv_id = saved_then_new_chat(qtbot, w, "A chat saved at 4-bit")
    _stepping_down_first(fake, "restore_kv", [KvPhase.Q4_0])
    with qtbot.waitSignal(w.conversations.opened, timeout=WAIT_MS) as opened:
        w.conversations.open(conv_id)
    settle(qtbot, w)
    assert opened.args[1].how == "restored"
    labels = [m.label for m in w.conversation.markers()]
    assert labels == ["Context memory restored from the snapshot at 4-bit"], labels
    shown = w.transcript.toPlainText()
    assert "before the conversation was read" not in shown and "restored from the snapshot at 4-bit" in shown


def test_a_chat_re_read_says_what_did_not_fit(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    """The re-read's own line is kept (issue 39's defect 6): it went down before the text was read."""
    w = fake_window(kv_mode=KvMode.LAZY)
    conv_id = saved_then_new_chat(qtbot, w, "A chat read again")
    fake.restore_error = KvRestoreError("the test refuses the snapshot")
    _stepping_down_first(fake, "rebuild_kv", [KvPhase.Q8_0])
    with qtbot.waitSignal(w.conversations.opened, timeout=WAIT_MS) as opened:
        w.conversations.open(conv_id)
    settle(qtbot, w)
    assert opened.args[1].how == "rebuilt"
    [label] = [m.label for m in w.conversation.markers()]
    assert label.startswith("Context memory went to 8-bit before the conversation was read"), label


LONG = "Here is a list: " + ", ".join(f"item {i}" for i in range(120)) + ". Which item comes first?"


def test_with_the_real_engine_a_relaunch_resumes_with_true_lines_and_compacted_per_chat(
    qtbot: QtBot, smollm2_path: Path
) -> None:
    """The real engine: its count of conversions goes on over a new chat's empty cache (the panel's does
    not), and a chat saved at 8-bit, opened after a relaunch, is restored from its snapshot with the
    cache stepping down before the state is read: one true line, none saying it did not fit (the line of
    the step taken when it was first read is stored with it, and shown again)."""
    first = open_window(qtbot, smollm2_path, kv_mode="lazy", snapshot_encryption="none")
    with qtbot.waitSignal(first.conversations.snapshot_saved, timeout=REPLY_TIMEOUT_MS):
        first.chat.send_text(LONG)  # does not fit the 16-bit level: converts while it is read
    settle(qtbot, first)
    conv_id = first.conversations.current
    assert first.kv is not None and first.kv.phase is KvPhase.Q8_0
    assert first.memory_panel.conversion_label.text().startswith("1×")
    stepped = [m.label for m in first.conversation.markers()]  # the step while it was read
    assert len(stepped) == 1 and stepped[0].startswith("Context compacted to 8-bit here"), stepped
    first.chat.new_chat()
    settle(qtbot, first)
    qtbot.waitUntil(lambda: first.kv is not None and first.kv.n_cells_used == 0, timeout=WAIT_MS)
    assert first.kv.n_steps == 1 and first.memory_panel.conversion_label.text() == "none yet"
    first.close()

    w = open_window(qtbot, smollm2_path, kv_mode="lazy", snapshot_encryption="none")
    try:
        qtbot.waitUntil(lambda: conv_id in w.conversations_panel.ids(), timeout=WAIT_MS)
        with qtbot.waitSignal(w.conversations.opened, timeout=LOAD_TIMEOUT_MS) as opened:
            w.conversations.open(conv_id)
        settle(qtbot, w)
        assert opened.args[1].how == "restored"
        assert w.kv is not None and w.kv.phase is KvPhase.Q8_0
        labels = [m.label for m in w.conversation.markers()]  # the stored line, then the resume's
        assert labels == [*stepped, "Context memory restored from the snapshot at 8-bit"], labels
    finally:
        w.close()
