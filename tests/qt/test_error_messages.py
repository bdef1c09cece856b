"""Every error the user sees says what happened and what to do, the technical account behind "Show
Details…"; never a bare ``str(err)`` such as "5" (issue 24, point 9)."""

from __future__ import annotations

import errno

import pytest
from pytestqt.qtbot import QtBot

from lazykv.core.errors import EngineError
from lazykv.core.history.keys import WrongPassphraseError
from lazykv.core.history.records import ConversationNotFound
from lazykv.core.history.store import Store
from lazykv.core.settings import Settings
from lazykv.qt.worker import failure
from tests.qt.conftest import FakeWindow
from tests.qt.helpers import WAIT_MS, chat, error_box

WHAT_TO_DO = ("try again", "report it", "close other programs", "choose")


@pytest.mark.parametrize("err", [
    KeyError(5), IndexError(5), ValueError(""), RuntimeError(), TypeError("x"), OSError(5),
    OSError(errno.ENOSPC, "No space left on device", "/data/c.sqlite3"), MemoryError(),
])
def test_an_error_of_any_kind_is_a_sentence_with_what_to_do_and_the_details(err: Exception) -> None:
    said = failure(err)
    assert said.message != str(err) and len(said.message.split()) >= 6
    assert any(words in said.message.lower() for words in WHAT_TO_DO), said.message
    assert type(err).__name__ in said.details  # the traceback, on demand


@pytest.mark.parametrize("err", [
    EngineError("The model file is damaged: download it again."), ConversationNotFound(3),
    WrongPassphraseError("Wrong passphrase: try again."),
])
def test_our_own_errors_are_shown_as_written(err: Exception) -> None:
    assert failure(err).message == str(err)


def test_an_unexpected_database_error_says_what_happened_and_what_to_do(
    qtbot: QtBot, fake_window: FakeWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = fake_window()
    chat(qtbot, w, "Hello")

    def broken(self: Store, conv_id: int, title: str) -> None:
        raise KeyError(5)

    monkeypatch.setattr(Store, "rename", broken)
    w.conversations.rename(w.conversations.current, "A new title")
    qtbot.waitUntil(lambda: error_box(w) is not None, timeout=WAIT_MS)
    box = error_box(w)
    assert "Renaming failed" in box.text()  # what happened
    assert "<p>5</p>" not in box.text() and "Try again" in box.text()  # what to do, not a bare "5"
    assert "KeyError: 5" in box.detailedText()  # the details, on demand


def test_a_file_error_without_a_reason_is_said_in_words(
    qtbot: QtBot, fake_window: FakeWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = fake_window()

    def broken(self: Settings) -> None:
        raise OSError(5)

    monkeypatch.setattr(Settings, "save", broken)
    w.apply_settings({"temperature": 0.5})
    qtbot.waitUntil(lambda: error_box(w) is not None, timeout=WAIT_MS)
    box = error_box(w)
    assert "Settings were not saved" in box.text() and "could not be read or written" in box.text()
    assert ": 5" not in box.text() and "try again" in box.text()
    assert "OSError: 5" in box.detailedText()
