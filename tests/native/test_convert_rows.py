"""GGML_OP_CONVERT_ROWS on the engine's CPU backend, which converts a lazy KV cache in host memory in place
and converts the rows of a saved state as they are read or written.

`ggml_convert_rows(ctx, a, b, n_rot)`: each row of a to F32 (F16 rows rotated as they are loaded), rotated in
groups of n_rot values by the FWHT of the Hadamard MUL_MAT (bit-identical to it, see test_fwht.py), then
quantized into b with the CPU's own `from_float`. Computed here as a one-node graph on the caller's memory and
checked against NumPy: the rotation, the quantization of every block (q8_0, q4_0, q5_0: the types a KV cache
steps through), and that converting in place (destination over the source's bytes), on any number of threads,
gives the bytes of an out-of-place conversion. Also the step a cache at q8_0 takes to q4_0: already rotated
rows, no rotation. The rotation itself is test_fwht.py's subject (bit-identical to the staged transform used
here); test-backend-ops compares the op with its reference implementation (test_backend_ops.py).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from .ggml_fa import _BASE, _CPU, _InitParams
from .test_fwht import staged_fwht

F32, F16, Q8_0, Q4_0, Q5_0 = 0, 1, 8, 2, 6
BLOCK_BYTES = {t: _BASE.ggml_row_size(t, 32) for t in (Q8_0, Q4_0, Q5_0)}  # 34, 18, 22
QUANT_NAMES = {Q8_0: "q8_0", Q4_0: "q4_0", Q5_0: "q5_0"}

_p = ctypes.c_void_p
for _lib, _name, _args, _res in (
    (_BASE, "ggml_convert_rows", [_p, _p, _p, ctypes.c_int], _p),
    (_BASE, "ggml_backend_tensor_alloc", [_p, _p, _p], ctypes.c_int),
    (_BASE, "ggml_backend_buffer_free", [_p], None),
    (_CPU, "ggml_backend_cpu_buffer_from_ptr", [_p, ctypes.c_size_t], _p),
    (_BASE, "ggml_quantize_chunk", [ctypes.c_int, _p, _p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, _p],
     ctypes.c_size_t),
):
    getattr(_lib, _name).argtypes, getattr(_lib, _name).restype = _args, _res


def aligned(n_bytes: int) -> np.ndarray:
    """Zeroed bytes at an address a CPU buffer accepts (ggml_backend_cpu_buffer_from_ptr: 32-byte aligned)."""
    raw = np.zeros(n_bytes + 64, dtype=np.uint8)
    offset = -raw.ctypes.data % 64
    return raw[offset : offset + n_bytes]


FILL = 0xA5  # the bytes around the source before a conversion: anything but zeros


def convert(src: np.ndarray, src_type: int, dst_type: int, n_per_row: int, n_rot: int,
            in_place: bool = False, n_threads: int = 1, n_extra: int = 0) -> bytes:
    """Convert the rows in `src` (bytes of rows of src_type) with a graph of one GGML_OP_CONVERT_ROWS on the
    CPU backend; returns the destination's bytes: the converted rows, then its `n_extra` rows past the
    source's, which the op zeroes (in place, over the source's bytes and past them)."""
    n_rows = src.nbytes // _BASE.ggml_row_size(src_type, n_per_row)
    dst_bytes = (n_rows + n_extra) * _BASE.ggml_row_size(dst_type, n_per_row)
    buf = aligned(max(src.nbytes, dst_bytes) if in_place else src.nbytes)
    buf[:] = FILL
    buf[:src.nbytes] = np.frombuffer(src.tobytes(), dtype=np.uint8)
    dst = buf if in_place else aligned(dst_bytes)
    dst[src.nbytes if in_place else 0:] = FILL
    before = dst.copy()

    mem_size = _BASE.ggml_tensor_overhead() * 4 + _BASE.ggml_graph_overhead()
    ctx = _BASE.ggml_init(_InitParams(mem_size, None, True))
    backend = _CPU.ggml_backend_cpu_init()
    buffers = [_CPU.ggml_backend_cpu_buffer_from_ptr(buf.ctypes.data, buf.nbytes)]
    if not in_place:
        buffers.append(_CPU.ggml_backend_cpu_buffer_from_ptr(dst.ctypes.data, dst.nbytes))
    try:
        a = _BASE.ggml_new_tensor_4d(ctx, src_type, n_per_row, n_rows, 1, 1)
        b = _BASE.ggml_new_tensor_4d(ctx, dst_type, n_per_row, n_rows + n_extra, 1, 1)
        assert _BASE.ggml_backend_tensor_alloc(buffers[0], a, buf.ctypes.data) == 0
        assert _BASE.ggml_backend_tensor_alloc(buffers[-1], b, dst.ctypes.data) == 0
        graph = _BASE.ggml_new_graph(ctx)
        _BASE.ggml_build_forward_expand(graph, _BASE.ggml_convert_rows(ctx, a, b, n_rot))
        _CPU.ggml_backend_cpu_set_n_threads(backend, n_threads)
        assert _BASE.ggml_backend_graph_compute(backend, graph) == 0
    finally:
        for buffer in buffers:
            _BASE.ggml_backend_buffer_free(buffer)
        _BASE.ggml_backend_free(backend)
        _BASE.ggml_free(ctx)
    assert np.array_equal(dst[dst_bytes:], before[dst_bytes:]), "a byte past the destination was written"
    return dst[:dst_bytes].tobytes()


def dequantize(data: bytes, dst_type: int, n_values: int) -> tuple[np.ndarray, np.ndarray]:
    """(values, block scales) of q8_0 / q4_0 / q5_0 blocks, as ggml's to_float computes them."""
    blocks = np.frombuffer(data, dtype=np.uint8).reshape(n_values // 32, BLOCK_BYTES[dst_type])
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)[:, 0]
    if dst_type == Q8_0:
        q = blocks[:, 2:].view(np.int8).astype(np.float32)
    else:
        nib = blocks[:, -16:]
        q = np.concatenate([nib & 0x0F, nib >> 4], axis=1).astype(np.int32)
        if dst_type == Q5_0:
            high = blocks[:, 2:6].copy().view(np.uint32)[:, 0]
            q |= (((high[:, None] >> np.arange(32)) & 1) << 4).astype(np.int32)
            q -= 16
        else:
            q -= 8
        q = q.astype(np.float32)
    return (q * d[:, None]).reshape(-1), d


