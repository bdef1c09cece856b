"""The conversation store: conversations and their transcripts, and the one thread that owns them.

One process has one connection: ``Database`` owns the ``Store`` and runs every operation on its
own thread, in order (the GUI submits and gets a Future, the engine thread calls and waits). Every
write is one transaction and returns an ``OpChanges`` saying what it changed, so each view refreshes
only for its own changes. Errors are ``StoreError`` subclasses whose message is written for the user.

The Store is put together from one module per job: ``connection`` (open, encrypt, migrate,
transactions), ``search`` (the list and its search), ``snapshot_budget`` (snapshot references and
their files) and ``exchange`` (export and import); this module holds the conversations themselves.

Transcripts are never replaced wholesale: ``sync_transcript`` appends what the caller added since
its last sync, or rewrites the caller's own edits only if nobody else wrote in between (compare and
swap), so two processes on one conversation never lose each other's turns; a conversation is
created by its ``uid`` (made by the caller), so two saves of a new chat cannot create it twice.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from lazykv.core.chat.conversation import ReplyStats, common_prefix
from lazykv.core.history import exchange
from lazykv.core.history.connection import Rewrap, reencrypt
from lazykv.core.history.records import (
    DEFAULT_TITLE,
    BranchLink,
    Change,
    ConversationNotFound,
    ConversationRecord,
    Deleted,
    OpChanges,
    OpChangesWithId,
    StoreError,
    Synced,
    TranscriptConflict,
    branch_link,
    branch_title,
    change_fields,
    check_text,
    clean_title,
    insert_messages,
    json_dict,
    new_uid,
    op_changes,
    read_markers,
    read_messages,
    read_stats,
    read_versions,
    settings_json,
    shown_time,
    validate_message,
    write_markers,
    write_stats,
    write_versions,
)
from lazykv.core.history.search import Listing
from lazykv.core.history.snapshot_budget import SnapshotBudget
from lazykv.core.paths import DB_FILE, SNAPSHOTS_DIR, data_dir

_UID = re.compile(r"[0-9a-f]{32}")
T = TypeVar("T")


class Store(Listing, SnapshotBudget):
    """The conversation database on one connection (see ``Connection``). Use it from one thread
    (``Database`` does)."""

    # conversations

    def _touch(self, db: sqlite3.Connection, conv_id: int) -> None:
        db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (self._now(), conv_id))

    def _update_column(self, conv_id: int, column: str, value: str, change: Change,
                       touch: bool = True) -> OpChanges:
        with self._write() as db:
            self._require(db, conv_id)
            db.execute(f"UPDATE conversations SET {column} = ? WHERE id = ?", (value, conv_id))
            if touch:
                self._touch(db, conv_id)
        return op_changes(conv_id, change, Change.LIST)

    def _insert_conversation(
        self, db: sqlite3.Connection, uid: str, title: str, system_prompt: str, settings: dict
    ) -> int:
        now = self._now()
        cursor = db.execute(
            "INSERT INTO conversations (uid, title, created, updated, system_prompt, settings)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (uid, clean_title(title), now, now, check_text("system prompt", system_prompt),
             settings_json(settings)),
        )  # fmt: skip
        return int(cursor.lastrowid)

    def conversation(self, conv_id: int) -> ConversationRecord:
        """Everything about one conversation; ConversationNotFound if there is none with this id."""
        with self._read() as db:
            return self._record(db, conv_id)

    def _record(self, db: sqlite3.Connection, conv_id: int) -> ConversationRecord:
        row = db.execute(
            "SELECT c.id, c.title, c.created, c.updated, c.system_prompt, c.settings, c.uid, c.parent_uid,"
            " coalesce(p.title, c.parent_title), c.branch_at, p.id FROM conversations c"
            " LEFT JOIN conversations p ON p.uid = c.parent_uid WHERE c.id = ?",
            (conv_id,),
        ).fetchone()
        if row is None:
            raise ConversationNotFound(conv_id)
        return ConversationRecord(
            id=row[0], title=row[1], created=shown_time(row[2]), updated=shown_time(row[3]),
            system_prompt=row[4], settings=json_dict(row[5]), messages=read_messages(db, conv_id),
            snapshot=self._snapshot(db, conv_id), uid=row[6], stats=read_stats(db, conv_id),
            versions=read_versions(db, conv_id), branch=branch_link(*row[7:]),
            markers=read_markers(db, conv_id),
        )  # fmt: skip

    def create_branch(
        self,
        uid: str,
        parent_uid: str,
        messages: Sequence[dict],
        *,
        system_prompt: str = "",
        settings: dict | None = None,
        stats: Mapping[int, ReplyStats] | None = None,
        versions: Mapping[int, Sequence[str]] | None = None,
        markers: Mapping[int, Sequence[tuple[int, str]]] | None = None,
    ) -> OpChangesWithId:
        """A new conversation ``uid`` holding ``messages``, the first messages of conversation
        ``parent_uid`` (as its window shows them: its last sync may still be queued behind this), with
        its system prompt and settings; titled after the parent, "Title (branch)", and linked to it.
        The parent is not changed. ConversationNotFound when the parent is gone."""
        if not isinstance(uid, str) or not _UID.fullmatch(uid):
            raise ValueError(f"not a conversation uid: {uid!r}")
        wanted = [validate_message(i, m) for i, m in enumerate(messages)]
        with self._write() as db:
            parent = db.execute("SELECT title FROM conversations WHERE uid = ?", (parent_uid,)).fetchone()
            if parent is None:
                raise ConversationNotFound(parent_uid)
            title = parent[0]
            conv_id = self._insert_conversation(db, uid, branch_title(title), system_prompt, settings or {})
            self._link(db, conv_id, BranchLink(parent_uid, title, len(wanted)))
            insert_messages(db, conv_id, wanted)
            write_stats(db, conv_id, stats or {})
            write_versions(db, conv_id, versions or {})
            write_markers(db, conv_id, markers or {})
        return OpChangesWithId(id=conv_id, **change_fields(op_changes(conv_id, Change.LIST)))

    @staticmethod
    def _branches(db: sqlite3.Connection, conv_id: int) -> set[int]:
        """The branches of conversation ``conv_id``: their list rows show it (its title, or that it is
        gone)."""
        return {row[0] for row in db.execute(
            "SELECT c.id FROM conversations c JOIN conversations p ON p.uid = c.parent_uid WHERE p.id = ?",
            (conv_id,))}  # fmt: skip

    def _link(self, db: sqlite3.Connection, conv_id: int, link: BranchLink | None) -> None:
        if link is not None:
            db.execute("UPDATE conversations SET parent_uid = ?, parent_title = ?, branch_at = ?"
                       " WHERE id = ?", (link.parent_uid, clean_title(link.parent_title), link.at, conv_id))

    def rename(self, conv_id: int, title: str) -> OpChanges:
        """A new title; the conversation keeps its place in the list (its last turn's time)."""
        changes = self._update_column(conv_id, "title", clean_title(title), Change.LIST, touch=False)
        with self._read() as db:  # its branches' rows name it
            return OpChanges(kinds=changes.kinds, conv_ids=changes.conv_ids | self._branches(db, conv_id))

    def delete(self, conv_id: int) -> Deleted:
        """Remove the conversation (its rows overwritten: secure_delete); ``record`` is for undo, with
        its snapshot's wrapped key, the only one left. Its snapshot file stays on disk (so undo can
        restore it) until ``erase``, once the undo has passed."""
        with self._write() as db:
            record = self._record(db, conv_id)
            branches = self._branches(db, conv_id)  # kept (they hold their own transcript): their rows
            db.execute("DELETE FROM conversations WHERE id = ?", (conv_id,))  # say it is gone
            self._drop_unreferenced(db)  # the keys of pieces only it held: in ``record`` alone now
        return Deleted(record=record, kinds=frozenset(Change), conv_ids=frozenset({conv_id, *branches}))

    def undelete(self, record: ConversationRecord) -> OpChangesWithId:
        """Put a deleted conversation back, with its id if that is free (``id`` says which it got). The
        snapshot reference comes back only if its file is still there."""
        settings_text = settings_json(record.settings)
        messages = [validate_message(i, m) for i, m in enumerate(record.messages)]
        with self._write() as db:
            taken = db.execute("SELECT 1 FROM conversations WHERE id = ? OR uid = ?",
                               (record.id, record.uid)).fetchone()  # fmt: skip
            cursor = db.execute(
                "INSERT INTO conversations (id, uid, title, created, updated, system_prompt, settings)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (None if taken else record.id, new_uid() if taken else record.uid, clean_title(record.title),
                 shown_time(record.created), shown_time(record.updated), record.system_prompt,
                 settings_text),
            )  # fmt: skip
            conv_id = int(cursor.lastrowid)
            self._link(db, conv_id, record.branch)
            insert_messages(db, conv_id, messages)
            write_stats(db, conv_id, record.stats)
            write_versions(db, conv_id, record.versions)
            write_markers(db, conv_id, record.markers)
            snap = record.snapshot
            if snap is not None and self.snapshot_path(snap.sha256).exists() and all(
                    (self.pieces_dir / f).is_file() for f in {p.file for p in snap.pieces}):  # fmt: skip
                db.execute(
                    "INSERT INTO snapshots"
                    " (conv_id, sha256, size, n_tokens, header_json, last_used, wrapped_key)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (conv_id, snap.sha256, snap.size, snap.n_tokens, snap.header_json, snap.last_used,
                     snap.wrapped_key),  # fmt: skip
                )
                # a piece saved again since keeps its newer row: the snapshot names pieces by address
                db.executemany("INSERT OR IGNORE INTO pieces (address, file, size, wrapped_key, offset)"
                               " VALUES (?, ?, ?, ?, ?)",
                               [(p.address, p.file, p.size, p.wrapped_key, p.offset)
                                for p in snap.pieces])  # fmt: skip
                db.executemany("INSERT INTO snapshot_pieces (conv_id, address) VALUES (?, ?)",
                               [(conv_id, p.address) for p in snap.pieces])  # fmt: skip
            branches = self._branches(db, conv_id)  # back under it
        return OpChangesWithId(id=conv_id, kinds=frozenset(Change), conv_ids=frozenset({conv_id, *branches}))

    def erase(self, record: ConversationRecord) -> OpChanges:
        """What a deleted conversation left behind, gone for good once its undo has passed: its
        snapshot file (unless the undo put it back), its words in the search index (FTS5 keeps
        deleted entries in its segments until they are merged: 'optimize' rewrites them, and
        secure_delete overwrites the pages it frees; SQLite 3.40 has no FTS5 secure-delete), and the
        WAL, which still holds the old pages (checkpointed and truncated). With the row gone, the
        snapshot's key is gone: a copy of the file elsewhere no longer decrypts."""
        if self.read_only:
            return OpChanges()
        snap = record.snapshot
        with self._write() as db:
            for index in ("messages_fts", "titles_fts"):
                db.execute(f"INSERT INTO {index}({index}) VALUES ('optimize')")
            orphan = snap is not None and db.execute(
                "SELECT 1 FROM snapshots WHERE sha256 = ?", (snap.sha256,)).fetchone() is None  # fmt: skip
            held = set(db.execute("SELECT address, file FROM pieces").fetchall())
        if orphan and snap is not None:
            self._unlink(snap.path)
        if snap is not None:  # the pieces no other snapshot holds (their keys went with the delete)
            self._unlink_pieces([p for p in snap.pieces if (p.address, p.file) not in held])
        with self._errors():
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return OpChanges()

    # transcripts

    def sync_transcript(
        self,
        uid: str,
        messages: Sequence[dict],
        synced: int,
        *,
        title: str = DEFAULT_TITLE,
        system_prompt: str = "",
        settings: dict | None = None,
        create: bool = False,
        stats: Mapping[int, ReplyStats] | None = None,
        versions: Mapping[int, Sequence[str]] | None = None,
        markers: Mapping[int, Sequence[tuple[int, str]]] | None = None,
    ) -> Synced:
        """Bring the stored transcript of conversation ``uid`` up to the caller's ``messages``, in one
        transaction; ``synced`` is how many of them the store held after the caller's last sync (0
        for a new conversation, ``len(Synced.messages)`` after each sync).

        - The stored first ``synced`` messages are still the caller's: its new messages are appended
          after everything stored, so turns another window added meanwhile are kept (``merged``).
        - Otherwise the caller edited or took back some of its messages: they are rewritten from the
          first difference on, but only if nothing was stored after ``synced`` meanwhile (compare
          and swap), else TranscriptConflict and nothing is written.

        With ``create`` a conversation with this uid is made if there is none (title, system prompt
        and settings are its first ones): a second sync of the same new chat finds it instead of
        making another. Without it, a missing conversation is ConversationNotFound (it was deleted).
        The system prompt and settings are updated each time (settings only when given). ``stats``
        (replies' figures by index in ``messages``) and ``versions`` (a regenerated reply's texts) are
        stored with those messages, unless another window's turns were merged in (the indices would
        not be the caller's); so are ``markers`` (by index: (offset, label) of the lines where the cache
        took a step), which replace the stored ones (None: those stored are kept).
        """
        if not isinstance(uid, str) or not _UID.fullmatch(uid):
            raise ValueError(f"not a conversation uid: {uid!r}")
        wanted = [validate_message(i, m) for i, m in enumerate(messages)]
        system_prompt = check_text("system prompt", system_prompt)
        settings_text = None if settings is None else settings_json(settings)
        with self._write() as db:
            row = db.execute("SELECT id, system_prompt, settings FROM conversations WHERE uid = ?",
                             (uid,)).fetchone()  # fmt: skip
            created = row is None
            if created:
                if not create:
                    raise ConversationNotFound(uid)
                conv_id = self._insert_conversation(db, uid, title, system_prompt, settings or {})
                row = (conv_id, system_prompt, settings_text or "{}")
            conv_id = int(row[0])
            stored = read_messages(db, conv_id)
            kinds = self._write_messages(db, conv_id, stored, wanted, synced)
            if row[1] != system_prompt:
                db.execute("UPDATE conversations SET system_prompt = ? WHERE id = ?",
                           (system_prompt, conv_id))  # fmt: skip
                kinds.add(Change.TRANSCRIPT)
            if settings_text is not None and row[2] != settings_text:
                db.execute("UPDATE conversations SET settings = ? WHERE id = ?", (settings_text, conv_id))
                kinds.add(Change.SETTINGS)
            if kinds and not created:
                self._touch(db, conv_id)
            result = read_messages(db, conv_id) if kinds else stored
            if result == wanted:
                write_stats(db, conv_id, stats or {})
                write_versions(db, conv_id, versions or {})
                if markers is not None:
                    write_markers(db, conv_id, markers)
        if created or kinds:
            kinds |= {Change.LIST}
        return Synced(id=conv_id, created=created, messages=result, merged=result != wanted,
                      kinds=frozenset(kinds), conv_ids=frozenset({conv_id}))  # fmt: skip

    @staticmethod
    def _write_messages(
        db: sqlite3.Connection, conv_id: int, stored: list[dict], wanted: list[dict], synced: int
    ) -> set[Change]:
        if 0 <= synced <= len(stored) and stored[:synced] == wanted[:synced]:
            new = wanted[synced:]
            if len(stored) > synced and stored[synced:] == new[: len(stored) - synced]:
                new = new[len(stored) - synced :]  # a retried sync: these were stored already
            insert_messages(db, conv_id, new)
            return {Change.TRANSCRIPT} if new else set()
        if synced != len(stored):
            raise TranscriptConflict(
                "This conversation was changed in another LazyKV Chat window while you edited it; "
                "your edit was not saved. Reopen the conversation to see both."
            )
        keep = common_prefix(stored, wanted)
        db.execute("DELETE FROM messages WHERE conv_id = ? AND seq >= ("
                   "SELECT seq FROM messages WHERE conv_id = ? ORDER BY seq LIMIT 1 OFFSET ?)",
                   (conv_id, conv_id, keep))  # fmt: skip
        insert_messages(db, conv_id, wanted[keep:])
        return {Change.TRANSCRIPT}

    # export / import

    def export_markdown(self, conv_id: int) -> str:
        return exchange.to_markdown(self.conversation(conv_id))

    def export_json(self, conv_id: int) -> dict:
        """The conversation as a JSON-able dict (no snapshot); ``import_json`` reads it back."""
        return exchange.to_json(self.conversation(conv_id))

    def import_json(self, data: dict) -> OpChangesWithId:
        """Add a conversation from ``export_json`` output; ValueError saying what is wrong with it."""
        conv = exchange.parse_export(data)
        with self._write() as db:
            # its exported uid when it is free, so that its branches, imported before or after, find it
            uid = conv["uid"] or new_uid()
            if db.execute("SELECT 1 FROM conversations WHERE uid = ?", (uid,)).fetchone() is not None:
                uid = new_uid()
            cursor = db.execute(
                "INSERT INTO conversations (uid, title, created, updated, system_prompt, settings)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (uid, conv["title"], conv["created"], conv["updated"], conv["system_prompt"],
                 conv["settings"]),
            )  # fmt: skip
            conv_id = int(cursor.lastrowid)
            self._link(db, conv_id, conv["branch"])
            insert_messages(db, conv_id, conv["messages"])
            branches = self._branches(db, conv_id)  # imported before it: under it now
        return OpChangesWithId(id=conv_id, kinds=frozenset({Change.LIST}),
                               conv_ids=frozenset({conv_id, *branches}))


