"""The conversation database's connection: SQLite in WAL mode, its schema and migrations, and
encryption at rest.

With a ``key`` the database is encrypted with SQLCipher (the ``sqlcipher3`` binding, FTS5
included): a plain database from an earlier version is encrypted in place on first open, crash-
safely (exported to a side file, which is renamed over the original only once complete).
A data folder this process cannot write opens the history read-only. Errors are ``StoreError``
subclasses whose message is written for the user.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from lazykv.core.files import fsync_dir
from lazykv.core.history.records import (
    MAX_TIME,
    ConversationNotFound,
    StoreBusyError,
    StoreError,
    StoreLockedError,
    StoreReadOnlyError,
)
from lazykv.core.paths import DB_FILE, PRIVATE_FILE, SNAPSHOTS_DIR, data_dir, private_dir, restrict

SCHEMA_VERSION = 10
DB_KEY_BYTES = 32
_PLAIN_HEADER = b"SQLite format 3\x00"


# the search index of the messages kept up to date (v1; made again by v10, which rebuilds the table)
_MESSAGES_FTS_TRIGGERS = """
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
"""

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
""" + _MESSAGES_FTS_TRIGGERS + """
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


# v5: each snapshot file has its own key, kept here wrapped by the master key (NULL: an unencrypted
# snapshot, or one saved before v5, which is refused as older and saved again): deleting the row (the
# conversation, a pruned snapshot) crypto-erases every copy of the file
_SCHEMA_V5 = """
ALTER TABLE snapshots ADD COLUMN wrapped_key BLOB;
"""

# v6: a snapshot's state is stored as pieces shared between snapshots (``pieces``): each piece once, its
# own key wrapped by the master key (NULL: unencrypted), and which snapshots hold it (the reference
# count; a piece's row, and with it its key, goes with its last reference). Snapshots saved before stay
# readable (format 3 files hold the whole state) and are saved as pieces next time.
_SCHEMA_V6 = """
CREATE TABLE pieces (
    address TEXT PRIMARY KEY,  -- keyed hash of its bytes
    file TEXT NOT NULL UNIQUE,  -- its file in the snapshots folder's pieces/
    size INTEGER NOT NULL,  -- bytes on disk
    wrapped_key BLOB
);
CREATE TABLE snapshot_pieces (
    conv_id INTEGER NOT NULL REFERENCES snapshots(conv_id) ON DELETE CASCADE,
    address TEXT NOT NULL REFERENCES pieces(address),
    PRIMARY KEY (conv_id, address)
);
CREATE INDEX snapshot_pieces_address ON snapshot_pieces(address);
"""

# v7: a branch names its parent by uid (a deleted parent leaves the link, said as gone; an undone delete or
# an import of the parent finds it again), the parent's title when it was made, and how many of the
# parent's messages it began with; NULL for a conversation that is no branch
_SCHEMA_V7 = """
ALTER TABLE conversations ADD COLUMN parent_uid TEXT;
ALTER TABLE conversations ADD COLUMN parent_title TEXT;
ALTER TABLE conversations ADD COLUMN branch_at INTEGER;
CREATE INDEX conversations_parent ON conversations(parent_uid);
"""

# v8: the lines shown inside or under a message where the KV cache took a step ("Context compacted to
# 8-bit here"), stored with it as a JSON list of [offset in its text, label]; NULL for none
_SCHEMA_V8 = """
ALTER TABLE messages ADD COLUMN markers TEXT;
"""

# v9: a save's new pieces are written into one pack file (a piece: its ``file`` and the ``offset`` of its
# record there; a pack goes with its last piece), so a resume opens a few files, not thousands; the
# pieces table is rebuilt without the file's uniqueness, pieces stored before v9 are packs of one piece
_SCHEMA_V9 = """
CREATE TABLE pieces_v9 (
    address TEXT PRIMARY KEY,  -- keyed hash of its bytes
    file TEXT NOT NULL,  -- its pack in the snapshots folder's pieces/
    size INTEGER NOT NULL,  -- bytes on disk: its record in the pack
    wrapped_key BLOB,
    offset INTEGER NOT NULL DEFAULT 0  -- where its record starts in the pack
);
INSERT INTO pieces_v9 (address, file, size, wrapped_key) SELECT address, file, size, wrapped_key FROM pieces;
CREATE TABLE snapshot_pieces_v9 (
    conv_id INTEGER NOT NULL REFERENCES snapshots(conv_id) ON DELETE CASCADE,
    address TEXT NOT NULL REFERENCES pieces_v9(address),
    PRIMARY KEY (conv_id, address)
);
INSERT INTO snapshot_pieces_v9 (conv_id, address) SELECT conv_id, address FROM snapshot_pieces;
DROP TABLE snapshot_pieces;
DROP TABLE pieces;
ALTER TABLE pieces_v9 RENAME TO pieces;
ALTER TABLE snapshot_pieces_v9 RENAME TO snapshot_pieces;
CREATE INDEX snapshot_pieces_address ON snapshot_pieces(address);
CREATE INDEX pieces_file ON pieces(file);
"""

# v10: tool turns. A reply that asks for tools and a tool's result are messages: the role 'tool' is
# allowed (SQLite cannot change a CHECK: the table is rebuilt, with the same ids, so the search index
# stays true; its triggers are made again), and ``tool_fields`` holds a message's tool keys as a JSON
# object (a reply's tool_calls; a result's tool_call_id, name and tool, how the call ended); NULL for
# any other message
_SCHEMA_V10 = """
CREATE TABLE messages_v10 (
    id INTEGER PRIMARY KEY,
    conv_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system', 'tool')),
    content TEXT NOT NULL,
    stats TEXT,
    versions TEXT,
    markers TEXT,
    tool_fields TEXT,
    UNIQUE (conv_id, seq)
);
INSERT INTO messages_v10 (id, conv_id, seq, role, content, stats, versions, markers)
    SELECT id, conv_id, seq, role, content, stats, versions, markers FROM messages;
