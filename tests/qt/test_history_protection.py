"""The history's protection in the window (issue 24, points 3, 4, 12 and 14): an answer applies only to
the choice it answers; nothing typed is written in plain text unless "no encryption" was chosen; a
deleted conversation leaves nothing behind once its undo has passed, in every protection mode; a key
change that fails leaves everything as it was, and can be retried."""

from __future__ import annotations

import threading
from dataclasses import replace

import keyring
import keyring.errors
import pytest
from keyring.backends import fail
from PySide6.QtWidgets import QInputDialog
from pytestqt.qtbot import QtBot

from lazykv.core.history.persistence import Persistence
from lazykv.core.paths import config_dir, data_dir
from lazykv.core.settings import Settings
from lazykv.qt.main_window import MainWindow
from tests.qt.conftest import FakeWindow
from tests.qt.helpers import FAST, WAIT_MS, chat, error_box, settle, stored
from tests.support.memory_keyring import MemoryKeyring

MARKER = "Zqxmarker4711"  # one search token, in no other text


def files_holding(text: str) -> list[str]:
    """The files under the data and config folders whose bytes hold ``text`` (as typed, or lower case as
    the search index keeps it)."""
    found = []
    for folder in (data_dir(), config_dir()):
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            data = path.read_bytes()
            if any(form.encode() in data for form in (text, text.lower())):
                found.append(str(path))
    return found


def give_passphrase(qtbot: QtBot, w: MainWindow, passphrase: str = "correct horse") -> None:
    """Answer the passphrase questions (typed twice when it is new)."""
    qtbot.waitUntil(lambda: w.findChild(QInputDialog, "passphrase-dialog") is not None, timeout=WAIT_MS)
    for name in ("passphrase-dialog", "passphrase-confirm-dialog"):
        qtbot.waitUntil(lambda n=name: w.findChild(QInputDialog, n) is not None, timeout=WAIT_MS)
        dialog = w.findChild(QInputDialog, name)
        dialog.setTextValue(passphrase)
        dialog.accept()
    qtbot.waitUntil(lambda: w.conversations.snapshots_on, timeout=WAIT_MS)
    settle(qtbot, w)


class AnswersLater(MemoryKeyring):
    """A keyring that answers only once ``release`` is set, then with an error (it stayed locked)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def get_password(self, service: str, username: str) -> str | None:
        self.release.wait()
        raise keyring.errors.KeyringLocked("the collection stayed locked")


def test_a_late_keyring_answer_applies_only_to_the_choice_it_answers(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    """Point 3: the keyring is asked, the user picks a passphrase meanwhile; the keyring's failure, when it
    comes, must not switch the passphrase's snapshots off."""
    backend = AnswersLater()
    keyring.set_keyring(backend)
    try:
        w = fake_window(snapshot_encryption="keyring")
        w.apply_settings({"snapshot_encryption": "passphrase"})
        give_passphrase(qtbot, w)
        backend.release.set()  # the first choice's answer arrives now
        qtbot.waitUntil(lambda: not w.conversations.prompts._keyring._carriers, timeout=WAIT_MS)
        settle(qtbot, w)
        assert w.conversations.snapshots_on and not w.conversations.keyring_failed
        assert not w.keyring_notice.isVisible() and not w.history_notice.isVisible()
        with qtbot.waitSignal(w.conversations.snapshot_saved, timeout=WAIT_MS):
            w.chat.send_text("Still kept under the passphrase?")
        settle(qtbot, w)
        assert w.settings["snapshot_encryption"] == "passphrase"
    finally:
        backend.release.set()


