"""Helpers of the GUI tests on the fake engine."""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtWidgets import QMessageBox, QPushButton
from pytestqt.qtbot import QtBot

from lazykv.core.engine.types import KvRestoreError
from lazykv.core.history.records import StoreBusyError
from lazykv.core.history.store import Store
from lazykv.qt.main_window import MainWindow, Timings
from tests.qt.fake_engine import FakeSession
from tests.support.history import stored_messages

FAST = Timings(idle_delay_ms=20, sample_interval_ms=60_000, undo_ms=60_000, shutdown_deadline_ms=2000)
WAIT_MS = 5000  # generous: the fake answers in milliseconds


def settle(qtbot: QtBot, w: MainWindow) -> None:
    """Until nothing is in flight (engine requests and database jobs)."""
    qtbot.waitUntil(lambda: w.ops.count == 0, timeout=WAIT_MS)


def chat(qtbot: QtBot, w: MainWindow, text: str) -> object:
    """Send and wait for the reply and every save it causes; return its ReplyResult."""
    with qtbot.waitSignal(w.reply_finished, timeout=WAIT_MS) as blocker:
        w.chat.send_text(text)
    settle(qtbot, w)
    return blocker.args[0]


def error_box(w: MainWindow) -> QMessageBox | None:
    return w.findChild(QMessageBox, "error-box")


def stored(w: MainWindow | None = None) -> list[tuple[str, list[dict[str, str]]]]:
    """Every saved conversation: (title, messages), most recent first; through ``w``'s own database
    (an encrypted history opens only with its key), else a plain one."""
    def read(store: Store) -> list[tuple[str, list[dict[str, str]]]]:
        return [(s.title, stored_messages(store, s.id)) for s in store.list_conversations()]

    if w is not None:
        return w.database.call(read)
    deadline = time.monotonic() + 10
    while True:
        try:
            store = Store()  # a second connection: busy while the app's first write sets the database up
        except StoreBusyError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        try:
            return read(store)
        finally:
            store.close()



def end_private(qtbot: QtBot, w: MainWindow, answer: str) -> None:
    """Answer "End the private chat?" (Private unticked with private turns on screen): "save",
    "discard" or "keep" (Cancel) clicked in the question once it is shown."""
    def shown() -> QPushButton | None:
        return next((b for b in w.findChildren(QPushButton, f"{answer}-private-chat") if b.isVisible()), None)

    qtbot.waitUntil(lambda: shown() is not None, timeout=WAIT_MS)
    button = shown()
    assert button is not None
    button.click()


def held(qtbot: QtBot, fake: FakeSession, start: Callable[[], object]) -> None:
    """Hold the fake engine, ``start`` something, and wait until the engine is held inside it."""
    fake.hold()
    start()
    qtbot.waitUntil(fake.waiting.is_set, timeout=WAIT_MS)


def saved_then_new_chat(qtbot: QtBot, w: MainWindow, text: str) -> int:
    """A saved conversation (``text`` and its reply), then a new chat on screen; returns its id."""
    chat(qtbot, w, text)
    conv_id = w.conversations.current
    assert conv_id is not None
    w.chat.new_chat()
    return conv_id


def reopening_held(qtbot: QtBot, w: MainWindow, fake: FakeSession, text: str) -> int:
    """A saved conversation whose snapshot the engine refuses, opened again and held while its
    transcript is re-read; returns its id."""
    fake.restore_error = KvRestoreError("the test refuses the snapshot")
    conv_id = saved_then_new_chat(qtbot, w, text)
    held(qtbot, fake, lambda: w.conversations.open(conv_id))
    return conv_id
