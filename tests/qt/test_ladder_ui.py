"""The ladder (f16 -> 8-bit -> 4-bit) in the window on the fake engine: each rung in the memory panel, the
context indicator, the banner and the transcript; compacting one step at a time; the KV mode's note and
the context memory budget in Settings (issue 14, the app)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtWidgets import QComboBox, QLabel
from pytestqt.qtbot import QtBot

from lazykv.core.engine.memory import MiB, context_for_budget, kv_bytes
from lazykv.core.engine.model_meta import read_model_meta
from lazykv.core.engine.types import KvStatus, StepEvent
from lazykv.core.idle import wants_idle_step
from lazykv.core.kinds import KvMode, KvPhase, StepStage
from lazykv.core.settings import Settings
from lazykv.qt.main_window import MainWindow, UiState
from lazykv.qt.settings_dialog import SettingsDialog
from lazykv.qt.stall_meter import StallMeter
from lazykv.qt.worker import Step
from tests.core.test_engine_budget import _meta
from tests.core.test_engine_snapshot import MEDIUM
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import FAST, WAIT_MS, chat, error_box, held, settle
from tests.qt.test_lazy_ui import GUI_STALL_BOUND_MS
from tests.qt.test_main_window import REPLY_TIMEOUT_MS, open_window
from tests.support.synthetic_gguf import SyntheticShape, write_llama_gguf

N_CTX = 1024  # the fake ladder's rungs: 16-bit 288 cells, 8-bit 542, 4-bit all 1,024
IDLE_MS = 1000  # long enough for a reply and its saves on the fake engine to finish first


def _compact(qtbot: QtBot, w: MainWindow, to: KvPhase) -> list[tuple[StepStage, str]]:
    """Compact one step with the toolbar's action; the banner's text at each event, as the user saw it."""
    seen: list[tuple[StepStage, str]] = []
    w.step_shown.connect(lambda e: seen.append((e.stage, w.banner.label.text())))
    with qtbot.waitSignal(w.converted, timeout=WAIT_MS) as converted:
        w.compact_action.trigger()
    assert converted.args == [True]
    qtbot.waitUntil(lambda: w.kv is not None and w.kv.phase is to, timeout=WAIT_MS)
    settle(qtbot, w)
    return seen


def test_a_ladder_conversation_shows_each_step_and_compacts_one_step_at_a_time(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = fake_window(kv_mode=KvMode.LADDER, n_ctx=N_CTX)
    fake.reply = ("word " * 200,)
    chat(qtbot, w, "Fill it")
    used = w.kv.n_cells_used
    assert 200 < used < 288
    panel, meter = w.memory_panel, w.context_meter.label
    assert panel.phase_label.text() == "16-bit (full precision) — ladder: goes to 8-bit at 288 tokens"
    assert panel.rung_label.text() == f"16-bit: {used} of 288 tokens · next 8-bit: 542"
    assert panel.cells_bar.format() == f"{used} / 288 (f16 view)"
    assert meter.text() == f"Context {used} / 1,024 tokens · 16-bit up to 288 · next 8-bit up to 542"
    assert "16-bit, then 8-bit, then 4-bit" in w.context_meter.toolTip()
    assert w.compact_action.isEnabled()
    assert w.compact_action.toolTip() == "Compact the context memory to 8-bit now"

    seen = _compact(qtbot, w, KvPhase.Q8_0)
    assert [stage for stage, _ in seen] == list(StepStage)
    assert seen[1][1] == "Compacting context memory to 8-bit… 50%"
    assert seen[-1][1] == f"Context memory compacted to 8-bit in 10 ms at token {used}"
    assert panel.phase_label.text() == "8-bit — ladder: goes to 4-bit at 542 tokens"
    assert panel.rung_label.text() == f"8-bit: {used} of 542 tokens · next 4-bit: 1,024"
    assert panel.cells_bar.format() == f"{used} / 542 (q8_0 view)"
    assert meter.text() == f"Context {used} / 1,024 tokens · 8-bit up to 542 · next 4-bit up to 1,024"
    assert w.compact_action.isEnabled()
    assert w.compact_action.toolTip() == "Compact the context memory to 4-bit now"

    seen = _compact(qtbot, w, KvPhase.Q4_0)
    assert seen[1][1] == "Compacting context memory to 4-bit… 50%"
    assert seen[-1][1] == f"Context memory compacted to 4-bit in 10 ms at token {used}"
    assert panel.phase_label.text() == "4-bit"
    assert panel.rung_label.text() == f"4-bit: {used} of 1,024 tokens · the last level"
    assert panel.cells_bar.format() == f"{used} / 1024 (q4_0)"
    assert meter.text() == f"Context {used} / 1,024 tokens · 4-bit"
    assert panel.conversion_label.text() == "2× (last 10 ms)"
    assert not w.compact_action.isEnabled() and "last level" in w.compact_action.toolTip()
    assert fake.calls.count("convert") == 2
    # each step is a line under the message it followed
    text = w.transcript.toPlainText()
    assert text.index(f"Context compacted to 8-bit here (at token {used})") \
        < text.index(f"Context compacted to 4-bit here (at token {used})")
    assert [m.label for m in w.conversation.markers()] == [f"Context compacted to {to} here (at token {used})"
                                                           for to in ("8-bit", "4-bit")]


def test_compacting_waits_for_the_step_on_its_way(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    """A second click while a step is on its way does not take the ladder a second step down."""
    w = fake_window(kv_mode=KvMode.LADDER, n_ctx=N_CTX)
    chat(qtbot, w, "Hello")
    held(qtbot, fake, w.compact_action.trigger)
    assert not w.compact_action.isEnabled()
    w.compact_action.trigger()  # ignored: disabled
    fake.release()
    qtbot.waitUntil(lambda: w.kv.phase is KvPhase.Q8_0, timeout=WAIT_MS)
    settle(qtbot, w)
    assert fake.calls.count("convert") == 1 and w.compact_action.isEnabled()


def test_the_idle_timer_does_not_add_a_step_to_a_manual_one(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = fake_window(kv_mode=KvMode.LADDER, n_ctx=N_CTX, idle_conversion=True,
                    timings=replace(FAST, idle_delay_ms=IDLE_MS))
    fake.reply = ("word " * 270,)  # the 16-bit rung (288 cells) over 90 % full: the idle timer starts
    chat(qtbot, w, "Fill it")
    assert w.chat.idle_conversion_pending
    # it fires while the manual step is held
    with qtbot.waitSignal(w.chat.idle_timer.timeout, timeout=WAIT_MS):
        held(qtbot, fake, w.compact_action.trigger)
    assert not w.chat.idle_conversion_pending
    assert sum(isinstance(r, Step) for r in w.engine.pending()) == 1
    fake.release()
    # the status after the step comes after its request is done: wait for it, not only for the requests
    qtbot.waitUntil(lambda: w.kv is not None and w.kv.phase is KvPhase.Q8_0, timeout=WAIT_MS)
    settle(qtbot, w)
    assert fake.calls.count("convert") == 1


def test_a_step_in_progress_names_its_target_in_the_panel_and_the_indicator(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    w = fake_window(kv_mode=KvMode.LADDER, n_ctx=N_CTX)
    chat(qtbot, w, "Hello")
    w.chat.show_step(StepEvent(StepStage.START, 0, 4, 300, target=KvPhase.Q4_0))
    assert w.memory_panel.phase_label.text() == "compacting to 4-bit…"
    assert w.memory_panel.rung_label.text() == "compacting to 4-bit… at 300 tokens"
    assert w.context_meter.label.text() == "Context 300 / 1,024 tokens · compacting to 4-bit…"
    assert w.banner.label.text() == "Compacting context memory to 4-bit… 0%"


def test_idle_compaction_takes_every_step_but_the_last() -> None:
    def status(phase: KvPhase, used: int, capacity: int, rungs: tuple[KvPhase, ...]) -> KvStatus:
        return KvStatus(KvMode.LADDER, phase, used, capacity, 1024, 1, rungs=rungs, n_cells_next=1024)

    ladder = (KvPhase.F16, KvPhase.Q8_0, KvPhase.Q4_0)
    assert wants_idle_step(status(KvPhase.F16, 270, 288, ladder))
    assert not wants_idle_step(status(KvPhase.F16, 200, 288, ladder))
    assert wants_idle_step(status(KvPhase.Q8_0, 500, 542, ladder))
    assert not wants_idle_step(status(KvPhase.Q4_0, 1000, 1024, ladder))
    assert not wants_idle_step(status(KvPhase.Q8_0, 1000, 1024, ()))  # a plain q8_0 cache


def test_the_kv_mode_says_what_the_ladder_trades(qtbot: QtBot) -> None:
    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    combo, note = dialog.editors["kv_mode"], dialog.findChild(QLabel, "kv_mode-note")
    assert isinstance(combo, QComboBox) and note is not None
    assert combo.itemText(combo.findData(KvMode.LADDER)) == "ladder (f16 → 8-bit → 4-bit)"
    assert note.text().startswith("Full f16 precision until")  # lazy, the default
    dialog.set_value("kv_mode", KvMode.LADDER)
    assert note.text() == ("f16, then 8-bit, then 4-bit, each level when the one before is full: about 3.5× "
                           "the tokens of f16 in the same memory; the last, 4-bit level trades some quality "
                           "for length.")
    dialog.set_value("kv_mode", KvMode.F16)
    assert note.text() == "Full precision throughout: the most memory per token."


def test_settings_show_the_tokens_each_mode_holds_in_the_budget(qtbot: QtBot) -> None:
    dialog = SettingsDialog(Settings(), meta=_meta(n_ctx_train=131072))  # Llama-3-8B's KV shape
    qtbot.addWidget(dialog)
    label, n_ctx = dialog.budget_label, dialog.editors["n_ctx"]
    # no budget: the context length's memory, in each mode
    # the steps the memory panel will show (issue 30), and what the recent window takes (issue 28): the
    # lazy modes keep it in the same memory, a plain f16 or q8_0 cache has none
    # (the window's 128 rows per layer, the 4 sinks', and the row that takes a batch's tokens it does not
    # keep)
    # then the chosen mode's tokens per GiB and quality, the figures estimate and the Models page give
    lazy = f"lazy q8_0 (f16 until half full): {{}} tokens per GiB · {KvMode.LAZY.quality}"
    assert label.text() == ("In 288.6 MiB of KV memory: f16 2,304 · q8_0 4,096 · <b>lazy 4,096</b> · "
                            f"ladder 7,680 tokens<br>{lazy.format('14,532')}<br>lazy levels: 16-bit up to "
                            "2,048 tokens, then 8-bit up to 4,096<br>16-bit beside the cache: the last 128 "
                            "tokens and the first 4 take 16.6 MiB (6% of the KV memory).")
    dialog.set_value("kv_recent", 0)  # no recent window: the sinks stay
    sinks = "<br>16-bit beside the cache: the first 4 tokens take 640.0 KiB (under 1% of the KV memory)."
    assert label.text() == ("In 272.6 MiB of KV memory: f16 2,048 · q8_0 4,096 · <b>lazy 4,096</b> · "
                            f"ladder 7,680 tokens<br>{lazy.format('15,385')}<br>lazy levels: 16-bit up to "
                            f"2,048 tokens, then 8-bit up to 4,096{sinks}")
    assert n_ctx.isEnabled()
    dialog.set_value("kv_mode", KvMode.LADDER)
    dialog.set_value("context_budget_mb", 2048)
    assert label.text() == ("In 2.0 GiB of KV memory: f16 16,384 · q8_0 30,720 · lazy 30,720 · "
                            "<b>ladder 58,112</b> tokens<br>ladder (f16 → 8-bit → 4-bit): 29,118 tokens per "
                            f"GiB · {KvMode.LADDER.quality}<br>ladder levels: 16-bit up to 16,128 tokens, "
                            f"then 8-bit up to 30,720, then 4-bit up to 58,112{sinks}")
    assert not n_ctx.isEnabled() and "budget sets the length" in n_ctx.toolTip()
    assert "(58,112 tokens)" in dialog.estimate_label.text() and dialog.ok_button.isEnabled()
    dialog.set_value("context_budget_mb", 8)  # 256 tokens of this model's ladder cache: 9 MiB, the sinks 0.6
    assert "8.0 MiB holds fewer than 256 tokens with this KV cache: 256 tokens need 9.6 MiB" in label.text()
    assert not dialog.ok_button.isEnabled()
    dialog.set_value("context_budget_mb", 0)
    assert n_ctx.isEnabled() and dialog.ok_button.isEnabled()
    capped = SettingsDialog(Settings(), meta=_meta(n_ctx_train=8192))
    qtbot.addWidget(capped)
    capped.set_value("context_budget_mb", 2048)
    assert "ladder 8,192 (the model's limit)" in capped.budget_label.text()
    no_model = SettingsDialog(Settings())
    qtbot.addWidget(no_model)
    assert no_model.budget_label.text() == "Load a model to see how many tokens fit in each KV mode."


def test_a_budget_loads_the_context_it_holds_and_survives_a_restart(
    qtbot: QtBot, fake_window: FakeWindow, fake_model: Path
) -> None:
    w = fake_window(kv_recent=0)  # the budget holds the cache alone (the window: the test above)
    meta = read_model_meta(fake_model)
    w.settings_action.trigger()
    dialog = w.settings_dialog
    dialog.set_value("kv_mode", KvMode.LADDER)
    dialog.set_value("context_budget_mb", 1)
    expected = context_for_budget(meta, MiB, KvMode.LADDER)
    assert expected == 1792 and kv_bytes(meta, expected, KvMode.LADDER) <= MiB  # 1,024 values a token
    with qtbot.waitSignal(w.model_loaded, timeout=WAIT_MS) as loaded:
        dialog.accept()
    assert (loaded.args[0].n_ctx, loaded.args[0].kv_mode) == (expected, KvMode.LADDER)
    settle(qtbot, w)
    assert f"ctx {expected}, KV ladder" in w.memory_panel.estimate_label.text()
    assert "<b>ladder 1,792</b>" in w.memory_panel.estimate_label.toolTip()  # on demand (issue 30)
    w.close()
    saved = Settings.load()
    assert (saved["kv_mode"], saved["context_budget_mb"]) == ("ladder", 1)
    again = MainWindow(saved, session=FakeSession(), timings=w.timings)  # type: ignore[arg-type]
    qtbot.addWidget(again)
    with qtbot.waitSignal(again.model_loaded, timeout=WAIT_MS) as reloaded:
        again.open_configured_model()
    assert reloaded.args[0].n_ctx == expected
    again.close()


def test_too_small_a_budget_is_said_in_one_sentence_and_the_model_stays(
    qtbot: QtBot, fake_window: FakeWindow, tmp_path: Path
) -> None:
    """Opening another model the budget cannot hold (the dialog measured the model loaded then)."""
    w = fake_window(kv_mode=KvMode.F16, context_budget_mb=1)
    before = w.model_info
    # 2 layers x 8 KV heads x (128 + 128): 8 KiB a token in f16, 2 MiB for the smallest context
    wide = write_llama_gguf(tmp_path / "wide.gguf", SyntheticShape(n_head=8, n_head_kv=8, embd=256))
    w.loading.open_model(wide)
    qtbot.waitUntil(lambda: error_box(w) is not None, timeout=WAIT_MS)
    assert ("1.0 MiB of context memory holds fewer than 256 tokens of wide.gguf with the f16 KV cache: 256 "
            "tokens need 2.0 MiB. Raise the budget, or set it to 0 to use the context length.") \
        in error_box(w).text()
    settle(qtbot, w)
    assert w.model_info is before and w.state is UiState.READY


def test_a_ladder_conversation_on_the_real_engine_shows_each_step(
    qtbot: QtBot, smollm2_path: Path
) -> None:
    """The real engine's steps (16-bit 256 cells, 8-bit 512, 4-bit 1,024 at n_ctx 1,024) as the window
    shows them: filled past the 16-bit rung by a prompt, then compacted to 4-bit with the action; the GUI
    thread never waits for either."""
    w = open_window(qtbot, smollm2_path, kv_mode=KvMode.LADDER, max_reply_tokens=8)
    try:
        qtbot.waitUntil(lambda: w.kv is not None)
        assert w.memory_panel.rung_label.text() == "16-bit: 0 of 256 tokens · next 8-bit: 512"
        seen: list[StepEvent] = []
        w.step_shown.connect(seen.append)
        meter = StallMeter()
        meter.start()
        with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as finished:
            w.chat.send_text(MEDIUM)  # ~330 tokens: past the 16-bit rung
        qtbot.waitUntil(lambda: w.kv.phase is KvPhase.Q8_0 and w.ops.count == 0, timeout=WAIT_MS)
        used = w.kv.n_cells_used
        assert finished.args[0].text.strip() and 256 < used < 512
        assert {e.target for e in seen} == {KvPhase.Q8_0}
        assert w.memory_panel.rung_label.text() == f"8-bit: {used} of 512 tokens · next 4-bit: 1,024"
        assert w.context_meter.label.text() == (f"Context {used} / 1,024 tokens · 8-bit up to 512 · "
                                                "next 4-bit up to 1,024")
        with qtbot.waitSignal(w.converted, timeout=REPLY_TIMEOUT_MS):
            w.compact_action.trigger()
        qtbot.waitUntil(lambda: w.kv.phase is KvPhase.Q4_0, timeout=WAIT_MS)
        meter.stop()
        assert seen[-1].target is KvPhase.Q4_0 and seen[-1].stage is StepStage.END
        assert w.memory_panel.rung_label.text() == f"4-bit: {used} of 1,024 tokens · the last level"
        assert w.banner.label.text().startswith("Context memory compacted to 4-bit in ")
        assert not w.compact_action.isEnabled()
        with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as again:
            w.chat.send_text(MEDIUM)  # a long prompt read on the 4-bit rung
        assert again.args[0].text.strip()
        assert meter.max_gap_ms < GUI_STALL_BOUND_MS
    finally:
        w.close()


def test_compact_snapshots_setting_saves_at_the_last_step(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    """Off by default (a snapshot keeps the rung the chat is on); on, every save asks for the last rung."""
    assert Settings()["compact_snapshots"] is False
    for compact, want in ((False, "capture"), (True, "capture-compact")):
        w = fake_window(kv_mode=KvMode.LADDER, n_ctx=N_CTX, snapshot_encryption="keyring",
                        compact_snapshots=compact)
        qtbot.waitUntil(lambda w=w: w.conversations.snapshots_on, timeout=WAIT_MS)
        fake.calls.clear()
        with qtbot.waitSignal(w.conversations.snapshot_saved, timeout=WAIT_MS):
            w.chat.send_text("Save me")
        assert [c for c in fake.calls if c.startswith("capture")] == [want]
