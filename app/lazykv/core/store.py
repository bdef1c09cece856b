"""The conversation database: SQLite in WAL mode with FTS5 search, and the KV snapshot references.

Conversations are the source of truth and are never pruned. KV snapshots are files in the
snapshots dir named ``<sha256>.lkv`` (written elsewhere); the database only references them, and
``prune_snapshots`` keeps their total size under a budget, least recently used first.

A ``Store`` is used from one thread (the app's worker thread). Every write is one transaction;
sqlite3 errors surface as ``StoreError`` with a message written for the user.
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import platformdirs

SCHEMA_VERSION = 1
APP_DIR_NAME = "lazykv"
DB_FILE = "conversations.sqlite3"
SNAPSHOTS_DIR = "snapshots"
SNAPSHOT_SUFFIX = ".lkv"
DEFAULT_TITLE = "New chat"
ROLES = ("user", "assistant", "system")
EXPORT_FORMAT = "lazykv-conversation"
EXPORT_VERSION = 1
SNIPPET_MARKS = ("[", "]")  # around the matched words in ConversationSummary.snippet
SNIPPET_TOKENS = 12
ORPHAN_GRACE_S = 60.0  # an unreferenced snapshot younger than this may be about to be referenced
STALE_TEMP_S = 3600.0

_SHA256 = re.compile(r"[0-9a-f]{64}")


class StoreError(Exception):
    """The conversation database could not do what was asked; the message is meant for the user."""


def data_dir() -> Path:
    """The platform's per-user data dir (``LAZYKV_DATA_DIR`` overrides it, e.g. for tests)."""
    override = os.environ.get("LAZYKV_DATA_DIR")
    if override:
        return Path(override)
    return Path(platformdirs.user_data_dir(APP_DIR_NAME, appauthor=False))


@dataclass(frozen=True)
class ConversationSummary:
    id: int
    title: str
    created: float
    updated: float
    n_messages: int
    snippet: str = ""  # when searching: an excerpt around the match, matched words in SNIPPET_MARKS


@dataclass(frozen=True)
class SnapshotRef:
    sha256: str
    path: Path
    size: int
    n_tokens: int
    header_json: str
    last_used: float


@dataclass
class ConversationRecord:
    """Everything needed to restore a conversation (also what ``Store.delete`` returns for undo)."""

    id: int
    title: str
    created: float
    updated: float
    system_prompt: str
    settings: dict
    messages: list[dict]
    snapshot: SnapshotRef | None


_SCHEMA_V1 = """
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused, so undelete gets its id back
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    settings TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX conversations_updated ON conversations(updated);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    conv_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
    content TEXT NOT NULL,
    UNIQUE (conv_id, seq)
);
CREATE TABLE snapshots (
    conv_id INTEGER PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
    sha256 TEXT NOT NULL,
    size INTEGER NOT NULL,
    n_tokens INTEGER NOT NULL,
    header_json TEXT NOT NULL,
    last_used REAL NOT NULL
);
CREATE INDEX snapshots_sha256 ON snapshots(sha256);

CREATE VIRTUAL TABLE messages_fts USING fts5(
    content, content='messages', content_rowid='id', tokenize='unicode61 remove_diacritics 2');
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;

CREATE VIRTUAL TABLE titles_fts USING fts5(
    title, content='conversations', content_rowid='id', tokenize='unicode61 remove_diacritics 2');
CREATE TRIGGER titles_fts_insert AFTER INSERT ON conversations BEGIN
    INSERT INTO titles_fts(rowid, title) VALUES (new.id, new.title);
END;
CREATE TRIGGER titles_fts_delete AFTER DELETE ON conversations BEGIN
    INSERT INTO titles_fts(titles_fts, rowid, title) VALUES ('delete', old.id, old.title);
END;
CREATE TRIGGER titles_fts_update AFTER UPDATE OF title ON conversations BEGIN
    INSERT INTO titles_fts(titles_fts, rowid, title) VALUES ('delete', old.id, old.title);
    INSERT INTO titles_fts(rowid, title) VALUES (new.id, new.title);
END;
"""


