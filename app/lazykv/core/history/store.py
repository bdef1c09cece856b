"""The conversation database: SQLite in WAL mode with FTS5 search, and the KV snapshot references.

Conversations are the source of truth and are never pruned. KV snapshots are files in the
snapshots dir named ``<sha256>.lkv`` (written elsewhere); the database only references them, and
``prune_snapshots`` keeps their total size under a budget, least recently used first.

One process has one connection: ``Database`` owns the ``Store`` and runs every operation on its
own thread, in order (the GUI submits and gets a Future, the engine thread calls and waits). Every
write is one transaction and returns an ``OpChanges`` saying what it changed, so each view refreshes
only for its own changes. Errors are ``StoreError`` subclasses whose message is written for the user.

With a ``key`` the database is encrypted at rest with SQLCipher (the ``sqlcipher3`` binding, FTS5
included): a plain database from an earlier version is encrypted in place on first open, crash-
safely (exported to a side file, which is renamed over the original only once complete).

Transcripts are never replaced wholesale: ``sync_transcript`` appends what the caller added since
its last sync, or rewrites the caller's own edits only if nobody else wrote in between (compare and
swap), so two processes on one conversation never lose each other's turns; a conversation is
created by its ``uid`` (made by the caller), so two saves of a new chat cannot create it twice.
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import platformdirs

from lazykv.core.chat.conversation import ReplyStats, common_prefix
from lazykv.core.files import fsync_dir

SCHEMA_VERSION = 4
APP_DIR_NAME = "lazykv"
DB_FILE = "conversations.sqlite3"
SNAPSHOTS_DIR = "snapshots"
SNAPSHOT_SUFFIX = ".lkv"
PENDING_PREFIX = "pending-"  # a snapshot being written: pending-<uuid>.lkv, then renamed to <sha256>.lkv
DEFAULT_TITLE = "New chat"
ROLES = ("user", "assistant", "system")
EXPORT_FORMAT = "lazykv-conversation"
EXPORT_VERSION = 1
SNIPPET_MARKS = ("[", "]")  # around the matched words in ConversationSummary.snippet
SNIPPET_TOKENS = 12
ORPHAN_GRACE_S = 60.0  # a leftover younger than this may belong to a save still in progress
MAX_TIME = 32503680000.0  # 3000-01-01 UTC: any time the list can show (datetime's range is wider)
MAX_TITLE_CHARS = 1000
DB_KEY_BYTES = 32
_PLAIN_HEADER = b"SQLite format 3\x00"
DIR_MODE = 0o700
FILE_MODE = 0o600

_SHA256 = re.compile(r"[0-9a-f]{64}")
_UID = re.compile(r"[0-9a-f]{32}")
T = TypeVar("T")


class StoreError(Exception):
    """The conversation database could not do what was asked; the message is meant for the user."""


class ConversationNotFound(StoreError):
    """No conversation with this id or uid (it was deleted, perhaps in another window)."""

    def __init__(self, conv: int | str) -> None:
        super().__init__("This conversation no longer exists: it was deleted.")
        self.conv = conv


class StoreBusyError(StoreError):
    """Another process holds the database's write lock (this process has one connection only)."""


class StoreReadOnlyError(StoreError):
    """The database is open read-only (a read-only data folder); nothing can be changed."""


class StoreLockedError(StoreError):
    """The database is encrypted and the key given (or none) does not open it."""


class TranscriptConflict(StoreError):
    """The caller edited messages that another window changed meanwhile; nothing was written."""


def data_dir() -> Path:
    """The platform's per-user data dir (``LAZYKV_DATA_DIR`` overrides it, e.g. for tests)."""
    override = os.environ.get("LAZYKV_DATA_DIR")
    if override:
        return Path(override)
    return Path(platformdirs.user_data_dir(APP_DIR_NAME, appauthor=False))


def new_uid() -> str:
    """A conversation's identity, made by whoever starts the conversation (see ``sync_transcript``)."""
    return uuid.uuid4().hex


class Change(StrEnum):
    """What an operation changed, for the views that show it."""

    LIST = "list"  # which conversations exist, their titles or their order
    TRANSCRIPT = "transcript"  # messages or system prompt of ``OpChanges.conv_ids``
    SETTINGS = "settings"  # per-conversation settings of ``conv_ids``
    SNAPSHOT = "snapshot"  # snapshot references (of ``conv_ids``, or any when pruning)


@dataclass(frozen=True, kw_only=True)
class OpChanges:
    """What an operation changed (Anki's OpChanges): a view refreshes only when ``touches`` says so."""

    kinds: frozenset[Change] = frozenset()
    conv_ids: frozenset[int] = frozenset()

    def touches(self, kind: Change, conv_id: int | None = None) -> bool:
        return kind in self.kinds and (conv_id is None or conv_id in self.conv_ids)

    @property
    def empty(self) -> bool:
        return not self.kinds


