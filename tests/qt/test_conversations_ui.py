"""Saved conversations in the window: list, search, rename, delete/undo, private mode, resume, fallback."""

from __future__ import annotations

import json
from pathlib import Path

import keyring
from keyring.backends import fail
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from lazykv.core.settings import Settings
from lazykv.core.store import Store
from lazykv.qt.main_window import MainWindow, UiState
from tests.qt.test_main_window import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, Relay, open_window

LONG = "Here is a list: " + ", ".join(f"item {i}" for i in range(120)) + ". Which item comes first?"


def chat(qtbot: QtBot, w: MainWindow, text: str, snapshot: bool = True) -> None:
    """Send, wait for the reply and (unless private) for its snapshot to be saved."""
    signal = w.worker.snapshot_saved if snapshot else w.worker.reply_finished
    done = Relay(signal)
    with qtbot.waitSignal(done.fired, timeout=REPLY_TIMEOUT_MS):
        w.send_text(text)


def listed(qtbot: QtBot, w: MainWindow, n: int) -> list[str]:
    qtbot.waitUntil(lambda: w.conversations_panel.list.count() == n, timeout=5000)
    return [w.conversations_panel.list.item(i).text().split("\n")[0] for i in range(n)]


def stored_messages(conv_id: int) -> list[dict[str, str]]:
    store = Store()
    try:
        return store.messages(conv_id)
    finally:
        store.close()


def test_a_reply_saves_the_transcript_and_an_encrypted_snapshot(qtbot: QtBot, smollm2_path: Path) -> None:
    w = open_window(qtbot, smollm2_path)
    try:
        chat(qtbot, w, "What is the capital of France?")
        assert listed(qtbot, w, 1) == ["What is the capital of France?"]
        conv_id = w.conversations.current
        assert [m["role"] for m in stored_messages(conv_id)] == ["user", "assistant"]
        assert w.conversations.last_saved.n_tokens > 10
        [snapshot] = (Path(Store().snapshots_dir)).glob("*.lkv")
        assert b"What is the capital" not in snapshot.read_bytes()  # encrypted (and compressed)
    finally:
        w.close()


def test_restart_and_open_resumes_from_the_snapshot(qtbot: QtBot, smollm2_path: Path) -> None:
    first = open_window(qtbot, smollm2_path)
    chat(qtbot, first, "Name three colours.")
    conv_id, transcript = first.conversations.current, first.conversation.turns()
    first.close()

    w = open_window(qtbot, smollm2_path)
    try:
        listed(qtbot, w, 1)
        opened = Relay(w.worker.conversation_opened)
        with qtbot.waitSignal(opened.fired, timeout=LOAD_TIMEOUT_MS):
            w.conversations.open(conv_id)
        result = opened.calls[0][1]
        assert result.how == "restored"
        assert w.conversation.turns() == transcript
        assert "Name three colours." in w.transcript.toPlainText()
        assert "Resumed from the snapshot" in w.resume_note
        assert w.state is UiState.READY
        chat(qtbot, w, "And three more?")
        assert len(stored_messages(conv_id)) == 4
    finally:
        w.close()


def test_incompatible_snapshot_rebuilds_with_progress_and_says_why(qtbot: QtBot, smollm2_path: Path) -> None:
    first = open_window(qtbot, smollm2_path, kv_mode="lazy")
    chat(qtbot, first, LONG)  # converts: a q8_0 snapshot
    conv_id = first.conversations.current
    first.close()

    w = open_window(qtbot, smollm2_path, kv_mode="f16")
    try:
        progress = Relay(w.worker.rebuild_progress)
        opened = Relay(w.worker.conversation_opened)
        with qtbot.waitSignal(opened.fired, timeout=LOAD_TIMEOUT_MS):
            w.conversations.open(conv_id)
        assert opened.calls[0][1].how == "rebuilt"
        assert progress.calls and progress.calls[-1][0] == progress.calls[-1][1]
        assert "Re-read from the transcript" in w.resume_note and "KV cache layout" in w.resume_note
        assert w.banner.isVisible() and "Re-read" in w.banner.label.text()
        chat(qtbot, w, "Thanks")
    finally:
        w.close()


