"""An independent reader of the engine's whole-context state format (patch 0001 on),
for checking cache contents from Python: what the engine saves is what it holds.

Layout: arch string; then per KV cache the extension block (tag, version, size, entries of id,
size, data: the layout entry holds the K/V types and the layer count, the lazy entry the rungs;
see native/README.md); n_stream; K/V rotation sizes (upstream's, state versions 11/4); per stream
the cell count, then per cell its position and sequence ids, then per layer the K rows, then the
V rows. Only models without per-cell extras (no M-RoPE, no PLE) and a non-transposed V.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

EXT_TAG = 0x6C6B7678  # LLAMA_STATE_EXT_TAG, 'lkvx'
EXT_REQUIRED = 0x80000000
EXT_LAYOUT = 1
EXT_LAZY = 2
EXT_RECENT = 3  # a lazy cache's recent window; optional: a reader may pass over it

QK8 = 32
Q8_BLOCK = 34
GGML_TYPE_F16 = 1
GGML_TYPE_Q8_0 = 8


@dataclass
class Tensor:
    type: int
    rows: np.ndarray  # uint8 [n_cells, row_size]


@dataclass
class CacheState:
    n_rot_k: int
    n_rot_v: int
    type_k: int = -1
    type_v: int = -1
    n_layer: int = 0
    ext_version: int = 0  # 0: no extension block (an upstream state)
    lazy_rung: int | None = None  # a lazy cache's rung when saved (a ggml type); the layout: the rows' type
    ext_entries: dict[int, bytes] = field(default_factory=dict)
    positions: list[int] = field(default_factory=list)
    k: list[Tensor] = field(default_factory=list)
    v: list[Tensor] = field(default_factory=list)
    recent: tuple[int, int] | None = None  # (tokens per sequence, slots per ring) of a lazy cache's window
    sinks: int = 0  # and the slots at the front of each ring that keep the first positions (patch 0030)
    window: Window | None = None


@dataclass
class Window:
    """The recent window written after a stream's cells: a ring per sequence (one for a sequence's state),
    its head, and per row written, oldest first, the cell (its index among the written cells) and the
    slot (ring * slots per ring + offset); the f16 K and V rows per layer (uint8 [n, row_size]), ring
    after ring."""

    cells: list[int]
    slots: list[int]
    heads: list[int]
    k: list[np.ndarray]
    v: list[np.ndarray]


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.off = data, 0

    def take(self, n: int) -> bytes:
        if self.off + n > len(self.data):
            raise ValueError("state blob ends early")
        out = self.data[self.off : self.off + n]
        self.off += n
        return out

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def i32(self) -> int:
        return struct.unpack("<i", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]


def parse_context_state(blob: bytes, n_caches: int = 1) -> tuple[str, list[CacheState]]:
    """The architecture and each KV cache (two for an iSWA model) of a whole-context state."""
    r = _Reader(blob)
    arch = r.take(r.u32()).decode()
    caches = [_parse_cache(r) for _ in range(n_caches)]
    if r.off != len(blob):
        raise ValueError(f"{len(blob) - r.off} trailing bytes")
    return arch, caches


def parse_seq_state(blob: bytes) -> CacheState:
    """The KV cache of a sequence state (after its magic and sequence id)."""
    r = _Reader(blob)
    r.take(8)
    cache = _parse_cache(r)
    if r.off != len(blob):
        raise ValueError(f"{len(blob) - r.off} trailing bytes")
    return cache


def parse_ext_block(data: bytes) -> tuple[int, dict[int, bytes]]:
    """(version, {entry id: data}) of the extension block at the start of ``data``, ({} if none)."""
    r = _Reader(data)
    if r.u32() != EXT_TAG:
        return 0, {}
    version, size = r.u32(), r.u32()
    block = _Reader(r.take(size))
    entries: dict[int, bytes] = {}
    while block.off < size:
        entry_id, n = block.u32(), block.u32()
        entries[entry_id] = block.take(n)
    return version, entries


def _parse_cache(r: _Reader) -> CacheState:
    version, entries = parse_ext_block(r.data[r.off :])
    if version:
        r.take(12 + sum(8 + len(d) for d in entries.values()))
    n_stream = r.u32()
    assert n_stream == 1, "unified caches only"
    cache = CacheState(n_rot_k=r.u32(), n_rot_v=r.u32(), ext_version=version, ext_entries=entries)
    if EXT_LAYOUT in entries:
        cache.type_k, cache.type_v, cache.n_layer = struct.unpack("<iiI", entries[EXT_LAYOUT][:12])
    if EXT_LAZY in entries:
        (cache.lazy_rung,) = struct.unpack("<i", entries[EXT_LAZY][:4])
    if EXT_RECENT in entries:
        cache.recent = struct.unpack("<II", entries[EXT_RECENT][:8])
        if len(entries[EXT_RECENT]) >= 12:
            (cache.sinks,) = struct.unpack("<I", entries[EXT_RECENT][8:12])
    n_cells = r.u32()
    if n_cells == 0:
        return cache
    for _ in range(n_cells):
        cache.positions.append(r.i32())
        r.take(4 * r.u32())  # sequence ids
    v_trans, n_layer = r.u32(), r.u32()
    assert v_trans == 0 and n_layer == (cache.n_layer or n_layer)
    cache.n_layer = n_layer
    for dest, header_type in ((cache.k, cache.type_k), (cache.v, cache.type_v)):
        for _ in range(n_layer):
            typ, row = r.i32(), r.u64()
            assert typ == header_type or header_type == -1, "every layer is stored as the header says"
            rows = np.frombuffer(r.take(n_cells * row), dtype=np.uint8).reshape(n_cells, row)
            dest.append(Tensor(typ, rows))
    if cache.recent is not None:
        ring, heads, pairs = cache.recent[1], [], []
        for k in range(r.u32()):
            heads.append(r.u32())
            pairs += [(r.u32(), k * ring + r.u32()) for _ in range(r.u32())]
        n = len(pairs)
        rows_k = [np.frombuffer(r.take(n * 2 * _f16_width(t)), dtype=np.uint8).reshape(n, -1)
                  for t in cache.k]
        rows_v = [np.frombuffer(r.take(n * 2 * _f16_width(t)), dtype=np.uint8).reshape(n, -1)
                  for t in cache.v]
        cache.window = Window([c for c, _ in pairs], [j for _, j in pairs], heads, rows_k, rows_v)
    return cache


def _f16_width(t: Tensor) -> int:
    """Values per row of a stored tensor (f16 rows, or blocks of 32 of a quantized type)."""
    block = {GGML_TYPE_F16: (1, 2), GGML_TYPE_Q8_0: (32, 34), 2: (32, 18), 6: (32, 22)}[t.type]
    return t.rows.shape[1] // block[1] * block[0]


def f16_values(t: Tensor) -> np.ndarray:
    assert t.type == GGML_TYPE_F16
    return t.rows.view(np.float16).astype(np.float32)


def q8_split(t: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(scales [cells, blocks] float32, codes [cells, blocks, 32] int8) of q8_0 rows."""
    assert t.type == GGML_TYPE_Q8_0
    blocks = t.rows.reshape(t.rows.shape[0], -1, Q8_BLOCK)
    scales = blocks[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float32)
    codes = blocks[:, :, 2:].view(np.int8)
    return scales, codes