def _changes(conv_id: int | None, *kinds: Change) -> OpChanges:
    return OpChanges(kinds=frozenset(kinds), conv_ids=frozenset(() if conv_id is None else (conv_id,)))


@dataclass(frozen=True, kw_only=True)
class OpChangesWithId(OpChanges):
    id: int  # the conversation the operation made or acted on


@dataclass(frozen=True, kw_only=True)
class Synced(OpChangesWithId):
    """``sync_transcript``'s answer. ``messages`` is the stored transcript: the caller's sync point is
    ``len(messages)`` and, when ``merged`` (another window's turns were kept before the caller's new
    ones), the caller shows ``messages`` instead of its own list."""

    created: bool
    messages: list[dict]
    merged: bool


@dataclass(frozen=True, kw_only=True)
class Deleted(OpChanges):
    record: ConversationRecord  # for undo (``undelete``)


@dataclass(frozen=True, kw_only=True)
class Pruned(OpChanges):
    pruned: list[str]  # sha256 of the snapshots dropped by the budget, least recently used first
    cleanup: Cleanup


@dataclass(frozen=True)
class Cleanup:
    """Leftovers removed from the snapshots dir (not counted as pruned snapshots)."""

    orphans: int = 0  # <sha256>.lkv files that no conversation references
    unfinished: int = 0  # temp and pending-*.lkv files of saves that never finished
    freed_bytes: int = 0

    def __add__(self, other: Cleanup) -> Cleanup:
        return Cleanup(self.orphans + other.orphans, self.unfinished + other.unfinished,
                       self.freed_bytes + other.freed_bytes)  # fmt: skip


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
    uid: str = field(default_factory=new_uid)
    stats: dict[int, ReplyStats] = field(default_factory=dict)  # by index in ``messages``: replies' figures
    versions: dict[int, list[str]] = field(default_factory=dict)  # by index: a regenerated reply's versions


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

# v2: every conversation gets a uid (creation by uid cannot happen twice); times the list cannot
# show (an import of an older version let "updated": 1e12 in) are brought back into range
_SCHEMA_V2 = f"""
ALTER TABLE conversations ADD COLUMN uid TEXT;
UPDATE conversations SET uid = lower(hex(randomblob(16)));
CREATE UNIQUE INDEX conversations_uid ON conversations(uid);
UPDATE conversations SET created = 0 WHERE NOT (typeof(created) IN ('real', 'integer')
    AND created BETWEEN 0 AND {MAX_TIME});
UPDATE conversations SET updated = created WHERE NOT (typeof(updated) IN ('real', 'integer')
    AND updated BETWEEN 0 AND {MAX_TIME});
"""

# v3: a reply's figures (time to first token, tokens/s) are stored with it, as JSON; NULL for the
# messages written before, by the user, or imported
_SCHEMA_V3 = """
ALTER TABLE messages ADD COLUMN stats TEXT;
"""

# v4: a regenerated reply keeps every version (a JSON list of texts, oldest first; the message's
# content is the one shown); NULL for a message never regenerated
_SCHEMA_V4 = """
ALTER TABLE messages ADD COLUMN versions TEXT;
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


# MIGRATIONS[v] upgrades a database at schema version v to v + 1 (0 is a new, empty file).
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    0: lambda db: _execute_script(db, _SCHEMA_V1),
    1: lambda db: _execute_script(db, _SCHEMA_V2),
    2: lambda db: _execute_script(db, _SCHEMA_V3),
    3: lambda db: _execute_script(db, _SCHEMA_V4),
}


def _driver(encrypted: bool) -> Any:
    """The DB-API module: the standard sqlite3, or SQLCipher's for an encrypted database."""
    if not encrypted:
        return sqlite3
    try:
        from sqlcipher3 import dbapi2
    except ImportError as exc:
        raise StoreError(
            "encrypting the conversation database needs the sqlcipher3 package, which is not installed"
        ) from exc
    return dbapi2


def _db_errors() -> tuple[type[Exception], ...]:
    try:
        from sqlcipher3 import dbapi2
    except ImportError:
        return (sqlite3.Error,)
    return (sqlite3.Error, dbapi2.Error)


def _is_plain(path: Path) -> bool:
    """Whether the file is an unencrypted SQLite database (an encrypted one starts with random bytes)."""
    try:
        with path.open("rb") as f:
            return f.read(len(_PLAIN_HEADER)) == _PLAIN_HEADER
    except OSError:
        return False