def _execute_script(db: sqlite3.Connection, script: str) -> None:
    """Run the statements of ``script`` one by one, inside the caller's transaction (unlike
    ``executescript``, which commits first)."""
    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            db.execute(statement)
            statement = ""
    if statement.strip():
        raise ValueError(f"incomplete SQL statement: {statement!r}")


def _create_schema_v1(db: sqlite3.Connection) -> None:
    _execute_script(db, _SCHEMA_V1)


# MIGRATIONS[v] upgrades a database at schema version v to v + 1 (0 is a new, empty file).
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {0: _create_schema_v1}


@cache
def _fts5_available() -> bool:
    db = sqlite3.connect(":memory:")
    try:
        db.execute("CREATE VIRTUAL TABLE probe USING fts5(x)")
    except sqlite3.OperationalError:
        return False
    finally:
        db.close()
    return True


def _user_message(exc: sqlite3.Error, path: Path) -> str:
    """What went wrong, for the user, from the SQLite result code (or, failing that, the message)."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    text = str(exc).lower()
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in text:
        return (
            f"the conversation database {path} is locked by another LazyKV Chat; "
            "close the other window and try again"
        )
    if code == sqlite3.SQLITE_FULL or "disk is full" in text:
        return (
            f"the disk is full: could not save to the conversation database {path}; "
            "the conversation is kept as it was before this change"
        )
    if (
        code in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT)
        or "not a database" in text
        or "malformed" in text
    ):
        return (
            f"the conversation database {path} is damaged (not a database); "
            "your conversations were not changed"
        )
    if code == sqlite3.SQLITE_READONLY:
        return f"the conversation database {path} is read-only; changes cannot be saved"
    if code == sqlite3.SQLITE_CANTOPEN:
        return f"cannot open the conversation database {path}"
    if code == sqlite3.SQLITE_IOERR:
        return f"could not read or write the conversation database {path} (disk error: {exc})"
    return f"the conversation database {path} failed: {exc}"


def _validate_message(index: int, message: Any) -> dict:
    where = f"message {index + 1}"
    if not isinstance(message, dict):
        raise ValueError(f"{where}: expected an object with role and content, got {type(message).__name__}")
    if set(message) != {"role", "content"}:
        raise ValueError(f"{where}: expected exactly the fields role and content, got {sorted(message)}")
    role, content = message["role"], message["content"]
    if role not in ROLES:
        raise ValueError(f"{where}: role must be one of {', '.join(ROLES)}, not {role!r}")
    if not isinstance(content, str):
        raise ValueError(f"{where}: content must be text, not {type(content).__name__}")
    return {"role": role, "content": content}


def _settings_json(settings: dict) -> str:
    if not isinstance(settings, dict) or not all(isinstance(k, str) for k in settings):
        raise ValueError(f"settings must be an object with text keys, got {settings!r}")
    try:
        return json.dumps(settings, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"settings are not JSON: {exc}") from None


def _check_sha256(sha256: str) -> str:
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return sha256


def _fts_query(text: str) -> str:
    """User text as an FTS5 query that cannot be a syntax error: every word a quoted string, all
    required, the last one a prefix (so results follow typing)."""
    words = text.replace("\x00", " ").split()
    quoted = ['"' + w.replace('"', '""') + '"' for w in words]
    return " ".join(quoted) + "*" if quoted else ""


def _is_temp_name(name: str) -> bool:
    """Names a snapshot writer may give a file before renaming it to ``<sha256>.lkv``."""
    return name.startswith((".", "tmp")) or name.endswith(".tmp")


class Store:
    """The conversation database. Use one Store from one thread; close it when done."""

    def __init__(
        self, path: Path | None = None, snapshots_dir: Path | None = None, *, busy_timeout_ms: int = 2000
    ) -> None:
        if not _fts5_available():
            raise StoreError(
                "this Python's SQLite was built without FTS5 full-text search, which LazyKV Chat needs"
            )
        self.path = Path(path) if path is not None else data_dir() / DB_FILE
        self.snapshots_dir = Path(snapshots_dir) if snapshots_dir is not None else data_dir() / SNAPSHOTS_DIR
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.snapshots_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the folder for the conversation database: {exc}") from exc
        self._last_now = 0.0
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreError(_user_message(exc, self.path)) from exc
        try:
            with self._errors():
                self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
                self._db.execute("PRAGMA foreign_keys = ON")
                self._db.execute("PRAGMA journal_mode = WAL").fetchone()
                self._migrate()
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    # plumbing

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreError(_user_message(exc, self.path)) from exc

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taking the write lock up front; rolled back on any error."""
        with self._errors():
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """Several reads that see one consistent state."""
        with self._errors():
            self._db.execute("BEGIN")
            try:
                yield self._db
            finally:
                if self._db.in_transaction:
                    self._db.execute("COMMIT")

    def _now(self) -> float:
        """Wall-clock time, strictly increasing within this Store so 'most recent first' is stable."""
        self._last_now = max(time.time(), self._last_now + 1e-6)
        return self._last_now

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the conversation database {self.path} was written by a newer LazyKV Chat "
                f"(schema {version}, this version knows {SCHEMA_VERSION}); update LazyKV Chat"
            )
        if version == SCHEMA_VERSION:
            return
        with self._write() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]  # another process may have won
            while version < SCHEMA_VERSION:
                MIGRATIONS[version](db)
                version += 1
                db.execute(f"PRAGMA user_version = {version}")

    @staticmethod
    def _require(db: sqlite3.Connection, conv_id: int) -> None:
        if db.execute("SELECT 1 FROM conversations WHERE id = ?", (conv_id,)).fetchone() is None:
            raise KeyError(conv_id)

    def _touch(self, db: sqlite3.Connection, conv_id: int) -> None:
        db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (self._now(), conv_id))

    def _update_column(self, conv_id: int, column: str, value: str) -> None:
        with self._write() as db:
            self._require(db, conv_id)
            db.execute(f"UPDATE conversations SET {column} = ? WHERE id = ?", (value, conv_id))
            self._touch(db, conv_id)

    # conversations

    def create_conversation(
        self, title: str = DEFAULT_TITLE, system_prompt: str = "", settings: dict | None = None
    ) -> int:
        settings_json = _settings_json(settings or {})
        now = self._now()
        with self._write() as db:
            cursor = db.execute(
                "INSERT INTO conversations (title, created, updated, system_prompt, settings)"
                " VALUES (?, ?, ?, ?, ?)",
                (title.strip() or DEFAULT_TITLE, now, now, system_prompt, settings_json),
            )
        return int(cursor.lastrowid)

    def conversation(self, conv_id: int) -> ConversationRecord:
        """Everything about one conversation; KeyError if there is none with this id."""
        with self._read() as db:
            return self._record(db, conv_id)

    def _record(self, db: sqlite3.Connection, conv_id: int) -> ConversationRecord:
        row = db.execute(
            "SELECT id, title, created, updated, system_prompt, settings FROM conversations WHERE id = ?",
            (conv_id,),
        ).fetchone()
        if row is None:
            raise KeyError(conv_id)
        return ConversationRecord(
            id=row[0], title=row[1], created=row[2], updated=row[3], system_prompt=row[4],
            settings=json.loads(row[5]), messages=self._messages(db, conv_id),
            snapshot=self._snapshot(db, conv_id),
        )  # fmt: skip

    def list_conversations(self) -> list[ConversationSummary]:
        """Every conversation, most recently updated first."""
        with self._errors():
            rows = self._db.execute(
                "SELECT c.id, c.title, c.created, c.updated,"
                " (SELECT count(*) FROM messages m WHERE m.conv_id = c.id)"
                " FROM conversations c ORDER BY c.updated DESC, c.id DESC"
            ).fetchall()
        return [ConversationSummary(*row) for row in rows]

    def search(self, query: str) -> list[ConversationSummary]:
        """Conversations whose messages or title contain every word of ``query`` (the last word may be
        the start of a word), most recently updated first, each with a snippet of the best match
        (a message if one matches, else the title). Any text is safe; a blank query lists everything."""
        fts = _fts_query(query)
        if not fts:
            return self.list_conversations()
        start, end = SNIPPET_MARKS
        with self._read() as db:
            hits = db.execute(
                "SELECT conv_id, snip FROM ("
                " SELECT m.conv_id AS conv_id, snippet(messages_fts, 0, :start, :end, '…', :n) AS snip,"
                "  messages_fts.rank AS rank, 0 AS kind"
                " FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid"
                " WHERE messages_fts MATCH :q"
                " UNION ALL"
                " SELECT titles_fts.rowid, snippet(titles_fts, 0, :start, :end, '…', :n), titles_fts.rank, 1"
                " FROM titles_fts WHERE titles_fts MATCH :q"
                ") ORDER BY kind, rank",
                {"q": fts, "start": start, "end": end, "n": SNIPPET_TOKENS},
            ).fetchall()
            snippets: dict[int, str] = {}
            for conv_id, snip in hits:
                snippets.setdefault(conv_id, snip)
            summaries = [s for s in self.list_conversations() if s.id in snippets]
        return [
            ConversationSummary(s.id, s.title, s.created, s.updated, s.n_messages, snippets[s.id])
            for s in summaries
        ]

    def rename(self, conv_id: int, title: str) -> None:
        self._update_column(conv_id, "title", title.strip() or DEFAULT_TITLE)

    def set_system_prompt(self, conv_id: int, text: str) -> None:
        self._update_column(conv_id, "system_prompt", text)

    def set_settings(self, conv_id: int, settings: dict) -> None:
        """Replace the conversation's settings (model path, sampling, ...): a JSON-able dict."""
        self._update_column(conv_id, "settings", _settings_json(settings))

    def delete(self, conv_id: int) -> ConversationRecord:
        """Remove the conversation and return it for undo. Its snapshot file stays on disk (so undo
        can restore it); ``prune_snapshots`` removes it later if nothing references it."""
        with self._write() as db:
            record = self._record(db, conv_id)
            db.execute("DELETE FROM conversations WHERE id = ?", (conv_id,))
        return record

    def undelete(self, record: ConversationRecord) -> int:
        """Put a deleted conversation back, with its id if that is free; returns the id it got. The
        snapshot reference comes back only if its file is still there."""
        settings_json = _settings_json(record.settings)
        messages = [_validate_message(i, m) for i, m in enumerate(record.messages)]
        with self._write() as db:
            taken = db.execute("SELECT 1 FROM conversations WHERE id = ?", (record.id,)).fetchone()
            cursor = db.execute(
                "INSERT INTO conversations (id, title, created, updated, system_prompt, settings)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (None if taken else record.id, record.title, record.created, record.updated,
                 record.system_prompt, settings_json),
            )  # fmt: skip
            conv_id = int(cursor.lastrowid)
            self._insert_messages(db, conv_id, messages)
            snap = record.snapshot
            if snap is not None and self.snapshot_path(snap.sha256).exists():
                db.execute(
                    "INSERT INTO snapshots (conv_id, sha256, size, n_tokens, header_json, last_used)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (conv_id, snap.sha256, snap.size, snap.n_tokens, snap.header_json, snap.last_used),
                )
        return conv_id

    # messages

    @staticmethod
    def _messages(db: sqlite3.Connection, conv_id: int) -> list[dict]:
        rows = db.execute("SELECT role, content FROM messages WHERE conv_id = ? ORDER BY seq", (conv_id,))
        return [{"role": role, "content": content} for role, content in rows]

    @staticmethod
    def _insert_messages(
        db: sqlite3.Connection, conv_id: int, messages: Sequence[dict], first: int = 0
    ) -> None:
        db.executemany(
            "INSERT INTO messages (conv_id, seq, role, content) VALUES (?, ?, ?, ?)",
            [(conv_id, first + i, m["role"], m["content"]) for i, m in enumerate(messages)],
        )

    def append_message(self, conv_id: int, role: str, content: str) -> None:
        message = _validate_message(0, {"role": role, "content": content})
        with self._write() as db:
            self._require(db, conv_id)
            row = db.execute("SELECT coalesce(max(seq) + 1, 0) FROM messages WHERE conv_id = ?", (conv_id,))
            self._insert_messages(db, conv_id, [message], first=row.fetchone()[0])
            self._touch(db, conv_id)

    def replace_messages(self, conv_id: int, messages: Sequence[dict]) -> None:
        """The whole message list at once (edit, regenerate, truncate), in one transaction."""
        checked = [_validate_message(i, m) for i, m in enumerate(messages)]
        with self._write() as db:
            self._require(db, conv_id)
            db.execute("DELETE FROM messages WHERE conv_id = ?", (conv_id,))
            self._insert_messages(db, conv_id, checked)
            self._touch(db, conv_id)

    def messages(self, conv_id: int) -> list[dict]:
        with self._read() as db:
            self._require(db, conv_id)
            return self._messages(db, conv_id)

    # snapshots

    def snapshot_path(self, sha256: str) -> Path:
        return self.snapshots_dir / f"{_check_sha256(sha256)}{SNAPSHOT_SUFFIX}"

    def _snapshot(self, db: sqlite3.Connection, conv_id: int) -> SnapshotRef | None:
        row = db.execute(
            "SELECT sha256, size, n_tokens, header_json, last_used FROM snapshots WHERE conv_id = ?",
            (conv_id,),
        ).fetchone()
        if row is None:
            return None
        sha256, size, n_tokens, header_json, last_used = row
        return SnapshotRef(sha256, self.snapshot_path(sha256), size, n_tokens, header_json, last_used)

    def set_snapshot(
        self, conv_id: int, sha256: str, size: int, n_tokens: int, header_json: str
    ) -> str | None:
        """Point the conversation at the snapshot file ``snapshot_path(sha256)``; returns the sha256 it
        pointed at before (delete that file if ``unreferenced`` says nothing else uses it)."""
        _check_sha256(sha256)
        if size < 0 or n_tokens < 0:
            raise ValueError(f"snapshot size and token count must not be negative ({size}, {n_tokens})")
        with self._write() as db:
            self._require(db, conv_id)
            previous = db.execute("SELECT sha256 FROM snapshots WHERE conv_id = ?", (conv_id,)).fetchone()
            db.execute(
                "INSERT OR REPLACE INTO snapshots (conv_id, sha256, size, n_tokens, header_json, last_used)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (conv_id, sha256, int(size), int(n_tokens), header_json, self._now()),
            )
        return previous[0] if previous else None

    def clear_snapshot(self, conv_id: int) -> None:
        with self._write() as db:
            db.execute("DELETE FROM snapshots WHERE conv_id = ?", (conv_id,))

    def touch_snapshot(self, conv_id: int) -> None:
        """Mark the conversation's snapshot as used now (on resume), for least-recently-used pruning."""
        with self._write() as db:
            db.execute("UPDATE snapshots SET last_used = ? WHERE conv_id = ?", (self._now(), conv_id))

    def unreferenced(self, sha256: str) -> bool:
        """Whether no conversation points at this snapshot."""
        with self._errors():
            return self._db.execute("SELECT 1 FROM snapshots WHERE sha256 = ?", (sha256,)).fetchone() is None

    def snapshot_bytes(self) -> int:
        """Total size of the referenced snapshots (each file counted once)."""
        with self._errors():
            row = self._db.execute(
                "SELECT coalesce(sum(size), 0) FROM (SELECT max(size) AS size FROM snapshots GROUP BY sha256)"
            ).fetchone()
        return int(row[0])

    def prune_snapshots(self, budget_bytes: int) -> list[str]:
        """Delete snapshot files until the referenced ones total at most ``budget_bytes``: least
        recently used first, clearing their references (transcripts are never touched). Also deletes
        ``*.lkv`` files nothing references (older than ORPHAN_GRACE_S) and temp files older than
        STALE_TEMP_S. Returns the sha256 of every snapshot file deleted, the pruned ones first, in
        the order they went."""
        with self._write() as db:
            by_age = db.execute(
                "SELECT sha256, max(size) FROM snapshots GROUP BY sha256 ORDER BY max(last_used), sha256"
            ).fetchall()
            total = sum(size for _, size in by_age)
            pruned: list[str] = []
            for sha256, size in by_age:
                if total <= budget_bytes:
                    break
                db.execute("DELETE FROM snapshots WHERE sha256 = ?", (sha256,))
                pruned.append(sha256)
                total -= size
            referenced = {row[0] for row in db.execute("SELECT DISTINCT sha256 FROM snapshots")}
        # references are gone before the files: a crash in between leaves orphans, removed next time
        for sha256 in pruned:
            self._unlink(self.snapshot_path(sha256))
        return pruned + self._remove_strays(referenced)

    def _remove_strays(self, referenced: set[str]) -> list[str]:
        removed = []
        now = time.time()
        try:
            entries = list(os.scandir(self.snapshots_dir))
        except OSError:
            return removed
        for entry in entries:
            try:
                if not entry.is_file(follow_symlinks=False):
                    continue
                age = now - entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            path = Path(entry.path)
            if path.suffix == SNAPSHOT_SUFFIX and not _is_temp_name(entry.name):
                if path.stem not in referenced and age > ORPHAN_GRACE_S and self._unlink(path):
                    removed.append(path.stem)
            elif _is_temp_name(entry.name) and age > STALE_TEMP_S:
                self._unlink(path)
        return removed

    @staticmethod
    def _unlink(path: Path) -> bool:
        """Delete a file; one that cannot be deleted now (e.g. open on Windows) is left for next time."""
        try:
            path.unlink(missing_ok=True)
        except OSError:
            return False
        return True

    # export / import

    def export_markdown(self, conv_id: int) -> str:
        record = self.conversation(conv_id)
        title = " ".join(record.title.split()) or DEFAULT_TITLE
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(record.created))
        parts = [f"# {title}", f"_LazyKV Chat conversation, started {created}_"]
        if record.system_prompt:
            parts += ["## System prompt", record.system_prompt]
        for message in record.messages:
            parts += [f"## {message['role'].capitalize()}", message["content"]]
        return "\n\n".join(parts) + "\n"

    def export_json(self, conv_id: int) -> dict:
        """The conversation as a JSON-able dict (no snapshot); ``import_json`` reads it back."""
        record = self.conversation(conv_id)
        return {
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "title": record.title,
            "system_prompt": record.system_prompt,
            "settings": record.settings,
            "messages": record.messages,
            "created": record.created,
            "updated": record.updated,
        }

    def import_json(self, data: dict) -> int:
        """Add a conversation from ``export_json`` output; ValueError saying what is wrong with it."""
        conv = _validate_export(data)
        with self._write() as db:
            cursor = db.execute(
                "INSERT INTO conversations (title, created, updated, system_prompt, settings)"
                " VALUES (?, ?, ?, ?, ?)",
                (conv["title"], conv["created"], conv["updated"], conv["system_prompt"], conv["settings"]),
            )
            conv_id = int(cursor.lastrowid)
            self._insert_messages(db, conv_id, conv["messages"])
        return conv_id


