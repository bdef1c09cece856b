"""Saved conversations in the window: the chat on screen, saving after each turn, resuming, the list.

``Conversations`` is the one owner of the chat on screen (its transcript, where it is saved,
whether it is private). Database work runs on the window's background thread (its own
connection, one job at a time, in order); snapshots are saved and restored by the engine
worker (it holds the KV cache). The transcript is written before the snapshot, so a crash
never loses a word that was on screen. Views refresh only for their own changes (Anki's
``operation_did_execute``): every database operation returns its ``OpChanges``, and the list
updates, adds or removes only the rows of the conversations it changed (a saved turn, a rename,
a delete and its undo, an import); only a new search query lists anew.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QWidget,
)

from lazykv.core.chat.conversation import Conversation
from lazykv.core.engine.memory import MiB, fmt_bytes
from lazykv.core.engine.types import ModelInfo, SamplingSettings
from lazykv.core.history.persistence import OpenResult, SaveResult
from lazykv.core.history.protection import (
    Protection,
)
from lazykv.core.history.records import (
    Change,
    ConversationRecord,
    ConversationSummary,
    Deleted,
    Loaded,
    OpChanges,
    OpChangesWithId,
    Synced,
    loaded,
    new_uid,
)
from lazykv.core.history.snapshot_budget import Cleanup
from lazykv.core.history.store import Database, Store
from lazykv.core.settings import Settings
from lazykv.qt.background import Background
from lazykv.qt.conversation_files import ConversationFiles
from lazykv.qt.conversations_panel import ConversationsPanel
from lazykv.qt.elided_label import StatusBar
from lazykv.qt.memory_panel import MemoryPanel
from lazykv.qt.notice_banner import NoticeBanner
from lazykv.qt.operations import EngineClient
from lazykv.qt.passphrase_prompt import FIELD_MIN_WIDTH
from lazykv.qt.private_chat import PrivateChat
from lazykv.qt.protection_prompts import ProtectionPrompts
from lazykv.qt.worker import ClearKv, Failure, OpenConversation, Reply, Request, SaveSnapshot

UNDO_MS = 10_000  # the status bar's offer to undo a delete
SAVED_NOTICE_MS = 5000  # "Saved: snapshot of …" beside the status bar's messages
# how long a delete can be undone (Chat > Undo delete): then the conversation is erased for good
# (its snapshot key and file, its words in the search index, the WAL's old pages); at quit, at once
ERASE_MS = 60_000
C = TypeVar("C", bound=OpChanges)
TITLE_CHARS = 60


def title_from(turns: list[dict[str, str]]) -> str:
    first = next((t["content"] for t in turns if t["role"] == "user"), "New chat")
    line = " ".join(first.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"


class ConversationsHost(Protocol):
    """What Conversations and its parts need from the window (the window satisfies it; no import of it
    here): each part names its own share (``ProtectionWindow``, ``PrivateWindow``, ``FilesWindow``)."""

    conversations_panel: ConversationsPanel
    memory_panel: MemoryPanel
    background: Background
    database: Database
    engine: EngineClient
    model_info: ModelInfo | None
    settings: Settings
    keyring_notice: NoticeBanner  # non-modal: the chat goes on while they are shown
    history_notice: NoticeBanner
    input: QWidget  # the message box: keyboard focus goes back to it after the Private switch

    def statusBar(self) -> StatusBar: ...  # noqa: N802 - Qt's name
    def show_error(self, title: str, message: str, details: str = "") -> QMessageBox: ...
    def show_exception(self, title: str, err: BaseException) -> QMessageBox: ...
    def setting(self, name: str) -> Any: ...
    def apply_settings(self, changed: dict[str, Any]) -> None: ...
    def save_settings(self) -> None: ...


class ChatScreen(Protocol):
    """What Conversations needs from the chat flow (the window's ``ChatFlow``): the chat on screen shown,
    its reply, its resume."""

    @property
    def reply_request(self) -> Reply | None: ...  # the reply streaming now
    def sampling(self) -> SamplingSettings: ...
    def can_switch_conversation(self) -> bool: ...
    def stop_reply(self) -> None: ...
    def show_chat(self, title: str | None) -> None: ...
    def begin_resume(self) -> None: ...
    def resume_progress(self, done: int, total: int) -> None: ...
    def end_resume(self, result: OpenResult | None, failure: Failure | None = None,
                   restored: str = "") -> None: ...


class SavedAs:
    """Where a chat is saved. Only database jobs set ``id`` and ``synced`` (they run one at a time, in
    order, on the database thread), so a second save queued behind a slow first one finds the
    conversation the first one created; ``uid`` makes that so in the database itself."""

    def __init__(self, conv_id: int | None = None, uid: str | None = None, synced: int = 0) -> None:
        self.id = conv_id
        self.uid = uid or new_uid()
        self.synced = synced  # how many of the chat's saved turns the database holds


@dataclasses.dataclass(eq=False)
class Chat:
    """The conversation on screen and where it is saved."""

    conversation: Conversation
    saved: SavedAs = dataclasses.field(default_factory=SavedAs)
    first_saved: int = 0  # turns before this are never written (typed while Private was on)
    unsaved_private_turns: bool = False


class Conversations(QObject):
    """Owns the chat on screen and asks for the snapshot protection (the key itself lives only in the
    engine worker's Persistence: the GUI knows whether snapshots are on, not the key). Its parts:
    ``prompts`` (the protection's questions), ``private_chat`` (the Private switch), ``files`` (export,
    import)."""

    private_changed = Signal(bool)
    undo_changed = Signal(str)  # the title of the conversation a delete's undo would restore ("": none)
    snapshots_changed = Signal(bool)  # whether snapshots are saved from now on
    saved = Signal(int)  # conversation id: its transcript was written
    snapshot_saved = Signal(int, object)  # conversation id, SaveResult
    opened = Signal(int, object)  # conversation id, OpenResult (after the window has shown it)
    # after each database operation: its OpChanges, and {conversation id: its list row now, or None
    # when it is gone} for the conversations whose row it changed
    operation_did_execute = Signal(object, object)

    def __init__(self, host: ConversationsHost, screen: ChatScreen, dialog_parent: QWidget,
                 system_prompt: str, undo_ms: int = UNDO_MS, erase_ms: int = ERASE_MS) -> None:
        super().__init__(dialog_parent)
        self.host = host
        self.screen = screen
        self._dialogs = dialog_parent
        self.chat = Chat(Conversation(system_prompt))
        self.private = False
        self.protection = Protection()  # the session's choices of protection (no key is kept here)
        self.history_open = False  # opened with the scheme's key: turns can be written
        self._waiting_chats: list[Chat] = []  # left (New chat) with turns to write once it opens
        self.snapshots_on = False
        self.last_saved: SaveResult | None = None
        self._deleted: ConversationRecord | None = None
        self._opening: int | None = None  # the id being read from the database to open
        # the engine request resuming the chat on screen (OpenConversation; a new branch's: Branch)
        self.resume: Request | None = None
        self._undo_ms = undo_ms
        self.prompts = ProtectionPrompts(self, host, self.protection, dialog_parent)
        self.private_chat = PrivateChat(self, host, screen, dialog_parent)
        self.files = ConversationFiles(dialog_parent, host, self)
        panel = host.conversations_panel
        panel.open_requested.connect(self.open)
        panel.rename_requested.connect(self.ask_rename)
        panel.delete_requested.connect(self.delete)
        panel.export_requested.connect(self.files.export)
        panel.import_requested.connect(self.files.ask_import)
        panel.search_changed.connect(self.refresh)
        panel.private_toggled.connect(self.private_chat.set_private)
        self.operation_did_execute.connect(self._show_changes)
        # "Deleted “title”  [Undo]" in the status bar for a while: its own label, so the button never
        # covers the words; Chat > Undo delete (Ctrl+Z) stays until the next delete
        self.undo_bar = QFrame()
        self.undo_bar.setObjectName("undo-bar")
        self.undo_text = QLabel()
        self.undo_text.setObjectName("undo-text")
        self.undo_button = QPushButton("Undo")
        self.undo_button.setObjectName("undo-delete")
        self.undo_button.clicked.connect(self.undo_delete)
        row = QHBoxLayout(self.undo_bar)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.undo_text)
        row.addWidget(self.undo_button)
        self.undo_bar.hide()
        host.statusBar().addWidget(self.undo_bar)
        self._undo_timer = QTimer(self)
        self._undo_timer.setSingleShot(True)
        self._undo_timer.timeout.connect(self.undo_bar.hide)
        self._erase_timer = QTimer(self)
        self._erase_timer.setSingleShot(True)
        self._erase_timer.setInterval(max(erase_ms, undo_ms))
        self._erase_timer.timeout.connect(self._erase_deleted)

    @property
    def keyring_failed(self) -> bool:
        """The OS keyring could not give the key this session."""
        return self.protection.keyring_failed

    @property
    def history_locked(self) -> bool:
        """The history is encrypted under another key: nothing is saved until it opens."""
        return self.protection.history_locked

    @property
    def current(self) -> int | None:
        """The id the chat on screen is saved under (None until its first save)."""
        return self.chat.saved.id

    @property
    def opening(self) -> int | None:
        """The conversation being read from the database to be shown (chosen in the list), if any."""
        return self._opening

    # -- database calls, on the background thread -------------------------------------------------

    def call(self, fn: Callable[[Store], Any], on_done: Callable[[Any], None] | None = None,
             what: str = "The conversation database",
             on_error: Callable[[Exception], None] | None = None) -> None:
        def failed(err: Exception) -> None:
            self.host.show_exception(f"{what} failed", err)

        database = self.host.database  # the process's one connection; the pool thread waits, not the GUI
        self.host.background.run(lambda: database.call(fn), on_done, on_error or failed, what)

    def execute(self, op: Callable[[Store], C], on_done: Callable[[C], None] | None, what: str) -> None:
        """Run a database operation; what it changed goes to ``operation_did_execute`` (with the list
        rows it changed, read in the same job), then its answer to ``on_done``."""
        def job(store: Store) -> tuple[C, dict[int, ConversationSummary | None]]:
            changes = op(store)
            touched = changes.conv_ids if changes.touches(Change.LIST) else ()
            return changes, {conv_id: store.summary(conv_id) for conv_id in touched}

        def done(answer: tuple[C, dict[int, ConversationSummary | None]]) -> None:
            changes, rows = answer
            self.operation_did_execute.emit(changes, rows)
            if on_done is not None:
                on_done(changes)

        self.call(job, done, what)

    def start_up(self) -> None:
        """Remove what interrupted saves left (also when snapshots are off), saying what went; say so
        when the history is read-only."""
        def done(answer: tuple[Cleanup, str]) -> None:
            cleanup, notice = answer
            self.history_opened()
            if notice:
                self.host.show_error("The conversation history is read-only", notice)
            elif cleanup.orphans or cleanup.unfinished:
                n = cleanup.unfinished + cleanup.orphans
                self.host.statusBar().showMessage(
                    f"Cleaned up {n} leftover snapshot file{'s' if n != 1 else ''} "
                    f"({fmt_bytes(cleanup.freed_bytes)} freed)", 10_000)

        self.call(lambda s: (s.clean_up(), s.notice), done, "Opening the conversation history",
                  self.prompts.history_failed)

    # -- the chat on screen -------------------------------------------------------------------------

    def new_chat(self, system_prompt: str) -> None:
        self._cancel_resume()
        self._opening = None
        if not self.history_open and self._unwritten(self.chat):  # written once the history opens
            self._waiting_chats.append(self.chat)
        self.chat = Chat(Conversation(system_prompt))
        self.host.memory_panel.new_chat()  # its "Compacted" counts this chat's steps
        self.screen.show_chat(None)
        self.host.conversations_panel.select(None)
        if self.host.model_info is not None:  # an empty cache, 16-bit again after a compaction
            self.host.engine.submit(ClearKv())

    # -- saving ----------------------------------------------------------------------------------------

    def persist(self, snapshot: bool) -> None:
        """Write the transcript now; then, if asked and possible, the KV snapshot (worker thread)."""
        chat = self.chat
        if self.private:
            chat.unsaved_private_turns = chat.unsaved_private_turns or len(chat.conversation) > 0
            return
        if self.history_open:
            self._write(chat, snapshot)
        # else kept here, written once the history opens (locked, or its key has not come yet)

    def unsaved_turns(self) -> int:
        """How many turns on screen or in chats left since are waiting for the history to open (it is
        locked, or its key has not come): a quit now loses them. Private turns are never saved."""
        if self.history_open:
            return 0
        chats = [*self._waiting_chats, *([] if self.private else [self.chat])]
        return sum(self._unwritten(chat) for chat in chats)

    def why_unsaved(self) -> str:
        """Why the history is not open, in a few words for a sentence."""
        if self.protection.keyring_late:
            return "your system's keyring has not answered yet"
        if self.protection.history_locked:
            return "your saved conversations are locked with another key"
        return "the conversation history is not open yet"

    @staticmethod
    def _unwritten(chat: Chat) -> int:
        return max(0, len(chat.conversation) - chat.first_saved - chat.saved.synced)

    def history_opened(self) -> None:
        """The history opened with the scheme's key: what waited for it is written now, in order."""
        self.history_open, self.protection.history_locked = True, False
        self.host.history_notice.hide()  # it only ever says that the history is locked
        waiting, self._waiting_chats = self._waiting_chats, []
        for chat in waiting:
            self._write(chat, snapshot=False)
        if not self.private and self._unwritten(self.chat):
            self._write(self.chat, snapshot=False)

    def _write(self, chat: Chat, snapshot: bool) -> None:
        """The chat's transcript into the history (append or compare-and-swap); then, for the chat on
        screen when asked, its KV snapshot."""
        chat.first_saved = min(chat.first_saved, len(chat.conversation))
        turns = chat.conversation.turns()[chat.first_saved:]
        if not turns:
            return
        system = chat.conversation.system_prompt
        settings = self._conversation_settings()
        saved = chat.saved
        messages = chat.conversation.messages()  # what the KV cache holds: the snapshot's binding
        first = chat.first_saved
        stats = {i - first: s for i, s in chat.conversation.stats().items() if i >= first}
        versions = {i - first: v for i, v in chat.conversation.all_versions().items() if i >= first}
        markers = {i - first: m for i, m in chat.conversation.markers_by_turn().items() if i >= first}

        def job(store: Store) -> Synced:
            # appended, or compare-and-swapped for an edit or a taken-back turn: never replaced wholesale
            result = store.sync_transcript(saved.uid, turns, saved.synced, title=title_from(turns),
                                           system_prompt=system, settings=settings, create=saved.id is None,
                                           stats=stats, versions=versions, markers=markers)
            saved.id, saved.synced = result.id, len(result.messages)
            return result

        def done(synced: Synced) -> None:
            self.saved.emit(synced.id)
            if synced.merged and self.chat.saved is saved:
                self._adopt(synced.messages)
            elif snapshot and self.chat.saved is saved and chat.first_saved == 0:  # no private turns
                self._save_snapshot(synced.id, messages)

        self.execute(job, done, "Saving the conversation")

    def forget_turn(self) -> None:
        """The last user turn was refused (taken back into the input box): the database forgets it too,
        and a conversation left empty is removed (it was made for that turn)."""
        chat = self.chat
        if self.private:
            return
        if len(chat.conversation) > chat.first_saved:
            self.persist(snapshot=False)
            return
        saved = chat.saved

        def job(store: Store) -> OpChanges:  # after the turn's own save, which may still be queued
            removed, saved.id, saved.synced = saved.id, None, 0
            return store.delete(removed) if removed is not None else OpChanges()

        self.execute(job, None, "Saving the conversation")

    def _conversation_settings(self) -> dict[str, Any]:
        """What the conversation was held in: the loaded model's context and KV cache (a budget's context,
        a mode the model could not take are the loaded model's, not the settings'), else the settings'."""
        model = self.host.model_info
        return {
            "model_path": str(model.path) if model else "",
            "kv_mode": str(model.kv_mode) if model else self.host.setting("kv_mode"),
            "n_ctx": model.n_ctx if model else self.host.setting("n_ctx"),
            "sampling": dataclasses.asdict(self.screen.sampling()),
        }

    def _adopt(self, stored: list[dict[str, str]]) -> None:
        """Another LazyKV Chat wrote turns into this conversation: they were kept, so show them."""
        chat = self.chat
        conversation = Conversation(chat.conversation.system_prompt)
        for message in [*chat.conversation.turns()[: chat.first_saved], *stored]:
            if message["role"] != "system":
                conversation.add_turn(message)  # a tool call or result too
        chat.conversation = conversation
        self.screen.show_chat(None)
        self.host.statusBar().showMessage(
            "Another LazyKV Chat window added turns to this conversation; they are shown here.", 10_000)

    def conversation_settings(self) -> dict[str, Any]:
        """What a conversation saved now records it was held in (``_conversation_settings``)."""
        return self._conversation_settings()

    def _save_snapshot(self, conv_id: int, messages: list[dict[str, str]]) -> None:
        if not self.snapshots_on or self.host.model_info is None:
            return
        budget = self.host.setting("snapshot_budget_mb") * MiB
        compact = bool(self.host.setting("compact_snapshots"))
        self.host.engine.submit(SaveSnapshot(conv_id, messages, budget, compact),
                                lambda r: self._snapshot_saved(conv_id, r), self._snapshot_failed)

    def snapshot_saved_as(self, conv_id: int, result: SaveResult | None) -> None:
        """A snapshot saved by another request (a new branch's): said as a reply's is."""
        self._snapshot_saved(conv_id, result)

    def _snapshot_saved(self, conv_id: int, result: SaveResult | None) -> None:
        if result is None:
            return
        self.last_saved = result
        pruned = f"; {len(result.pruned)} old snapshots pruned" if result.pruned else ""
        # beside the status bar's messages: the reply's "Prompt N tokens, M reused" stays readable
        self.host.statusBar().show_notice(
            f"Saved: snapshot of {result.n_tokens} tokens, {fmt_bytes(result.size)}, "
            f"in {1000 * result.seconds:.0f} ms{pruned}", SAVED_NOTICE_MS)
        self.snapshot_saved.emit(conv_id, result)

    def _snapshot_failed(self, failure: Failure) -> None:
        if not failure.cancelled:
            self.host.statusBar().showMessage(
                f"The KV snapshot was not saved ({failure.message}); the transcript is saved and will be "
                "re-read", 10_000)

    # -- the list -----------------------------------------------------------------------------------

    def refresh(self, query: str | None = None) -> None:
        """List anew for the search box's query (start-up, a new query); operations change only their
        own rows (``operation_did_execute``)."""
        panel = self.host.conversations_panel
        query = panel.search.text() if query is None else query

        def shown(items: list[ConversationSummary]) -> None:
            panel.set_conversations(items, self.current)

        self.call(lambda s: s.search(query) if query.strip() else s.list_conversations(), shown,
                  "Listing the conversations", self.prompts.history_failed)

    def _show_changes(self, changes: OpChanges, rows: dict[int, ConversationSummary | None]) -> None:
        """The list's side of ``operation_did_execute``: only the changed rows. While a search is shown,
        a conversation that is not among its results (imported, or back from a delete) may match it:
        the search runs again."""
        panel = self.host.conversations_panel
        if panel.search.text().strip() and any(
                summary is not None and conv_id not in panel.ids() for conv_id, summary in rows.items()):
            self.refresh()
        else:
            panel.apply(rows, self.current)

    # -- opening ---------------------------------------------------------------------------------------

    def open(self, conv_id: int) -> None:
        """Read the conversation off the GUI thread, show it, then restore or rebuild its KV cache.

        Asked by the list whenever its current row changes (a click, the arrow keys): the list's row is
        the chat on screen. Chosen while another one is re-read, it replaces it (that re-read is
        stopped). Refused (a reply is streaming, a model reloading) or failed: the list goes back to the
        chat on screen, and says why."""
        if conv_id == self.current:  # (back to) the chat on screen: a read still on its way is dropped
            self._opening = None
            return
        if not self.screen.can_switch_conversation():
            self.host.conversations_panel.select(self.current)
            self.host.statusBar().showMessage(
                "Another conversation opens once the reply has ended (Stop ends it) or the model has "
                "loaded", 5000)
            return
        self._opening = conv_id

        def failed(err: Exception) -> None:  # the list goes back to the chat on screen
            if self._opening == conv_id:
                self._opening = None
                self.host.conversations_panel.select(self.current)
            self.host.show_exception("Opening the conversation failed", err)

        self.call(lambda s: loaded(s.conversation(conv_id)), self._show, "Opening the conversation", failed)

    def _show(self, loaded: Loaded) -> None:
        record, messages = loaded.record, loaded.messages
        if self._opening != record.id:
            return  # another chat was chosen, or this one deleted, while it was read
        self.put_on_screen(loaded)
        if self.host.model_info is not None:
            self._resume(record.id, messages)
        # else: resumed once a model has loaded (resume_shown)

    def put_on_screen(self, loaded: Loaded) -> None:
        """Make ``loaded`` the chat on screen (its cache is resumed next: ``_show``, ``resume_with``)."""
        record = loaded.record
        self._opening = None
        self._cancel_resume()
        self.chat = Chat(loaded.conversation, SavedAs(record.id, record.uid, len(record.messages)))
        self.host.memory_panel.new_chat()
        self.screen.show_chat(record.title)
        self.host.conversations_panel.select(record.id)

    def resume_shown(self) -> None:
        """A model has loaded with no cache of the chat on screen (opened before it, e.g. at start-up):
        restore the chat's snapshot or re-read it now."""
        chat = self.chat
        if chat.saved.id is not None and len(chat.conversation) and self.resume is None:
            self._resume(chat.saved.id, chat.conversation.messages())

    def _resume(self, conv_id: int, messages: list[dict[str, str]]) -> None:
        self.resume_with(OpenConversation(conv_id, messages))

    def resume_with(self, request: Request, answered: Callable[[Any], OpenResult] | None = None,
                    restored: str = "") -> None:
        """Make the chat on screen's cache by ``request`` (its resume: stopped or replaced as one);
        ``answered`` turns its answer into the OpenResult the chat shows, ``restored`` what the chat says
        of a cache that was not re-read."""
        self.screen.begin_resume()
        chat = self.chat
        self.resume = request
        self.host.engine.submit(
            request,
            lambda result: self._resumed(chat, answered(result) if answered else result, restored),
            lambda failure: self._resume_failed(chat, failure),
            lambda progress: self.screen.resume_progress(*progress) if chat is self.chat else None,
        )

    def cancel_resume(self) -> None:
        """Stop re-reading the transcript (the banner's Stop): the next reply reads the rest."""
        if self.resume is not None:
            self.resume.cancel.set()

    def _cancel_resume(self) -> None:
        self.cancel_resume()
        self.resume = None

    def _resumed(self, chat: Chat, result: OpenResult, restored: str = "") -> None:
        if chat is not self.chat:  # replaced while it resumed: its answer only ends the wait
            self._stale_resume_ended()
            return
        self.resume = None
        self.screen.end_resume(result, restored=restored)
        self.opened.emit(chat.saved.id, result)

    def _stale_resume_ended(self) -> None:
        """The resume of a chat no longer on screen answered: it ends the wait, unless the chat on
        screen is being resumed now (that one's answer will)."""
        if self.resume is None:
            self.screen.end_resume(None, Failure("", cancelled=True))

    def _resume_failed(self, chat: Chat, failure: Failure) -> None:
        if chat is not self.chat:
            self._stale_resume_ended()
            return
        self.resume = None
        self.screen.end_resume(None, failure)

    # -- rename, delete, export, import ----------------------------------------------------------------

    def ask_rename(self, conv_id: int) -> None:
        self._ask_text("rename-dialog", "Rename conversation", "Title:",
                       lambda title: self.rename(conv_id, title),
                       text=self.host.conversations_panel.title(conv_id) or "")

    def _ask_text(self, name: str, title: str, label: str, on_text: Callable[[str], None],
                  text: str = "") -> QInputDialog:
        """A window-modal text question starting with ``text``, deleted when closed; ``on_text`` gets
        the accepted text."""
        dialog = QInputDialog(self._dialogs)
        dialog.setObjectName(name)
        dialog.setWindowTitle(title)
        dialog.setLabelText(label)
        dialog.setTextValue(text)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.textValueSelected.connect(on_text)
        dialog.open()
        for field in dialog.findChildren(QLineEdit):  # made by open(); the dialog's layout follows it
            field.setMinimumWidth(FIELD_MIN_WIDTH)  # its title whole, and room for a long name to edit
        return dialog

    def rename(self, conv_id: int, title: str) -> None:
        self.execute(lambda s: s.rename(conv_id, title), None, "Renaming")

    def delete(self, conv_id: int) -> None:
        """Delete now, with Undo in the status bar for a while (the snapshot file stays until pruned).

        The chat on screen, when it is the one deleted (even while it is still being opened), is
        replaced by a new chat at once; its resume is stopped."""
        if conv_id == self._opening:
            self._opening = None
        if conv_id == self.current:
            self.screen.stop_reply()
            self.new_chat(self.chat.conversation.system_prompt)

        def done(deleted: Deleted) -> None:
            self._erase_deleted()  # only the last delete can be undone: an earlier one is erased now
            record = self._deleted = deleted.record
            self._erase_timer.start()
            self.host.statusBar().clearMessage()
            self.undo_text.setText(f"Deleted “{record.title}”")
            self.undo_bar.show()
            self._undo_timer.start(self._undo_ms)
            self.undo_changed.emit(record.title)

        self.execute(lambda s: s.delete(conv_id), done, "Deleting")

    @property
    def can_undo_delete(self) -> bool:
        return self._deleted is not None

    def undo_delete(self) -> None:
        """Put the last deleted conversation back and open it (unless a private chat with turns is on
        screen: it is listed then, not opened)."""
        record, self._deleted = self._deleted, None
        self.undo_bar.hide()
        self._undo_timer.stop()
        self._erase_timer.stop()
        self.undo_changed.emit("")
        if record is None:
            return

        def done(changes: OpChangesWithId) -> None:
            self.host.statusBar().showMessage(f"Restored “{record.title}”", 5000)
            if not (self.private and len(self.chat.conversation)):
                self.open(changes.id)

        self.execute(lambda s: s.undelete(record), done, "Undoing the delete")

    def _erase_deleted(self) -> None:
        """The undo of the last delete has passed: what the conversation left is erased for good
        (``Store.erase``): its snapshot's key and file, its words in the search index, the WAL."""
        record, self._deleted = self._deleted, None
        self._erase_timer.stop()
        if record is None:
            return
        self.undo_bar.hide()
        self.undo_changed.emit("")
        self.call(lambda s: s.erase(record), None, "Erasing the deleted conversation")

    def erase_pending(self) -> None:
        """At quit: a delete whose undo is still on hand is erased now (queued before the database
        closes; the undo would not survive the quit anyway)."""
        record, self._deleted = self._deleted, None
        self._erase_timer.stop()
        if record is not None:
            self.host.database.submit(lambda s: s.erase(record))