def _apply_key(db: Any, key: bytes) -> None:
    """SQLCipher's raw-key form (no key derivation: the key is already 256 random or scrypt bits)."""
    if len(key) != DB_KEY_BYTES:
        raise ValueError(f"the database key must have {DB_KEY_BYTES} bytes")
    db.execute("PRAGMA cipher_log_level = NONE")
    db.execute(f"PRAGMA key = \"x'{key.hex()}'\"")


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


def _user_error(exc: Exception, path: Path) -> StoreError:
    """What went wrong, for the user, from the SQLite result code (or, failing that, the message)."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    text = str(exc).lower()
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in text:
        # this process has one connection (Database), so the lock is another process's
        return StoreBusyError(
            f"The conversation database {path} is busy: another LazyKV Chat is writing to it. "
            "Try again in a moment."
        )
    if code == sqlite3.SQLITE_FULL or "disk is full" in text:
        return StoreError(
            f"the disk is full: could not save to the conversation database {path}; "
            "the conversation is kept as it was before this change"
        )
    if (
        code in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT)
        or "not a database" in text
        or "malformed" in text
    ):
        return StoreError(
            f"the conversation database {path} is damaged (not a database); "
            "your conversations were not changed"
        )
    if code == sqlite3.SQLITE_READONLY:
        return StoreReadOnlyError(f"the conversation database {path} is read-only; changes cannot be saved")
    if code == sqlite3.SQLITE_CANTOPEN:
        return StoreError(f"cannot open the conversation database {path}")
    if code == sqlite3.SQLITE_IOERR:
        return StoreError(f"could not read or write the conversation database {path} (disk error: {exc})")
    return StoreError(f"the conversation database {path} failed: {exc}")


def _check_text(what: str, value: Any) -> str:
    """Text SQLite can store and Qt can show: a str without unpaired surrogates."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be text, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid Unicode text (it holds an unpaired surrogate)") from None
    return value


def _title(value: Any) -> str:
    """A title as the list shows it: one line, not empty, not huge."""
    title = " ".join(_check_text("title", value).split())[:MAX_TITLE_CHARS]
    return title or DEFAULT_TITLE


def _check_time(what: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_TIME
    ):
        raise ValueError(f"{what} must be a time in seconds between 1970 and 3000, not {value!r}")
    return float(value)


def _shown_time(value: Any) -> float:
    """A stored time as something the list can show, whatever the row holds."""
    try:
        return _check_time("time", value)
    except ValueError:
        return 0.0


def _validate_message(index: int, message: Any) -> dict:
    where = f"message {index + 1}"
    if not isinstance(message, dict):
        raise ValueError(f"{where}: expected an object with role and content, got {type(message).__name__}")
    if set(message) != {"role", "content"}:
        raise ValueError(f"{where}: expected exactly the fields role and content, got {sorted(message)}")
    role, content = message["role"], message["content"]
    if role not in ROLES:
        raise ValueError(f"{where}: role must be one of {', '.join(ROLES)}, not {role!r}")
    return {"role": str(role), "content": _check_text(f"{where}: content", content)}


def _settings_json(settings: dict) -> str:
    if not isinstance(settings, dict) or not all(isinstance(k, str) for k in settings):
        raise ValueError(f"settings must be an object with text keys, got {settings!r}")
    try:
        text = json.dumps(settings, allow_nan=False, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"settings are not JSON: {exc}") from None
    return _check_text("settings", text)


def _json_dict(text: str) -> dict:
    """Stored JSON (settings, a reply's stats) as a dict; a damaged value reads as none (the row still
    shows)."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _json_texts(text: str) -> list[str]:
    """Stored JSON (a reply's versions) as a list of texts; a damaged value reads as none."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return []
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else []


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
    """Names a snapshot writer gives a file before renaming it to ``<sha256>.lkv``."""
    return name.startswith((".", "tmp", PENDING_PREFIX)) or name.endswith(".tmp")


def _writable(path: Path) -> bool:
    """Whether this process may create or change ``path`` (a file or a dir that may not exist yet)."""
    while not path.exists():
        if path.parent == path:
            return False
        path = path.parent
    return os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0))


def _private_dir(path: Path) -> None:
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    _restrict(path, DIR_MODE)


def _restrict(path: Path, mode: int) -> None:
    """Owner-only permissions on our own file or dir (best effort: e.g. not on Windows)."""
    try:
        if path.stat().st_mode & 0o777 != mode:
            path.chmod(mode)
    except OSError:
        pass


