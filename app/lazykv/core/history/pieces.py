"""Snapshot pieces: a KV state stored as content-defined chunks shared between snapshots.

A state is cut where its own bytes say (``cut``: a boundary after every 8-byte window whose hash has its
top CUT_BITS bits zero, at least MIN_PIECE and at most MAX_PIECE apart), so two states that share a run
of bytes share the pieces inside it wherever the run sits. llama.cpp's sequence state is layer-major
(for each layer the K rows of every cell, then the V rows), so a branch shares each layer's leading
cells with its parent and differs in each layer's tail: about one piece per layer region is new, plus
its own cells (measured in bench/results/branches.md; a structure-aware cut would need the engine's
state format in Python, this works for every format, window and rung).

A piece is addressed by a keyed hash of its bytes (``address``: HMAC-SHA256 under a key derived from the
master key, so equal bytes are found without the name telling anything; plain sha256 unencrypted) and
stored as its own file, encrypted with AES-256-GCM under its own key, the address and length in the
associated data; unencrypted, its sha256 (= its address) is checked. The bytes are not deflated: KV
cells barely compress (see snapshot.COMPRESS_LEVEL). A snapshot file (format 4) lists its pieces
(``pack_manifest``); ``assemble`` reads them back into one buffer, each piece decrypted in place.
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import hashlib
import hmac
import os
import struct
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from lazykv.core.history.snapshot import (
    SnapshotAuthError,
    SnapshotCorruptError,
    SnapshotError,
    _buffer,
)

MAGIC = b"LKVPIECE"
VERSION = 1
SUFFIX = ".lkvp"
CUT_BITS = 14  # a boundary every 16 KiB on average: ~1.5% of a 4k-token parent per branch (measured)
MIN_PIECE = 4 * 1024
MAX_PIECE = 64 * 1024
KEY_BYTES = 32
_NONCE = 12
_TAG = 16
_HASH = 32
_PREFIX = struct.Struct("<8sBI")  # magic, version, plain length
_ENTRY = struct.Struct("<32sI")  # a manifest entry: raw address, length
_COUNT = struct.Struct("<I")
_MULT = np.uint64(0x9E3779B97F4A7C15)


class PieceError(SnapshotError):
    """A piece is missing, damaged or not the one named; ``address`` says which."""

    def __init__(self, message: str, address: str) -> None:
        super().__init__(message)
        self.address = address


@dataclass(frozen=True)
class Piece:
    address: str  # 64 hex
    start: int
    end: int


def cut(data: bytes | memoryview) -> list[int]:
    """The end offsets of the pieces of ``data`` (content-defined; the last one is len(data))."""
    view = np.frombuffer(data, np.uint8)
    n = len(view)
    found = []
    shift = np.uint64(64 - CUT_BITS)
    for k in range(8):  # each alignment of the 8-byte window, as one vectorized pass
        m = (n - k) // 8
        if m > 0:
            words = view[k : k + 8 * m].view("<u8")
            found.append(np.flatnonzero(((words * _MULT) >> shift) == 0) * 8 + (k + 8))
    candidates = np.sort(np.concatenate(found)).tolist() if found else []
    ends, last = [], 0
    while last < n:
        i = bisect.bisect_left(candidates, last + MIN_PIECE)
        end = min(candidates[i] if i < len(candidates) else n, last + MAX_PIECE, n)
        ends.append(end)
        last = end
    return ends


def address_key(master: bytes | None, purpose: bytes) -> bytes | None:
    """The key of the pieces' addresses under ``master`` (None without encryption: plain sha256)."""
    if master is None:
        return None
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=b"lazykv piece address v1|" + purpose).derive(master)  # fmt: skip


def address(hash_key: bytes | None, data: bytes | memoryview) -> str:
    if hash_key is None:
        return hashlib.sha256(data).hexdigest()
    return hmac.new(hash_key, data, hashlib.sha256).hexdigest()


def split(data: bytes | memoryview, hash_key: bytes | None) -> list[Piece]:
    """``data`` cut into addressed pieces, in order."""
    view = memoryview(data).cast("B")
    pieces, start = [], 0
    for end in cut(view):
        pieces.append(Piece(address(hash_key, view[start:end]), start, end))
        start = end
    return pieces


def pack_manifest(pieces: Sequence[Piece]) -> bytes:
    """What a format-4 snapshot holds in place of the state: its pieces' addresses and lengths."""
    return _COUNT.pack(len(pieces)) + b"".join(
        _ENTRY.pack(bytes.fromhex(p.address), p.end - p.start) for p in pieces)  # fmt: skip