def check_quantized(values: np.ndarray, data: bytes, dst_type: int) -> None:
    """Every value within half a quantization step of its block (plus the f16 rounding of the scale; q4_0
    and q5_0 clamp the code opposite the block's extreme, one step off), each block's scale from its
    largest magnitude."""
    got, d = dequantize(data, dst_type, values.size)
    step = np.repeat(np.abs(d), 32) * (0.5 if dst_type == Q8_0 else 1.0)
    assert np.all(np.abs(got - values.reshape(-1)) <= step + 1e-3 * np.abs(values.reshape(-1)) + 1e-6)
    amax = np.abs(values.reshape(-1, 32)).max(axis=1)
    levels = {Q8_0: 127, Q4_0: 8, Q5_0: 16}[dst_type]
    np.testing.assert_allclose(np.abs(d), amax / levels, rtol=2e-3)


@pytest.mark.parametrize("dst_type", [Q8_0, Q4_0, Q5_0], ids=QUANT_NAMES.get)
@pytest.mark.parametrize("n_rot", [0, 64, 128])
def test_f16_rows_rotate_and_quantize_in_place(dst_type: int, n_rot: int) -> None:
    rng = np.random.default_rng(n_rot + dst_type)
    n_per_row = 256
    x = rng.normal(0, 2, (53, n_per_row)).astype(np.float16)
    out = convert(x, F16, dst_type, n_per_row, n_rot)
    want = x.astype(np.float32)
    if n_rot:
        want = staged_fwht(want.reshape(-1, n_rot)).reshape(want.shape)
    check_quantized(want, out, dst_type)
    assert convert(x, F16, dst_type, n_per_row, n_rot, in_place=True) == out


def test_q8_0_rows_step_down_to_q4_0_in_place() -> None:
    """The already rotated q8_0 rows of a cache convert to q4_0 without rotating again."""
    rng = np.random.default_rng(3)
    n_per_row = 1024
    x = rng.normal(0, 2, (41, n_per_row)).astype(np.float16)
    q8 = np.frombuffer(convert(x, F16, Q8_0, n_per_row, 128), dtype=np.uint8)
    values, _ = dequantize(q8.tobytes(), Q8_0, x.size)
    out = convert(q8, Q8_0, Q4_0, n_per_row, 0)
    check_quantized(values, out, Q4_0)
    assert convert(q8, Q8_0, Q4_0, n_per_row, 0, in_place=True) == out


