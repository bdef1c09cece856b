"""The API cache: the server's KV cache saved after each reply as a snapshot keyed by its token prefix,
found again by a later request that starts with the same tokens, after a restart too.

Each snapshot is a file of the app's snapshot container (``core/snapshot``: AES-256-GCM under the
app's key, the header authenticated with the payload). Its header binds it to the model (sha256),
the context size, the KV mode and the engine, and, in place of a conversation's transcript, to the
keyed hash of the tokens it holds. A request's prompt is cut into blocks of ``BLOCK`` tokens whose
hashes are chained (each covers every token before it); the entry sharing the most leading blocks
with the prompt, or holding an exact prefix of it, is restored and the engine reads only the rest.

A snapshot's state is stored as the app's pieces (``core/history/pieces``: content-defined, addressed by
a keyed hash, each encrypted under its own key wrapped by the master key, a save's new ones in one pack
under ``pieces/``), so requests that share a long prefix store its cells once; the snapshot file holds
the list of its pieces. The index records each piece's pack, offset, size and wrapped key, and which
entries hold it: a piece goes with the last entry holding it, a pack with its last piece.

The index (``index.json``: sizes, chained block hashes, last use, pieces) is a hint, never trusted: a
file is restored only when its authenticated header and tokens prove the binding, and each piece only
when it authenticates under its key as the piece the authenticated list names. The hashes are keyed
(HMAC with a key derived from the snapshot key), so they reveal nothing about a prompt to someone
who can list the folder. Files live in one folder per (model, context, KV mode, engine): another
model or setting never even looks at them. The folder has a budget in bytes (snapshot files, and each
piece once); past it the least recently used entries go.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import struct
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from lazykv.core.chat.conversation import common_prefix
from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.types import KvRestoreError
from lazykv.core.files import write_text_atomic
from lazykv.core.history.persistence import Crypto
from lazykv.core.history.pieces import (
    KEY_BYTES,
    Location,
    PieceError,
    address_key,
    assemble,
    pack_manifest,
    punch_holes,
    split,
    sync_folder,
    unpack_manifest,
    write_pack,
)
from lazykv.core.history.snapshot import (
    MAX_PAYLOAD_BYTES,
    Encryption,
    SnapshotError,
    SnapshotHeader,
    read_snapshot,
    write_snapshot,
)
from lazykv.core.history.snapshot import Binding as SnapshotBinding
from lazykv.core.paths import private_dir

log = logging.getLogger(__name__)

BLOCK = 64  # tokens per chained hash: a restored entry is cut back to the last block the prompt shares
SUFFIX = ".lkvsnap"
INDEX = "index.json"
INDEX_VERSION = 3  # 2: each entry records its file's sha256; 3: its state in pieces
PIECES = "pieces"  # the folder of the packs
PACK_SUFFIX = ".lkvp"
# the snapshot header's conversation id for API entries: no conversation of the app's database has it
# (ids count up from 1); the prefix hash stands where a conversation's transcript digest does
API_CONVERSATION_ID = 2**63 - 1
_HASH_HEX = 32  # a block hash: 128 bits of the HMAC, hex
_PACK_NAME = re.compile(r"[0-9a-f]{32}" + re.escape(PACK_SUFFIX))


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
    pieces: list[str] = field(default_factory=list)  # the addresses of its state's pieces, each once


@dataclass(frozen=True)
class StoredPiece:
    """A piece in the index: its pack, its record's offset and size there, its key wrapped (hex; "" plain)."""

    file: str
    offset: int
    size: int
    wrapped_key: str


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
        self._piece_hash_key = address_key(self._key, b"api prefix cache")
        self._lock = threading.Lock()
        self.counters = _Counters()
        private_dir(self.folder.parent, own=True)
        private_dir(self.folder, own=True)
        private_dir(self.pieces_dir, own=True)
        self._pieces: dict[str, StoredPiece] = {}
        self._entries = self._load_index()
        self._remove_strays()

    @property
    def pieces_dir(self) -> Path:
        return self.folder / PIECES

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
            _, tokens, manifest = read_snapshot(path, self._key, binding, sha256=recorded,
                                                check=self._check_header)
            if self.digest(tokens) != entry.digest:
                raise _Refused("its tokens are not the prefix it was filed under")
            unwrap = None if self._key is None else self._crypto.piece_keys()
            state = assemble(unpack_manifest(manifest, MAX_PAYLOAD_BYTES),
                             lambda address: self._locate(address, unwrap))
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

    def _locate(self, address: str, unwrap: Callable[[bytes, str], bytes] | None) -> Location:
        with self._lock:
            piece = self._pieces.get(address)
        if piece is None or (piece.wrapped_key == "") != (unwrap is None):
            raise PieceError("a piece of the snapshot is not in the cache's index", address)
        key = None
        if unwrap is not None:
            try:
                key = unwrap(bytes.fromhex(piece.wrapped_key), address)
            except ValueError as err:
                raise PieceError(f"a piece's key is damaged ({err})", address) from err
        return Location(self.pieces_dir / piece.file, key, piece.offset, piece.size)

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
        parts = split(kv.state, self._piece_hash_key)
        pack, new = None, {}
        try:
            pack, new = self._write_pieces(kv.state, parts)
            sha = write_snapshot(pending, header, kv.tokens, pack_manifest(parts), self._key)
            os.replace(pending, self._path(digest))
        except (SnapshotError, OSError) as err:
            pending.unlink(missing_ok=True)
            if pack is not None:
                (self.pieces_dir / pack).unlink(missing_ok=True)
            self.counters.last_error = f"{type(err).__name__}: {err}"
            log.warning("API cache: the snapshot was not saved: %s", err)
            return None
        entry = Entry(digest, len(kv.tokens), self.block_hashes(kv.tokens), self._path(digest).stat().st_size,
                      time.time(), sha, list(dict.fromkeys(p.address for p in parts)))
        with self._lock:
            previous = self._entries.pop(digest, None)
            self._pieces.update(new)
            self._entries[digest] = entry
        if previous is not None:  # the same tokens saved again: what only the earlier one held goes
            self._release(previous)
        self.counters.saved += 1
        self._evict(keep=digest)
        self._write_index()
        return entry

    def _write_pieces(self, state: bytes, parts: list) -> tuple[str | None, dict[str, StoredPiece]]:
        """The pieces of ``parts`` the index does not hold, written as one pack, each under its own key
        (wrapped by the master key, as the app's are), and made durable; returns the pack and them."""
        with self._lock:
            known = set(self._pieces)
        todo = {p.address: p for p in parts if p.address not in known}
        if not todo:
            return None, {}
        keys = {a: None if self._key is None else os.urandom(KEY_BYTES) for a in todo}
        name = f"{uuid.uuid4().hex}{PACK_SUFFIX}"
        view = memoryview(state)
        try:
            spans = write_pack(self.pieces_dir, name, [(a, view[p.start : p.end], keys[a])
                                                       for a, p in todo.items()])  # fmt: skip
            sync_folder(self.pieces_dir, [name])
        except BaseException:
            (self.pieces_dir / name).unlink(missing_ok=True)
            raise
        new = {}
        for address, (offset, size) in zip(todo, spans, strict=True):
            key = keys[address]
            wrapped = "" if key is None else self._crypto.wrap_piece(key, address).hex()
            new[address] = StoredPiece(name, offset, size, wrapped)
        return name, new

    def _evict(self, keep: str) -> None:
        with self._lock:
            order = sorted(self._entries.values(), key=lambda e: e.used)
        for entry in order:
            if self.stats().bytes <= self.budget_bytes:
                break
            if entry.digest == keep:
                continue
            self._drop(entry.digest, write=False)
            self.counters.evicted += 1
        if self.stats().bytes > self.budget_bytes:  # the new entry alone is past the budget: it goes too
            self._drop(keep, write=False)
            self.counters.evicted += 1

    def stats(self) -> CacheStats:
        """Entries and the bytes they take: their snapshot files, and each piece once however many hold it."""
        with self._lock:
            held = {a for e in self._entries.values() for a in e.pieces}
            pieces = sum(self._pieces[a].size for a in held if a in self._pieces)
            return CacheStats(len(self._entries), sum(e.size for e in self._entries.values()) + pieces,
                              self.budget_bytes)

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())

    # --- files ---------------------------------------------------------------------------------------

    def _path(self, digest: str) -> Path:
        return self.folder / f"{digest}{SUFFIX}"

    def _drop(self, digest: str, write: bool = True) -> None:
        with self._lock:
            entry = self._entries.pop(digest, None)
        self._path(digest).unlink(missing_ok=True)
        if entry is not None:
            self._release(entry)
        if write:
            self._write_index()

    def _release(self, entry: Entry) -> None:
        """The pieces only ``entry`` held (no entry in the index now) leave the index, and with them
        their keys; a pack no piece is left in is deleted, in others their records' bytes are freed."""
        with self._lock:
            held = {a for e in self._entries.values() for a in e.pieces}
            gone = [(a, self._pieces.pop(a)) for a in entry.pieces if a not in held and a in self._pieces]
            packs = {p.file for p in self._pieces.values()}
        for name in {p.file for _, p in gone} - packs:
            (self.pieces_dir / name).unlink(missing_ok=True)
        punch_holes(self.pieces_dir, [(p.file, p.offset, p.size) for _, p in gone if p.file in packs])

    def _load_index(self) -> dict[str, Entry]:
        try:
            raw = json.loads((self.folder / INDEX).read_text(encoding="utf-8"))
            if raw.get("version") != INDEX_VERSION:
                return {}
            pieces = {str(a): StoredPiece(str(p["file"]), int(p["offset"]), int(p["size"]),
                                          str(p["wrapped_key"]))
                      for a, p in raw["pieces"].items()}  # fmt: skip
            pieces = {a: p for a, p in pieces.items() if _PACK_NAME.fullmatch(p.file)}  # a name, never a path
            entries = {}
            for item in raw["entries"]:
                entry = Entry(str(item["digest"]), int(item["n_tokens"]), [str(b) for b in item["blocks"]],
                              int(item["size"]), float(item["used"]), str(item["sha256"]),
                              [str(a) for a in item["pieces"]])  # fmt: skip
                if len(entry.digest) == 64 and self._path(entry.digest).is_file():  # its pieces: at restore
                    entries[entry.digest] = entry
            held = {a for e in entries.values() for a in e.pieces}
            self._pieces = {a: p for a, p in pieces.items() if a in held}
            return entries
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            log.warning("API cache: its index is damaged (%s); starting it again", err)
            return {}

    def _write_index(self) -> None:
        with self._lock:
            items = [asdict(e) for e in self._entries.values()]
            pieces = {a: asdict(p) for a, p in self._pieces.items()}
        try:
            write_text_atomic(self.folder / INDEX, json.dumps({"version": INDEX_VERSION, "entries": items,
                                                               "pieces": pieces}))
        except OSError as err:
            log.warning("API cache: its index was not written: %s", err)

    def _remove_strays(self) -> None:
        """Files no entry names (an unfinished save, an index lost): nothing finds them again."""
        for path in self.folder.glob(f"*{SUFFIX}"):
            if path.name[: -len(SUFFIX)] not in self._entries:
                path.unlink(missing_ok=True)
        for path in self.folder.glob(f".pending-*{SUFFIX}"):
            path.unlink(missing_ok=True)
        packs = {p.file for p in self._pieces.values()}
        for path in self.pieces_dir.iterdir():
            if path.name not in packs and (path.suffix in (PACK_SUFFIX, ".tmp")):
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
