"""What the history holds, as Python values: records, change sets, the errors (their messages are
written for the user), the checks every stored value passes, and the rows of a conversation's
messages."""

from __future__ import annotations

import json
import math
import re
import sqlite3
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from lazykv.core.chat.conversation import (
    APP_KEYS,
    SENT_KEYS,
    Conversation,
    ReplyStats,
    check_turn,
    turn_texts,
)

DEFAULT_TITLE = "New chat"
ROLES = ("user", "assistant", "system", "tool")
MAX_TIME = 32503680000.0  # 3000-01-01 UTC: any time the list can show (datetime's range is wider)
MAX_TITLE_CHARS = 1000

_SHA256 = re.compile(r"[0-9a-f]{64}")


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


@dataclass(frozen=True)
class BranchLink:
    """A branch's link to the conversation it was branched from: the parent's uid, its title when the
    branch was made (what the branch says once the parent is gone), and how many of the parent's
    messages the branch began with (it branched at message ``at``)."""

    parent_uid: str
    parent_title: str
    at: int
    parent_id: int | None = None  # the parent in this history now (None: deleted, or never imported)


@dataclass(frozen=True)
class ConversationSummary:
    id: int
    title: str
    created: float
    updated: float
    n_messages: int
    snippet: str = ""  # when searching: an excerpt around the match, matched words in SNIPPET_MARKS
    branch: BranchLink | None = None  # None: not a branch


@dataclass(frozen=True)
class PieceRow:
    """A stored piece of snapshot state (``pieces``): its address, pack file, size on disk (its record's
    length) and own key, wrapped by the master key (None: unencrypted), and where its record starts in
    the pack."""

    address: str
    file: str
    size: int
    wrapped_key: bytes | None = field(default=None, repr=False)
    offset: int = 0


@dataclass(frozen=True)
class SnapshotRef:
    sha256: str
    path: Path
    size: int
    n_tokens: int
    header_json: str
    last_used: float
    wrapped_key: bytes | None = field(default=None, repr=False)  # the file's own key, wrapped (None: plain)
    pieces: tuple[PieceRow, ...] = field(default=(), repr=False)  # what it holds of the shared pieces


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
    branch: BranchLink | None = None  # a branch's link to its parent (None: not a branch)
    # by index: the lines shown in or under a message where the cache took a step, (offset, label)
    markers: dict[int, list[tuple[int, str]]] = field(default_factory=dict)


BRANCH_SUFFIX = " (branch)"


def branch_title(parent_title: str) -> str:
    """A new branch's title: its parent's, said to be a branch ("Title (branch)"; a branch's branch too)."""
    title = clean_title(parent_title)
    return title if title.endswith(BRANCH_SUFFIX) else clean_title(title + BRANCH_SUFFIX)


def branch_link(parent_uid: Any, parent_title: Any, at: Any, parent_id: Any = None) -> BranchLink | None:
    """A stored (or imported) link as a BranchLink; None for a conversation that is no branch, or a link
    damaged beyond showing."""
    if not isinstance(parent_uid, str) or not parent_uid or isinstance(at, bool) or not isinstance(at, int):
        return None
    title = clean_title(parent_title) if isinstance(parent_title, str) else DEFAULT_TITLE
    return BranchLink(parent_uid, title, max(0, at), parent_id if isinstance(parent_id, int) else None)


def op_changes(conv_id: int | None, *kinds: Change) -> OpChanges:
    return OpChanges(kinds=frozenset(kinds), conv_ids=frozenset(() if conv_id is None else (conv_id,)))


def change_fields(op: OpChanges) -> dict[str, Any]:
    """The fields of ``op``, to build a subclass (``Deleted``, ...) with the same changes."""
    return {"kinds": op.kinds, "conv_ids": op.conv_ids}


