"""The API cache: the server's KV cache saved after each reply as a snapshot keyed by its token prefix,
found again by a later request that starts with the same tokens, after a restart too.

Each snapshot is a file of the app's snapshot container (``core/snapshot``: AES-256-GCM under the
app's key, the header authenticated with the payload). Its header binds it to the model (sha256),
the context size, the KV mode and the engine, and, in place of a conversation's transcript, to the
keyed hash of the tokens it holds. A request's prompt is cut into blocks of ``BLOCK`` tokens whose
hashes are chained (each covers every token before it); the entry sharing the most leading blocks
with the prompt, or holding an exact prefix of it, is restored and the engine reads only the rest.

The index (``index.json``: sizes, chained block hashes, last use) is a hint, never trusted: a file
is restored only when its authenticated header and tokens prove the binding. The hashes are keyed
(HMAC with a key derived from the snapshot key), so they reveal nothing about a prompt to someone
who can list the folder. Files live in one folder per (model, context, KV mode, engine): another
model or setting never even looks at them. The folder has a budget in bytes; past it the least
recently used entries go.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import struct
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from lazykv.core.chat.conversation import common_prefix
from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.types import KvRestoreError
from lazykv.core.files import write_text_atomic
from lazykv.core.history.persistence import Crypto
from lazykv.core.history.snapshot import Binding as SnapshotBinding
from lazykv.core.history.snapshot import (
    Encryption,
    SnapshotError,
    SnapshotHeader,
    read_snapshot,
    write_snapshot,
)
from lazykv.core.paths import private_dir

log = logging.getLogger(__name__)

BLOCK = 64  # tokens per chained hash: a restored entry is cut back to the last block the prompt shares
SUFFIX = ".lkvsnap"
INDEX = "index.json"
INDEX_VERSION = 2  # 2: each entry records its file's sha256
# the snapshot header's conversation id for API entries: no conversation of the app's database has it
# (ids count up from 1); the prefix hash stands where a conversation's transcript digest does
API_CONVERSATION_ID = 2**63 - 1
_HASH_HEX = 32  # a block hash: 128 bits of the HMAC, hex


@dataclass(frozen=True)
class Binding:
    """What a snapshot must have been saved with to be restored here."""

    model_sha256: str
    n_ctx: int
    kv_mode: str
    engine_version: str

    def folder_name(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


@dataclass
class Entry:
    digest: str  # keyed hash of all its tokens (64 hex): the file name and the header's binding
    n_tokens: int
    blocks: list[str]  # chained keyed hashes of its full blocks
    size: int
    used: float  # last saved or restored (unix time): the LRU order
    sha256: str  # of the file as written


@dataclass(frozen=True)
class Match:
    entry: Entry
    n_tokens: int  # leading tokens of the prompt the entry holds


@dataclass(frozen=True)
class CacheStats:
    entries: int
    bytes: int
    budget: int


@dataclass
class _Counters:
    restored: int = 0
    saved: int = 0
    refused: int = 0
    evicted: int = 0
    last_error: str = ""


class PrefixCache:
    """One folder of API snapshots for one binding. Used from the engine's thread (``lock`` guards the
    index for readers such as ``stats``)."""

    def __init__(self, root: Path, binding: Binding, crypto: Crypto, budget_bytes: int,
                 min_tokens: int = BLOCK) -> None:
        self.binding = binding
        self.folder = Path(root) / binding.folder_name()
        self.budget_bytes = budget_bytes
        self.min_tokens = max(1, min_tokens)
        self._crypto = crypto
        self._key = crypto.key_for_writing()
        self._hash_key = _hash_key(self._key)
        self._lock = threading.Lock()
        self.counters = _Counters()
        private_dir(self.folder.parent, own=True)
        private_dir(self.folder, own=True)
        self._entries = self._load_index()
        self._remove_strays()

    # --- lookup and restore -------------------------------------------------------------------------

    def digest(self, tokens: Sequence[int]) -> str:
        return hmac.new(self._hash_key, _pack(tokens), hashlib.sha256).hexdigest()

    def block_hashes(self, tokens: Sequence[int]) -> list[str]:
        chain, out = b"", []
        for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
            chain = hmac.new(self._hash_key, chain + _pack(tokens[start : start + BLOCK]), hashlib.sha256
                             ).digest()
            out.append(chain.hex()[:_HASH_HEX])
        return out

    def best(self, tokens: Sequence[int]) -> Match | None:
        """The entry holding the longest leading part of ``tokens`` (at least ``min_tokens``), if any."""
        with self._lock:
            entries = list(self._entries.values())
        if not entries:
            return None
        blocks = self.block_hashes(tokens)
        best: Match | None = None
        for entry in entries:
            n = common_prefix(entry.blocks, blocks) * BLOCK
            if entry.n_tokens <= len(tokens) and entry.n_tokens > n:
                if self.digest(tokens[: entry.n_tokens]) == entry.digest:
                    n = entry.n_tokens
            if n >= self.min_tokens and (best is None or n > best.n_tokens):
                best = Match(entry, n)
        return best

    def restore(self, session: EngineSession, match: Match) -> bool:
        """Put ``match``'s snapshot into the session's cache (read once, authenticated, bound to this
        model, context, KV mode and token prefix); False, with the entry dropped, when it cannot be.
        After a refusal by the engine the cache is empty: the prompt is read from the start."""
        entry = match.entry
        path = self._path(entry.digest)
        try:
            binding = SnapshotBinding(API_CONVERSATION_ID, entry.digest)
            # unencrypted, the file can only be checked against the digest its save recorded
            recorded = entry.sha256 if self._key is None else None
            _, tokens, state = read_snapshot(path, self._key, binding, sha256=recorded,
                                             check=self._check_header)
            if self.digest(tokens) != entry.digest:
                raise _Refused("its tokens are not the prefix it was filed under")
            session.restore_kv(tokens, state)
        except (SnapshotError, KvRestoreError, OSError, _Refused) as err:
            self.counters.refused += 1
            self.counters.last_error = f"{type(err).__name__}: {err}"
            log.warning("API cache: snapshot %s… not restored: %s", entry.digest[:12], err)
            self._drop(entry.digest)
            return False
        self.counters.restored += 1
        entry.used = time.time()
        self._write_index()
        return True

    def _check_header(self, header: SnapshotHeader) -> None:
        """The authenticated header's binding to this model and these settings (the prefix hash and the
        API's conversation id are in the associated data: read_snapshot checks those)."""
        expected = {"model_sha256": self.binding.model_sha256, "n_ctx": self.binding.n_ctx,
                    "kv_mode": self.binding.kv_mode, "engine_version": self.binding.engine_version,
                    "encryption": self._crypto.scheme.value}
        for name, value in expected.items():
            if getattr(header, name) != value:
                raise _Refused(f"it was saved with another {name}")

    # --- save and evict ------------------------------------------------------------------------------

    def save(self, session: EngineSession) -> Entry | None:
        """Snapshot the session's cache as it is now (after a reply), unless it is short, or an entry
        already holds all of it but less than a block (re-reading that little costs less than a file;
        then only that entry's last use is updated). Evicts the least recently used past the budget."""
        tokens = session.cached_tokens()
        if len(tokens) < self.min_tokens:
            return None
        known = self.best(tokens)
        if known is not None and len(tokens) - known.n_tokens < BLOCK:
            known.entry.used = time.time()
            self._write_index()
            return known.entry
        digest = self.digest(tokens)
        kv = session.capture_kv()
        header = SnapshotHeader.for_layout(
            kv.layout, model_sha256=self.binding.model_sha256, n_tokens=len(kv.tokens),
            encryption=self._crypto.scheme, conversation_id=API_CONVERSATION_ID, n_messages=0,
            transcript_sha256=digest,
        )
        pending = self.folder / f".pending-{uuid.uuid4().hex}{SUFFIX}"
        try:
            sha = write_snapshot(pending, header, kv.tokens, kv.state, self._key)
            os.replace(pending, self._path(digest))
        except (SnapshotError, OSError) as err:
            pending.unlink(missing_ok=True)
            self.counters.last_error = f"{type(err).__name__}: {err}"
            log.warning("API cache: the snapshot was not saved: %s", err)
            return None
        entry = Entry(digest, len(kv.tokens), self.block_hashes(kv.tokens), self._path(digest).stat().st_size,
                      time.time(), sha)
        with self._lock:
            self._entries[digest] = entry
        self.counters.saved += 1
        self._evict(keep=digest)
        self._write_index()
        return entry

    def _evict(self, keep: str) -> None:
        with self._lock:
            order = sorted(self._entries.values(), key=lambda e: e.used)
            total = sum(e.size for e in order)
        for entry in order:
            if total <= self.budget_bytes:
                break
            if entry.digest == keep:
                continue
            self._drop(entry.digest, write=False)
            self.counters.evicted += 1
            total -= entry.size
        if total > self.budget_bytes:  # the new entry alone is past the budget: it goes too
            self._drop(keep, write=False)
            self.counters.evicted += 1

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(len(self._entries), sum(e.size for e in self._entries.values()),
                              self.budget_bytes)

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())

    # --- files ---------------------------------------------------------------------------------------

    def _path(self, digest: str) -> Path:
        return self.folder / f"{digest}{SUFFIX}"

    def _drop(self, digest: str, write: bool = True) -> None:
        with self._lock:
            self._entries.pop(digest, None)
        self._path(digest).unlink(missing_ok=True)
        if write:
            self._write_index()

    def _load_index(self) -> dict[str, Entry]:
        try:
            raw = json.loads((self.folder / INDEX).read_text(encoding="utf-8"))
            if raw.get("version") != INDEX_VERSION:
                return {}
            entries = {}
            for item in raw["entries"]:
                entry = Entry(str(item["digest"]), int(item["n_tokens"]), [str(b) for b in item["blocks"]],
                              int(item["size"]), float(item["used"]), str(item["sha256"]))
                if len(entry.digest) == 64 and self._path(entry.digest).is_file():
                    entries[entry.digest] = entry
            return entries
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            log.warning("API cache: its index is damaged (%s); starting it again", err)
            return {}

    def _write_index(self) -> None:
        with self._lock:
            items = [asdict(e) for e in self._entries.values()]
        try:
            write_text_atomic(self.folder / INDEX, json.dumps({"version": INDEX_VERSION, "entries": items}))
        except OSError as err:
            log.warning("API cache: its index was not written: %s", err)

    def _remove_strays(self) -> None:
        """Files no entry names (an unfinished save, an index lost): nothing finds them again."""
        for path in self.folder.glob(f"*{SUFFIX}"):
            if path.name[: -len(SUFFIX)] not in self._entries:
                path.unlink(missing_ok=True)
        for path in self.folder.glob(f".pending-*{SUFFIX}"):
            path.unlink(missing_ok=True)


class _Refused(Exception):
    """An authenticated snapshot that is not the one the index promised."""


def _hash_key(key: bytes | None) -> bytes:
    """The prefix hashes' key, derived from the snapshot key (none without encryption: plain sha256)."""
    if key is None:
        return b"lazykv api prefix, unencrypted"
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"lazykv api prefix v1").derive(key)


def _pack(tokens: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}i", *tokens)



def unencrypted() -> Crypto:
    """The crypto of ``--no-encryption``."""
    return Crypto(Encryption.NONE)
