"""ggml-cpu's row conversion (patch 0007), which converts a lazy KV cache in host memory in place and
converts f16 rows of a saved state as they are read.

`ggml_cpu_convert_rows(src, src_type, dst, dst_type, n_rows, n_per_row, n_rot, tmp)`: each row to F32
(F16 rows rotated as they are loaded), rotated in groups of n_rot values by the FWHT of the Hadamard
MUL_MAT (bit-identical to it, see test_fwht.py), then quantized with the CPU's own `from_float`. Checked
here against NumPy: the rotation, the quantization of every block (q8_0, q4_0, q5_0: the types a KV cache
steps through), and that converting in place (destination over the source's bytes) gives the bytes of an
out-of-place conversion. Also the step a cache at q8_0 takes to q4_0: already rotated rows, no rotation.
The rotation itself is test_fwht.py's subject (bit-identical to the staged transform used here).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from .ggml_fa import _BASE, _CPU
from .test_fwht import staged_fwht

F16, Q8_0, Q4_0, Q5_0 = 1, 8, 2, 6
BLOCK_BYTES = {t: _BASE.ggml_row_size(t, 32) for t in (Q8_0, Q4_0, Q5_0)}  # 34, 18, 22
QUANT_NAMES = {Q8_0: "q8_0", Q4_0: "q4_0", Q5_0: "q5_0"}

_CPU.ggml_cpu_convert_rows.argtypes = [
    ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
    ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
]
_CPU.ggml_cpu_convert_rows.restype = None


def convert(src: np.ndarray, src_type: int, dst_type: int, n_per_row: int, n_rot: int,
            in_place: bool = False) -> bytes:
    """Convert the rows in `src` (bytes of rows of src_type); returns the destination rows' bytes."""
    n_rows = src.nbytes // _BASE.ggml_row_size(src_type, n_per_row)
    dst_bytes = n_rows * _BASE.ggml_row_size(dst_type, n_per_row)
    buf = np.frombuffer(src.tobytes(), dtype=np.uint8).copy()
    dst = buf if in_place else np.zeros(dst_bytes, dtype=np.uint8)
    tmp = np.zeros(n_per_row, dtype=np.float32)
    _CPU.ggml_cpu_convert_rows(buf.ctypes.data, src_type, dst.ctypes.data, dst_type, n_rows, n_per_row,
                               n_rot, tmp.ctypes.data)
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
