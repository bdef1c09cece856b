"""What is on screen agrees with itself and with the engine (issue 30, defects 4-9), on the fake engine."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QInputDialog, QLabel
from pytestqt.qtbot import QtBot

from lazykv.core.engine.memory import plan_context
from lazykv.core.engine.model_meta import read_model_meta
from lazykv.core.engine.planner import estimate
from lazykv.core.engine.types import StepEvent
from lazykv.core.kinds import FinishReason, KvMode, KvPhase, StepStage
from lazykv.core.settings import Settings
from lazykv.qt.memory_panel import MemoryPanel
from lazykv.qt.settings_dialog import SettingsDialog
from lazykv.qt.ui_state import UiState
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import FAST, WAIT_MS, chat, end_private, held, saved_then_new_chat, settle, stored


def test_settings_and_the_memory_panel_give_the_ladder_s_steps_from_one_plan(
    qtbot: QtBot, fake_model: Path
) -> None:
    """Defect 7: ladder, 512 tokens: Settings said "f16 0" where the panel showed a 144-token 16-bit rung;
    both now show the planner's steps (the engine's own, tests/core/test_step_plan.py)."""
    meta = read_model_meta(fake_model)
    dialog = SettingsDialog(Settings(), meta)
    qtbot.addWidget(dialog)
    dialog.set_value("kv_mode", KvMode.LADDER)
    dialog.set_value("kv_recent", 0)  # the cache's own memory: the window would take half of it here
    dialog.set_value("n_ctx", 512)
    steps = "ladder levels: 16-bit up to 144 tokens, then 8-bit up to 256, then 4-bit up to 512"
    assert steps in dialog.budget_label.text()
    assert "f16 0 " not in dialog.budget_label.text() and "f16 under 256" in dialog.budget_label.text()
    panel = MemoryPanel()
    qtbot.addWidget(panel)
    panel.set_estimate("fake.gguf", estimate(meta, 512, KvMode.LADDER),
                       plan=plan_context(meta, 512, KvMode.LADDER))
    assert steps in panel.estimate_label.text()


def test_new_private_chat_is_an_empty_chat_that_saves_nothing_until_it_ends(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    """Defect 2's entry point: File > New private chat (Ctrl+Shift+N); unticking Private ends it (a new,
    empty chat), so what was never saved is never on screen with what is."""
    w = fake_window()
    chat(qtbot, w, "A saved question")
    assert w.new_private_action.shortcut() == QKeySequence("Ctrl+Shift+N")
    assert w.new_private_action in w.menuBar().actions()[0].menu().actions()  # the File menu
    w.new_private_action.trigger()
    settle(qtbot, w)
    assert len(w.conversation) == 0 and w.conversations.private and w.private_action.isChecked()
    assert w.conversations_panel.selected_id() is None
    chat(qtbot, w, "A private question")
    assert [title for title, _ in stored()] == ["A saved question"]
    w.conversations_panel.private_box.click()
    end_private(qtbot, w, "discard")  # asked first (issue 45.6)
    settle(qtbot, w)
    assert not w.conversations.private and len(w.conversation) == 0
    assert "not saved" in w.statusBar().currentMessage()
    result = chat(qtbot, w, "Public again")
    assert result.n_reused == 0  # the cache was emptied with the private chat
    assert [title for title, _ in stored()] == ["Public again", "A saved question"]


def test_a_delete_says_what_went_beside_its_undo_which_stays_on_hand_and_reopens_the_chat(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    """Defect 4: the Undo button covered the start of "Deleted …"; Undo expired after 10 s with no other
    way back; an undone chat was listed but not reopened, the status bar still said "Deleted"; the
    empty chat after a delete kept the deleted chat's "Resumed from the snapshot" banner."""
    w = fake_window(timings=replace(FAST, undo_ms=100))
    conv_id = saved_then_new_chat(qtbot, w, "Giraffes are tall")
    with qtbot.waitSignal(w.conversations.opened, timeout=WAIT_MS):
        w.conversations.open(conv_id)
    settle(qtbot, w)
    assert w.banner.isVisible() and "Resumed from the snapshot" in w.banner.label.text()

    w.conversations.delete(conv_id)
    settle(qtbot, w)
    assert len(w.conversation) == 0 and not w.banner.isVisible() and not w.chat.resume_note
    text, button = w.findChild(QLabel, "undo-text"), w.conversations.undo_button
    assert text is not None and text.text() == "Deleted “Giraffes are tall”"
    assert text.isVisible() and button.isVisible()
    assert text.geometry().right() < button.geometry().left()  # side by side, never on top
    assert w.undo_delete_action.isEnabled() and "Giraffes" in w.undo_delete_action.text()

    qtbot.waitUntil(lambda: not button.isVisible(), timeout=WAIT_MS)  # the status bar's offer expired
    assert w.undo_delete_action.isEnabled()  # the menu's stays
    assert w.undo_delete_action.shortcut() == QKeySequence(QKeySequence.StandardKey.Undo)
    w.undo_delete_action.trigger()
    qtbot.waitUntil(lambda: w.conversations.current == conv_id, timeout=WAIT_MS)
    settle(qtbot, w)
    assert [m["content"] for m in w.conversation.turns()][0] == "Giraffes are tall"
    assert w.conversations_panel.selected_id() == conv_id
    assert "Deleted" not in w.statusBar().currentMessage() and not text.isVisible()
    assert not w.undo_delete_action.isEnabled()