def test_without_a_keyring_nothing_typed_is_written_until_a_protection_is_chosen(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    """Point 4: Settings say "keyring", the keyring is not there: the history is not opened in plain text;
    what is typed is kept in the window and the banner says so, until the user chooses."""
    keyring.set_keyring(fail.Keyring())
    w = fake_window(snapshot_encryption="keyring")
    qtbot.waitUntil(w.history_notice.isVisible, timeout=WAIT_MS)
    text = w.history_notice.label.text()
    assert text.startswith("Your system's keyring") and "kept in this window only" in text
    chat(qtbot, w, f"Typed without a keyring {MARKER}")
    assert w.conversations.unsaved_turns() == 2 and files_holding(MARKER) == []
    assert not (data_dir() / "conversations.sqlite3").exists() or stored(w) == []
    next(b for b in w.history_notice.choices() if b.text() == "Use a passphrase…").click()
    give_passphrase(qtbot, w)
    qtbot.waitUntil(lambda: w.conversations.unsaved_turns() == 0, timeout=WAIT_MS)
    settle(qtbot, w)
    assert [title for title, _ in stored(w)] == [f"Typed without a keyring {MARKER}"]  # written now,
    assert files_holding(MARKER) == []  # encrypted


@pytest.mark.parametrize("mode", ["keyring", "passphrase", "none"])
def test_a_deleted_conversation_leaves_no_trace_in_any_file_once_its_undo_has_passed(
    qtbot: QtBot, fake_window: FakeWindow, mode: str
) -> None:
    """Point 12, in every protection mode: after the delete and its undo window, a word typed in the
    conversation is in no file under the data and config folders, WAL included."""
    w = fake_window(timings=replace(FAST, undo_ms=50, erase_ms=100), snapshot_encryption=mode)
    if mode == "passphrase":
        give_passphrase(qtbot, w)
    chat(qtbot, w, "Giraffes are tall")
    kept = w.conversations.current
    w.chat.new_chat()
    with qtbot.waitSignal(w.conversations.snapshot_saved, timeout=WAIT_MS):
        w.chat.send_text(f"My secret is {MARKER}, keep it")
    settle(qtbot, w)
    gone = w.conversations.current
    assert files_holding(MARKER) == [] if mode != "none" else files_holding(MARKER)
    snapshot = w.database.call(lambda s: s.conversation(gone).snapshot)
    assert snapshot is not None and snapshot.path.exists()
    w.conversations.delete(gone)
    qtbot.waitUntil(lambda: w.conversations.can_undo_delete, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: not w.conversations.can_undo_delete, timeout=WAIT_MS)  # the undo passed
    settle(qtbot, w)
    assert files_holding(MARKER) == [] and not snapshot.path.exists()
    assert [title for title, _ in stored(w)] == ["Giraffes are tall"] and kept is not None


def test_a_delete_still_undoable_at_quit_is_erased_before_the_database_closes(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    w = fake_window(snapshot_encryption="none")
    chat(qtbot, w, f"Quit right after deleting {MARKER}")
    w.conversations.delete(w.conversations.current)
    qtbot.waitUntil(lambda: w.conversations.can_undo_delete, timeout=WAIT_MS)
    assert w.close() and w.shutdown_engine()
    assert files_holding(MARKER) == []


def test_a_key_change_that_fails_changes_nothing_says_so_and_can_be_retried(
    qtbot: QtBot, fake_window: FakeWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Point 14: keyring to passphrase, the re-encryption fails mid-way: the history and its snapshots stay
    under the keyring's key, the setting goes back to "keyring", and choosing again succeeds."""
    w = fake_window(snapshot_encryption="keyring")
    qtbot.waitUntil(lambda: w.conversations.snapshots_on, timeout=WAIT_MS)
    with qtbot.waitSignal(w.conversations.snapshot_saved, timeout=WAIT_MS):
        w.chat.send_text("Kept under the keyring")
    settle(qtbot, w)
    real = Persistence.change_crypto

    def fails(self: Persistence, new: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Persistence, "change_crypto", fails)
    w.apply_settings({"snapshot_encryption": "passphrase"})
    give_passphrase_without_waiting(qtbot, w)
    qtbot.waitUntil(lambda: error_box(w) is not None, timeout=WAIT_MS)
    box = error_box(w)
    assert "was not changed" in box.text()
    assert "No space left" in box.text() + box.informativeText() + box.detailedText()
    error_box(w).close()
    settle(qtbot, w)
    assert w.settings["snapshot_encryption"] == "keyring"
    assert Settings.load()["snapshot_encryption"] == "keyring"
    assert [title for title, _ in stored(w)] == ["Kept under the keyring"]  # still open under the old key
    monkeypatch.setattr(Persistence, "change_crypto", real)
    w.apply_settings({"snapshot_encryption": "passphrase"})  # tried again
    give_passphrase_without_waiting(qtbot, w)
    qtbot.waitUntil(lambda: w.conversations.protection.scheme_in_use == "passphrase", timeout=WAIT_MS)
    settle(qtbot, w)
    assert w.conversations.snapshots_on and [t for t, _ in stored(w)] == ["Kept under the keyring"]


def give_passphrase_without_waiting(qtbot: QtBot, w: MainWindow) -> None:
    """Answer the passphrase questions, without waiting for snapshots to be on."""
    for name in ("passphrase-dialog", "passphrase-confirm-dialog"):
        qtbot.waitUntil(lambda n=name: w.findChild(QInputDialog, n) is not None, timeout=WAIT_MS)
        dialog = w.findChild(QInputDialog, name)
        dialog.setTextValue("correct horse")
        dialog.accept()
        if name == "passphrase-dialog" and (data_dir() / "passphrase.json").exists():
            return
