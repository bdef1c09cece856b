"""The lazy q8 cache made visible: conversion progress, memory panel, settings (the conversion end to end)."""

from __future__ import annotations

import json
from pathlib import Path

from pytestqt.qtbot import QtBot

from lazykv.core.engine.types import StepEvent
from lazykv.core.kinds import KvMode, KvPhase, StepStage
from lazykv.core.settings import SETTINGS, Settings
from lazykv.qt.main_window import MainWindow, UiState
from lazykv.qt.settings_dialog import EDITORS, SettingsDialog
from lazykv.qt.stall_meter import StallMeter
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import FAST, WAIT_MS, error_box, settle
from tests.qt.test_main_window import open_window

# 650 tokens for n_ctx 1024, whose lazy f16 view holds 512 cells
LONG_MESSAGE = "Here is a list: " + ", ".join(f"item {i}" for i in range(120)) + ". Which item comes first?"
GUI_STALL_BOUND_MS = 1000  # loose: a blocked GUI thread would show the conversion or a decode step here


def test_a_conversion_during_a_reply_shows_progress_then_the_phase_change(
    qtbot: QtBot, smollm2_path: Path
) -> None:
    w = open_window(qtbot, smollm2_path, max_reply_tokens=16)
    try:
        qtbot.waitUntil(lambda: w.kv is not None)
        assert w.memory_panel.phase_label.text().startswith("16-bit")
        assert "/ 512 (f16 view)" in w.memory_panel.cells_bar.format()
        seen: list[tuple[StepEvent, UiState, bool]] = []
        w.step_shown.connect(lambda e: seen.append((e, w.state, w.banner.isVisible())))
        meter = StallMeter()
        meter.start()
        with qtbot.waitSignal(w.reply_finished, timeout=60_000) as finished:
            w.chat.send_text(LONG_MESSAGE)
        meter.stop()
        assert 512 < finished.args[0].n_prompt < 1000 and finished.args[0].text
        stages = [e.stage for e, _, _ in seen]
        assert stages[0] is StepStage.START and stages[-1] is StepStage.END and len(stages) >= 3
        assert {state for _, state, _ in seen} == {UiState.REPLYING} and all(shown for _, _, shown in seen)
        assert "8-bit" in w.banner.label.text() and "ms at token" in w.banner.label.text()
        qtbot.waitUntil(lambda: w.kv.phase is KvPhase.Q8_0, timeout=10_000)
        assert w.memory_panel.phase_label.text().startswith("8-bit")
        assert "/ 1024 (q8_0)" in w.memory_panel.cells_bar.format()
        # converted while the prompt was read: a line between the user's message and the reply
        text = w.transcript.toPlainText()
        assert text.index(LONG_MESSAGE[-20:]) < text.index("Context compacted to 8-bit here (at token") \
            < text.index(finished.args[0].text.strip()[:20])
        [marker] = w.conversation.markers()
        assert marker.message_index == 0
        assert meter.max_gap_ms < GUI_STALL_BOUND_MS
    finally:
        w.close()


def test_manual_compaction_and_the_idle_setting(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = fake_window(idle_conversion=False)
    fake.reply = ("word " * 120,)
    with qtbot.waitSignal(w.reply_finished, timeout=WAIT_MS):
        w.chat.send_text("Fill it")
    settle(qtbot, w)
    assert not w.chat.idle_conversion_pending and "convert" not in fake.calls
    assert w.compact_action.isEnabled()
    with qtbot.waitSignal(w.converted, timeout=WAIT_MS):
        w.compact_action.trigger()
    # the status that follows the conversion is its own request: wait for it, not for a fixed moment
    qtbot.waitUntil(lambda: w.kv is not None and w.kv.phase is KvPhase.Q8_0, timeout=WAIT_MS)


def test_settings_dialog_is_derived_from_the_declaration_and_changes_survive_a_restart(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession, fake_model: Path
) -> None:
    w = fake_window()
    w.settings_action.trigger()
    dialog = w.settings_dialog
    assert isinstance(dialog, SettingsDialog) and dialog.isVisible()
    assert set(dialog.editors) == {s.name for s in SETTINGS if s.in_dialog}
    assert {s.kind for s in SETTINGS if s.in_dialog} <= set(EDITORS)
    assert "needs about" in dialog.estimate_label.text()
    dialog.set_value("n_ctx", 2048)
    dialog.set_value("kv_mode", KvMode.Q8_0)
    dialog.set_value("temperature", 0.5)
    with qtbot.waitSignal(w.model_loaded, timeout=WAIT_MS) as loaded:
        dialog.accept()
    assert (loaded.args[0].n_ctx, loaded.args[0].kv_mode) == (2048, KvMode.Q8_0)
    w.close()  # waits for the settings write

    saved = Settings.load()
    assert (saved["n_ctx"], saved["kv_mode"], saved["temperature"]) == (2048, "q8_0", 0.5)
    assert saved["model_path"] == str(fake_model) and saved["recent_models"] == [str(fake_model)]
    again = MainWindow(saved, session=FakeSession(), timings=FAST)  # type: ignore[arg-type]
    qtbot.addWidget(again)
    with qtbot.waitSignal(again.model_loaded, timeout=WAIT_MS) as reloaded:
        again.open_configured_model()
    assert (reloaded.args[0].n_ctx, reloaded.args[0].kv_mode) == (2048, KvMode.Q8_0)
    again.close()


def test_a_damaged_settings_file_is_reported_and_defaults_are_used(
    qtbot: QtBot, _config_dir: Path, fake: FakeSession
) -> None:
    damaged = {"schema_version": 2, "settings": {"n_ctx": "big"}}
    (_config_dir / "settings.json").write_text(json.dumps(damaged))
    w = MainWindow(session=fake, timings=FAST)  # type: ignore[arg-type]
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: error_box(w) is not None)
    assert "n_ctx" in error_box(w).text()
    assert w.setting("n_ctx") == 4096
    w.close()
