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
stored as a record (``write_pack``), encrypted with AES-256-GCM under its own key, the address and length
in the associated data; unencrypted, its sha256 (= its address) is checked. The new pieces of one save are
the records of one pack file (the database names each piece's pack and offset): a resume opens and maps
a pack once, not a file per piece (~27 us each). The bytes are not
deflated: KV cells barely compress (see snapshot.COMPRESS_LEVEL). A snapshot file (format 4) lists its
pieces (``pack_manifest``); ``assemble`` reads them back into one buffer, each piece decrypted in place.
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import hashlib
import hmac
import mmap
import os
import struct
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
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


def _record(addr: str, view: memoryview, key: bytes | None) -> list[bytes | memoryview]:
    """A piece's record: prefix, then (unencrypted) its bytes and their sha256, or a nonce and its bytes
    encrypted under ``key`` with the tag (AES-256-GCM, the prefix and address in the associated data)."""
    prefix = _PREFIX.pack(MAGIC, VERSION, len(view))
    if key is None:
        return [prefix, view, hashlib.sha256(view).digest()]
    nonce = os.urandom(_NONCE)
    return [prefix, nonce, AESGCM(key).encrypt(nonce, view, _aad(prefix, addr))]


def write_pack(folder: Path, name: str, items: Sequence[tuple[str, bytes | memoryview, bytes | None]]
               ) -> list[tuple[int, int]]:  # fmt: skip
    """Write the records of the pieces ``items`` (address, bytes, own 32-byte key or None: unencrypted)
    one after the other as the pack ``folder/name`` (temp file, rename; no fsync: ``sync_folder`` once
    after a save's pack); returns each record's (offset, size)."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    spans = []
    try:
        try:
            offset = 0
            for addr, data, key in items:
                size = 0
                for part in _record(addr, memoryview(data).cast("B"), key):
                    part = memoryview(part)
                    size += len(part)
                    while part:
                        part = part[os.write(fd, part) :]
                spans.append((offset, size))
                offset += size
        finally:
            os.close(fd)
        os.replace(tmp, folder / name)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return spans


def write_piece(folder: Path, name: str, addr: str, data: bytes | memoryview, key: bytes | None) -> int:
    """Write one piece as a pack of its own (``write_pack``); returns its size on disk."""
    return write_pack(folder, name, [(addr, data, key)])[0][1]


class Location(NamedTuple):  # a tuple, not a dataclass: one is made per piece at each resume
    """Where a piece's record is: its pack, offset and size there, and the piece's own key (None: plain)."""

    path: Path
    key: bytes | None
    offset: int = 0
    size: int = -1  # -1: the record's expected size (its length plus the record's overhead)


def _overhead(key: bytes | None) -> int:
    return _PREFIX.size + (_HASH if key is None else _NONCE + _TAG)


def _open_record(body: memoryview, addr: str, length: int, key: bytes | None, out: memoryview) -> None:
    """Decrypt (or check) the record ``body`` of the piece ``addr`` into ``out`` (``length`` bytes)."""
    prefix = _PREFIX.pack(MAGIC, VERSION, length)
    if len(body) != length + _overhead(key) or body[: _PREFIX.size] != prefix:
        raise PieceError("a piece of the snapshot is damaged (its size or signature is wrong)", addr)
    if key is None:
        data = body[_PREFIX.size : _PREFIX.size + length]
        digest = hashlib.sha256(data).digest()
        if digest.hex() != addr or not hmac.compare_digest(digest, bytes(body[-_HASH:])):
            raise PieceError("a piece of the snapshot is damaged (its checksum does not match)", addr)
        out[:length] = data
        return
    try:
        AESGCM(key).decrypt_into(body[_PREFIX.size : _PREFIX.size + _NONCE], body[_PREFIX.size + _NONCE :],
                                 _aad(prefix, addr), out)
    except InvalidTag:
        raise PieceError("a piece of the snapshot could not be authenticated (wrong key, or modified)",
                         addr) from None  # fmt: skip


def assemble(entries: Sequence[tuple[str, int]], locate: Callable[[str], Location]) -> memoryview:
    """The state the pieces ``entries`` make, read into one writable buffer owned by nobody else;
    ``locate(address)`` says where a piece's record is (raising PieceError when it has none). Each pack
    is opened once and mapped (its records read from the page cache, not copied first); every piece is
    then authenticated (or checked) and decrypted in place; PieceError when one is missing, damaged or
    not the piece named."""
    total = sum(length for _, length in entries)
    out = _buffer(total)
    by_pack: dict[str, list[tuple[str, int, int, Location]]] = {}
    pos = 0
    for addr, length in entries:
        where = locate(addr)
        by_pack.setdefault(os.fspath(where.path), []).append((addr, length, pos, where))
        pos += length
    for path, wanted in by_pack.items():
        with _Mapped(path, wanted[0][0]) as pack:
            for addr, length, at, where in wanted:
                size = where.size if where.size >= 0 else length + _overhead(where.key)
                _open_record(pack.view[where.offset : where.offset + size], addr, length, where.key,
                             out[at : at + length])  # fmt: skip
    if pos != total:
        raise SnapshotAuthError("The snapshot's pieces do not add up to its state.")
    return out


class _Mapped:
    """A pack mapped read-only for the records read from it (``view``); unmapped on exit. Packs are never
    truncated (written whole and renamed; a freed record is a hole, read as zeros and refused)."""

    def __init__(self, path: str, addr: str) -> None:
        self.path, self.addr = path, addr

    def __enter__(self) -> _Mapped:
        try:
            with open(self.path, "rb", buffering=0) as f:
                if os.fstat(f.fileno()).st_size == 0:
                    raise PieceError("a piece of the snapshot is damaged (its pack is empty)", self.addr)
                self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError as e:
            raise PieceError(f"a piece of the snapshot is missing ({e.strerror or e})", self.addr) from e
        except OSError as e:
            reason = e.strerror or e
            raise PieceError(f"a piece of the snapshot could not be read ({reason})", self.addr) from e
        self.view = memoryview(self.map)
        return self

    def __exit__(self, *exc: object) -> None:
        self.view.release()
        try:
            self.map.close()
        except BufferError:  # a slice still held (by an error's traceback): unmapped when it goes
            pass


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


_FALLOC_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE (Linux)


def punch_holes(folder: Path, spans: Sequence[tuple[str, int, int]]) -> None:
    """Free the bytes of the records (pack name, offset, size) no row names any more in packs that still
    hold other pieces, where the file system can (Linux's fallocate); elsewhere they stay until the pack
    goes. Either way such a record no longer decrypts: its key went with its row. Best effort."""
    fallocate = getattr(_libc, "fallocate", None) if _libc is not None else None
    if fallocate is None or not spans:
        return
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    for name, offset, size in spans:
        try:
            fd = os.open(folder / name, os.O_WRONLY)
        except OSError:
            continue
        try:
            fallocate(fd, _FALLOC_PUNCH_HOLE, offset, size)
        finally:
            os.close(fd)