def reencrypt(path: Path, old_key: bytes | None, new_key: bytes | None) -> None:
    """Rewrite the closed database at ``path`` from ``old_key`` to ``new_key`` (None: plain), in place
    and crash-safely: exported to a side file, which is renamed over it only once complete (a crash
    before leaves the old file as it was; the side file is redone next time); the old WAL is
    checkpointed and truncated first, so a stale one never meets the new file."""
    cipher = _driver(True)
    side = path.with_name(path.name + ".encrypting")
    for leftover in (side, *(side.with_name(side.name + s) for s in ("-wal", "-shm", "-journal"))):
        leftover.unlink(missing_ok=True)
    try:
        db = cipher.connect(path, isolation_level=None)
        try:
            if old_key is not None:
                _apply_key(db, old_key)
            db.execute("PRAGMA busy_timeout = 2000")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            os.close(os.open(side, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, FILE_MODE))
            target = "" if new_key is None else f"x'{new_key.hex()}'"
            db.execute("ATTACH DATABASE ? AS target KEY ?", (str(side), target))
            db.execute("SELECT sqlcipher_export('target')").fetchone()
            db.execute(f"PRAGMA target.user_version = {version}")
            db.execute("DETACH DATABASE target")
        finally:
            db.close()
    except _db_errors() as exc:
        side.unlink(missing_ok=True)
        raise _user_error(exc, path) from exc
    with side.open("rb+") as f:
        os.fsync(f.fileno())
    os.replace(side, path)
    for stale in ("-wal", "-shm"):
        path.with_name(path.name + stale).unlink(missing_ok=True)
    fsync_dir(path.parent)