class Database:
    """The one owner of the conversation database in this process: one connection, one thread.

    Every operation is a function of the ``Store``, run in order on the database thread:
    ``submit`` returns a Future (the GUI adds a callback that hops back to its thread), ``call``
    waits for the result (the engine thread, or code already on the database thread). The Store is
    opened by the first operation, so a failure to open is that operation's error and the next one
    tries again. ``in_flight`` counts submitted operations not yet finished (to disable mutating
    actions, to let tests wait for zero, to tell shutdown what it waits for).
    """

    def __init__(
        self,
        path: Path | None = None,
        snapshots_dir: Path | None = None,
        *,
        key: bytes | None = None,
        opener: Callable[[Path, Path], Store] | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else data_dir() / DB_FILE
        self.snapshots_dir = Path(snapshots_dir) if snapshots_dir is not None else data_dir() / SNAPSHOTS_DIR
        self._key = key
        self._opener = opener or (lambda path, snapshots: Store(path, snapshots, key=self._key))
        self._store: Store | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lazykv-db")
        self._thread: int | None = None
        self._lock = threading.Lock()
        self._in_flight = 0
        self._closed = False

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def submit(self, op: Callable[[Store], T]) -> Future[T]:
        """Queue ``op``; its Future holds the result or the (StoreError, ValueError, ...) it raised
        (after ``close``: StoreError, the database is closed)."""
        return self._queue(self._run, op)

    def call(self, op: Callable[[Store], T]) -> T:
        """Run ``op`` and return its result (in place when already on the database thread)."""
        if threading.get_ident() == self._thread:
            return op(self._open())
        return self.submit(op).result()

    def set_key(self, key: bytes | None) -> Future[None]:
        """From the next operation on, open the database with ``key`` (``keys.database_key`` of the
        scheme's key; None: plain). Queued in order: an open connection is closed first, and a plain
        database is encrypted in place when it is next opened."""
        return self._queue(self._rekey, key)

    def change_key(self, new_key: bytes | None, rewrap: Rewrap | None = None) -> Future[None]:
        """Re-encrypt the database from the key it has now to ``new_key`` (None: plain), in place and
        crash-safely (``reencrypt``), e.g. when the user changes how the history is protected;
        ``rewrap`` carries each snapshot's wrapped key over in the same rewrite. All or nothing: a
        failure leaves the database as it was, under its old key, and can be retried."""
        return self._queue(self._change_key, (new_key, rewrap))

    def _queue(self, fn: Callable[[Any], T], arg: Any) -> Future[T]:
        with self._lock:
            if self._closed:
                closed: Future[T] = Future()
                closed.set_exception(StoreError("The conversation database is closed."))
                return closed
            self._in_flight += 1
            # submitted under the lock: close() cannot shut the executor down between the check above
            # and this submit (the write would be dropped), it queues its own close after it
            future = self._executor.submit(fn, arg)
        future.add_done_callback(self._finished)
        return future

    def close(self, timeout: float | None = None) -> bool:
        """Finish the queued operations, then close the connection. False when they did not finish
        within ``timeout`` seconds (the database thread closes it when they do)."""
        with self._lock:
            if self._closed:
                return True
            self._closed = True
            closing = self._executor.submit(self._close_store)  # after every write queued so far
        self._executor.shutdown(wait=False)
        try:
            closing.result(timeout)
        except TimeoutError:
            return False
        return True

    def _run(self, op: Callable[[Store], T]) -> T:
        self._thread = threading.get_ident()
        return op(self._open())

    def _open(self) -> Store:
        if self._store is None:
            self._store = self._opener(self.path, self.snapshots_dir)
        return self._store

    def _rekey(self, key: bytes | None) -> None:
        self._close_store()
        self._key = key

    def _change_key(self, change: tuple[bytes | None, Rewrap | None]) -> None:
        new_key, rewrap = change
        self._close_store()
        if self.path.exists() and new_key != self._key:
            reencrypt(self.path, self._key, new_key, rewrap)
        self._key = new_key

    def _close_store(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def _finished(self, _: Future) -> None:
        with self._lock:
            self._in_flight -= 1