@pytest.mark.parametrize("n_threads", [2, 3, 4])
@pytest.mark.parametrize(
    ("src_type", "dst_type", "n_rot"),
    [(F16, Q8_0, 64), (F16, Q4_0, 128), (Q8_0, Q4_0, 0), (Q8_0, Q5_0, 0), (Q5_0, Q4_0, 0)],
    ids=["f16-q8_0", "f16-q4_0", "q8_0-q4_0", "q8_0-q5_0", "q5_0-q4_0"],
)
def test_in_place_on_several_threads_is_the_out_of_place_conversion(
        src_type: int, dst_type: int, n_rot: int, n_threads: int) -> None:
    """In place on several threads the op converts a chunk of rows at a time: chunks that grow by the ratio of
    the row sizes where destination rows are at most 4/5 of the source's (every step of a lazy cache: q8_0 to
    q5_0 is the closest, 22/34), through its work buffer otherwise (q5_0 to q4_0, 18/22). Enough rows here for
    many chunks (and a last, partial one), each byte as converted out of place on one thread."""
    rng = np.random.default_rng(n_threads)
    n_per_row = 256
    x = rng.normal(0, 2, (2999, n_per_row)).astype(np.float16)
    src = x if src_type == F16 else np.frombuffer(convert(x, F16, src_type, n_per_row, 64), np.uint8)
    want = convert(src, src_type, dst_type, n_per_row, n_rot)
    assert convert(src, src_type, dst_type, n_per_row, n_rot, in_place=True, n_threads=n_threads) == want
    assert convert(src, src_type, dst_type, n_per_row, n_rot, n_threads=n_threads) == want


def hostile_blocks(rng: np.random.Generator) -> np.ndarray:
    """Blocks of 32 f32 values where a quantizer's choices show: the largest magnitude twice with opposite
    signs (the first one sets the scale's sign), all zeros and negative zeros, one value only, denormals,
    values at the rounding boundaries of the codes, very large and very small scales, no positive value, a NaN
    or an infinity, and plain noise."""
    blocks = [rng.normal(0, 1, (64, 32))]
    ties = rng.normal(0, 1, (64, 32))
    ties[:, 3], ties[:, 17] = 2.5, -2.5
    blocks.append(ties)
    ties2 = ties.copy()
    ties2[:, 3], ties2[:, 17] = -2.5, 2.5
    blocks.append(ties2)
    blocks.append(np.zeros((2, 32)))
    blocks.append(np.tile([0.0, -0.0], (2, 16)))
    single = np.zeros((32, 32))
    single[np.arange(32), np.arange(32)] = rng.normal(0, 3, 32)
    blocks.append(single)
    blocks.append(rng.normal(0, 1e-39, (8, 32)))  # denormals
    grid = np.tile(np.linspace(-8, 8, 32), (16, 1)) + rng.normal(0, 1e-6, (16, 32))  # near code boundaries
    grid[:, 0] = -8.0
    blocks.append(grid)
    blocks.append(rng.normal(0, 1e30, (8, 32)))
    blocks.append(rng.normal(0, 1e-30, (8, 32)))
    blocks.append(rng.integers(-16, 17, (64, 32)) * 0.25)  # many exact ties
    blocks.append(-np.abs(rng.normal(0, 1, (8, 32))))  # no positive value
    special = rng.normal(0, 1, (4, 32))
    special[0, 5], special[1, 30], special[2, 0], special[3, 9] = np.nan, np.inf, -np.inf, np.nan
    blocks.append(special)  # left to the reference
    # in random order: the kernels find the scales of 8 blocks at once, and leave a block to one at a time
    return rng.permutation(np.concatenate(blocks)).astype(np.float32)