def hadamard(n: int) -> np.ndarray:
    """The Sylvester Hadamard matrix scaled by 1/sqrt(n) (dense: an independent reference)."""
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def reference_q8(values: np.ndarray, n_rot: int) -> tuple[np.ndarray, np.ndarray]:
    """Rotate rows in blocks of n_rot (0: none), then quantize to q8_0 like ggml's reference."""
    x = values.astype(np.float64)
    if n_rot:
        x = (x.reshape(x.shape[0], -1, n_rot) @ hadamard(n_rot)).reshape(x.shape)
    x = x.astype(np.float32).reshape(x.shape[0], -1, QK8)
    amax = np.abs(x).max(axis=2)
    d = amax / 127.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    codes = np.rint(x * inv[:, :, None]).astype(np.int8)
    return d.astype(np.float16).astype(np.float32), codes


def conversion_mismatches(before: CacheState, after: CacheState) -> tuple[int, int]:
    """Compare every converted q8_0 tensor of `after` with the NumPy rotate-then-quantize of the same
    f16 tensor of `before`: scales within 0.2 %, codes off by at most one. Returns (codes off by one,
    codes); the caller bounds their ratio."""
    total = off = 0
    pairs = ((before.k, after.k, after.n_rot_k), (before.v, after.v, after.n_rot_v))
    for tensors_b, tensors_a, n_rot in pairs:
        for tb, ta in zip(tensors_b, tensors_a, strict=True):
            want_d, want_q = reference_q8(f16_values(tb), n_rot)
            got_d, got_q = q8_split(ta)
            np.testing.assert_allclose(got_d, want_d, rtol=2e-3, atol=0)
            diff = np.abs(got_q.astype(np.int16) - want_q.astype(np.int16))
            assert diff.max() <= 1
            total += diff.size
            off += int(np.count_nonzero(diff))
    return off, total


def byte_mismatches(a: CacheState, b: CacheState, ggml_type: int) -> tuple[int, int]:
    """Compare the K and V rows of two caches stored as ggml_type, byte for byte: (bytes that differ,
    bytes); the caller bounds their ratio."""
    off = total = 0
    for ta, tb in zip(a.k + a.v, b.k + b.v, strict=True):
        assert ta.type == tb.type == ggml_type and ta.rows.shape == tb.rows.shape
        off += int(np.count_nonzero(ta.rows != tb.rows))
        total += ta.rows.size
    return off, total