def check_text(what: str, value: Any) -> str:
    """Text SQLite can store and Qt can show: a str without unpaired surrogates."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be text, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid Unicode text (it holds an unpaired surrogate)") from None
    return value


def clean_title(value: Any) -> str:
    """A title as the list shows it: one line, not empty, not huge."""
    title = " ".join(check_text("title", value).split())[:MAX_TITLE_CHARS]
    return title or DEFAULT_TITLE


def check_time(what: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_TIME
    ):
        raise ValueError(f"{what} must be a time in seconds between 1970 and 3000, not {value!r}")
    return float(value)


def shown_time(value: Any) -> float:
    """A stored time as something the list can show, whatever the row holds."""
    try:
        return check_time("time", value)
    except ValueError:
        return 0.0


def validate_message(index: int, message: Any) -> dict:
    """A message to store, checked and copied: a system prompt's, or a turn of the conversation (a
    reply's tool calls and a tool's result included: ``check_turn``)."""
    where = f"message {index + 1}"
    if not isinstance(message, dict):
        raise ValueError(f"{where}: expected an object with role and content, got {type(message).__name__}")
    role = message.get("role")
    if role not in ROLES:
        raise ValueError(f"{where}: role must be one of {', '.join(ROLES)}, not {role!r}")
    if role == "system":
        if set(message) != {"role", "content"}:
            raise ValueError(f"{where}: expected exactly the fields role and content, got {sorted(message)}")
        return {"role": "system", "content": check_text(f"{where}: content", message["content"])}
    turn = check_turn(message, where)
    for what, text in turn_texts(turn):
        check_text(f"{where}: {what}", text)
    return turn


def _tool_fields(message: dict) -> str | None:
    """A message's tool keys as the column ``tool_fields`` holds them (None: it has none)."""
    role = message["role"]
    fields = {k: message[k] for k in (*SENT_KEYS.get(role, ()), *APP_KEYS.get(role, ())) if k in message}
    return json.dumps(fields, ensure_ascii=False) if fields else None


def _stored_message(role: str, content: str, tool_fields: str | None) -> dict:
    """A stored message as a dict; damaged tool fields read as none (a tool result's id and name as
    empty), so the conversation still opens."""
    message = {"role": role, "content": content}
    if tool_fields is None and role != "tool":
        return message
    try:
        return check_turn({**message, **json_dict(tool_fields or "")})
    except ValueError:
        return {**message, "tool_call_id": "", "name": ""} if role == "tool" else message


def settings_json(settings: dict) -> str:
    if not isinstance(settings, dict) or not all(isinstance(k, str) for k in settings):
        raise ValueError(f"settings must be an object with text keys, got {settings!r}")
    try:
        text = json.dumps(settings, allow_nan=False, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"settings are not JSON: {exc}") from None
    return check_text("settings", text)


def json_dict(text: str) -> dict:
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


def check_sha256(sha256: str) -> str:
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return sha256


def read_messages(db: sqlite3.Connection, conv_id: int) -> list[dict]:
    rows = db.execute("SELECT role, content, tool_fields FROM messages WHERE conv_id = ? ORDER BY seq",
                      (conv_id,))  # fmt: skip
    return [_stored_message(*row) for row in rows]


def read_stats(db: sqlite3.Connection, conv_id: int) -> dict[int, ReplyStats]:
    rows = db.execute("SELECT stats FROM messages WHERE conv_id = ? ORDER BY seq", (conv_id,))
    found = {i: ReplyStats.from_json(json_dict(text)) for i, (text,) in enumerate(rows) if text}
    return {i: stats for i, stats in found.items() if stats is not None}


def read_versions(db: sqlite3.Connection, conv_id: int) -> dict[int, list[str]]:
    rows = db.execute("SELECT versions FROM messages WHERE conv_id = ? ORDER BY seq", (conv_id,))
    found = {i: _json_texts(text) for i, (text,) in enumerate(rows) if text}
    return {i: versions for i, versions in found.items() if len(versions) > 1}


