"""The lazy q8 cache made visible: conversion progress, memory panel, idle-time conversion, settings."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from lazykv.core.settings import SETTINGS, Settings
from lazykv.qt.main_window import MainWindow, UiState
from lazykv.qt.settings_dialog import SettingsDialog
from lazykv.qt.stall_meter import StallMeter
from tests.qt.test_main_window import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, Relay, open_window

# prompts of known size for n_ctx 1024, whose lazy f16 view holds 512 cells; 650 tokens here:
LONG_MESSAGE = "Here is a list: " + ", ".join(f"item {i}" for i in range(120)) + ". Which item comes first?"
NEARLY_FULL = "Summarise: " + "word " * 450  # ~480 cells with the reply: >= 90% of the view, still f16
GUI_STALL_BOUND_MS = 1000  # loose: a blocked GUI thread would show the conversion or a decode step here


def chat(qtbot: QtBot, w: MainWindow, text: str) -> object:
    finished = Relay(w.worker.reply_finished)
    with qtbot.waitSignal(finished.fired, timeout=REPLY_TIMEOUT_MS):
        w.send_text(text)
    return finished.calls[-1][0]


def test_conversion_during_a_reply_shows_progress_then_the_phase_change(
    qtbot: QtBot, smollm2_path: Path
) -> None:
    w = open_window(qtbot, smollm2_path, max_reply_tokens=16)
    try:
        qtbot.waitUntil(lambda: w.kv is not None)
        assert w.memory_panel.phase_label.text().startswith("f16")
        assert "/ 512 (f16 view)" in w.memory_panel.cells_bar.format()
        events = Relay(w.worker.conversion)
        seen_banner: list[bool] = []
        events.fired.connect(lambda _: seen_banner.append(w.banner.isVisible()))
        meter = StallMeter()
        meter.start()
        result = chat(qtbot, w, LONG_MESSAGE)
        meter.stop()
        assert 512 < result.n_prompt < 1000 and result.text
        stages = [e.stage for e, _ in w.conversions]
        assert stages[0] == "start" and stages[-1] == "end" and len(stages) >= 3
        assert {state for _, state in w.conversions} == {UiState.REPLYING}
        assert all(seen_banner)
        assert "8-bit" in w.banner.label.text() and "ms at token" in w.banner.label.text()
        qtbot.waitUntil(lambda: not w.banner.isVisible(), timeout=10_000)
        assert w.memory_panel.phase_label.text().startswith("q8_0")
        assert "/ 1024 (q8_0)" in w.memory_panel.cells_bar.format()
        assert "1×" in w.memory_panel.conversion_label.text()
        assert "8-bit KV from here, token" in w.transcript.toPlainText()
        [marker] = w.conversation.markers()
        assert marker.message_index == 1
        assert meter.max_gap_ms < GUI_STALL_BOUND_MS
    finally:
        w.close()


def test_idle_conversion_waits_for_idle_and_never_lands_in_a_reply(qtbot: QtBot, smollm2_path: Path) -> None:
    w = open_window(qtbot, smollm2_path, max_reply_tokens=8, idle_conversion=True)
    try:
        chat(qtbot, w, NEARLY_FULL)
        qtbot.waitUntil(lambda: w.kv.fill >= 0.9, timeout=5000)  # the status after the reply
        assert w.kv.phase == "f16"
        assert w._idle_timer.isActive() and w.conversions == []
        chat(qtbot, w, "Thanks")  # sent within the idle delay: the timer stops, the reply fits in f16
        assert w.kv.phase == "f16"
        ended = Relay(w.worker.conversion)
        qtbot.waitUntil(lambda: any(e.stage == "end" for (e,) in ended.calls), timeout=10_000)
        assert {state for _, state in w.conversions} == {UiState.READY}
        qtbot.waitUntil(lambda: w.kv.phase == "q8_0")
        assert "8-bit KV from here" in w.transcript.toPlainText()
    finally:
        w.close()


def test_idle_conversion_is_a_setting(qtbot: QtBot, smollm2_path: Path) -> None:
    w = open_window(qtbot, smollm2_path, max_reply_tokens=8, idle_conversion=False)
    try:
        chat(qtbot, w, NEARLY_FULL)
        assert not w._idle_timer.isActive()
        qtbot.waitUntil(w.compact_action.isEnabled, timeout=5000)
        ended = Relay(w.worker.conversion)
        with qtbot.waitSignal(ended.fired, timeout=10_000, check_params_cb=lambda e: e[0].stage == "end"):
            w.compact_action.trigger()
    finally:
        w.close()


def test_settings_dialog_is_derived_from_the_declaration_and_changes_survive_a_restart(
    qtbot: QtBot, smollm2_path: Path
) -> None:
    w = open_window(qtbot, smollm2_path)
    try:
        w.settings_action.trigger()
        dialog = w.settings_dialog
        assert isinstance(dialog, SettingsDialog) and dialog.isVisible()
        assert set(dialog.editors) == {s.name for s in SETTINGS if s.in_dialog}
        assert "needs about" in dialog.estimate_label.text()
        dialog.set_value("n_ctx", 2048)
        dialog.set_value("kv_mode", "q8_0")
        dialog.set_value("temperature", 0.5)
        loaded = Relay(w.worker.model_loaded)
        with qtbot.waitSignal(loaded.fired, timeout=LOAD_TIMEOUT_MS):
            dialog.accept()
        info = loaded.calls[0][0]
        assert (info.n_ctx, info.kv_mode) == (2048, "q8_0")
        qtbot.waitUntil(lambda: w.kv is not None and w.kv.kv_mode == "q8_0")
        assert w.memory_panel.phase_label.text().startswith("q8_0")
    finally:
        w.close()  # waits for the settings write

    saved = Settings.load()
    assert (saved["n_ctx"], saved["kv_mode"], saved["temperature"]) == (2048, "q8_0", 0.5)
    assert saved["model_path"] == str(smollm2_path) and saved["recent_models"] == [str(smollm2_path)]
    again = MainWindow(saved)
    qtbot.addWidget(again)
    loaded = Relay(again.worker.model_loaded)
    with qtbot.waitSignal(loaded.fired, timeout=LOAD_TIMEOUT_MS):
        again.open_configured_model()
    assert (loaded.calls[0][0].n_ctx, loaded.calls[0][0].kv_mode) == (2048, "q8_0")
    again.close()


def test_a_damaged_settings_file_is_reported_and_defaults_are_used(qtbot: QtBot, _config_dir: Path) -> None:
    damaged = {"schema_version": 2, "settings": {"n_ctx": "big"}}
    (_config_dir / "settings.json").write_text(json.dumps(damaged))
    w = MainWindow()
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: w.findChild(QMessageBox, "error-box") is not None)
    assert "n_ctx" in w.findChild(QMessageBox, "error-box").text()
    assert w.setting("n_ctx") == 4096
    w.close()