def unpack_manifest(data: bytes | memoryview, limit: int) -> list[tuple[str, int]]:
    """(address, length) of each piece; SnapshotCorruptError unless it is exactly such a list of at most
    ``limit`` bytes in all."""
    view = memoryview(data)
    if len(view) < _COUNT.size:
        raise SnapshotCorruptError("The snapshot file is damaged: its list of pieces is missing.")
    (count,) = _COUNT.unpack_from(view)
    if len(view) != _COUNT.size + count * _ENTRY.size:
        raise SnapshotCorruptError("The snapshot file is damaged: its list of pieces is truncated.")
    entries = [(raw.hex(), length) for raw, length in _ENTRY.iter_unpack(view[_COUNT.size :])]
    if any(length <= 0 for _, length in entries) or sum(n for _, n in entries) > limit:
        raise SnapshotCorruptError("The snapshot file is damaged: its pieces' sizes are impossible.")
    return entries


def _aad(prefix: bytes, addr: str) -> bytes:
    return prefix + b"|lazykv piece|" + addr.encode()


def write_piece(folder: Path, name: str, addr: str, data: bytes | memoryview, key: bytes | None) -> int:
    """Write one piece as ``folder/name`` (temp file, rename; no fsync: ``sync_folder`` once after all
    of a save's pieces); returns its size on disk. ``key``: its own 32-byte key (None: unencrypted)."""
    view = memoryview(data).cast("B")
    prefix = _PREFIX.pack(MAGIC, VERSION, len(view))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    try:
        try:
            if key is None:
                parts = [prefix, view, hashlib.sha256(view).digest()]
            else:
                nonce = os.urandom(_NONCE)
                enc = Cipher(algorithms.AES(key), modes.GCM(nonce)).encryptor()
                enc.authenticate_additional_data(_aad(prefix, addr))
                parts = [prefix, nonce, enc.update(view), enc.finalize(), enc.tag]
            size = 0
            for part in parts:
                part = memoryview(part)
                size += len(part)
                while part:
                    part = part[os.write(fd, part) :]
        finally:
            os.close(fd)
        os.replace(tmp, folder / name)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return size


def read_piece_into(path: Path, addr: str, length: int, key: bytes | None, out: memoryview,
                    scratch: memoryview) -> None:  # fmt: skip
    """Decrypt (or check) the piece at ``path`` into ``out`` (``length`` bytes, plus one AES block of
    room); PieceError when it is missing, damaged or not the piece ``addr``."""
    overhead = _PREFIX.size + (_HASH if key is None else _NONCE + _TAG)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise PieceError(f"a piece of the snapshot is missing ({e.strerror or e})", addr) from e
    try:
        n = os.readv(fd, [scratch[: length + overhead + 1]])
    except OSError as e:
        raise PieceError(f"a piece of the snapshot could not be read ({e.strerror or e})", addr) from e
    finally:
        os.close(fd)
    body = scratch[:n]
    prefix = bytes(body[: _PREFIX.size])
    if n != length + overhead or prefix != _PREFIX.pack(MAGIC, VERSION, length):
        raise PieceError("a piece of the snapshot is damaged (its size or signature is wrong)", addr)
    if key is None:
        data = body[_PREFIX.size : _PREFIX.size + length]
        digest = hashlib.sha256(data).digest()
        if digest.hex() != addr or not hmac.compare_digest(digest, bytes(body[-_HASH:])):
            raise PieceError("a piece of the snapshot is damaged (its checksum does not match)", addr)
        out[:length] = data
        return
    nonce = bytes(body[_PREFIX.size : _PREFIX.size + _NONCE])
    dec = Cipher(algorithms.AES(key), modes.GCM(nonce)).decryptor()
    dec.authenticate_additional_data(_aad(prefix, addr))
    dec.update_into(body[_PREFIX.size + _NONCE : n - _TAG], out)
    try:
        dec.finalize_with_tag(bytes(body[n - _TAG : n]))
    except InvalidTag:
        raise PieceError("a piece of the snapshot could not be authenticated (wrong key, or modified)",
                         addr) from None  # fmt: skip


def assemble(entries: Sequence[tuple[str, int]], locate: Callable[[str], tuple[Path, bytes | None]]
             ) -> memoryview:  # fmt: skip
    """The state the pieces ``entries`` make, read into one writable buffer owned by nobody else;
    ``locate(address)`` gives a piece's file and key (raising PieceError when it has none)."""
    total = sum(length for _, length in entries)
    out = _buffer(total + 16)  # update_into wants one AES block of room
    scratch = _buffer(max((length for _, length in entries), default=0) + 128)
    pos = 0
    for addr, length in entries:
        path, key = locate(addr)
        read_piece_into(path, addr, length, key, out[pos : pos + length + 16], scratch)
        pos += length
    if pos != total:
        raise SnapshotAuthError("The snapshot's pieces do not add up to its state.")
    return out[:total]


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if os.name == "posix" else None


def sync_folder(folder: Path, names: Sequence[str]) -> None:
    """Make the pieces written (``names`` in ``folder``) durable: one syncfs of the file system where
    there is one (an fsync per piece took seconds for a first save of thousands), else each file."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        if _libc is not None and hasattr(_libc, "syncfs") and _libc.syncfs(fd) == 0:
            return
        for name in names:
            with open(folder / name, "rb") as f:
                os.fsync(f.fileno())
        os.fsync(fd)
    finally:
        os.close(fd)