class Store:
    """The conversation database on one connection. Use it from one thread (``Database`` does).

    ``read_only`` (or a data folder this process cannot write) opens the history without changing
    it: every write raises StoreReadOnlyError and ``notice`` says why, for the user.
    """

    def __init__(
        self,
        path: Path | None = None,
        snapshots_dir: Path | None = None,
        *,
        busy_timeout_ms: int = 2000,
        read_only: bool = False,
        key: bytes | None = None,
    ) -> None:
        if not _fts5_available():
            raise StoreError(
                "this Python's SQLite was built without FTS5 full-text search, which LazyKV Chat needs"
            )
        self.path = Path(path) if path is not None else data_dir() / DB_FILE
        self.snapshots_dir = Path(snapshots_dir) if snapshots_dir is not None else data_dir() / SNAPSHOTS_DIR
        self.read_only = read_only or not (_writable(self.path.parent) and _writable(self.path))
        if self.read_only and key is not None and _is_plain(self.path):
            key = None  # a plain history cannot be encrypted here: shown as it is
        self.encrypted = key is not None
        self._key = key
        self._driver = _driver(self.encrypted)
        self._last_now = 0.0
        if not self.read_only:
            try:
                _private_dir(self.path.parent)
                _private_dir(self.snapshots_dir)
            except OSError as exc:
                raise StoreError(f"cannot create the folder for the conversation database: {exc}") from exc
        self._db = self._connect()
        try:
            with self._errors():
                self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
                self._db.execute("PRAGMA foreign_keys = ON")
                if self.read_only:
                    self._check_version()
                else:
                    self._db.execute("PRAGMA journal_mode = WAL").fetchone()
                    self._migrate()
        except BaseException:
            self._db.close()
            raise

    @property
    def notice(self) -> str:
        """A sentence for the user when the history cannot be changed ("" when it can)."""
        if not self.read_only:
            return ""
        return (
            f"The conversation folder {self.path.parent} is read-only: your history is shown, "
            "but new conversations and changes are not saved."
        )

    def close(self) -> None:
        self._db.close()

    # plumbing

    def _connect(self) -> Any:
        try:
            if not self.read_only:
                if not self.path.exists():  # created owner-only; SQLite gives -wal/-shm the same mode
                    os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, FILE_MODE))
                elif self._key is not None and self.path.stat().st_size and _is_plain(self.path):
                    reencrypt(self.path, None, self._key)
                _restrict(self.path, FILE_MODE)
                return self._unlocked(self._driver.connect(self.path, isolation_level=None,
                                                           check_same_thread=False))  # fmt: skip
            if not self.path.exists():  # nothing saved yet and nothing can be: an empty history
                db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
                for version in range(SCHEMA_VERSION):
                    MIGRATIONS[version](db)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                return db
            return self._connect_read_only()
        except OSError as exc:
            raise StoreError(f"cannot create the conversation database {self.path}: {exc}") from exc
        except _db_errors() as exc:
            raise _user_error(exc, self.path) from exc

    def _unlocked(self, db: Any) -> Any:
        """``db`` with the key applied and checked (StoreLockedError when it does not open it)."""
        try:
            if self._key is not None:
                _apply_key(db, self._key)
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except _db_errors() as exc:
            db.close()
            code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
            if code == sqlite3.SQLITE_NOTADB and self._key is not None:
                raise StoreLockedError(
                    f"The conversation database {self.path} is encrypted and could not be unlocked "
                    "with this key: choose the protection it was saved with (OS keyring or passphrase)."
                ) from exc
            if code == sqlite3.SQLITE_NOTADB and not _is_plain(self.path):
                raise StoreLockedError(
                    f"the conversation database {self.path} is damaged (not a database), or encrypted "
                    "and no key was given; your conversations were not changed"
                ) from exc
            raise
        return db

    def _connect_read_only(self) -> Any:
        """Read-only, with the WAL's last transactions if SQLite can read them here; else (no -shm
        file it could use) immutable, which no other writer can contradict in a read-only folder."""
        uri = self.path.resolve().as_uri()
        connect = self._driver.connect
        try:
            return self._unlocked(connect(uri + "?mode=ro", uri=True, isolation_level=None,
                                          check_same_thread=False))  # fmt: skip
        except StoreLockedError:
            raise
        except _db_errors():
            pass
        return self._unlocked(connect(uri + "?mode=ro&immutable=1", uri=True, isolation_level=None,
                                      check_same_thread=False))  # fmt: skip

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except _db_errors() as exc:
            raise _user_error(exc, self.path) from exc

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taking the write lock up front; rolled back on any error."""
        if self.read_only:
            raise StoreReadOnlyError(self.notice)
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

    def _check_version(self) -> int:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the conversation database {self.path} was written by a newer LazyKV Chat "
                f"(schema {version}, this version knows {SCHEMA_VERSION}); update LazyKV Chat"
            )
        if self.read_only and version != SCHEMA_VERSION:
            raise StoreReadOnlyError(
                f"{self.notice} It was written by an older LazyKV Chat and cannot be upgraded there."
            )
        return version

    def _migrate(self) -> None:
        if self._check_version() == SCHEMA_VERSION:
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
            raise ConversationNotFound(conv_id)

    def _touch(self, db: sqlite3.Connection, conv_id: int) -> None:
        db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (self._now(), conv_id))

    def _update_column(self, conv_id: int, column: str, value: str, change: Change) -> OpChanges:
        with self._write() as db:
            self._require(db, conv_id)
            db.execute(f"UPDATE conversations SET {column} = ? WHERE id = ?", (value, conv_id))
            self._touch(db, conv_id)
        return _changes(conv_id, change, Change.LIST)

    # conversations

    def create_conversation(
        self, title: str = DEFAULT_TITLE, system_prompt: str = "", settings: dict | None = None
    ) -> int:
        """A new empty conversation's id (the app creates conversations through ``sync_transcript``)."""
        with self._write() as db:
            return self._insert_conversation(db, new_uid(), title, system_prompt, settings or {})

    def _insert_conversation(
        self, db: sqlite3.Connection, uid: str, title: str, system_prompt: str, settings: dict
    ) -> int:
        now = self._now()
        cursor = db.execute(
            "INSERT INTO conversations (uid, title, created, updated, system_prompt, settings)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (uid, _title(title), now, now, _check_text("system prompt", system_prompt),
             _settings_json(settings)),
        )  # fmt: skip
        return int(cursor.lastrowid)

    def conversation(self, conv_id: int) -> ConversationRecord:
        """Everything about one conversation; ConversationNotFound if there is none with this id."""
        with self._read() as db:
            return self._record(db, conv_id)

    def conversation_id(self, uid: str) -> int:
        """The id of the conversation with this uid; ConversationNotFound if there is none."""
        with self._errors():
            row = self._db.execute("SELECT id FROM conversations WHERE uid = ?", (uid,)).fetchone()
        if row is None:
            raise ConversationNotFound(uid)
        return int(row[0])

    def _record(self, db: sqlite3.Connection, conv_id: int) -> ConversationRecord:
        row = db.execute(
            "SELECT id, title, created, updated, system_prompt, settings, uid"
            " FROM conversations WHERE id = ?",
            (conv_id,),
        ).fetchone()
        if row is None:
            raise ConversationNotFound(conv_id)
        return ConversationRecord(
            id=row[0], title=row[1], created=_shown_time(row[2]), updated=_shown_time(row[3]),
            system_prompt=row[4], settings=_json_dict(row[5]), messages=self._messages(db, conv_id),
            snapshot=self._snapshot(db, conv_id), uid=row[6], stats=self._stats(db, conv_id),
            versions=self._versions(db, conv_id),
        )  # fmt: skip

    def list_conversations(self) -> list[ConversationSummary]:
        """Every conversation, most recently updated first (a row with a damaged time still shows)."""
        with self._errors():
            rows = self._db.execute(
                "SELECT c.id, c.title, c.created, c.updated,"
                " (SELECT count(*) FROM messages m WHERE m.conv_id = c.id)"
                " FROM conversations c ORDER BY c.updated DESC, c.id DESC"
            ).fetchall()
        return [
            ConversationSummary(id_, str(title), _shown_time(created), _shown_time(updated), n)
            for id_, title, created, updated, n in rows
        ]

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

    def rename(self, conv_id: int, title: str) -> OpChanges:
        return self._update_column(conv_id, "title", _title(title), Change.LIST)

    def set_system_prompt(self, conv_id: int, text: str) -> OpChanges:
        return self._update_column(conv_id, "system_prompt", _check_text("system prompt", text),
                                   Change.TRANSCRIPT)  # fmt: skip

    def set_settings(self, conv_id: int, settings: dict) -> OpChanges:
        """Replace the conversation's settings (model path, sampling, ...): a JSON-able dict."""
        return self._update_column(conv_id, "settings", _settings_json(settings), Change.SETTINGS)

    def delete(self, conv_id: int) -> Deleted:
        """Remove the conversation; ``record`` is for undo. Its snapshot file stays on disk (so undo
        can restore it); ``prune_snapshots`` removes it later if nothing references it."""
        with self._write() as db:
            record = self._record(db, conv_id)
            db.execute("DELETE FROM conversations WHERE id = ?", (conv_id,))
        return Deleted(record=record, **_fields(_changes(conv_id, *Change)))

    def undelete(self, record: ConversationRecord) -> OpChangesWithId:
        """Put a deleted conversation back, with its id if that is free (``id`` says which it got). The
        snapshot reference comes back only if its file is still there."""
        settings_json = _settings_json(record.settings)
        messages = [_validate_message(i, m) for i, m in enumerate(record.messages)]
        with self._write() as db:
            taken = db.execute("SELECT 1 FROM conversations WHERE id = ? OR uid = ?",
                               (record.id, record.uid)).fetchone()  # fmt: skip
            cursor = db.execute(
                "INSERT INTO conversations (id, uid, title, created, updated, system_prompt, settings)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (None if taken else record.id, new_uid() if taken else record.uid, _title(record.title),
                 _shown_time(record.created), _shown_time(record.updated), record.system_prompt,
                 settings_json),
            )  # fmt: skip
            conv_id = int(cursor.lastrowid)
            self._insert_messages(db, conv_id, messages)
            self._write_stats(db, conv_id, record.stats)
            self._write_versions(db, conv_id, record.versions)
            snap = record.snapshot
            if snap is not None and self.snapshot_path(snap.sha256).exists():
                db.execute(
                    "INSERT INTO snapshots (conv_id, sha256, size, n_tokens, header_json, last_used)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (conv_id, snap.sha256, snap.size, snap.n_tokens, snap.header_json, snap.last_used),
                )
        return OpChangesWithId(id=conv_id, **_fields(_changes(conv_id, *Change)))

    # messages

    @staticmethod
    def _messages(db: sqlite3.Connection, conv_id: int) -> list[dict]:
        rows = db.execute("SELECT role, content FROM messages WHERE conv_id = ? ORDER BY seq", (conv_id,))
        return [{"role": role, "content": content} for role, content in rows]

    @staticmethod
    def _stats(db: sqlite3.Connection, conv_id: int) -> dict[int, ReplyStats]:
        rows = db.execute("SELECT stats FROM messages WHERE conv_id = ? ORDER BY seq", (conv_id,))
        found = {i: ReplyStats.from_json(_json_dict(text)) for i, (text,) in enumerate(rows) if text}
        return {i: stats for i, stats in found.items() if stats is not None}

    @staticmethod
    def _versions(db: sqlite3.Connection, conv_id: int) -> dict[int, list[str]]:
        rows = db.execute("SELECT versions FROM messages WHERE conv_id = ? ORDER BY seq", (conv_id,))
        found = {i: _json_texts(text) for i, (text,) in enumerate(rows) if text}
        return {i: versions for i, versions in found.items() if len(versions) > 1}

    @staticmethod
    def _write_versions(db: sqlite3.Connection, conv_id: int, versions: Mapping[int, Sequence[str]]) -> None:
        """Store each regenerated reply's versions with the message at that index."""
        if not versions:
            return
        seqs = [seq for (seq,) in db.execute("SELECT seq FROM messages WHERE conv_id = ? ORDER BY seq",
                                             (conv_id,))]  # fmt: skip
        rows = [(json.dumps([_check_text("reply version", t) for t in texts], ensure_ascii=False), seqs[i])
                for i, texts in versions.items() if 0 <= i < len(seqs)]
        db.executemany("UPDATE messages SET versions = ? WHERE conv_id = ? AND seq = ? AND versions IS NOT ?",
                       [(text, conv_id, seq, text) for text, seq in rows])

    @staticmethod
    def _write_stats(db: sqlite3.Connection, conv_id: int, stats: Mapping[int, ReplyStats]) -> None:
        """Store each reply's figures with the message at that index (those already stored are kept)."""
        if not stats:
            return
        seqs = [seq for (seq,) in db.execute("SELECT seq FROM messages WHERE conv_id = ? ORDER BY seq",
                                             (conv_id,))]  # fmt: skip
        db.executemany(
            "UPDATE messages SET stats = ? WHERE conv_id = ? AND seq = ? AND stats IS NOT ?",
            [(text, conv_id, seqs[i], text) for i, text in
             ((i, json.dumps(s.to_json())) for i, s in stats.items() if 0 <= i < len(seqs))],
        )

    @staticmethod
    def _insert_messages(db: sqlite3.Connection, conv_id: int, messages: Sequence[dict]) -> None:
        """Add ``messages`` after the conversation's last one."""
        first = db.execute("SELECT coalesce(max(seq) + 1, 0) FROM messages WHERE conv_id = ?",
                           (conv_id,)).fetchone()[0]  # fmt: skip
        db.executemany(
            "INSERT INTO messages (conv_id, seq, role, content) VALUES (?, ?, ?, ?)",
            [(conv_id, first + i, m["role"], m["content"]) for i, m in enumerate(messages)],
        )

    def append_message(self, conv_id: int, role: str, content: str) -> OpChanges:
        message = _validate_message(0, {"role": role, "content": content})
        with self._write() as db:
            self._require(db, conv_id)
            self._insert_messages(db, conv_id, [message])
            self._touch(db, conv_id)
        return _changes(conv_id, Change.TRANSCRIPT, Change.LIST)

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
        not be the caller's).
        """
        if not isinstance(uid, str) or not _UID.fullmatch(uid):
            raise ValueError(f"not a conversation uid: {uid!r}")
        wanted = [_validate_message(i, m) for i, m in enumerate(messages)]
        system_prompt = _check_text("system prompt", system_prompt)
        settings_json = None if settings is None else _settings_json(settings)
        with self._write() as db:
            row = db.execute("SELECT id, system_prompt, settings FROM conversations WHERE uid = ?",
                             (uid,)).fetchone()  # fmt: skip
            created = row is None
            if created:
                if not create:
                    raise ConversationNotFound(uid)
                conv_id = self._insert_conversation(db, uid, title, system_prompt, settings or {})
                row = (conv_id, system_prompt, settings_json or "{}")
            conv_id = int(row[0])
            stored = self._messages(db, conv_id)
            kinds = self._write_messages(db, conv_id, stored, wanted, synced)
            if row[1] != system_prompt:
                db.execute("UPDATE conversations SET system_prompt = ? WHERE id = ?",
                           (system_prompt, conv_id))  # fmt: skip
                kinds.add(Change.TRANSCRIPT)
            if settings_json is not None and row[2] != settings_json:
                db.execute("UPDATE conversations SET settings = ? WHERE id = ?", (settings_json, conv_id))
                kinds.add(Change.SETTINGS)
            if kinds and not created:
                self._touch(db, conv_id)
            result = self._messages(db, conv_id) if kinds else stored
            if result == wanted:
                self._write_stats(db, conv_id, stats or {})
                self._write_versions(db, conv_id, versions or {})
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
            Store._insert_messages(db, conv_id, new)
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
        Store._insert_messages(db, conv_id, wanted[keep:])
        return {Change.TRANSCRIPT}

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

    def clear_snapshot(self, conv_id: int) -> OpChanges:
        with self._write() as db:
            db.execute("DELETE FROM snapshots WHERE conv_id = ?", (conv_id,))
        return _changes(conv_id, Change.SNAPSHOT)

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

    def prune_snapshots(self, budget_bytes: int, keep: str | None = None) -> Pruned:
        """Delete snapshot files until the referenced ones total at most ``budget_bytes``: least
        recently used first, clearing their references (transcripts are never touched); ``keep`` (the
        snapshot just saved) is never pruned, even if it alone is over the budget. Then the leftovers
        older than ORPHAN_GRACE_S go (``clean_up``), counted apart from the pruned snapshots."""
        with self._write() as db:
            by_age = db.execute(
                "SELECT sha256, max(size) FROM snapshots GROUP BY sha256 ORDER BY max(last_used), sha256"
            ).fetchall()
            total = sum(size for _, size in by_age)
            pruned: list[str] = []
            for sha256, size in by_age:
                if total <= budget_bytes:
                    break
                if sha256 == keep:
                    continue
                db.execute("DELETE FROM snapshots WHERE sha256 = ?", (sha256,))
                pruned.append(sha256)
                total -= size
        # references are gone before the files: a crash in between leaves orphans, removed next time
        for sha256 in pruned:
            self._unlink(self.snapshot_path(sha256))
        cleanup = self.clean_up(ORPHAN_GRACE_S)
        conv_kinds = frozenset({Change.SNAPSHOT}) if pruned else frozenset()
        return Pruned(pruned=pruned, cleanup=cleanup, kinds=conv_kinds)

    def clean_up(self, grace_s: float = ORPHAN_GRACE_S) -> Cleanup:
        """Remove what interrupted saves and old versions left in the snapshots dir: temp files,
        ``pending-*.lkv`` and ``<sha256>.lkv`` files no conversation references, each older than
        ``grace_s`` (run at start-up, also when snapshots are off; 0 when no other process can be
        saving). Files of other names are not ours and stay."""
        if self.read_only:
            return Cleanup()
        with self._errors():
            referenced = {row[0] for row in self._db.execute("SELECT DISTINCT sha256 FROM snapshots")}
        try:
            entries = list(os.scandir(self.snapshots_dir))
        except OSError:
            return Cleanup()
        now, total = time.time(), Cleanup()
        for entry in entries:
            try:
                if not entry.is_file(follow_symlinks=False):
                    continue
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if now - info.st_mtime < grace_s:
                continue
            path = Path(entry.path)
            if _is_temp_name(entry.name):
                found = Cleanup(unfinished=1, freed_bytes=info.st_size)
            elif path.suffix == SNAPSHOT_SUFFIX and _SHA256.fullmatch(path.stem) and (
                path.stem not in referenced
            ):
                found = Cleanup(orphans=1, freed_bytes=info.st_size)
            else:
                continue
            if self._unlink(path):
                total += found
        return total

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

    def import_json(self, data: dict) -> OpChangesWithId:
        """Add a conversation from ``export_json`` output; ValueError saying what is wrong with it."""
        conv = _validate_export(data)
        with self._write() as db:
            cursor = db.execute(
                "INSERT INTO conversations (uid, title, created, updated, system_prompt, settings)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (new_uid(), conv["title"], conv["created"], conv["updated"], conv["system_prompt"],
                 conv["settings"]),
            )  # fmt: skip
            conv_id = int(cursor.lastrowid)
            self._insert_messages(db, conv_id, conv["messages"])
        return OpChangesWithId(id=conv_id, **_fields(_changes(conv_id, Change.LIST)))


def _fields(changes: OpChanges) -> dict[str, Any]:
    return {"kinds": changes.kinds, "conv_ids": changes.conv_ids}


_EXPORT_FIELDS = {"format", "version", "title", "system_prompt", "settings", "messages", "created", "updated"}


def _validate_export(data: Any) -> dict:
    """The fields of an exported conversation, checked against what the app can store and show,
    with settings as JSON text."""
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
    if not isinstance(data["messages"], list):
        raise ValueError(f"messages must be a list, not {type(data['messages']).__name__}")
    created = _check_time("created", data["created"])
    updated = _check_time("updated", data["updated"])
    return {
        "title": _title(data["title"]),
        "system_prompt": _check_text("system_prompt", data["system_prompt"]),
        "settings": _settings_json(data["settings"]),
        "messages": [_validate_message(i, m) for i, m in enumerate(data["messages"])],
        "created": created,
        "updated": max(updated, created),
    }


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

    def change_key(self, new_key: bytes | None) -> Future[None]:
        """Re-encrypt the database from the key it has now to ``new_key`` (None: plain), in place and
        crash-safely (``reencrypt``), e.g. when the user changes how the history is protected."""
        return self._queue(self._change_key, new_key)

    def _queue(self, fn: Callable[[Any], T], arg: Any) -> Future[T]:
        with self._lock:
            if self._closed:
                closed: Future[T] = Future()
                closed.set_exception(StoreError("The conversation database is closed."))
                return closed
            self._in_flight += 1
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
        closing = self._executor.submit(self._close_store)
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

    def _change_key(self, new_key: bytes | None) -> None:
        self._close_store()
        if self.path.exists() and new_key != self._key:
            reencrypt(self.path, self._key, new_key)
        self._key = new_key

    def _close_store(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def _finished(self, _: Future) -> None:
        with self._lock:
            self._in_flight -= 1
