"""Continue the reply (Ctrl+Shift+R) goes on with the reply that was cut off in place (issue 45, defect 5):
the same version, its text extended, its figures both parts'; before, it made "Reply 2/2"."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from lazykv.core.errors import EngineError
from lazykv.core.kinds import FinishReason
from lazykv.qt.main_window import MainWindow
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import WAIT_MS, chat, error_box, held, settle
from tests.qt.test_main_window import REPLY_TIMEOUT_MS, open_window

LIMIT = "Reply stopped at the length limit (8 tokens; Settings > Max reply tokens)"


def _text(w: MainWindow) -> str:
    return " ".join(w.transcript.toPlainText().split())


def _record(w: MainWindow):  # noqa: ANN202 - a ConversationRecord
    return w.database.call(lambda store: store.conversation(w.conversations.current))


def _cut(qtbot: QtBot, w: MainWindow, fake: FakeSession) -> None:
    fake.reply, fake.finish_reason = ("Red", " is"), FinishReason.LENGTH
    chat(qtbot, w, "Name a colour and say why.")
    assert w.continue_action.isEnabled() and LIMIT in _text(w)


def _continue(qtbot: QtBot, w: MainWindow, fake: FakeSession, *pieces: str,
              finish: FinishReason = FinishReason.STOP) -> None:
    fake.reply, fake.finish_reason = pieces, finish
    with qtbot.waitSignal(w.reply_finished, timeout=WAIT_MS):
        w.continue_action.trigger()
    settle(qtbot, w)


def test_continue_extends_the_cut_reply_in_place(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = fake_window(max_reply_tokens=8)
    _cut(qtbot, w, fake)
    cut = w.conversation.stats()[1]
    _continue(qtbot, w, fake, " warm", " and bright.")
    assert fake.calls.count("continue") == 1
    assert [t["content"] for t in w.conversation.turns()] == ["Name a colour and say why.",
                                                              "Red is warm and bright."]
    assert w.conversation.versions(1) == ["Red is warm and bright."]  # one version, extended
    assert not w.versions_bar.isVisible()  # no "Reply 2/2"
    stats = w.conversation.stats()[1]
    assert stats.n_tokens == cut.n_tokens + 2 and stats.note == ""
    assert stats.time_to_first_token == cut.time_to_first_token
    assert w.transcript.message_count() == 2 and _text(w).count("Red is") == 1
    assert "Red is warm and bright." in _text(w) and stats.summary() in _text(w) and LIMIT not in _text(w)
    assert not w.continue_action.isEnabled()  # it ended by itself
    record = _record(w)
    assert record.messages[-1]["content"] == "Red is warm and bright." and record.versions == {}
    assert record.stats[1] == stats


def test_continuing_a_regenerated_version_extends_that_version(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = fake_window(max_reply_tokens=8)
    fake.reply = ("Green.",)
    chat(qtbot, w, "Name a colour and say why.")
    fake.reply, fake.finish_reason = ("Blue", " is"), FinishReason.LENGTH
    with qtbot.waitSignal(w.reply_finished, timeout=WAIT_MS):
        w.chat.regenerate()
    settle(qtbot, w)
    assert w.versions_label.text() == "Reply 2/2" and w.continue_action.isEnabled()
    _continue(qtbot, w, fake, " calm.")
    assert w.conversation.versions(1) == ["Green.", "Blue is calm."]
    assert w.versions_label.text() == "Reply 2/2"  # not 3/3
    assert _record(w).versions == {1: ["Green.", "Blue is calm."]}
    w.previous_version.click()
    assert w.conversation.turns()[-1]["content"] == "Green."


def test_a_continue_stopped_before_its_first_word_keeps_the_cut_reply(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = fake_window(max_reply_tokens=8)
    _cut(qtbot, w, fake)
    stats = w.conversation.stats()
    fake.reply, fake.finish_reason = (" warm.",), FinishReason.STOP
    held(qtbot, fake, w.continue_action.trigger)  # held while the prompt is read: no word yet
    qtbot.waitUntil(lambda: "Red is" in _text(w), timeout=WAIT_MS)  # streamed again (every 80 ms)
    assert _text(w).count("Red is") == 1  # not shown twice
    with qtbot.waitSignal(w.reply_finished, timeout=WAIT_MS):
        w.chat.stop_reply()
        fake.release()
    settle(qtbot, w)
    assert w.conversation.turns()[-1]["content"] == "Red is" and w.conversation.stats() == stats
    assert w.conversation.versions(1) == ["Red is"] and not w.versions_bar.isVisible()
    assert w.continue_action.isEnabled() and LIMIT in _text(w) and _text(w).count("Red is") == 1
    assert "Nothing was added" in w.statusBar().currentMessage()


def test_a_failed_continue_keeps_the_cut_reply_and_says_why(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = fake_window(max_reply_tokens=8)
    _cut(qtbot, w, fake)
    fake.reply_error = EngineError("The engine could not read the prompt.")
    with qtbot.waitSignal(w.reply_failed, timeout=WAIT_MS):
        w.continue_action.trigger()
    settle(qtbot, w)
    box = error_box(w)
    assert box is not None and "Continue tries again" in box.text() + box.informativeText()
    assert [t["content"] for t in w.conversation.turns()] == ["Name a colour and say why.", "Red is"]
    assert w.input.toPlainText() == "" and w.continue_action.isEnabled()
    assert _record(w).messages[-1]["content"] == "Red is"


def test_with_the_real_engine_continue_extends_the_cut_reply(qtbot: QtBot, smollm2_path: Path) -> None:
    w = open_window(qtbot, smollm2_path, max_reply_tokens=8)
    try:
        with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as finished:
            w.chat.send_text("Count from one to twenty in words, separated by commas.")
        assert finished.args[0].finish_reason is FinishReason.LENGTH
        qtbot.waitUntil(lambda: w.ops.count == 0, timeout=WAIT_MS)
        cut, cut_stats = w.conversation.turns()[-1]["content"], w.conversation.stats()[1]
        assert w.continue_action.isEnabled()
        with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as finished:
            w.continue_action.trigger()
        assert finished.args[0].text and finished.args[0].n_reused > 0
        qtbot.waitUntil(lambda: w.ops.count == 0, timeout=WAIT_MS)
        assert len(w.conversation) == 2
        whole = w.conversation.turns()[-1]["content"]
        assert whole == cut + finished.args[0].text and len(whole) > len(cut)
        assert w.conversation.versions(1) == [whole] and not w.versions_bar.isVisible()
        assert w.conversation.stats()[1].n_tokens > cut_stats.n_tokens
        assert w.transcript.message_count() == 2
    finally:
        w.close()
