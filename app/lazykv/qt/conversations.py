"""Saved conversations in the window: the list, saving after each reply, resuming, the snapshot key.

Database work runs on the window's background thread (its own connection); snapshots are
saved and restored by the engine worker (it holds the KV cache). The transcript is written
before the snapshot, so a crash never loses a word that was on screen.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import QFileDialog, QInputDialog, QLineEdit, QMessageBox, QPushButton

from lazykv.core.conversation import Conversation
from lazykv.core.files import write_text_atomic
from lazykv.core.keys import KeyringUnavailableError, load_or_create_key, new_salt
from lazykv.core.memory import fmt_bytes
from lazykv.core.persistence import Crypto, OpenResult, SaveResult
from lazykv.core.snapshot import ENCRYPTION_KEYRING, ENCRYPTION_NONE, ENCRYPTION_PASSPHRASE
from lazykv.core.store import ConversationRecord, Store

if TYPE_CHECKING:
    from lazykv.qt.main_window import MainWindow

UNDO_MS = 10_000
TITLE_CHARS = 60


def title_from(turns: list[dict[str, str]]) -> str:
    first = next((t["content"] for t in turns if t["role"] == "user"), "New chat")
    line = " ".join(first.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"


class Conversations(QObject):
    """Owns the window's conversation id, the GUI-side database connection and the snapshot crypto."""

    save_snapshot_requested = Signal(int, object)  # conversation id, budget bytes (may exceed int32)
    open_requested = Signal(int, object)  # conversation id, messages
    crypto_changed = Signal(object)  # Crypto | None

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = window
        self.current: int | None = None
        self.private = False
        self.crypto: Crypto | None = None
        self.last_saved: SaveResult | None = None
        self.last_opened: OpenResult | None = None
        self._store: Store | None = None  # lives on the background thread
        self._deleted: ConversationRecord | None = None
        panel = window.conversations_panel
        panel.open_requested.connect(self.open)
        panel.new_requested.connect(window.new_chat)
        panel.rename_requested.connect(self.ask_rename)
        panel.delete_requested.connect(self.delete)
        panel.export_requested.connect(self.export)
        panel.import_requested.connect(self.ask_import)
        panel.search_changed.connect(self.refresh)
        panel.private_toggled.connect(self.set_private)
        self.undo_button = QPushButton("Undo")
        self.undo_button.setObjectName("undo-delete")
        self.undo_button.hide()
        self.undo_button.clicked.connect(self.undo_delete)
        window.statusBar().addWidget(self.undo_button)
        self._undo_timer = QTimer(self)
        self._undo_timer.setSingleShot(True)
        self._undo_timer.timeout.connect(self.undo_button.hide)

    # -- database calls, on the background thread -------------------------------------------------

    def call(self, fn: Callable[[Store], Any], on_done: Callable[[Any], None] | None = None,
             what: str = "The conversation database") -> None:
        def job() -> Any:
            if self._store is None:
                self._store = Store()
            return fn(self._store)

        def failed(err: Exception) -> None:
            self.window.show_error(f"{what} failed", str(err))

        self.window.background.run(job, on_done, failed)

    def close(self) -> None:
        def job() -> None:
            if self._store is not None:
                self._store.close()
                self._store = None

        self.window.background.run(job)

    # -- the list -----------------------------------------------------------------------------------

    def refresh(self, query: str | None = None) -> None:
        query = self.window.conversations_panel.search.text() if query is None else query
        current = self.current
        self.call(lambda s: s.search(query) if query.strip() else s.list_conversations(),
                  lambda items: self.window.conversations_panel.set_conversations(items, current))

    def set_private(self, private: bool) -> None:
        self.private = private
        self.window.conversations_panel.private_box.setChecked(private)
        self.window.update_title()

    # -- saving ----------------------------------------------------------------------------------------

    def persist(self, snapshot: bool) -> None:
        """Write the transcript now; then, if asked and possible, the KV snapshot (worker thread)."""
        conversation = self.window.conversation
        if self.private or len(conversation) == 0:
            return
        turns, system = conversation.turns(), conversation.system_prompt
        settings = {
            "model_path": str(self.window.model_info.path) if self.window.model_info else "",
            "kv_mode": self.window.setting("kv_mode"),
            "n_ctx": self.window.setting("n_ctx"),
            "sampling": dataclasses.asdict(self.window.sampling()),
        }
        conv_id = self.current

        def job(store: Store) -> int:
            cid = conv_id
            if cid is None:
                cid = store.create_conversation(title_from(turns), system, settings)
            store.replace_messages(cid, turns)
            store.set_system_prompt(cid, system)
            store.set_settings(cid, settings)
            return cid

        def done(cid: int) -> None:
            if self.window.conversation is conversation:
                self.current = cid
            if snapshot and self.crypto is not None and self.window.model_info is not None:
                budget = self.window.setting("snapshot_budget_mb") * 1024 * 1024
                self.save_snapshot_requested.emit(cid, budget)
            self.refresh()

        self.call(job, done, "Saving the conversation")

    def on_snapshot_saved(self, conv_id: int, result: SaveResult) -> None:
        self.last_saved = result
        pruned = f"; {len(result.pruned)} old snapshots pruned" if result.pruned else ""
        self.window.statusBar().showMessage(
            f"Saved: snapshot of {result.n_tokens} tokens, {fmt_bytes(result.size)}, "
            f"in {1000 * result.seconds:.0f} ms{pruned}", 5000)

    def on_snapshot_failed(self, conv_id: int, message: str) -> None:
        self.window.statusBar().showMessage(
            f"The KV snapshot was not saved ({message}); the transcript is saved and will be re-read", 10_000)

    # -- opening ---------------------------------------------------------------------------------------

    def open(self, conv_id: int) -> None:
        if not self.window.can_switch_conversation() or conv_id == self.current:
            return
        self.call(lambda s: s.conversation(conv_id), self._show, "Opening the conversation")

    def _show(self, record: ConversationRecord) -> None:
        conversation = Conversation(record.system_prompt)
        for message in record.messages:
            if message["role"] == "system":
                conversation.system_prompt = message["content"]
            else:
                conversation.add(message["role"], message["content"])
        self.current = record.id
        self.window.show_conversation(conversation, record.title)
        if self.window.model_info is not None:
            self.window.begin_resume()
            self.open_requested.emit(record.id, conversation.messages())
        self.refresh()

    def on_opened(self, conv_id: int, result: OpenResult) -> None:
        self.last_opened = result
        self.window.end_resume(result)

    # -- rename, delete, export, import ----------------------------------------------------------------

    def ask_rename(self, conv_id: int) -> None:
        dialog = QInputDialog(self.window)
        dialog.setObjectName("rename-dialog")
        dialog.setWindowTitle("Rename conversation")
        dialog.setLabelText("Title:")
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.textValueSelected.connect(lambda title: self.rename(conv_id, title))
        dialog.open()

    def rename(self, conv_id: int, title: str) -> None:
        self.call(lambda s: s.rename(conv_id, title), lambda _: self._after_change(conv_id), "Renaming")

    def delete(self, conv_id: int) -> None:
        """Delete now, with Undo in the status bar for a while (the snapshot file stays until pruned)."""
        def done(record: ConversationRecord) -> None:
            self._deleted = record
            if record.id == self.current:
                self.window.new_chat()
            self.window.statusBar().showMessage(f"Deleted “{record.title}”", UNDO_MS)
            self.undo_button.show()
            self._undo_timer.start(UNDO_MS)
            self.refresh()

        self.call(lambda s: s.delete(conv_id), done, "Deleting")

    def undo_delete(self) -> None:
        record, self._deleted = self._deleted, None
        self.undo_button.hide()
        if record is not None:
            self.call(lambda s: s.undelete(record), lambda _: self.refresh(), "Undoing the delete")

    def export(self, conv_id: int, fmt: str) -> None:
        suffix, filt = (".md", "Markdown (*.md)") if fmt == "markdown" else (".json", "JSON (*.json)")
        path, _ = QFileDialog.getSaveFileName(
            self.window, "Export conversation", f"conversation{suffix}", filt
        )
        if path:
            self.export_to(conv_id, fmt, Path(path))

    def export_to(self, conv_id: int, fmt: str, path: Path) -> None:
        def job(store: Store) -> Path:
            if fmt == "markdown":
                text = store.export_markdown(conv_id)
            else:
                text = json.dumps(store.export_json(conv_id), indent=2, ensure_ascii=False)
            write_text_atomic(path, text + "\n")
            return path

        def done(written: Path) -> None:
            self.window.statusBar().showMessage(f"Exported to {written}", 5000)

        self.call(job, done, "Exporting")

    def ask_import(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Import conversation", "", "JSON (*.json)")
        if path:
            self.import_from(Path(path))

    def import_from(self, path: Path) -> None:
        def job(store: Store) -> int:
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as err:
                raise ValueError(f"{path.name} is not a conversation export: {err}") from err
            return store.import_json(data)

        self.call(job, lambda _: self.refresh(), f"Importing {path.name}")

    def _after_change(self, conv_id: int) -> None:
        self.refresh()

    # -- the snapshot key ------------------------------------------------------------------------------

    def setup_crypto(self) -> None:
        """How snapshots are protected, from the setting; asks when the keyring is missing."""
        scheme = self.window.setting("snapshot_encryption")
        if scheme == "none":
            self._use(Crypto(ENCRYPTION_NONE))
        elif scheme == "passphrase":
            self.ask_passphrase()
        else:
            def use_key(key: bytes) -> None:
                self._use(Crypto(ENCRYPTION_KEYRING, key))

            self.window.background.run(load_or_create_key, use_key, self._keyring_missing)

    def _use(self, crypto: Crypto | None) -> None:
        self.crypto = crypto
        self.crypto_changed.emit(crypto)

    def _keyring_missing(self, err: Exception) -> None:
        self._use(None)
        message = str(err) if isinstance(err, KeyringUnavailableError) else f"The OS keyring failed: {err}"
        box = QMessageBox(QMessageBox.Icon.Information, "Conversation snapshots", message, parent=self.window)
        box.setObjectName("keyring-box")
        box.setInformativeText(
            "Snapshots let a long conversation resume in milliseconds instead of re-reading it. "
            "Conversations themselves are saved either way."
        )
        passphrase = box.addButton("Use a passphrase…", QMessageBox.ButtonRole.AcceptRole)
        plain = box.addButton("Save without encryption", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton("Don't save snapshots", QMessageBox.ButtonRole.RejectRole)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)

        def chosen(button: QPushButton) -> None:
            if button is passphrase:
                self.window.apply_settings({"snapshot_encryption": "passphrase"})
            elif button is plain:
                self.window.apply_settings({"snapshot_encryption": "none"})

        box.buttonClicked.connect(chosen)
        box.open()

    def ask_passphrase(self) -> None:
        dialog = QInputDialog(self.window)
        dialog.setObjectName("passphrase-dialog")
        dialog.setWindowTitle("Snapshot passphrase")
        dialog.setLabelText("Passphrase for this session's conversation snapshots:")
        dialog.setTextEchoMode(QLineEdit.EchoMode.Password)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.textValueSelected.connect(self.use_passphrase)
        dialog.open()

    def use_passphrase(self, passphrase: str) -> None:
        if not passphrase:
            self._use(None)
            return
        salt_hex = self.window.settings["passphrase_salt"]
        if not salt_hex:
            salt_hex = new_salt().hex()
            self.window.settings.set("passphrase_salt", salt_hex)
            self.window.save_settings()
        self._use(Crypto(ENCRYPTION_PASSPHRASE, passphrase=passphrase, salt=bytes.fromhex(salt_hex)))
