"""Saved conversations: resuming with the real engine (slow); export, import and the keyring on the fake."""

from __future__ import annotations

import json
from pathlib import Path

import keyring
from keyring.backends import fail
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from lazykv.core.kinds import ExportFormat
from lazykv.core.settings import Settings
from lazykv.core.store import SNAPSHOTS_DIR, data_dir
from lazykv.qt.main_window import MainWindow, UiState
from tests.qt.conftest import FakeWindow
from tests.qt.helpers import WAIT_MS, chat, error_box, settle, stored
from tests.qt.test_main_window import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, open_window

LONG = "Here is a list: " + ", ".join(f"item {i}" for i in range(120)) + ". Which item comes first?"


def chat_and_snapshot(qtbot: QtBot, w: MainWindow, text: str) -> None:
    with qtbot.waitSignal(w.conversations.snapshot_saved, timeout=REPLY_TIMEOUT_MS):
        w.send_text(text)
    settle(qtbot, w)


def test_restart_and_open_resumes_from_the_encrypted_snapshot(qtbot: QtBot, smollm2_path: Path) -> None:
    first = open_window(qtbot, smollm2_path, snapshot_encryption="keyring")
    chat_and_snapshot(qtbot, first, "Name three colours.")
    conv_id, transcript = first.conversations.current, first.conversation.turns()
    assert first.conversations.last_saved is not None and first.conversations.last_saved.n_tokens > 10
    [snapshot] = (data_dir() / SNAPSHOTS_DIR).glob("*.lkv")
    assert b"Name three colours" not in snapshot.read_bytes()  # encrypted (and compressed)
    first.close()

    w = open_window(qtbot, smollm2_path, snapshot_encryption="keyring")
    try:
        qtbot.waitUntil(lambda: w.conversations_panel.ids() == [conv_id], timeout=WAIT_MS)
        with qtbot.waitSignal(w.conversations.opened, timeout=LOAD_TIMEOUT_MS) as opened:
            w.conversations.open(conv_id)
        assert opened.args[1].how == "restored"
        assert w.conversation.turns() == transcript and "Resumed from the snapshot" in w.resume_note
        assert w.state is UiState.READY
        chat_and_snapshot(qtbot, w, "And three more?")
        [(_, messages)] = stored(w)
        assert len(messages) == 4
    finally:
        w.close()


def test_an_incompatible_snapshot_is_re_read_with_progress_and_says_why(
    qtbot: QtBot, smollm2_path: Path
) -> None:
    first = open_window(qtbot, smollm2_path, kv_mode="lazy", snapshot_encryption="keyring")
    chat_and_snapshot(qtbot, first, LONG)  # converts: a q8_0 snapshot
    conv_id = first.conversations.current
    first.close()

    w = open_window(qtbot, smollm2_path, kv_mode="f16", snapshot_encryption="keyring")
    try:
        progress: list[tuple[int, int]] = []
        w.worker.progress.connect(lambda _request, p: progress.append(p))
        with qtbot.waitSignal(w.conversations.opened, timeout=LOAD_TIMEOUT_MS) as opened:
            w.conversations.open(conv_id)
        assert opened.args[1].how == "rebuilt"
        assert progress and progress[-1][0] == progress[-1][1] > 512
        assert "Re-read from the transcript" in w.resume_note and "KV cache layout" in w.resume_note
        with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as reply:
            w.send_text("Thanks")
        assert reply.args[0].n_reused > 512  # the re-read cache served the next reply
    finally:
        w.close()


def test_export_and_import_json(qtbot: QtBot, fake_window: FakeWindow, tmp_path: Path) -> None:
    w = fake_window()
    chat(qtbot, w, "Export me.")
    out = tmp_path / "c.json"
    w.conversations.export_to(w.conversations.current, ExportFormat.JSON, out)
    md = tmp_path / "c.md"
    w.conversations.export_to(w.conversations.current, ExportFormat.MARKDOWN, md)
    settle(qtbot, w)
    assert json.loads(out.read_text())["messages"][0] == {"role": "user", "content": "Export me."}
    assert "Export me." in md.read_text()
    w.conversations.import_from(out)
    qtbot.waitUntil(lambda: len(w.conversations_panel.ids()) == 2, timeout=WAIT_MS)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    w.conversations.import_from(bad)
    qtbot.waitUntil(lambda: error_box(w) is not None, timeout=WAIT_MS)
    assert "not a conversation export" in error_box(w).text()


def test_without_a_keyring_the_user_chooses_and_conversations_are_still_saved(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    keyring.set_keyring(fail.Keyring())
    w = fake_window(snapshot_encryption="keyring")
    qtbot.waitUntil(lambda: w.findChild(QMessageBox, "keyring-box") is not None, timeout=WAIT_MS)
    box = w.findChild(QMessageBox, "keyring-box")
    assert "No OS keyring" in box.text()
    chat(qtbot, w, "Saved anyway?")  # no snapshot key yet: the transcript only
    assert [title for title, _ in stored()] == ["Saved anyway?"]
    next(b for b in box.buttons() if b.text() == "Save without encryption").click()
    qtbot.waitUntil(lambda: w.conversations.snapshots_on, timeout=WAIT_MS)
    with qtbot.waitSignal(w.conversations.snapshot_saved, timeout=WAIT_MS):
        w.send_text("And now?")
    settle(qtbot, w)
    assert Settings.load()["snapshot_encryption"] == "none"