def test_paging_to_an_earlier_reply_shows_its_own_speed_and_how_it_ended(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    """Defect 5: Reply 1/2 lost its speed line and its "Reply stopped" mark once paged back to."""
    w = fake_window()
    fake.reply = ("Red", " is", " warm.")
    fake.finish_reason = FinishReason.LENGTH  # the first reply is cut off
    chat(qtbot, w, "Name a colour.")
    first = w.conversation.stats()[1]
    assert first.note.startswith("Reply stopped") and first.n_tokens == 3
    fake.reply, fake.finish_reason = ("Blue.",), FinishReason.STOP
    with qtbot.waitSignal(w.reply_finished, timeout=WAIT_MS):
        w.chat.regenerate()
    settle(qtbot, w)
    assert w.conversation.stats()[1].n_tokens == 1 and not w.conversation.stats()[1].note

    w.previous_version.click()
    assert w.versions_label.text() == "Reply 1/2"
    assert w.conversation.stats()[1] == first
    shown = w.transcript.toPlainText()
    assert "Reply stopped" in shown and first.summary() in shown
    w.next_version.click()
    assert w.conversation.stats()[1].n_tokens == 1 and "Reply stopped" not in w.transcript.toPlainText()


def test_f2_renames_from_the_message_box_and_esc_leaves_edit_mode(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    """Defect 9: F2 worked only with the list focused (in the message box it did nothing and the caret
    went); Esc did not leave edit mode."""
    w = fake_window()
    chat(qtbot, w, "A chat to rename")
    w.activateWindow()
    qtbot.waitActive(w)
    w.input.setFocus()
    qtbot.waitUntil(w.input.hasFocus)
    qtbot.keyClick(w.input, Qt.Key.Key_F2)
    dialog = w.findChild(QInputDialog, "rename-dialog")
    assert dialog is not None and dialog.isVisible() and dialog.textValue() == "A chat to rename"
    dialog.reject()
    qtbot.waitUntil(w.input.hasFocus)  # the caret is back in the message box

    w.chat.edit_message(0)
    assert w.edit_bar.isVisible()
    qtbot.keyClick(w.input, Qt.Key.Key_Escape)
    assert not w.edit_bar.isVisible()
    w.chat.send_text("Not an edit")
    qtbot.waitUntil(lambda: w.state.name == "READY", timeout=WAIT_MS)
    settle(qtbot, w)
    assert [t["content"] for t in w.conversation.turns()][0] == "A chat to rename"  # nothing replaced


def test_a_step_taken_before_the_step_was_full_says_what_did_not_fit(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    """Defect 6: after a reload the conversation read again did not fit the 16-bit rung, and the marker
    said "Context compacted to 8-bit here (at token 0)"; it says what happened now."""
    w = fake_window(kv_mode=KvMode.LAZY)
    chat(qtbot, w, "Hello there")
    qtbot.waitUntil(lambda: w.kv is not None and w.kv.rungs != (), timeout=WAIT_MS)
    capacity = w.kv.n_cells_capacity
    w.set_state(UiState.REPLYING)  # the prompt is being read: the reply has no text yet
    w._reply_text = ""
    for stage in (StepStage.START, StepStage.END):  # as the engine reports it
        w.chat.show_step(StepEvent(stage, 1, 1, 0, 0.01, KvPhase.Q8_0))
    w.set_state(UiState.READY)
    [marker] = w.conversation.markers()
    assert marker.label == ("Context memory went to 8-bit before the conversation was read: it no longer "
                            f"fit the 16-bit level ({capacity:,} tokens)")
    assert "at token 0" not in w.transcript.toPlainText()
    for stage in (StepStage.START, StepStage.END):  # idle or Compact now: early by choice
        w.chat.show_step(StepEvent(stage, 1, 1, 20, 0.01, KvPhase.Q8_0))
    assert w.conversation.markers()[-1].label == "Context compacted to 8-bit here (at token 20)"


def test_a_small_window_squeezes_nothing_onto_anything_and_a_large_one_gives_the_room_back(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    """Defect 8: at the minimum size the memory panel's rows overlapped and the status bar's texts ran
    into each other; enlarged again, the panel stayed narrow, the Cells bar's text wrapped in it."""
    w = fake_window(kv_mode=KvMode.LADDER)
    chat(qtbot, w, "Hello there")
    w.resize(1300, 800)
    qtbot.wait(50)
    roomy_dock = w.memory_dock.width()
    w.model_label.setText("A-model-with-a-long-file-name-from-a-hub.Q4_K_M · llama · 135M params · ctx 4096")
    w.resize(w.minimumSizeHint())
    qtbot.waitUntil(lambda: w.size() == w.minimumSizeHint(), timeout=WAIT_MS)
    qtbot.wait(50)
    w.statusBar().showMessage("Prompt 388 tokens, 375 reused from the cache")

    panel = w.memory_panel
    rows = [panel.phase_label, panel.rung_label, panel.cells_bar, panel.kv_label, panel.conversion_label,
            panel.weights_label, panel.rss_label, panel.graph, panel.estimate_label]
    for label in (r for r in rows if isinstance(r, QLabel) and r.wordWrap()):
        assert label.height() >= label.heightForWidth(label.width()), label.text()  # not squashed
    for upper, lower in zip(rows, rows[1:], strict=False):
        assert upper.geometry().bottom() < lower.geometry().top(), (upper, lower)
    label = w.model_label
    assert label.fontMetrics().horizontalAdvance(label.shown_text()) <= label.contentsRect().width()
    message_end = w.statusBar().fontMetrics().horizontalAdvance(w.statusBar().currentMessage())
    assert message_end < label.geometry().left() or label.shown_text() != label.text()

    w.resize(1300, 800)
    qtbot.waitUntil(lambda: w.memory_dock.width() >= roomy_dock, timeout=WAIT_MS)
    assert not panel.cells_bar.isTextVisible()  # the figures are in the line above it, never under the fill


def test_paging_to_another_reply_puts_it_in_the_cache_and_the_context_indicator(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    """Defect 5: the context indicator kept the other reply's token count until the next send: the
    cache now holds the version shown (the common prefix kept, the rest read)."""
    w = fake_window()
    fake.reply = ("A short one.",)
    chat(qtbot, w, "Name a colour.")
    short = w.kv.n_cells_used
    fake.reply = ("A much longer reply with many more words in it than the first.",)
    with qtbot.waitSignal(w.reply_finished, timeout=WAIT_MS):
        w.chat.regenerate()
    settle(qtbot, w)
    long = w.kv.n_cells_used
    assert long > short + 5
    w.previous_version.click()
    settle(qtbot, w)
    # the reply's closing (the template's end of turn) is in it now: a token or so more than at the reply
    qtbot.waitUntil(lambda: short <= w.kv.n_cells_used <= short + 2, timeout=WAIT_MS)
    assert f"Context {w.kv.n_cells_used:,} /" in w.context_meter.label.text()
    assert "sync" in fake.calls


def test_a_chat_chosen_while_a_reply_streams_is_refused_and_the_list_shows_the_chat_on_screen(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    """Defect 3's other half: the list never highlights a chat other than the one on screen."""
    w = fake_window()
    other = saved_then_new_chat(qtbot, w, "The other chat")
    chat(qtbot, w, "This chat")
    current = w.conversations.current
    held(qtbot, fake, lambda: w.chat.send_text("A reply that takes a while"))
    w.conversations_panel.select(other)  # as a click does, before the window hears of it
    w.conversations_panel.open_requested.emit(other)
    assert w.conversations_panel.selected_id() == current and w.conversations.current == current
    assert "reply has ended" in w.statusBar().currentMessage()
    fake.release()
    qtbot.waitUntil(lambda: w.state.name == "READY", timeout=WAIT_MS)
    settle(qtbot, w)
