"""Snapshot files: one conversation's KV-cache sequence state and the tokens it covers.

Layout::

    MAGIC | u32 LE header length | header (canonical JSON) | body

    body, encrypted schemes:  12-byte nonce | AES-256-GCM(compressed payload) | 16-byte tag
                              (the associated data is MAGIC | length | header | binding: the header
                              is authenticated too, and so is the binding the reader expects)
    body, ENCRYPTION_NONE:    compressed payload | sha256(MAGIC | length | header | compressed payload)
                              (detects corruption; not tamper-proof: anyone can recompute the hash;
                              the reader checks the whole file against the sha256 its database row
                              recorded instead)

    compressed payload = zlib(payload, COMPRESS_LEVEL)
    payload            = u32 LE n_tokens | n_tokens * i32 LE | engine state bytes (format 3)
                         or the list of the state's pieces (format 4, ``pieces.pack_manifest``)

The binding is (conversation id, sha256 of the transcript the tokens were made from): a file read
for another conversation, or for another version of it, fails authentication. A file is read once:
the header that is checked is the one whose bytes are decrypted and returned.

The header is parsed strictly before anything else, and nothing is returned (let alone passed to
native code) unless the tag (or the hash) checks out. Decompression is bounded, so a crafted file
cannot exhaust memory. Files are written atomically and readable only by the owner.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import struct
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from lazykv import __version__
from lazykv.core.chat.conversation import sent_tool_keys
from lazykv.core.engine.types import KvLayout
from lazykv.core.files import fsync_dir
from lazykv.core.kinds import KvMode, KvPhase, StorageType

MAGIC = b"LKVSNAP\x00"
# 2: the header binds the snapshot to its conversation and the transcript it holds
# 3: the binding is in the associated data, each file has its own key (wrapped by the master key in
#    the database row), no KDF salt (the passphrase record keeps it). Older files are refused as older:
#    the transcript is re-read and saved again in the current format.
# 4: the state is stored as pieces shared between snapshots (``pieces``): the payload holds their list
#    in place of the state. Format 3 files (the whole state) are still read.
FORMAT_VERSION = 4
WHOLE_STATE_VERSION = 3  # the last format whose payload is the state itself
READ_VERSIONS = (WHOLE_STATE_VERSION, FORMAT_VERSION)


class Encryption(StrEnum):
    KEYRING = "aes-256-gcm/keyring"
    PASSPHRASE = "aes-256-gcm/passphrase"
    NONE = "none"


ENCRYPTION_KEYRING = Encryption.KEYRING
ENCRYPTION_PASSPHRASE = Encryption.PASSPHRASE
ENCRYPTION_NONE = Encryption.NONE
ENCRYPTIONS = tuple(Encryption)

# the payload is a zlib stream; a KV cache's f16/q8_0 cells barely compress (~7% at level 1 for
# SmolLM2) while inflating 20 MiB took 200+ ms of a resume and deflating 1.2 s of a save, so the
# stream uses stored blocks: the format keeps zlib, the cost of a resume stays near a file read
COMPRESS_LEVEL = 0
MAX_HEADER_BYTES = 64 * 1024
MAX_PAYLOAD_BYTES = 4 * 1024**3  # default bound on the decompressed payload
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
HASH_BYTES = 32

_LEN = struct.Struct("<I")
_PREFIX_BYTES = len(MAGIC) + _LEN.size
_CHUNK = 16 * 1024 * 1024  # encryption/decryption step; the streaming GCM API has no 2 GiB limit
_INFLATE_CHUNK = 1024 * 1024
_AES_BLOCK = 16
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAX_TEXT = 256
_INT32_MAX = 2**31 - 1
_UINT32_MAX = 2**32 - 1

CACHE_TYPES = tuple(t for t in StorageType if t is not StorageType.F32)  # a header's type_k/type_v
KV_MODES = tuple(KvMode)
LAZY_PHASES = ("disabled", *(p.value for p in KvPhase if p is not KvPhase.CONVERTING))  # never mid-conversion


class SnapshotError(Exception):
    """A snapshot could not be saved or opened; the message is meant for the user."""


class SnapshotCorruptError(SnapshotError):
    """Truncated file, bad magic, a header that does not parse, bad compression."""


class SnapshotAuthError(SnapshotError):
    """Authentication failed: wrong key, or the file was modified or damaged."""


class SnapshotVersionError(SnapshotError):
    """The file was written in a newer format than this version understands."""


class SnapshotOldFormatError(SnapshotError):
    """The file was written in an older format that this version no longer opens."""


class SnapshotBindingError(SnapshotError):
    """The file is bound to another conversation, or to another version of its transcript."""


@dataclass(frozen=True)
class Binding:
    """What a snapshot is bound to: its conversation and the transcript its tokens were made from."""

    conversation_id: int
    transcript_sha256: str

    @classmethod
    def of(cls, header: SnapshotHeader) -> Binding:
        return cls(header.conversation_id, header.transcript_sha256)

    def to_bytes(self) -> bytes:
        return b"lazykv snapshot binding v1|%d|%s" % (self.conversation_id, self.transcript_sha256.encode())


class _Invalid(Exception):
    """A header field is out of range (turned into SnapshotCorruptError or ValueError)."""


@dataclass(frozen=True)
class SnapshotHeader:
    app_version: str
    engine_version: str  # e.g. "0.3.36+lazykv.2b6b96c19b" (includes the patch-set label)
    model_sha256: str  # 64 lowercase hex
    n_ctx: int
    type_k: str  # "f16" | "q8_0" | "q4_0" | "q5_0" (the rung of a ladder when saved)
    type_v: str
    kv_mode: str  # "f16" | "q8_0" | "lazy" | "ladder"
    lazy_phase: str  # "disabled" | "f16" | "q8_0" | "q4_0" | "q5_0"
    n_rot_k: int
    n_rot_v: int
    state_version: int  # the engine's sequence-state format version
    n_tokens: int
    encryption: str  # one of ENCRYPTIONS
    conversation_id: int  # the conversation it was saved for: another one's file is refused
    n_messages: int  # how many of the conversation's messages (as sent to the engine) it holds
    transcript_sha256: str  # transcript_digest() of those messages: an older or other transcript is refused
    created: float = 0.0  # unix time
    format_version: int = FORMAT_VERSION

    @classmethod
    def for_layout(
        cls, layout: KvLayout, *, model_sha256: str, n_tokens: int, encryption: str,
        conversation_id: int, n_messages: int, transcript_sha256: str,
    ) -> SnapshotHeader:  # fmt: skip
        """The header of a cache saved now: the engine's layout of it (``EngineSession.capture_kv``) and what
        the file is bound to (a conversation, or the local API's token prefix)."""
        texts = {k: str(getattr(layout, k)) for k in ("engine_version", "type_k", "type_v", "kv_mode",
                                                       "lazy_phase")}
        counts = {k: int(getattr(layout, k)) for k in ("n_ctx", "n_rot_k", "n_rot_v", "state_version")}
        return cls(app_version=__version__, model_sha256=model_sha256, n_tokens=n_tokens,
                   encryption=encryption, conversation_id=conversation_id, n_messages=n_messages,
                   transcript_sha256=transcript_sha256, created=time.time(), **texts, **counts)

    def to_bytes(self) -> bytes:
        """Canonical JSON: sorted keys, no spaces, UTF-8."""
        return json.dumps(
            asdict(self), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> SnapshotHeader:
        """Parse strictly: the exact field set, their types and ranges, or SnapshotCorruptError."""
        try:
            obj = json.loads(
                data.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant
            )
        except (ValueError, RecursionError) as e:
            raise SnapshotCorruptError("The snapshot file is damaged: its header does not parse.") from e
        if not isinstance(obj, dict):
            raise SnapshotCorruptError("The snapshot file is damaged: its header is not a JSON object.")
        version = obj.get("format_version")
        if _is_int(version) and version > FORMAT_VERSION:
            raise SnapshotVersionError(
                f"This snapshot was made by a newer LazyKV Chat (snapshot format {version}; "
                f"this version reads format {FORMAT_VERSION}). Update LazyKV Chat to open it."
            )
        if _is_int(version) and 0 < version < WHOLE_STATE_VERSION:
            raise SnapshotOldFormatError(
                f"This snapshot was made by an older LazyKV Chat (snapshot format {version}), "
                "before each snapshot had its own key bound to its conversation; it is not opened."
            )
        try:
            _check_fields(obj)
        except _Invalid as e:
            raise SnapshotCorruptError(f"The snapshot file is damaged: {e}.") from None
        return cls(**obj)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("duplicate key")
    return obj


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not allowed")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_FIELD_NAMES = frozenset(f.name for f in fields(SnapshotHeader))


def _check_fields(obj: dict[str, Any]) -> None:
    """Raise _Invalid unless ``obj`` holds exactly the header fields with valid values."""
    if set(obj) != _FIELD_NAMES:
        missing = sorted(_FIELD_NAMES - set(obj))
        extra = sorted(set(obj) - _FIELD_NAMES)
        raise _Invalid(f"header fields missing {missing} or unknown {extra}")

    def text(name: str) -> None:
        value = obj[name]
        if not isinstance(value, str) or not value or len(value) > _MAX_TEXT or not value.isprintable():
            raise _Invalid(f"{name} is not a short printable text")

    def integer(name: str, low: int, high: int) -> None:
        value = obj[name]
        if not _is_int(value) or not low <= value <= high:
            raise _Invalid(f"{name} is not an integer in [{low}, {high}]")

    def choice(name: str, allowed: tuple[str, ...]) -> None:
        if obj[name] not in allowed or not isinstance(obj[name], str):
            raise _Invalid(f"{name} is not one of {', '.join(allowed)}")

    if obj["format_version"] not in READ_VERSIONS or not _is_int(obj["format_version"]):
        raise _Invalid("unknown format version")
    text("app_version")
    text("engine_version")
    if not isinstance(obj["model_sha256"], str) or not _HEX64.fullmatch(obj["model_sha256"]):
        raise _Invalid("model_sha256 is not 64 lowercase hex digits")
    integer("n_ctx", 1, _INT32_MAX)
    integer("n_tokens", 0, obj["n_ctx"])
    integer("n_rot_k", 0, 65536)
    integer("n_rot_v", 0, 65536)
    integer("state_version", 0, _UINT32_MAX)
    integer("conversation_id", 1, 2**63 - 1)
    integer("n_messages", 0, _UINT32_MAX)
    if not isinstance(obj["transcript_sha256"], str) or not _HEX64.fullmatch(obj["transcript_sha256"]):
        raise _Invalid("transcript_sha256 is not 64 lowercase hex digits")
    choice("type_k", CACHE_TYPES)
    choice("type_v", CACHE_TYPES)
    choice("kv_mode", KV_MODES)
    choice("lazy_phase", LAZY_PHASES)
    choice("encryption", ENCRYPTIONS)
    created = obj["created"]
    if (
        isinstance(created, bool)
        or not isinstance(created, int | float)
        or not math.isfinite(created)
        or created < 0
    ):
        raise _Invalid("created is not a time")


def transcript_digest(messages: Sequence[dict[str, Any]]) -> str:
    """sha256 of the messages' roles and contents, and their tool keys when they have any (canonical
    JSON): what a snapshot is bound to."""
    canonical = [[m["role"], m["content"], *([tools] if (tools := sent_tool_keys(m)) else [])]
                 for m in messages]
    text = json.dumps(canonical, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# --- writing ---------------------------------------------------------------------------------------


def write_snapshot(
    path: Path, header: SnapshotHeader, tokens: Sequence[int], state: bytes, key: bytes | None
) -> str:
    """Write atomically (temp file in the same directory, fsync, rename, fsync the directory).

    Returns the sha256 hex of the file's bytes. ``key`` is 32 bytes for the encrypted schemes and
    None for ENCRYPTION_NONE (else ValueError). Any OSError removes the temp file, leaves a previous
    file at ``path`` untouched and becomes a SnapshotError (the OSError is its ``__cause__``).
    """
    path = Path(path)
    header_bytes = _checked_header_bytes(header, tokens)
    _check_key(header.encryption, key)
    prefix = MAGIC + _LEN.pack(len(header_bytes)) + header_bytes
    compressed = _compress(tokens, state)  # pieces of one zlib stream, written one after the other
    try:
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise _save_error(e) from e
    digest = hashlib.sha256()
    try:
        try:
            _write_all(fd, prefix, digest)
            if key is None:
                checksum = hashlib.sha256(prefix)
                for piece in compressed:
                    _write_all(fd, piece, digest)
                    checksum.update(piece)
                _write_all(fd, checksum.digest(), digest)
            else:
                _write_encrypted(fd, key, prefix + Binding.of(header).to_bytes(), compressed, digest)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_name, path)
    except BaseException as e:
        _remove_quietly(tmp_name)
        if isinstance(e, OSError):
            raise _save_error(e) from e
        raise
    try:
        fsync_dir(path.parent)
    except OSError as e:
        raise _save_error(e) from e
    return digest.hexdigest()


def _checked_header_bytes(header: SnapshotHeader, tokens: Sequence[int]) -> bytes:
    try:
        _check_fields(asdict(header))
    except _Invalid as e:
        raise ValueError(f"invalid snapshot header: {e}") from None
    if len(tokens) != header.n_tokens:
        raise ValueError(f"{len(tokens)} tokens but header.n_tokens is {header.n_tokens}")
    header_bytes = header.to_bytes()
    if len(header_bytes) > MAX_HEADER_BYTES:
        raise ValueError("snapshot header too large")
    return header_bytes


def _check_key(encryption: str, key: bytes | None) -> None:
    if encryption == ENCRYPTION_NONE:
        if key is not None:
            raise ValueError("a key was given for an unencrypted snapshot")
    elif key is None or len(key) != KEY_BYTES:
        raise ValueError(f"{encryption} needs a {KEY_BYTES}-byte key")


def _compress(tokens: Sequence[int], state: bytes) -> list[bytes]:
    """The zlib stream of (token count, tokens, state), as the pieces the compressor returned: joining
    them would copy the whole state once more."""
    try:
        token_bytes = struct.pack(f"<I{len(tokens)}i", len(tokens), *tokens)
    except struct.error as e:
        raise ValueError(f"token ids must be 32-bit integers: {e}") from None
    compressor = zlib.compressobj(COMPRESS_LEVEL)
    return [compressor.compress(token_bytes), compressor.compress(state), compressor.flush()]


def _write_encrypted(fd: int, key: bytes, aad: bytes, compressed: list[bytes], digest: Any) -> None:
    nonce = os.urandom(NONCE_BYTES)
    encryptor = Cipher(algorithms.AES(key), modes.GCM(nonce)).encryptor()
    encryptor.authenticate_additional_data(aad)
    _write_all(fd, nonce, digest)
    for piece in compressed:
        view = memoryview(piece)
        for start in range(0, len(view), _CHUNK):
            _write_all(fd, encryptor.update(view[start : start + _CHUNK]), digest)
    _write_all(fd, encryptor.finalize(), digest)
    _write_all(fd, encryptor.tag, digest)


def _write_all(fd: int, data: bytes, digest: Any) -> None:
    digest.update(data)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _remove_quietly(name: str) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass


def _save_error(e: OSError) -> SnapshotError:
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return SnapshotError(
            "could not save the snapshot: disk full. Free some space and save again; "
            "the previous snapshot was kept."
        )
    return SnapshotError(f"could not save the snapshot: {e.strerror or e}")


# --- reading ---------------------------------------------------------------------------------------


def read_header(path: Path) -> SnapshotHeader:
    """Parse the magic and header only: unauthenticated, for listings and compatibility pre-checks."""
    with _open(path) as f:
        header, _ = _read_prefix(f)
    return header


def read_snapshot(
    path: Path,
    key: bytes | None | Callable[[SnapshotHeader], bytes | None],
    binding: Binding,
    *,
    sha256: str | None = None,
    check: Callable[[SnapshotHeader], None] | None = None,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
) -> tuple[SnapshotHeader, list[int], memoryview]:
    """Read once and authenticate; returns (header, tokens, state) only if the file checks out.

    The file is opened once: ``check`` (e.g. "does this header fit the loaded engine", raising to
    refuse) sees the header whose bytes are then authenticated and returned, before anything is
    decrypted. ``binding`` is what the caller expects the file to be bound to: a header bound to
    anything else is refused (SnapshotBindingError), and the binding is part of the associated data.
    ``sha256`` (the file's recorded digest): the file's bytes must hash to it, the only check an
    unencrypted file can have against being swapped for another well-formed one.

    ``key`` (or what it answers for the checked header, when it is a function) must be given for
    encrypted files and None for unencrypted ones: a key with an
    unencrypted file is refused (SnapshotAuthError), so an encrypted file cannot be swapped for a
    forged plain one. ``max_payload_bytes`` bounds the decompressed size. ``state`` is a writable
    view of a buffer owned by nobody else, so native code can read it in place: a resume of a
    91 MiB state makes three passes over it (read, decrypt, inflate) instead of seven copies.
    """
    with _open(path) as f:
        header, prefix = _read_prefix(f)
        if check is not None:
            check(header)
        if Binding.of(header) != binding:
            raise SnapshotBindingError(
                "This snapshot belongs to another conversation, or to another version of it; it was "
                "not opened."
            )
        if callable(key):
            key = key(header)
        if header.encryption == ENCRYPTION_NONE and key is not None:
            raise SnapshotAuthError(
                "This snapshot is not encrypted, but an encrypted one was expected; it was not opened."
            )
        if header.encryption != ENCRYPTION_NONE and (key is None or len(key) != KEY_BYTES):
            raise SnapshotAuthError("This snapshot is encrypted; it cannot be opened without its key.")
        body = _read_rest(f, path)
    if sha256 is not None:
        digest = hashlib.sha256(prefix)
        digest.update(body)
        if digest.hexdigest() != sha256:
            raise SnapshotAuthError("This snapshot file is not the one that was saved; it was not opened.")
    if header.encryption == ENCRYPTION_NONE:
        compressed = _check_hash(prefix, body)
    else:
        assert key is not None
        compressed = _decrypt(key, prefix + binding.to_bytes(), body)
        del body  # the ciphertext: free it before the payload is allocated
    payload = _decompress(compressed, max_payload_bytes)
    tokens, state = _split_payload(payload, header.n_tokens)
    return header, tokens, state


def _open(path: Path) -> BinaryIO:
    try:
        return open(path, "rb")
    except FileNotFoundError as e:
        raise SnapshotError(f"snapshot file missing: {path}") from e
    except OSError as e:
        raise SnapshotError(f"could not open the snapshot {path}: {e.strerror or e}") from e


def _read_exactly(f: BinaryIO, n: int, what: str) -> bytes:
    try:
        data = f.read(n)
    except OSError as e:
        raise SnapshotError(f"could not read the snapshot: {e.strerror or e}") from e
    if len(data) != n:
        raise SnapshotCorruptError(f"The snapshot file is damaged: it ends inside the {what}.")
    return data


def _read_prefix(f: BinaryIO) -> tuple[SnapshotHeader, bytes]:
    """The parsed header and the raw bytes it came from (MAGIC | length | header)."""
    magic = _read_exactly(f, len(MAGIC), "file signature")
    if magic != MAGIC:
        raise SnapshotCorruptError("This is not a LazyKV Chat snapshot file (wrong signature).")
    length_bytes = _read_exactly(f, _LEN.size, "header length")
    (length,) = _LEN.unpack(length_bytes)
    if not 0 < length <= MAX_HEADER_BYTES:
        raise SnapshotCorruptError("The snapshot file is damaged: its header length is impossible.")
    header_bytes = _read_exactly(f, length, "header")
    return SnapshotHeader.from_bytes(header_bytes), magic + length_bytes + header_bytes


def _buffer(n: int) -> memoryview:
    """n writable bytes, not zeroed (a bytearray would be written twice: zeros, then the data)."""
    return memoryview(np.empty(n, dtype=np.uint8)).cast("B")


def _read_rest(f: BinaryIO, path: Path) -> memoryview:
    """The file from the current position to its end, read straight into one buffer."""
    try:
        data = _buffer(max(os.fstat(f.fileno()).st_size - f.tell(), 0))
        n = f.readinto(data) or 0
        extra = f.read() if n == len(data) else b""  # the file grew since fstat
    except OSError as e:
        raise SnapshotError(f"could not read the snapshot {path}: {e.strerror or e}") from e
    return memoryview(bytes(data[:n]) + extra) if extra else data[:n]


def _check_hash(prefix: bytes, body: memoryview) -> memoryview:
    if len(body) < HASH_BYTES:
        raise SnapshotCorruptError("The snapshot file is damaged: it is truncated.")
    compressed, expected = body[:-HASH_BYTES], body[-HASH_BYTES:]
    digest = hashlib.sha256(prefix)
    digest.update(compressed)
    if digest.digest() != expected:
        raise SnapshotCorruptError("The snapshot file is damaged: its checksum does not match.")
    return compressed


def _decrypt(key: bytes, aad: bytes, body: memoryview) -> bytearray:
    if len(body) < NONCE_BYTES + TAG_BYTES:
        raise SnapshotCorruptError("The snapshot file is damaged: it is truncated.")
    nonce, tag = bytes(body[:NONCE_BYTES]), bytes(body[-TAG_BYTES:])
    ciphertext = body[NONCE_BYTES:-TAG_BYTES]
    decryptor = Cipher(algorithms.AES(key), modes.GCM(nonce)).decryptor()
    decryptor.authenticate_additional_data(aad)
    plain = _buffer(len(ciphertext) + _AES_BLOCK - 1)  # update_into wants one block of headroom
    n = 0
    for start in range(0, len(ciphertext), _CHUNK):
        n += decryptor.update_into(ciphertext[start : start + _CHUNK], plain[n:])
    try:
        decryptor.finalize_with_tag(tag)
    except InvalidTag:
        raise SnapshotAuthError(
            "The snapshot could not be opened: wrong key, or the file was modified or damaged."
        ) from None
    return plain[:n]


def _decompress(compressed: bytes | memoryview, limit: int) -> memoryview:
    """Inflate in steps of _INFLATE_CHUNK, each piece copied (from the CPU cache) into one buffer; only
    authenticated bytes get here. The buffer starts at the input's size, which stored blocks (what
    this app writes) never exceed; deflated data grows it."""
    decompressor = zlib.decompressobj()
    source = memoryview(compressed)
    out, n = _buffer(min(len(source), limit + 1)), 0
    trailing = False  # input left after the end of the stream
    try:
        for start in range(0, len(source), _INFLATE_CHUNK):
            data: bytes | memoryview = source[start : start + _INFLATE_CHUNK]
            while data and not decompressor.eof:
                piece = decompressor.decompress(data, limit + 1 - n)
                if n + len(piece) > len(out):
                    grown = _buffer(min(max(2 * len(out), n + len(piece)), limit + 1))
                    grown[:n] = out[:n]
                    out = grown
                out[n : n + len(piece)] = piece
                n += len(piece)
                if n > limit:
                    raise SnapshotCorruptError(
                        f"The snapshot is larger than the {limit}-byte limit; it was not opened."
                    )
                data = decompressor.unconsumed_tail
            if decompressor.eof:
                trailing = bool(data) or start + _INFLATE_CHUNK < len(source)
                break
    except zlib.error as e:
        raise SnapshotCorruptError("The snapshot file is damaged: its data does not decompress.") from e
    if not decompressor.eof or decompressor.unused_data or trailing:
        raise SnapshotCorruptError("The snapshot file is damaged: its compressed data is incomplete.")
    return out[:n]


def _split_payload(payload: memoryview, n_tokens: int) -> tuple[list[int], memoryview]:
    if len(payload) < _LEN.size:
        raise SnapshotCorruptError("The snapshot file is damaged: its token list is missing.")
    (count,) = _LEN.unpack_from(payload)
    if count != n_tokens:
        raise SnapshotCorruptError("The snapshot file is damaged: its token count does not match the header.")
    end = _LEN.size + 4 * count
    if len(payload) < end:
        raise SnapshotCorruptError("The snapshot file is damaged: its token list is truncated.")
    tokens = list(struct.unpack_from(f"<{count}i", payload, _LEN.size))
    return tokens, payload[end:]