def test_search_rename_delete_and_undo(qtbot: QtBot, smollm2_path: Path) -> None:
    w = open_window(qtbot, smollm2_path, max_reply_tokens=4)
    try:
        chat(qtbot, w, "Tell me about giraffes.")
        giraffes = w.conversations.current
        w.new_chat()
        chat(qtbot, w, "Tell me about volcanoes.")
        assert listed(qtbot, w, 2) == ["Tell me about volcanoes.", "Tell me about giraffes."]

        w.conversations_panel.search.setText("giraff")
        qtbot.waitUntil(lambda: w.conversations_panel.ids() == [giraffes], timeout=5000)
        assert "[giraffe" in w.conversations_panel.list.item(0).text().lower()
        w.conversations_panel.search.clear()
        listed(qtbot, w, 2)

        w.conversations.rename(giraffes, "Tall animals")
        qtbot.waitUntil(lambda: "Tall animals" in listed(qtbot, w, 2), timeout=5000)

        w.conversations.delete(giraffes)
        assert listed(qtbot, w, 1) == ["Tell me about volcanoes."]
        assert w.conversations.undo_button.isVisible()
        w.conversations.undo_button.click()
        qtbot.waitUntil(lambda: giraffes in w.conversations_panel.ids(), timeout=5000)
        assert len(stored_messages(giraffes)) == 2
    finally:
        w.close()


def test_private_mode_saves_nothing(qtbot: QtBot, smollm2_path: Path) -> None:
    w = open_window(qtbot, smollm2_path, max_reply_tokens=4)
    try:
        w.private_action.setChecked(True)
        assert "private" in w.windowTitle()
        chat(qtbot, w, "A secret.", snapshot=False)
        qtbot.wait(300)
        assert w.conversations.current is None and w.conversations_panel.list.count() == 0
        store = Store()
        assert store.list_conversations() == [] and list(store.snapshots_dir.glob("*.lkv")) == []
        store.close()
    finally:
        w.close()


def test_export_and_import_json(qtbot: QtBot, smollm2_path: Path, tmp_path: Path) -> None:
    w = open_window(qtbot, smollm2_path, max_reply_tokens=4)
    try:
        chat(qtbot, w, "Export me.")
        out = tmp_path / "c.json"
        w.conversations.export_to(w.conversations.current, "json", out)
        qtbot.waitUntil(out.exists, timeout=5000)
        data = json.loads(out.read_text())
        assert data["messages"][0] == {"role": "user", "content": "Export me."}
        md = tmp_path / "c.md"
        w.conversations.export_to(w.conversations.current, "markdown", md)
        qtbot.waitUntil(md.exists, timeout=5000)
        assert "Export me." in md.read_text()
        w.conversations.import_from(out)
        listed(qtbot, w, 2)
        bad = tmp_path / "bad.json"
        bad.write_text("{not json")
        w.conversations.import_from(bad)
        qtbot.waitUntil(lambda: w.findChild(QMessageBox, "error-box") is not None, timeout=5000)
        assert "not a conversation export" in w.findChild(QMessageBox, "error-box").text()
    finally:
        w.close()


def test_without_a_keyring_the_user_chooses_and_conversations_are_still_saved(
    qtbot: QtBot, smollm2_path: Path
) -> None:
    keyring.set_keyring(fail.Keyring())
    w = open_window(qtbot, smollm2_path, max_reply_tokens=4)
    try:
        qtbot.waitUntil(lambda: w.findChild(QMessageBox, "keyring-box") is not None, timeout=5000)
        box = w.findChild(QMessageBox, "keyring-box")
        assert "No OS keyring" in box.text()
        chat(qtbot, w, "Saved anyway?", snapshot=False)  # no snapshot key yet: the transcript only
        listed(qtbot, w, 1)
        plain = next(b for b in box.buttons() if b.text() == "Save without encryption")
        plain.click()
        qtbot.waitUntil(lambda: w.conversations.crypto is not None, timeout=5000)
        chat(qtbot, w, "And now?")
        assert Settings.load()["snapshot_encryption"] == "none"
    finally:
        w.close()
