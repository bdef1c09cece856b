"""Save a conversation's KV cache as a snapshot file and resume from it, or from the transcript.

Runs on the engine's thread (it drives the EngineSession); database work goes through the
process's one ``Database``. Saving: capture the cache, write the encrypted file under a pending
name (temp file, fsync, rename inside write_snapshot), rename it to its sha256, then point the
database row at it: a crash at any step leaves the previous snapshot or the new one, and the
transcript is never touched. The header binds the file to its conversation and to the transcript
it holds. Opening: the file must be the one the row recorded, for this conversation and for
exactly the transcript being opened; its header is checked against the loaded engine before
anything is decrypted, the payload is authenticated before it reaches native code, and any
refusal falls back to re-reading the transcript, with a short note saying why (one line; the
technical reason is in ``OpenResult.details``).

``Persistence`` owns the snapshot crypto of the process: ``set_crypto(None)`` drops the key, and
nothing is saved until another is set.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.fingerprint import model_sha256
from lazykv.core.engine.types import KvRestoreError
from lazykv.core.history.keys import KEY_BYTES, UnlockedPassphrase, database_key, wrapping_key
from lazykv.core.history.pieces import (
    Location,
    Piece,
    PieceError,
    address_key,
    assemble,
    pack_manifest,
    split,
    sync_folder,
    unpack_manifest,
    write_pack,
)
from lazykv.core.history.records import Change, OpChanges, PieceRow, SnapshotRef
from lazykv.core.history.snapshot import (
    MAX_PAYLOAD_BYTES,
    WHOLE_STATE_VERSION,
    Binding,
    Encryption,
    SnapshotAuthError,
    SnapshotBindingError,
    SnapshotCorruptError,
    SnapshotError,
    SnapshotHeader,
    SnapshotOldFormatError,
    SnapshotVersionError,
    read_snapshot,
    transcript_digest,
    write_snapshot,
)
from lazykv.core.history.snapshot_budget import PENDING_PREFIX, PIECE_SUFFIX, SNAPSHOT_SUFFIX, Cleanup
from lazykv.core.history.store import Database, Store
from lazykv.core.kinds import KvPhase
from lazykv.core.paths import private_dir

NOTE_MAX_CHARS = 200
_NONCE_BYTES = 12


def _wrap_aad(conv_id: int) -> bytes:
    return b"lazykv snapshot key v1|%d" % conv_id


def _piece_aad(address: str) -> bytes:
    return b"lazykv piece key v1|" + address.encode()


class SnapshotsOffError(SnapshotError):
    """No snapshot protection is set (``set_crypto(None)``), so no snapshot is written."""


@dataclass(eq=False)
class Crypto:
    """How snapshots are protected. Keys live in memory only, and never show in a repr.

    The keyring scheme needs its ``key``; the passphrase scheme an ``UnlockedPassphrase``, which
    only ``keys.PassphraseLock`` makes (after checking the passphrase against its record, or after
    a new one was typed twice): nothing is ever written under an unverified passphrase.
    """

    scheme: Encryption
    key: bytes | None = field(default=None, repr=False)  # the keyring key
    unlocked: UnlockedPassphrase | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.scheme = Encryption(self.scheme)
        if self.scheme is Encryption.KEYRING and self.key is None:
            raise ValueError("the keyring scheme needs its key")
        if self.scheme is Encryption.PASSPHRASE and not isinstance(self.unlocked, UnlockedPassphrase):
            raise ValueError("the passphrase scheme needs a checked passphrase (keys.PassphraseLock)")

    def __repr__(self) -> str:
        held = "none" if self.master() is None else "<hidden>"
        return f"Crypto(scheme={self.scheme.value!r}, key={held})"

    def master(self) -> bytes | None:
        """The master key of this scheme (None: nothing is encrypted)."""
        if self.scheme is Encryption.KEYRING:
            return self.key
        if self.scheme is Encryption.PASSPHRASE:
            assert self.unlocked is not None
            return self.unlocked.key
        return None

    def key_for_writing(self) -> bytes | None:
        """The key of files kept outside the history (the local API's prefix cache): the master key."""
        return self.master()

    def wrap(self, key: bytes, conv_id: int) -> bytes:
        """A snapshot's own ``key``, wrapped (AES-GCM) under this scheme's master key for conversation
        ``conv_id``: what its database row keeps."""
        master = self.master()
        if master is None:
            raise ValueError("no master key: an unencrypted snapshot has no key to wrap")
        nonce = os.urandom(_NONCE_BYTES)
        return nonce + AESGCM(wrapping_key(master)).encrypt(nonce, key, _wrap_aad(conv_id))

    def unwrap(self, wrapped: bytes, conv_id: int) -> bytes:
        """The snapshot key ``wrap`` wrapped; SnapshotAuthError under another master key or conversation."""
        master = self.master()
        if master is None:
            raise SnapshotError("it is encrypted, and no key is available now")
        try:
            return AESGCM(wrapping_key(master)).decrypt(
                wrapped[:_NONCE_BYTES], wrapped[_NONCE_BYTES:], _wrap_aad(conv_id))
        except (InvalidTag, ValueError):
            raise SnapshotAuthError(
                "its key does not open under this key (another keyring or passphrase)") from None

    def wrap_piece(self, key: bytes, address: str) -> bytes:
        """A piece's own key, wrapped under the master key for the piece ``address``."""
        master = self.master()
        if master is None:
            raise ValueError("no master key: an unencrypted piece has no key to wrap")
        nonce = os.urandom(_NONCE_BYTES)
        return nonce + AESGCM(wrapping_key(master)).encrypt(nonce, key, _piece_aad(address))

    def piece_keys(self) -> Callable[[bytes, str], bytes]:
        """Unwraps pieces' keys (``wrap_piece``), the wrapping key derived once for all of them;
        SnapshotAuthError under another master key or for another piece."""
        master = self.master()
        if master is None:
            raise SnapshotError("it is encrypted, and no key is available now")
        aead = AESGCM(wrapping_key(master))

        def unwrap(wrapped: bytes, address: str) -> bytes:
            try:
                return aead.decrypt(wrapped[:_NONCE_BYTES], wrapped[_NONCE_BYTES:], _piece_aad(address))
            except (InvalidTag, ValueError):
                raise SnapshotAuthError("a piece's key does not open under this key") from None

        return unwrap

    def database_key(self) -> bytes | None:
        """The conversation database's key under this scheme (None: the history is not encrypted)."""
        key = self.master()
        return None if key is None else database_key(key)

    def key_for_reading(self, encryption: str, wrapped: bytes | None, conv_id: int) -> bytes | None:
        """The own key of a snapshot saved under ``encryption`` (None for an unencrypted one), from
        its row's ``wrapped`` key."""
        if encryption == Encryption.NONE:
            return None
        if self.master() is None:
            if encryption == Encryption.KEYRING:
                raise SnapshotError("it is encrypted with the keyring key, which is not available now")
            raise SnapshotError("it is protected by a passphrase, which was not given in this session")
        if wrapped is None:
            raise SnapshotOldFormatError("it was saved before each snapshot had its own key")
        return self.unwrap(wrapped, conv_id)  # under whichever scheme wraps the keys now


class OpenHow(StrEnum):
    RESTORED = "restored"  # the snapshot was restored
    REBUILT = "rebuilt"  # the transcript was re-read (``note`` says why)
    EMPTY = "empty"  # nothing to read


@dataclass(frozen=True)
class SaveResult:
    sha256: str
    size: int
    n_tokens: int
    seconds: float
    pruned: list[str]  # snapshots dropped by the budget (least recently used first)
    cleanup: Cleanup  # leftovers removed (orphaned files, unfinished saves): not pruned snapshots
    changes: OpChanges
    written: int = 0  # bytes this save wrote: the pieces not stored before, and the snapshot file


@dataclass(frozen=True)
class OpenResult:
    how: OpenHow
    note: str  # why it was re-read: one short line for the user, never engine output ("" if restored)
    n_tokens: int
    seconds: float
    details: str = ""  # the technical reason (e.g. the engine's), for a "details" disclosure


class Refused(Exception):
    """A snapshot that is not restored: ``note`` for the user, ``details`` for whoever asks."""

    def __init__(self, note: str, details: str = "") -> None:
        super().__init__(note)
        self.note = note
        self.details = details or note


_Refused = Refused


class Persistence:
    def __init__(
        self, db: Database, engine: EngineSession, fingerprints: Path, crypto: Crypto | None = None
    ) -> None:
        self.db = db
        self.engine = engine
        self._crypto = crypto
        self._fingerprints = fingerprints

    @property
    def crypto(self) -> Crypto | None:
        return self._crypto

    def set_crypto(self, crypto: Crypto | None) -> None:
        """How snapshots are protected from now on; None: none are saved, and no key is kept."""
        self._crypto = crypto

    def change_crypto(self, new: Crypto) -> None:
        """Protect the history and every snapshot under ``new`` from now on, all or nothing: the
        database is re-encrypted under ``new``'s key and each snapshot's own key rewrapped under its
        master key in one crash-safe rewrite (``Database.change_key``); a snapshot whose key cannot be
        carried over (to or from no encryption, or not under the key in use) loses its row, and its
        conversation is re-read next time. A failure changes nothing: the database keeps its key,
        this keeps the crypto it had, and the change can be tried again."""
        old = self._crypto

        def rewrap(wrapped: bytes, owner: int | str) -> bytes | None:  # a snapshot's, or a piece's
            if old is None or old.master() is None or new.master() is None:
                return None
            try:
                if isinstance(owner, str):
                    return new.wrap_piece(old.piece_keys()(wrapped, owner), owner)
                return new.wrap(old.unwrap(wrapped, owner), owner)
            except SnapshotError:
                return None

        self.db.change_key(new.database_key(), rewrap).result()
        self._crypto = new

    def model_sha(self) -> str:
        """The loaded model's sha256 (the fingerprint cache avoids re-hashing an unchanged file)."""
        return model_sha256(self.engine.model_info().path, self._fingerprints)

    def save(
        self, conv_id: int, messages: Sequence[dict[str, str]], budget_bytes: int = 0, compact: bool = False
    ) -> SaveResult:
        """Snapshot the conversation's cache now; ``messages`` are the ones it holds (what the engine
        was sent: ``Conversation.messages()``); ``compact``: at the cache's last rung (see
        EngineSession.capture_kv). Then prune the least recently used snapshots past the budget
        (never this one) and the leftovers. SnapshotsOffError without a crypto."""
        crypto = self._crypto
        if crypto is None:
            raise SnapshotsOffError("snapshots are off")
        t0 = time.perf_counter()
        kv = self.engine.capture_kv(compact)
        header = self._header(kv.layout, len(kv.tokens), crypto, conv_id, messages)
        pending = self.db.snapshots_dir / f"{PENDING_PREFIX}{uuid.uuid4().hex}{SNAPSHOT_SUFFIX}"
        key = None if crypto.master() is None else os.urandom(KEY_BYTES)  # this file's own key
        wrapped = None if key is None else crypto.wrap(key, conv_id)
        (stored, parts), written = self._write_pieces(kv.state, crypto)
        try:
            manifest = pack_manifest(parts)
            sha = write_snapshot(pending, header, kv.tokens, manifest, key)
            final = self.db.snapshots_dir / f"{sha}{SNAPSHOT_SUFFIX}"
            try:
                os.replace(pending, final)
            except OSError:
                pending.unlink(missing_ok=True)
                raise
        except BaseException:
            self._remove_pieces(written)
            raise
        size = final.stat().st_size
        header_json = json.dumps(asdict(header))

        def record(store: Store) -> tuple[list[str], Cleanup]:
            previous = store.set_snapshot(conv_id, sha, size, len(kv.tokens), header_json, wrapped, stored)
            if previous and previous != sha and store.unreferenced(previous):
                store.snapshot_path(previous).unlink(missing_ok=True)
            if budget_bytes <= 0:
                return [], Cleanup()
            pruned = store.prune_snapshots(budget_bytes, keep=sha)
            return pruned.pruned, pruned.cleanup

        try:
            pruned, cleanup = self.db.call(record)
        except BaseException:
            self._remove_pieces(written)  # none of them is counted: the rows were not written
            raise
        changes = OpChanges(kinds=frozenset({Change.SNAPSHOT}), conv_ids=frozenset({conv_id}))
        total = size + sum(p.size for p in stored)
        new_bytes = size + sum(p.size for p in stored if p.file in written)
        return SaveResult(sha, total, len(kv.tokens), time.perf_counter() - t0, pruned, cleanup, changes,
                          new_bytes)

    def _write_pieces(self, state: bytes, crypto: Crypto) -> tuple[tuple[tuple[PieceRow, ...], list[Piece]],
                                                                    set[str]]:
        """The state cut into pieces (``pieces.split``); those not stored yet written into one pack, each
        under a key of its own, and made durable. Returns (the rows of the pieces it is made of, each
        once; the pieces in order) and the files written (the pack, or none)."""
        master = crypto.master()
        parts = split(state, address_key(master, b"history"))
        order = list(dict.fromkeys(p.address for p in parts))
        known = self.db.call(lambda store: store.piece_rows(order))
        folder = self.db.snapshots_dir / "pieces"
        private_dir(folder, own=True)
        view = memoryview(state)
        new: dict[str, tuple[Piece, bytes | None]] = {}
        for part in parts:
            if part.address not in known and part.address not in new:
                new[part.address] = (part, None if master is None else os.urandom(KEY_BYTES))
        rows: dict[str, PieceRow] = {}
        written: set[str] = set()
        try:
            if new:
                name = f"{uuid.uuid4().hex}{PIECE_SUFFIX}"
                written.add(name)
                spans = write_pack(folder, name, [(p.address, view[p.start : p.end], key)
                                                  for p, key in new.values()])  # fmt: skip
                for (part, key), (offset, size) in zip(new.values(), spans, strict=True):
                    wrapped = None if key is None else crypto.wrap_piece(key, part.address)
                    rows[part.address] = PieceRow(part.address, name, size, wrapped, offset)
                sync_folder(folder, sorted(written))
        except BaseException:
            self._remove_pieces(written)
            raise
        stored = tuple(known.get(a) or rows[a] for a in order)
        return (stored, parts), written

    def _remove_pieces(self, files: set[str]) -> None:
        for name in files:
            (self.db.snapshots_dir / "pieces" / name).unlink(missing_ok=True)

    def _header(
        self, layout: dict[str, object], n_tokens: int, crypto: Crypto, conv_id: int,
        messages: Sequence[dict[str, str]],
    ) -> SnapshotHeader:  # fmt: skip
        return SnapshotHeader.for_layout(
            layout, model_sha256=self.model_sha(), n_tokens=n_tokens, encryption=crypto.scheme,
            conversation_id=conv_id, n_messages=len(messages), transcript_sha256=transcript_digest(messages),
        )

    def open(
        self, conv_id: int, messages: Sequence[dict[str, str]], on_progress: Callable[[int, int], None]
    ) -> OpenResult:
        """Restore the conversation's snapshot, or re-read ``messages`` (the transcript, as the engine
        is sent it) when it cannot be."""
        t0 = time.perf_counter()
        record = self.db.call(lambda store: store.conversation(conv_id))
        note, details = "no snapshot was saved", ""
        if record.snapshot is not None:
            try:
                n = self._restore(record.snapshot, conv_id, messages)
            except _Refused as refused:
                note, details = refused.note, refused.details
            else:
                self.db.call(lambda store: store.touch_snapshot(conv_id))
                return OpenResult(OpenHow.RESTORED, "", n, time.perf_counter() - t0)
        if not any(m["role"] != "system" for m in messages):
            return OpenResult(OpenHow.EMPTY, "", 0, time.perf_counter() - t0)
        n = self.engine.rebuild_kv(messages, on_progress)
        return OpenResult(OpenHow.REBUILT, note, n, time.perf_counter() - t0, details)

    def mismatch(self, header: SnapshotHeader) -> _Refused | None:
        """Why a snapshot with this header cannot go into the loaded cache (None when it may): a plain
        note, and the technical account as its details. Whether its cells fit this cache is the
        engine's to say, from the state itself, once the file is read (EngineSession.kv_refusal)."""
        layout = self.engine.layout()
        if header.model_sha256 != self.model_sha():
            return _Refused("it was saved with another model")
        if header.state_version != layout.state_version:
            return _Refused(
                "it was saved by another version of the engine",
                f"state format {header.state_version}; this engine uses {layout.state_version}",
            )
        if header.n_tokens > layout.n_ctx:
            return _Refused(
                "it is longer than the context size set now",
                f"it holds {header.n_tokens} tokens, more than this context of {layout.n_ctx}",
            )
        return None

    def layout_refusal(self, header: SnapshotHeader, refusal: str) -> _Refused:
        """The note for a state the engine refuses (``EngineSession.kv_refusal``): how the cache stores its
        cells differs (the engine judges that, from the state itself), in the user's words."""
        layout = self.engine.layout()
        then, now = _memory_words(header.type_k), _memory_words(layout.type_k)
        return _Refused(
            "it was saved with other context-memory settings" + (f" ({then} then, {now} now)"
                                                                 if then != now else ""),
            f"the engine refuses its KV state ({refusal}); "
            f"it was saved as K/V {header.type_k}/{header.type_v}, "
            f"rotation {header.n_rot_k}/{header.n_rot_v}; this {layout.kv_mode} cache stores "
            f"{layout.type_k}/{layout.type_v}, rotation {layout.n_rot_k}/{layout.n_rot_v}",
        )

    def _restore(self, ref: SnapshotRef, conv_id: int, messages: Sequence[dict[str, str]]) -> int:
        """``ref`` is what the database recorded when the snapshot was saved: a file with any other
        header (a forged unencrypted one, an older snapshot, another conversation's) is refused, and
        so is one that holds anything but exactly ``messages``. The file is read once: the header
        checked is the one whose bytes are restored; an unencrypted file must hash to ``ref.sha256``."""
        if not ref.path.exists():
            raise _Refused("its snapshot file is missing")
        recorded = _recorded_header(ref.header_json)
        binding = Binding(conv_id, transcript_digest(messages))

        def check(header: SnapshotHeader) -> None:  # before anything is decrypted
            _check_binding(header, recorded, binding, len(messages))
            refused = self.mismatch(header)
            if refused is not None:
                raise refused

        crypto = self._crypto or Crypto(Encryption.NONE)

        def key(header: SnapshotHeader) -> bytes | None:  # once the header is checked
            return crypto.key_for_reading(header.encryption, ref.wrapped_key, conv_id)

        plain = recorded.get("encryption") == Encryption.NONE
        try:
            header, tokens, state = read_snapshot(ref.path, key, binding, check=check,
                                                  sha256=ref.sha256 if plain else None)  # fmt: skip
            if header.format_version != WHOLE_STATE_VERSION:  # the state is in pieces
                state = self._assembled(state, ref, crypto, plain)
            refusal = self.engine.kv_refusal(tokens, state)  # before the cache changes
            if refusal is not None:
                raise self.layout_refusal(header, refusal)
            self.engine.restore_kv(tokens, state)
        except (SnapshotError, KvRestoreError, OSError) as err:
            raise _refusal(err) from err
        return len(tokens)

    def restore(self, conv_id: int, messages: Sequence[dict[str, str]]) -> int:
        """Restore the conversation's snapshot, which must hold exactly ``messages``; returns its tokens.
        Refused (the cache maybe emptied) when it cannot be; nothing is re-read."""
        record = self.db.call(lambda store: store.conversation(conv_id))
        if record.snapshot is None:
            raise Refused("no snapshot was saved")
        n = self._restore(record.snapshot, conv_id, messages)
        self.db.call(lambda store: store.touch_snapshot(conv_id))
        return n

    def _assembled(self, manifest: memoryview, ref: SnapshotRef, crypto: Crypto, plain: bool) -> memoryview:
        """The state from the pieces an authenticated manifest lists, each authenticated (or, unencrypted,
        checked against its address) as it is read."""
        rows = {p.address: p for p in ref.pieces}
        unwrap = None if plain else crypto.piece_keys()
        folder = self.db.snapshots_dir / "pieces"
        paths: dict[str, Path] = {}

        def locate(address: str) -> Location:
            row = rows.get(address)
            if row is None or (row.wrapped_key is None) != plain:
                raise PieceError("a piece of the snapshot is not recorded for it", address)
            key = None if unwrap is None else unwrap(row.wrapped_key, address)
            path = paths.get(row.file) or paths.setdefault(row.file, folder / row.file)  # a pack's path once
            return Location(path, key, row.offset, row.size)

        return assemble(unpack_manifest(manifest, MAX_PAYLOAD_BYTES), locate)


def _check_binding(header: SnapshotHeader, recorded: dict, binding: Binding, n_messages: int) -> None:
    if recorded.get("encryption") != header.encryption:
        raise _Refused("its snapshot file is not the one saved (its protection differs)")
    if recorded != asdict(header):
        raise _Refused("its snapshot file is not the one saved for it (replaced or older)")
    if header.conversation_id != binding.conversation_id:
        raise _Refused("its snapshot belongs to another conversation")
    if header.n_messages != n_messages or header.transcript_sha256 != binding.transcript_sha256:
        raise _Refused("its snapshot holds another version of this conversation")


def _recorded_header(header_json: str) -> dict:
    try:
        recorded = json.loads(header_json)
    except ValueError:
        return {}
    return recorded if isinstance(recorded, dict) else {}


# the user's note for each kind of refused snapshot, the first matching class wins
_REFUSAL_NOTES: tuple[tuple[type[Exception], str], ...] = (
    (SnapshotVersionError, "its snapshot was saved by a newer LazyKV Chat"),
    (SnapshotBindingError, "its snapshot belongs to another conversation or another version of it"),
    (PieceError, "a piece of its snapshot is missing or damaged"),
    (SnapshotOldFormatError, "its snapshot was saved by an older LazyKV Chat"),
    (SnapshotAuthError,
     "its snapshot could not be authenticated (wrong key, or the file was modified or damaged)"),
    (SnapshotCorruptError, "its snapshot file is damaged"),
    (KvRestoreError, "the engine could not take the saved state into this cache"),
    (OSError, "its snapshot file could not be read"),
)


def _refusal(err: Exception) -> _Refused:
    """A one-line note for the user from an error; the error's own text goes to ``details``."""
    if isinstance(err, _Refused):
        return err
    details = str(err)
    note = next((text for kind, text in _REFUSAL_NOTES if isinstance(err, kind)), details)
    return _Refused(_one_line(note), details)


def _memory_words(ggml_type: str) -> str:
    """A KV cache type as a user knows it: "8-bit" for q8_0, "16-bit" for f16 (another as it is)."""
    rungs = set(KvPhase) - {KvPhase.CONVERTING}
    return KvPhase(ggml_type).words if ggml_type in rungs else ggml_type


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= NOTE_MAX_CHARS else line[: NOTE_MAX_CHARS - 1] + "…"
