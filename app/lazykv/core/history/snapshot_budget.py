"""The KV snapshots' references in the database and their files, kept under a size budget.

Snapshot files are named ``<sha256>.lkv`` in the snapshots dir (written by ``persistence``); the
database only points at them. ``prune_snapshots`` keeps their total size under a budget, least
recently used first; ``clean_up`` removes what interrupted saves left behind. Transcripts are never
touched here.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lazykv.core.history.connection import Connection
from lazykv.core.history.pieces import punch_holes
from lazykv.core.history.records import Change, OpChanges, PieceRow, SnapshotRef, StoreError, check_sha256

SNAPSHOT_SUFFIX = ".lkv"
PIECES_DIR = "pieces"  # the shared pieces of snapshot states (``pieces``), in packs: a save's new ones
PIECE_SUFFIX = ".lkvp"
_SQL_VARS = 500  # addresses per query (SQLite's bound on parameters)
PENDING_PREFIX = "pending-"  # a snapshot being written: pending-<uuid>.lkv, then renamed to <sha256>.lkv
ORPHAN_GRACE_S = 60.0  # a leftover younger than this may belong to a save still in progress

_SHA256 = re.compile(r"[0-9a-f]{64}")
_PIECE_NAME = re.compile(r"[0-9a-f]{32}" + re.escape(PIECE_SUFFIX))


@dataclass(frozen=True)
class Cleanup:
    """Leftovers removed from the snapshots dir (not counted as pruned snapshots)."""

    orphans: int = 0  # <sha256>.lkv files that no conversation references
    unfinished: int = 0  # temp and pending-*.lkv files of saves that never finished
    freed_bytes: int = 0

    def __add__(self, other: Cleanup) -> Cleanup:
        return Cleanup(self.orphans + other.orphans, self.unfinished + other.unfinished,
                       self.freed_bytes + other.freed_bytes)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Pruned(OpChanges):
    pruned: list[str]  # sha256 of the snapshots dropped by the budget, least recently used first
    cleanup: Cleanup


def _is_temp_name(name: str) -> bool:
    """Names a snapshot writer gives a file before renaming it to ``<sha256>.lkv``."""
    return name.startswith((".", "tmp", PENDING_PREFIX)) or name.endswith(".tmp")


class SnapshotBudget(Connection):
    """The snapshot operations of ``Store``: which file a conversation's context memory is in, and
    the budget that bounds them all."""

    def snapshot_path(self, sha256: str) -> Path:
        return self.snapshots_dir / f"{check_sha256(sha256)}{SNAPSHOT_SUFFIX}"

    @property
    def pieces_dir(self) -> Path:
        return self.snapshots_dir / PIECES_DIR

    def piece_rows(self, addresses: list[str]) -> dict[str, PieceRow]:
        """The stored pieces among ``addresses``, by address."""
        found: dict[str, PieceRow] = {}
        with self._read() as db:
            for start in range(0, len(addresses), _SQL_VARS):
                part = addresses[start : start + _SQL_VARS]
                marks = ",".join("?" * len(part))
                for row in db.execute(f"SELECT {_PIECE_COLUMNS} FROM pieces WHERE address IN"
                                      f" ({marks})", part):  # fmt: skip
                    found[row[0]] = _piece(row)
        return found

    @staticmethod
    def _pieces_of(db: sqlite3.Connection, conv_id: int) -> tuple[PieceRow, ...]:
        columns = ", ".join(f"p.{c}" for c in _PIECE_COLUMNS.split(", "))
        rows = db.execute(f"SELECT {columns} FROM snapshot_pieces s"
                          " JOIN pieces p ON p.address = s.address WHERE s.conv_id = ?",
                          (conv_id,))  # fmt: skip
        return tuple(_piece(row) for row in rows)

    @staticmethod
    def _drop_unreferenced(db: sqlite3.Connection) -> list[PieceRow]:
        """Delete the rows (and so the keys) of the pieces no snapshot holds; returns them."""
        unheld = "FROM pieces WHERE address NOT IN (SELECT address FROM snapshot_pieces)"
        rows = [_piece(row) for row in db.execute(f"SELECT {_PIECE_COLUMNS} {unheld}")]
        db.execute(f"DELETE {unheld}")
        return rows

    def _unlink_pieces(self, gone: list[PieceRow]) -> None:
        """The files of pieces whose rows are gone: a pack no row names any more is deleted; in one that
        still holds other pieces, their records' bytes are freed (a hole punched, where the file system
        can; their keys are gone in any case)."""
        files = sorted({p.file for p in gone})
        if not files:
            return
        with self._errors():
            held = {row[0] for start in range(0, len(files), _SQL_VARS)
                    for row in self._db.execute(
                        "SELECT DISTINCT file FROM pieces WHERE file IN"
                        f" ({','.join('?' * len(files[start : start + _SQL_VARS]))})",
                        files[start : start + _SQL_VARS])}  # fmt: skip
        for name in files:
            if name not in held:
                self._unlink(self.pieces_dir / name)
        punch_holes(self.pieces_dir, [(p.file, p.offset, p.size) for p in gone if p.file in held])

    @staticmethod
    def _stored_bytes(db: sqlite3.Connection) -> int:
        """The snapshot files and the pieces they hold, each piece counted once."""
        files = db.execute("SELECT coalesce(sum(size), 0) FROM (SELECT max(size) AS size FROM snapshots"
                           " GROUP BY sha256)").fetchone()[0]  # fmt: skip
        pieces = db.execute("SELECT coalesce(sum(size), 0) FROM pieces").fetchone()[0]
        return int(files) + int(pieces)

    def stored_bytes(self) -> int:
        """What the snapshots take on disk (shared pieces once): what the budget bounds."""
        with self._read() as db:
            return self._stored_bytes(db)

    def _snapshot(self, db: sqlite3.Connection, conv_id: int) -> SnapshotRef | None:
        row = db.execute(
            "SELECT sha256, size, n_tokens, header_json, last_used, wrapped_key FROM snapshots"
            " WHERE conv_id = ?",
            (conv_id,),
        ).fetchone()
        if row is None:
            return None
        sha256, size, n_tokens, header_json, last_used, wrapped = row
        return SnapshotRef(sha256, self.snapshot_path(sha256), size, n_tokens, header_json, last_used,
                           None if wrapped is None else bytes(wrapped),
                           self._pieces_of(db, conv_id))  # fmt: skip

    def set_snapshot(
        self, conv_id: int, sha256: str, size: int, n_tokens: int, header_json: str,
        wrapped_key: bytes | None = None, pieces: tuple[PieceRow, ...] = (),
    ) -> str | None:  # fmt: skip
        """Point the conversation at the snapshot file ``snapshot_path(sha256)`` (``wrapped_key``: the
        file's own key, wrapped by the master key; None for an unencrypted file) and the ``pieces`` its
        state is made of (a piece already stored keeps its row, file and key: a save that wrote it again
        finds its own file removed); returns the sha256 it pointed at before (delete that file if
        ``unreferenced`` says nothing else uses it). The pieces only the previous snapshot held go,
        rows (their keys) and files. StoreError, nothing changed, when a piece's file is gone."""
        check_sha256(sha256)
        if size < 0 or n_tokens < 0:
            raise ValueError(f"snapshot size and token count must not be negative ({size}, {n_tokens})")
        with self._write() as db:
            self._require(db, conv_id)
            previous = db.execute("SELECT sha256 FROM snapshots WHERE conv_id = ?", (conv_id,)).fetchone()
            db.execute("DELETE FROM snapshot_pieces WHERE conv_id = ?", (conv_id,))
            db.execute(
                "INSERT OR REPLACE INTO snapshots"
                " (conv_id, sha256, size, n_tokens, header_json, last_used, wrapped_key)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (conv_id, sha256, int(size), int(n_tokens), header_json, self._now(), wrapped_key),
            )
            db.executemany(f"INSERT OR IGNORE INTO pieces ({_PIECE_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
                           [_piece_values(p) for p in pieces])  # fmt: skip
            db.executemany("INSERT OR IGNORE INTO snapshot_pieces (conv_id, address) VALUES (?, ?)",
                           [(conv_id, p.address) for p in pieces])  # fmt: skip
            stored = self._pieces_of(db, conv_id)
            for file in {piece.file for piece in stored}:
                if not (self.pieces_dir / file).is_file():
                    raise StoreError("a piece of an earlier snapshot was removed while this one was saved; "
                                     "it is saved again after the next reply")
            dropped = self._drop_unreferenced(db)
        kept = {(p.address, p.file) for p in stored}  # a piece stored meanwhile keeps the other record
        self._unlink_pieces(dropped + [p for p in pieces if (p.address, p.file) not in kept])
        return previous[0] if previous else None

    def touch_snapshot(self, conv_id: int) -> None:
        """Mark the conversation's snapshot as used now (on resume), for least-recently-used pruning."""
        with self._write() as db:
            db.execute("UPDATE snapshots SET last_used = ? WHERE conv_id = ?", (self._now(), conv_id))

    def unreferenced(self, sha256: str) -> bool:
        """Whether no conversation points at this snapshot."""
        with self._errors():
            return self._db.execute("SELECT 1 FROM snapshots WHERE sha256 = ?", (sha256,)).fetchone() is None

    def prune_snapshots(self, budget_bytes: int, keep: str | None = None) -> Pruned:
        """Delete snapshot files until the referenced ones total at most ``budget_bytes``: least
        recently used first, clearing their references (transcripts are never touched); ``keep`` (the
        snapshot just saved) is never pruned, even if it alone is over the budget. Then the leftovers
        older than ORPHAN_GRACE_S go (``clean_up``), counted apart from the pruned snapshots."""
        with self._write() as db:
            by_age = db.execute(
                "SELECT sha256 FROM snapshots GROUP BY sha256 ORDER BY max(last_used), sha256"
            ).fetchall()
            total = self._stored_bytes(db)  # a piece held by several snapshots counts once
            pruned: list[str] = []
            dropped: list[PieceRow] = []
            for (sha256,) in by_age:
                if total <= budget_bytes:
                    break
                if sha256 == keep:
                    continue
                db.execute("DELETE FROM snapshots WHERE sha256 = ?", (sha256,))  # its references cascade
                dropped += self._drop_unreferenced(db)  # only what no other snapshot holds
                pruned.append(sha256)
                total = self._stored_bytes(db)
        # references are gone before the files: a crash in between leaves orphans, removed next time
        for sha256 in pruned:
            self._unlink(self.snapshot_path(sha256))
        self._unlink_pieces(dropped)
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
        with self._write() as db:  # a crash between a delete and its erase: those pieces' rows
            self._drop_unreferenced(db)
        with self._errors():
            referenced = {row[0] for row in self._db.execute("SELECT DISTINCT sha256 FROM snapshots")}
            held = {row[0] for row in self._db.execute("SELECT file FROM pieces")}
        pieces = self._sweep(self.pieces_dir, grace_s,
                             lambda name: bool(_PIECE_NAME.fullmatch(name)) and name not in held)
        return pieces + self._sweep(self.snapshots_dir, grace_s, lambda name: (
            name.endswith(SNAPSHOT_SUFFIX) and bool(_SHA256.fullmatch(name.removesuffix(SNAPSHOT_SUFFIX)))
            and name.removesuffix(SNAPSHOT_SUFFIX) not in referenced))

    def _sweep(self, folder: Path, grace_s: float, orphan: Callable[[str], bool]) -> Cleanup:
        """Delete the files of ``folder`` older than ``grace_s`` that are unfinished writes or, by their name,
        ``orphan``s; other files are not ours and stay."""
        total = Cleanup()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return total
        now = time.time()
        for entry in entries:
            try:
                if not entry.is_file(follow_symlinks=False):
                    continue
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if now - info.st_mtime < grace_s:
                continue
            if _is_temp_name(entry.name):
                found = Cleanup(unfinished=1, freed_bytes=info.st_size)
            elif orphan(entry.name):
                found = Cleanup(orphans=1, freed_bytes=info.st_size)
            else:
                continue
            if self._unlink(Path(entry.path)):
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


_PIECE_COLUMNS = "address, file, size, wrapped_key, offset"


def _piece(row: tuple) -> PieceRow:
    address, file, size, wrapped, offset = row
    return PieceRow(address, file, int(size), None if wrapped is None else bytes(wrapped), int(offset))


def _piece_values(p: PieceRow) -> tuple:
    return p.address, p.file, p.size, p.wrapped_key, p.offset
