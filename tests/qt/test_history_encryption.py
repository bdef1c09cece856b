"""The history encrypted at rest under the scheme the user chose (issue 17.12), through the window."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from lazykv.core.paths import DB_FILE, data_dir
from tests.qt.conftest import FakeWindow
from tests.qt.helpers import WAIT_MS, chat, settle

SECRET = "my secret is pomegranate"


def _database() -> Path:
    return data_dir() / DB_FILE


def _plain_text_anywhere() -> bool:
    files = [p for p in data_dir().glob(f"{DB_FILE}*") if p.is_file()]
    return any(b"pomegranate" in p.read_bytes() for p in files)


def test_with_the_keyring_scheme_the_history_is_encrypted_and_still_listed(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    w = fake_window(snapshot_encryption="keyring")
    qtbot.waitUntil(lambda: w.conversations.snapshots_on, timeout=WAIT_MS)
    chat(qtbot, w, SECRET)
    assert not _database().read_bytes().startswith(b"SQLite format 3\x00")
    assert not _plain_text_anywhere()
    w.close()
    again = fake_window(snapshot_encryption="keyring")
    qtbot.waitUntil(lambda: again.conversations_panel.ids() != [], timeout=WAIT_MS)
    assert len(again.conversations_panel.ids()) == 1


def test_a_plain_history_is_encrypted_when_a_scheme_is_chosen_and_decrypted_for_none(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    w = fake_window(snapshot_encryption="none")
    chat(qtbot, w, SECRET)
    assert _plain_text_anywhere()
    w.apply_settings({"snapshot_encryption": "keyring"})
    qtbot.waitUntil(lambda: not _database().read_bytes().startswith(b"SQLite format 3\x00"), timeout=WAIT_MS)
    settle(qtbot, w)
    assert not _plain_text_anywhere() and len(w.conversations_panel.ids()) == 1
    w.apply_settings({"snapshot_encryption": "none"})
    qtbot.waitUntil(lambda: _database().read_bytes().startswith(b"SQLite format 3\x00"), timeout=WAIT_MS)
    settle(qtbot, w)
    assert len(w.conversations_panel.ids()) == 1
