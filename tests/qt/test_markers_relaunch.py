"""The lines where the KV cache took a step are stored with the conversation (issue 45, defect 8): shown
before a relaunch, they are shown again after it (a new window on the same data folder), at the same
place, and after a switch back; the resume from the snapshot adds its one line, once. On the fake
engine."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

from pytestqt.qtbot import QtBot

from lazykv.core.chat.conversation import Marker
from lazykv.core.kinds import KvMode, KvPhase
from lazykv.core.settings import Settings
from lazykv.qt.main_window import MainWindow
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import FAST, WAIT_MS, chat, settle
from tests.qt.test_status_bar import _stepping_down_first

RESTORED = "Context memory restored from the snapshot at 4-bit"


def _stepping_in_reply(fake: FakeSession) -> None:
    """The fake's replies take the ladder one step down after their first piece, as a long reply does."""
    original = fake.stream_reply

    def stream(*args: object, **kwargs: object) -> Generator[str, None, object]:
        inner = original(*args, **kwargs)  # type: ignore[arg-type]
        stepped = False
        while True:
            try:
                piece = next(inner)
            except StopIteration as end:
                return end.value
            yield piece
            if not stepped:
                stepped = fake.step_kv_now()

    fake.stream_reply = stream  # type: ignore[method-assign]


def _relaunch(qtbot: QtBot, fake_model: Path, conv_id: int) -> MainWindow:
    """A new window on the same data folder, its snapshot restored by an engine that steps the empty
    cache down to the rung it was saved at first (as the real one does); once the chat has resumed."""
    fake = FakeSession()
    _stepping_down_first(fake, "restore_kv", [KvPhase.Q8_0, KvPhase.Q4_0])
    w = MainWindow(Settings.load(), session=fake, timings=FAST, reopen_last=True)  # type: ignore[arg-type]
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.conversations.current == conv_id, timeout=WAIT_MS)
    with qtbot.waitSignal(w.conversations.opened, timeout=WAIT_MS) as opened:
        w.loading.open_model(fake_model)  # the reopened chat resumes once the model has loaded
    assert opened.args[1].how == "restored"
    settle(qtbot, w)
    return w


def test_markers_shown_before_a_relaunch_are_shown_again_where_they_were(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession, fake_model: Path
) -> None:
    first = fake_window(kv_mode=KvMode.LADDER)
    _stepping_in_reply(fake)
    fake.reply = ("Hello ", "there, ", "friend.")
    chat(qtbot, first, "Hi")  # 16-bit -> 8-bit while the reply is written: a line under it
    with qtbot.waitSignal(first.converted, timeout=WAIT_MS):
        first.chat.convert_now()  # 8-bit -> 4-bit, the chat idle: a line under the last message
    settle(qtbot, first)
    conv_id = first.conversations.current
    markers = first.conversation.markers()
    assert [(m.message_index, m.label.split(" (")[0]) for m in markers] == [
        (1, "Context compacted to 8-bit during this reply"), (1, "Context compacted to 4-bit here")]
    shown = first.transcript.toPlainText()
    assert all(m.label in shown for m in markers)
    first.close()

    again = _relaunch(qtbot, fake_model, conv_id)
    try:
        assert again.conversation.markers() == [*markers, Marker(1, len("Hello there, friend."), RESTORED)]
        text = again.transcript.toPlainText()
        assert text.count(RESTORED) == 1
        assert text.replace(f"{RESTORED}\n", "") == shown  # every line at its place, and nothing else
        again.chat.new_chat()  # a switch to another chat and back: read from the history again
        settle(qtbot, again)
        with qtbot.waitSignal(again.conversations.opened, timeout=WAIT_MS):
            again.conversations.open(conv_id)
        settle(qtbot, again)
        assert again.conversation.markers() == [*markers, Marker(1, len("Hello there, friend."), RESTORED)]
        assert again.transcript.toPlainText() == text
    finally:
        again.close()

    third = _relaunch(qtbot, fake_model, conv_id)  # its resume says what the stored line says: once
    try:
        assert [m.label for m in third.conversation.markers()].count(RESTORED) == 1
        assert third.transcript.toPlainText() == text
    finally:
        third.close()