@pytest.mark.parametrize("dst_type", [Q4_0, Q5_0], ids=QUANT_NAMES.get)
def test_the_cpu_quantization_is_bit_identical_to_the_reference(dst_type: int) -> None:
    """The CPU's own q4_0 and q5_0 quantization (the series' AVX2 kernels) gives the bytes of ggml's reference
    quantizer (ggml_quantize_chunk: quantize_row_*_ref), so that a lazy cache's rungs and a plain cache of the
    same type hold what upstream's reference would. (Upstream's AVX2 q8_0 is not bit-identical to its own
    reference on blocks of denormals, where it takes the reciprocal of the scale differently: its choice.)"""
    x = hostile_blocks(np.random.default_rng(dst_type))
    n_per_row = 11 * 32  # 8 blocks whose scales are found together, and 3 on their own
    x = np.concatenate([x.ravel(), np.zeros(-x.size % n_per_row, np.float32)])
    rows = np.ascontiguousarray(x.reshape(-1, n_per_row))
    n_rows = rows.shape[0]
    out = convert(rows, F32, dst_type, n_per_row, 0)
    ref = np.zeros(len(out), dtype=np.uint8)
    written = _BASE.ggml_quantize_chunk(dst_type, rows.ctypes.data, ref.ctypes.data, 0, n_rows, n_per_row,
                                        None)
    assert written == len(out)
    got = np.frombuffer(out, np.uint8).reshape(-1, BLOCK_BYTES[dst_type])
    want = ref.reshape(-1, BLOCK_BYTES[dst_type])
    differ = np.flatnonzero((got != want).any(axis=1))
    assert differ.size == 0, f"{differ.size} blocks differ, the first: {differ[:5]}"