_EXPORT_FIELDS = {"format", "version", "title", "system_prompt", "settings", "messages", "created", "updated"}


def _validate_export(data: Any) -> dict:
    """The fields of an exported conversation, checked, with settings as JSON text."""
    if not isinstance(data, dict):
        raise ValueError(f"not a LazyKV conversation: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != EXPORT_FORMAT:
        raise ValueError(
            f"not a LazyKV conversation: format is {data.get('format')!r}, not {EXPORT_FORMAT!r}"
        )
    version = data.get("version")
    if type(version) is not int or version != EXPORT_VERSION:
        raise ValueError(
            f"unsupported conversation version {version!r} (this LazyKV Chat reads {EXPORT_VERSION})"
        )
    unknown = sorted(set(data) - _EXPORT_FIELDS)
    if unknown:
        raise ValueError(f"unknown field(s) in the conversation: {', '.join(unknown)}")
    missing = sorted(_EXPORT_FIELDS - set(data))
    if missing:
        raise ValueError(f"missing field(s) in the conversation: {', '.join(missing)}")
    for field in ("title", "system_prompt"):
        if not isinstance(data[field], str):
            raise ValueError(f"{field} must be text, not {type(data[field]).__name__}")
    for field in ("created", "updated"):
        value = data[field]
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise ValueError(f"{field} must be a time in seconds, not {value!r}")
    if not isinstance(data["messages"], list):
        raise ValueError(f"messages must be a list, not {type(data['messages']).__name__}")
    return {
        "title": data["title"].strip() or DEFAULT_TITLE,
        "system_prompt": data["system_prompt"],
        "settings": _settings_json(data["settings"]),
        "messages": [_validate_message(i, m) for i, m in enumerate(data["messages"])],
        "created": float(data["created"]),
        "updated": float(data["updated"]),
    }