DROP TABLE messages;
ALTER TABLE messages_v10 RENAME TO messages;
""" + _MESSAGES_FTS_TRIGGERS


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
    4: lambda db: _execute_script(db, _SCHEMA_V5),
    5: lambda db: _execute_script(db, _SCHEMA_V6),
    6: lambda db: _execute_script(db, _SCHEMA_V7),
    7: lambda db: _execute_script(db, _SCHEMA_V8),
    8: lambda db: _execute_script(db, _SCHEMA_V9),
    9: lambda db: _execute_script(db, _SCHEMA_V10),
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


def _writable(path: Path) -> bool:
    """Whether this process may create or change ``path`` (a file or a dir that may not exist yet)."""
    while not path.exists():
        if path.parent == path:
            return False
        path = path.parent
    return os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0))


def _private_dir(path: Path) -> None:
    private_dir(path, own=True)  # and each folder made above it


# carries a snapshot's wrapped key (its row's conversation id given; for a piece, its address) over to a
# new master key; None drops the snapshot's row (its key cannot follow: to or from no encryption)
Rewrap = Callable[[bytes, "int | str"], "bytes | None"]


def reencrypt(path: Path, old_key: bytes | None, new_key: bytes | None, rewrap: Rewrap | None = None) -> None:
    """Rewrite the closed database at ``path`` from ``old_key`` to ``new_key`` (None: plain), in place
    and crash-safely: exported to a side file, which is renamed over it only once complete (a crash
    or any error before leaves the old file as it was; the side file is redone next time); the old
    WAL is checkpointed and truncated first, so a stale one never meets the new file. ``rewrap``
    rewrites each snapshot's wrapped key in the side file, so the keys change with the database or
    not at all."""
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
            os.close(os.open(side, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, PRIVATE_FILE))
            target = "" if new_key is None else f"x'{new_key.hex()}'"
            db.execute("ATTACH DATABASE ? AS target KEY ?", (str(side), target))
            db.execute("SELECT sqlcipher_export('target')").fetchone()
            db.execute(f"PRAGMA target.user_version = {version}")
            if rewrap is not None and version >= 5:
                _rewrap_snapshot_keys(db, rewrap)
            db.execute("DETACH DATABASE target")
        finally:
            db.close()
    except _db_errors() as exc:
        side.unlink(missing_ok=True)
        raise _user_error(exc, path) from exc
    except BaseException:
        side.unlink(missing_ok=True)
        raise
    try:
        with side.open("rb+") as f:
            os.fsync(f.fileno())
        os.replace(side, path)
    except BaseException:
        side.unlink(missing_ok=True)
        raise
    for stale in ("-wal", "-shm"):
        path.with_name(path.name + stale).unlink(missing_ok=True)
    fsync_dir(path.parent)


def _rewrap_snapshot_keys(db: Any, rewrap: Rewrap) -> None:
    """In the side file ``target``, in one transaction: each snapshot key rewrapped, or its row gone."""
    db.execute("BEGIN")
    try:
        for conv_id, wrapped in db.execute("SELECT conv_id, wrapped_key FROM target.snapshots").fetchall():
            new = None if wrapped is None else rewrap(bytes(wrapped), conv_id)
            if new is None:
                db.execute("DELETE FROM target.snapshots WHERE conv_id = ?", (conv_id,))
            else:
                db.execute("UPDATE target.snapshots SET wrapped_key = ? WHERE conv_id = ?", (new, conv_id))
        if _has_table(db, "target", "pieces"):
            _rewrap_piece_keys(db, rewrap)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _has_table(db: Any, schema: str, name: str) -> bool:
    return db.execute(f"SELECT 1 FROM {schema}.sqlite_master WHERE type = 'table' AND name = ?",
                      (name,)).fetchone() is not None  # fmt: skip


def _rewrap_piece_keys(db: Any, rewrap: Rewrap) -> None:
    """The pieces' keys rewrapped; a snapshot gone above, or holding a piece whose key cannot follow,
    loses its references, and a piece no snapshot holds loses its row (its file is an orphan)."""
    db.execute("DELETE FROM target.snapshot_pieces"
               " WHERE conv_id NOT IN (SELECT conv_id FROM target.snapshots)")
    for address, wrapped in db.execute("SELECT address, wrapped_key FROM target.pieces").fetchall():
        new = None if wrapped is None else rewrap(bytes(wrapped), address)
        if new is None:
            holders = "SELECT conv_id FROM target.snapshot_pieces WHERE address = ?"
            db.execute(f"DELETE FROM target.snapshots WHERE conv_id IN ({holders})", (address,))
            db.execute(f"DELETE FROM target.snapshot_pieces WHERE conv_id IN ({holders})", (address,))
        else:
            db.execute("UPDATE target.pieces SET wrapped_key = ? WHERE address = ?", (new, address))
    db.execute("DELETE FROM target.snapshot_pieces"
               " WHERE conv_id NOT IN (SELECT conv_id FROM target.snapshots)")
    db.execute("DELETE FROM target.pieces WHERE address NOT IN (SELECT address FROM target.snapshot_pieces)")


class Connection:
    """The conversation database on one connection: opened (encrypted or not), migrated, and its
    transactions. ``Store`` adds the operations; use it from one thread (``Database`` does).

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
                self._db.execute("PRAGMA secure_delete = ON")  # deleted text is overwritten, not left
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
                    os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, PRIVATE_FILE))
                elif self._key is not None and self.path.stat().st_size and _is_plain(self.path):
                    reencrypt(self.path, None, self._key)
                restrict(self.path, PRIVATE_FILE)
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