def _json_markers(text: str) -> list[tuple[int, str]]:
    """Stored JSON (a message's markers) as (offset, label) pairs; a damaged entry reads as none."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return []
    if not isinstance(value, list):
        return []
    return [(offset, label) for offset, label in (m for m in value if isinstance(m, list) and len(m) == 2)
            if type(offset) is int and offset >= 0 and isinstance(label, str)]


def read_markers(db: sqlite3.Connection, conv_id: int) -> dict[int, list[tuple[int, str]]]:
    rows = db.execute("SELECT markers FROM messages WHERE conv_id = ? ORDER BY seq", (conv_id,))
    found = {i: _json_markers(text) for i, (text,) in enumerate(rows) if text}
    return {i: markers for i, markers in found.items() if markers}


def write_markers(db: sqlite3.Connection, conv_id: int,
                  markers: Mapping[int, Sequence[tuple[int, str]]]) -> None:
    """The conversation's markers are ``markers`` (by index in its messages): each message's are
    replaced, a message without any in ``markers`` has none."""
    rows = db.execute("SELECT seq, markers FROM messages WHERE conv_id = ? ORDER BY seq", (conv_id,))
    changed = []
    for i, (seq, stored) in enumerate(rows.fetchall()):
        wanted = [[int(offset), check_text("marker", label)] for offset, label in markers.get(i, ())]
        text = json.dumps(wanted, ensure_ascii=False) if wanted else None
        if text != stored:
            changed.append((text, conv_id, seq))
    db.executemany("UPDATE messages SET markers = ? WHERE conv_id = ? AND seq = ?", changed)


def write_versions(db: sqlite3.Connection, conv_id: int, versions: Mapping[int, Sequence[str]]) -> None:
    """Store each regenerated reply's versions with the message at that index."""
    if not versions:
        return
    seqs = [seq for (seq,) in db.execute("SELECT seq FROM messages WHERE conv_id = ? ORDER BY seq",
                                         (conv_id,))]  # fmt: skip
    rows = [(json.dumps([check_text("reply version", t) for t in texts], ensure_ascii=False), seqs[i])
            for i, texts in versions.items() if 0 <= i < len(seqs)]
    db.executemany("UPDATE messages SET versions = ? WHERE conv_id = ? AND seq = ? AND versions IS NOT ?",
                   [(text, conv_id, seq, text) for text, seq in rows])


def write_stats(db: sqlite3.Connection, conv_id: int, stats: Mapping[int, ReplyStats]) -> None:
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


def insert_messages(db: sqlite3.Connection, conv_id: int, messages: Sequence[dict]) -> None:
    """Add ``messages`` after the conversation's last one."""
    first = db.execute("SELECT coalesce(max(seq) + 1, 0) FROM messages WHERE conv_id = ?",
                       (conv_id,)).fetchone()[0]  # fmt: skip
    db.executemany(
        "INSERT INTO messages (conv_id, seq, role, content, tool_fields) VALUES (?, ?, ?, ?, ?)",
        [(conv_id, first + i, m["role"], m["content"], _tool_fields(m)) for i, m in enumerate(messages)],
    )


@dataclass(frozen=True)
class Loaded:
    """A conversation read for opening: its record, its Conversation and the messages its resume sends."""

    record: ConversationRecord
    conversation: Conversation
    messages: list[dict[str, Any]]


def loaded(record: ConversationRecord) -> Loaded:
    """Everything opening a conversation needs, built where the record was read (the database thread):
    a long one's turns are never copied on the GUI thread."""
    conversation = Conversation(record.system_prompt)
    for i, message in enumerate(record.messages):
        if message["role"] == "system":
            conversation.system_prompt = message["content"]
            continue
        conversation.add_turn(message)
        if (stats := record.stats.get(i)) is not None:
            conversation.set_stats(len(conversation) - 1, stats)
        if i in record.versions:
            conversation.set_versions(len(conversation) - 1, record.versions[i])
        for offset, label in record.markers.get(i, ()):
            conversation.add_marker(len(conversation) - 1, offset, label)
    return Loaded(record, conversation, conversation.messages())
