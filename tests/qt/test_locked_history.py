"""A keyring that hangs and an encrypted history (issue 17.6): no turn typed meanwhile is lost silently.

The history stays locked while the keyring does not answer; what is typed is kept in the window and
written as soon as the keyring answers (even after its timeout), and quitting before that asks first.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator

import keyring
import pytest
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from lazykv.core.history import keys
from lazykv.core.paths import data_dir
from lazykv.qt import protection_prompts
from lazykv.qt.main_window import MainWindow
from tests.qt.conftest import FakeWindow
from tests.qt.helpers import WAIT_MS, chat, settle, stored
from tests.support.memory_keyring import MemoryKeyring

TIMEOUT_S = 0.3  # the keyring's timeout in these tests (the app's is keys.KEYRING_TIMEOUT_S)


class HangingKeyring(MemoryKeyring):
    """The user's keyring, whose unlock prompt nobody answers until ``release`` is set."""

    def __init__(self, secrets: dict[tuple[str, str], str]) -> None:
        super().__init__()
        self.secrets = dict(secrets)
        self.release = threading.Event()

    def get_password(self, service: str, username: str) -> str | None:
        self.release.wait()
        return super().get_password(service, username)


def _hang(monkeypatch: pytest.MonkeyPatch, secrets: dict[tuple[str, str], str]) -> HangingKeyring:
    backend = HangingKeyring(secrets)
    keyring.set_keyring(backend)
    monkeypatch.setattr(protection_prompts, "load_or_create_key",
                        functools.partial(keys.load_or_create_key, TIMEOUT_S))
    return backend


@pytest.fixture
def hanging(qtbot: QtBot, fake_window: FakeWindow,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[HangingKeyring]:
    """A history encrypted under the keyring's key (one saved conversation), then that keyring hanging."""
    first = fake_window(snapshot_encryption="keyring")
    chat(qtbot, first, "Kept under the key")
    assert first.close()
    backend = _hang(monkeypatch, keyring.get_keyring().secrets)
    try:
        yield backend
    finally:
        backend.release.set()


def _locked_window(qtbot: QtBot, fake_window: FakeWindow) -> MainWindow:
    w = fake_window(snapshot_encryption="keyring")
    chat(qtbot, w, "Typed while the keyring hangs")  # before its timeout
    qtbot.waitUntil(w.history_notice.isVisible, timeout=WAIT_MS)  # after it
    assert not w.keyring_notice.isVisible()  # one banner, which says what happens when it answers
    assert "stay closed until your system's keyring answers" in w.history_notice.label.text()
    return w


def _unsaved_box(w: MainWindow) -> QMessageBox | None:
    return w.findChild(QMessageBox, "unsaved-box")


def test_turns_typed_while_the_keyring_hangs_are_written_when_it_answers(
    qtbot: QtBot, fake_window: FakeWindow, hanging: HangingKeyring
) -> None:
    w = _locked_window(qtbot, fake_window)
    chat(qtbot, w, "Typed while locked")
    w.chat.new_chat()
    chat(qtbot, w, "Another chat while locked")
    assert w.conversations.unsaved_turns() == 6
    hanging.release.set()  # the user unlocks the keyring: its late answer opens the history
    qtbot.waitUntil(lambda: len(w.conversations_panel.ids()) == 3, timeout=WAIT_MS)
    settle(qtbot, w)
    assert not w.history_notice.isVisible() and not w.keyring_notice.isVisible()
    assert w.conversations.unsaved_turns() == 0 and w.conversations.snapshots_on
    assert sorted((title, len(messages)) for title, messages in stored(w)) == [
        ("Another chat while locked", 2), ("Kept under the key", 2), ("Typed while the keyring hangs", 4)]
    chat(qtbot, w, "And after")  # the chat on screen goes on saving as usual
    assert dict((title, len(messages)) for title, messages in stored(w))["Another chat while locked"] == 4
    assert w.close()


def test_quitting_while_locked_says_what_would_be_lost_and_can_wait(
    qtbot: QtBot, fake_window: FakeWindow, hanging: HangingKeyring
) -> None:
    w = _locked_window(qtbot, fake_window)
    assert not w.close()  # asks first
    box = _unsaved_box(w)
    assert box is not None and box.isVisible() and w.isVisible()
    assert box.text() == ("2 messages you typed are not saved: your system's keyring has not answered yet. "
                          "If you quit now, they will be lost.")
    keep = next(b for b in box.buttons() if b.text() == "Keep the window open")
    assert box.defaultButton() is keep
    keep.click()
    qtbot.waitUntil(lambda: _unsaved_box(w) is None, timeout=WAIT_MS)
    assert w.isVisible()
    hanging.release.set()
    qtbot.waitUntil(lambda: w.conversations.unsaved_turns() == 0, timeout=WAIT_MS)
    settle(qtbot, w)
    assert "Typed while the keyring hangs" in [title for title, _ in stored(w)]
    assert w.close() and _unsaved_box(w) is None  # nothing at stake any more: no question


def test_quitting_while_locked_can_lose_the_turns_when_the_user_says_so(
    qtbot: QtBot, fake_window: FakeWindow, hanging: HangingKeyring
) -> None:
    w = _locked_window(qtbot, fake_window)
    chat(qtbot, w, "One more")
    assert not w.close()
    box = _unsaved_box(w)
    assert box is not None and box.text().startswith("4 messages you typed are not saved")
    next(b for b in box.buttons() if b.text() == "Quit and lose them").click()
    qtbot.waitUntil(lambda: not w.isVisible(), timeout=WAIT_MS)
    hanging.release.set()
    again = fake_window(snapshot_encryption="keyring")  # the keyring answers at once now
    qtbot.waitUntil(lambda: again.conversations_panel.ids() != [], timeout=WAIT_MS)
    assert [title for title, _ in stored(again)] == ["Kept under the key"]


def test_with_no_history_yet_nothing_is_written_in_plain_text_while_the_keyring_hangs(
    qtbot: QtBot, fake_window: FakeWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = _hang(monkeypatch, {})  # its first use: the key is made once it answers
    try:
        w = _locked_window(qtbot, fake_window)
        assert not _written_in_plain_text(b"keyring hangs")
        backend.release.set()
        qtbot.waitUntil(lambda: len(w.conversations_panel.ids()) == 1, timeout=WAIT_MS)
        settle(qtbot, w)
        assert [title for title, _ in stored(w)] == ["Typed while the keyring hangs"]
        assert not _written_in_plain_text(b"keyring hangs")  # encrypted under the keyring's key
        assert w.close()
    finally:
        backend.release.set()


def _written_in_plain_text(words: bytes) -> bool:
    return any(words in path.read_bytes() for path in data_dir().rglob("*") if path.is_file())
