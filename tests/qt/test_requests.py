"""Engine requests with identity, on the fake engine: each race of issue 16 in milliseconds."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.errors import EngineError
from lazykv.core.kinds import DEFAULT_KV_MODE
from lazykv.core.settings import SETTINGS_BY_NAME, Settings, load_spec
from lazykv.qt.main_window import MainWindow, Timings, UiState
from lazykv.qt.worker import Step
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import FAST, WAIT_MS, chat, error_box, held, settle, stored


def test_a_stop_after_the_reply_ended_never_reaches_the_next_reply(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    """Stop pressed after the worker finished the reply but before the window heard of it."""
    w = fake_window()
    fake.after_reply.clear()
    w.chat.send_text("Hello")
    assert fake.after_reply.wait(2)  # the worker is done with the reply; the window has not seen it yet
    assert w.state is UiState.REPLYING
    w.stop_button.click()
    with qtbot.waitSignal(w.reply_finished, timeout=WAIT_MS) as first:
        pass
    assert not first.args[0].cancelled
    second = chat(qtbot, w, "And again")
    assert not second.cancelled and second.text == "Fake reply text."


def test_stop_cancels_the_prompt_being_read(qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession) -> None:
    w = fake_window()
    held(qtbot, fake, lambda: w.chat.send_text("A long prompt"))
    with qtbot.waitSignal(w.reply_finished, timeout=WAIT_MS) as stopped:
        w.stop_button.click()
    assert stopped.args[0].cancelled and stopped.args[0].text == ""
    assert "stopped" in w.transcript.toPlainText()
    fake.release()
    assert not chat(qtbot, w, "Next").cancelled


def test_a_failed_idle_conversion_is_reported_as_such_and_keeps_the_turn(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = fake_window()
    chat(qtbot, w, "Keep me")
    fake.convert_error = EngineError("the cache could not be compacted")
    w.chat.convert_now()
    qtbot.waitUntil(lambda: error_box(w) is not None, timeout=WAIT_MS)
    text = error_box(w).text()
    assert "Compacting the context memory failed" in text and "The reply failed" not in text
    assert [t["content"] for t in w.conversation.turns()] == ["Keep me", "Fake reply text."]
    assert w.input.toPlainText() == ""
    assert w.state is UiState.READY


def test_a_failure_is_reported_against_its_own_request(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    """A conversion queued behind a reply fails: the reply still ends as a reply."""
    w = fake_window()
    held(qtbot, fake, lambda: w.chat.send_text("Hello"))
    fake.convert_error = EngineError("no")
    w.engine.submit(Step())  # no failure handler: reported as what it was
    fake.release()
    with qtbot.waitSignal(w.reply_finished, timeout=WAIT_MS) as reply:
        pass
    assert reply.args[0].text == "Fake reply text."
    qtbot.waitUntil(lambda: error_box(w) is not None, timeout=WAIT_MS)
    assert "Compacting the context memory failed" in error_box(w).text()
    assert len(w.conversation) == 2


def test_a_refused_turn_goes_back_to_the_input_and_out_of_the_database(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    w = fake_window()
    with qtbot.waitSignal(w.reply_failed, timeout=WAIT_MS) as failed:
        w.chat.send_text("word " * 400)  # over the fake's context
    settle(qtbot, w)
    assert isinstance(failed.args[0].message, str) and "no longer fits" in failed.args[0].message
    assert w.input.toPlainText().startswith("word word") and len(w.conversation) == 0
    assert stored() == []
    error_box(w).accept()
    chat(qtbot, w, "Short one")
    with qtbot.waitSignal(w.reply_failed, timeout=WAIT_MS):
        w.chat.send_text("word " * 400)
    settle(qtbot, w)
    [(_, messages)] = stored()
    assert [m["content"] for m in messages] == ["Short one", "Fake reply text."]


def test_close_drops_queued_requests_hides_first_and_waits_with_a_deadline(
    qtbot: QtBot, fake: FakeSession, fake_model: object
) -> None:
    from lazykv.core.settings import Settings

    settings = Settings()
    settings.set("snapshot_encryption", "none")
    w = MainWindow(settings, session=fake, timings=Timings(shutdown_deadline_ms=300))  # type: ignore[arg-type]
    qtbot.addWidget(w)
    w.show()
    fake.uncancellable_load = True
    fake.hold()
    w.loading.open_model(fake_model)  # type: ignore[arg-type]
    qtbot.waitUntil(fake.waiting.is_set, timeout=WAIT_MS)
    for _ in range(3):
        w.engine.submit(Step())
    hidden_before_wait: list[bool] = []
    w.ops.changed.connect(lambda _: hidden_before_wait.append(not w.isVisible()))
    started = time.monotonic()
    assert w.shutdown_engine() is False  # the load ignores cancel tokens: the deadline ends the wait
    assert 0.25 < time.monotonic() - started < 2.0
    assert not w.isVisible() and all(hidden_before_wait)
    fake.release()
    qtbot.waitUntil(lambda: "close" in fake.calls, timeout=WAIT_MS)
    assert fake.calls.count("convert") == 0  # the queued requests were dropped


def test_close_while_replying_stops_the_reply_at_once(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = fake_window()
    held(qtbot, fake, lambda: w.chat.send_text("Hello"))
    w.chat.convert_now()
    started = time.monotonic()
    assert w.shutdown_engine() is True
    assert time.monotonic() - started < FAST.shutdown_deadline_ms / 1000
    assert fake.calls[-1] == "close" and "convert" not in fake.calls


def test_the_operation_count_follows_requests_and_jobs(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = fake_window()
    assert w.ops.count == 0
    gate = threading.Event()
    w.background.run(lambda: gate.wait(5), what="A slow disk")
    held(qtbot, fake, lambda: w.chat.send_text("Hello"))
    assert sorted(w.ops.labels()) == ["A slow disk", "Saving the conversation", "The reply"]
    gate.set()
    fake.release()
    settle(qtbot, w)
    assert w.ops.count == 0


def test_a_background_job_without_an_error_handler_is_still_reported(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    w = fake_window()

    def broken() -> None:
        raise OSError(28, "No space left on device")

    w.background.run(broken, what="Writing the cache")
    qtbot.waitUntil(lambda: error_box(w) is not None, timeout=WAIT_MS)
    assert "Writing the cache failed" in error_box(w).text()
    assert isinstance(error_box(w), QMessageBox)


def test_idle_conversion_runs_after_the_injected_delay(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = fake_window(idle_conversion=True)
    fake.reply = ("word " * 120,)  # the fake's f16 view holds 128 of 256 cells: >= 90 % after this
    with qtbot.waitSignal(w.converted, timeout=WAIT_MS) as converted:
        w.chat.send_text("Fill it")
    assert converted.args == [True]
    engine_work = [c for c in fake.calls if c in ("reply", "convert")]
    assert engine_work == ["reply", "convert"]  # after the reply, never inside it
    assert "Context compacted to 8-bit here (at token" in w.transcript.toPlainText()
    [marker] = w.conversation.markers()
    assert marker.message_index == 1


def test_the_load_defaults_are_declared_once() -> None:
    """LoadSpec's defaults are the settings' declared defaults: one value each, in core.kinds."""
    spec = load_spec(Settings(), "m")
    assert spec == LoadSpec(Path("m"))
    assert spec.kv_mode == SETTINGS_BY_NAME["kv_mode"].default == DEFAULT_KV_MODE


def test_engine_reloading_actions_wait_for_the_engine_requests_in_flight(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    w = fake_window()
    held(qtbot, fake, w.chat.convert_now)
    assert w.state is UiState.READY and w.send_button.isEnabled()
    assert not w.settings_action.isEnabled() and not w.open_action.isEnabled()
    fake.release()
    settle(qtbot, w)
    assert w.settings_action.isEnabled() and w.open_action.isEnabled()