def hostile_q8_0_blocks(rng: np.random.Generator) -> np.ndarray:
    """q8_0 blocks (34 bytes: an f16 scale, 32 int8 codes) where a requantization from the codes could part
    from the reference: every largest magnitude, there twice with opposite signs in half of the blocks;
    multiples of 16 with their ties (the next rung's code a whole number before rounding, which only they
    have); -128, codes all 0, scales of +0, -0, negative, denormal, the largest f16, Inf and NaN; and plain
    blocks as a cache holds them (largest code 127)."""
    n = 1024
    codes = rng.integers(-127, 128, (n, 32))
    codes[:64, 0] = 127  # a cache's blocks
    for b, top in enumerate(range(1, 129)):  # every largest magnitude, with opposite signs in half of them
        row = 64 + b
        codes[row] = rng.integers(-top + 1, top, 32) if top > 1 else 0
        codes[row, b % 32] = top if top < 128 else -128
        if b % 2:
            codes[row, (b + 7) % 32] = -codes[row, b % 32] if top < 128 else 127
    codes[200:216] = rng.integers(-16, 17, (16, 32))  # many exact ties of the q4_0 codes
    codes[220:224] = 0
    # largest magnitudes that are multiples of 16, where 8.5 - 8c/m (q4_0) or 16.5 - 16c/m (q5_0) is a whole
    # number for some codes (ties: k*c/m odd, k 16 or 32), with scales where the reference's float arithmetic
    # then lands just below it (the largest ties first: they are where it does)
    tie_rows = {230: (48, 0x3013, 16), 231: (80, 0x3002, 16), 232: (96, 0x3013, 16), 233: (112, 0x3000, 16),
                234: (32, 0x307F, 16), 235: (96, 0x3010, 32), 236: (32, 0x307F, 32)}
    for row, (top, _, k) in tie_rows.items():
        ties = sorted((c for c in range(1 - top, top) if (k * c) % top == 0 and (k * c // top) % 2),
                      key=lambda c: -abs(c))[:31]
        codes[row] = 0
        codes[row, 0] = top
        codes[row, 1:1 + len(ties)] = ties
    d = np.abs(rng.normal(0, 0.05, n)).astype(np.float16)
    d[list(tie_rows)] = np.array([bits for _, bits, _ in tie_rows.values()], dtype=np.uint16).view(np.float16)
    d[300:304] = [0.0, -0.0, -0.03, -1.5]
    d[304:308] = np.array([6e-8, 1e-7, 3e-5, 65504.0], dtype=np.float16)
    d[308:312] = [np.inf, -np.inf, np.nan, np.nan]
    d[220] = 0.5
    blocks = np.zeros((n, 34), dtype=np.uint8)
    blocks[:, :2] = d.view(np.uint8).reshape(n, 2)
    blocks[:, 2:] = codes.astype(np.int8).view(np.uint8)
    return blocks[rng.permutation(n)]


@pytest.mark.parametrize("dst_type", [Q4_0, Q5_0], ids=QUANT_NAMES.get)
@pytest.mark.parametrize("n_blocks", [8, 41])
def test_q8_0_rows_requantize_as_the_reference(dst_type: int, n_blocks: int) -> None:
    """The q8_0 -> q4_0 / q5_0 step works from the q8_0 codes (the series' AVX2 kernel) and gives the bytes of
    the reference: the values as ggml's q8_0 to_float gives them (code times scale, exact in f32), then
    ggml_quantize_chunk, in place and out of place, on one thread and on three. Rows of 8 blocks (the
    constants of 8 blocks are computed at once) and of 41 (a chunk of 32 blocks, then one of 9: a group of 8
    and one block). Blocks of largest magnitude 127 (the cache's) take one multiplication a code, their sign
    read from their codes (rows with +127 and -127, either first); a block of another kind hands the rest of
    its 8 to the general path, and the blocks in random order mix the two."""
    blocks = hostile_q8_0_blocks(np.random.default_rng(dst_type))
    blocks = blocks[: len(blocks) // n_blocks * n_blocks]
    n_per_row = n_blocks * 32
    src = np.ascontiguousarray(blocks.reshape(-1))
    with np.errstate(invalid="ignore"):  # 0 times Inf, as ggml gives it too
        values, _ = dequantize(src.tobytes(), Q8_0, blocks.shape[0] * 32)
    rows = np.ascontiguousarray(values.reshape(-1, n_per_row).astype(np.float32))
    ref = np.zeros(rows.shape[0] * _BASE.ggml_row_size(dst_type, n_per_row), dtype=np.uint8)
    _BASE.ggml_quantize_chunk(dst_type, rows.ctypes.data, ref.ctypes.data, 0, rows.shape[0], n_per_row, None)
    want = ref.reshape(-1, BLOCK_BYTES[dst_type])
    for in_place, n_threads in ((False, 1), (True, 1), (True, 3)):
        out = convert(src, Q8_0, dst_type, n_per_row, 0, in_place=in_place, n_threads=n_threads)
        got = np.frombuffer(out, np.uint8).reshape(-1, BLOCK_BYTES[dst_type])
        differ = np.flatnonzero((got != want).any(axis=1))
        where = f"{in_place=} {n_threads=}"
        assert differ.size == 0, f"{where}: {differ.size} blocks differ, the first: {differ[:5]}"


@pytest.mark.parametrize(("src_type", "dst_type", "n_rot"),
                         [(F16, Q8_0, 128), (Q8_0, Q4_0, 0), (Q8_0, Q5_0, 0), (Q5_0, Q4_0, 0)],
                         ids=["f16-q8_0", "q8_0-q4_0", "q8_0-q5_0", "q5_0-q4_0"])
@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("past", [0, 3], ids=["to-source-end", "past-source"])
def test_rows_past_the_source_are_zeroed(src_type: int, dst_type: int, n_rot: int, n_threads: int,
                                         past: int) -> None:
    """A destination with more rows than the source, as a lazy KV cache steps from a quantized rung: in place,
    its rows past the source's cover the source's stale bytes (and `past` rows more), and come out zero - on
    one thread (each row's tail part zeroed after it), on several (q5_0 -> q4_0: rows of similar size, staged,
    the tail zeroed at the end; the others in growing chunks). No byte past the destination is written
    (convert() checks), and out of place the extra rows are zeroed as well."""
    rng = np.random.default_rng(n_threads)
    n_per_row = 256
    x = rng.normal(0, 2, (997, n_per_row)).astype(np.float16)
    src = x if src_type == F16 else np.frombuffer(convert(x, F16, src_type, n_per_row, 64), np.uint8)
    want = convert(src, src_type, dst_type, n_per_row, n_rot, in_place=True, n_threads=n_threads)
    dst_row = _BASE.ggml_row_size(dst_type, n_per_row)
    n_extra = -(-src.nbytes // dst_row) - len(want) // dst_row + past
    for in_place in (True, False):
        got = np.frombuffer(convert(src, src_type, dst_type, n_per_row, n_rot, in_place=in_place,
                                    n_threads=n_threads, n_extra=n_extra), np.uint8)
        assert got.size >= src.nbytes > len(want)
        assert got[:len(want)].tobytes() == want
        nonzero = np.flatnonzero(got[len(want):])
        first = nonzero[:5] + len(want)
        assert nonzero.size == 0, f"{in_place=}: {nonzero.size} bytes not zeroed, the first: {first}"
