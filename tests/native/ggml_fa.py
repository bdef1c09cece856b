"""ggml's FLASH_ATTN_EXT (and the Hadamard-hinted MUL_MAT of the K/V rotation) on the engine's own CPU
backend, through ctypes.

Builds the graph the way upstream's test-backend-ops does (K and V as views of a larger buffer, like a KV
cache; inputs uniform in [-1, 1]; an F16 mask with values in [-1, 1]) and computes it with the CPU backend,
optionally with `use_ref` (the vec-only reference implementation: no tiling, no KV splitting).
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
GGML_TYPE_Q4_0 = 2
GGML_TYPE_Q5_0 = 6
GGML_TYPE_Q8_0 = 8
GGML_PREC_F32 = 10
GGML_HINT_SRC0_IS_HADAMARD = 1
TYPE_NAMES = {"f32": GGML_TYPE_F32, "f16": GGML_TYPE_F16, "q4_0": GGML_TYPE_Q4_0, "q5_0": GGML_TYPE_Q5_0,
              "q8_0": GGML_TYPE_Q8_0}

# upstream tests/test-backend-ops.cpp, test_flash_attn_ext::max_nmse_err()
FLASH_ATTN_EXT_MAX_NMSE = 5e-4


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class _TypeTraits(ctypes.Structure):
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)),
        ("from_float_ref", ctypes.c_void_p),
    ]


def _load() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    base = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
    cpu = ctypes.CDLL(str(lib_dir / "libggml-cpu.so"))
    p, i64, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t
    sigs = {
        (base, "ggml_init"): ([_InitParams], p),
        (base, "ggml_free"): ([p], None),
        (base, "ggml_tensor_overhead"): ([], sz),
        (base, "ggml_graph_overhead"): ([], sz),
        (base, "ggml_row_size"): ([ctypes.c_int, i64], sz),
        (base, "ggml_new_tensor_4d"): ([p, ctypes.c_int, i64, i64, i64, i64], p),
        (base, "ggml_view_4d"): ([p, p, i64, i64, i64, i64, sz, sz, sz, sz], p),
        (base, "ggml_get_data"): ([p], p),
        (base, "ggml_nbytes"): ([p], sz),
        (base, "ggml_flash_attn_ext"): ([p, p, p, p, p, ctypes.c_float, ctypes.c_float, ctypes.c_float], p),
        (base, "ggml_flash_attn_ext_set_prec"): ([p, ctypes.c_int], None),
        (base, "ggml_flash_attn_ext_add_kv"): ([p, p, p], None),
        (base, "ggml_get_type_traits"): ([ctypes.c_int], ctypes.POINTER(_TypeTraits)),
        (base, "ggml_mul_mat"): ([p, p, p], p),
        (base, "ggml_mul_mat_set_hint"): ([p, ctypes.c_int], None),
        (base, "ggml_new_graph"): ([p], p),
        (base, "ggml_build_forward_expand"): ([p, p], None),
        (base, "ggml_quantize_chunk"): ([ctypes.c_int, p, p, i64, i64, i64, p], sz),
        (base, "ggml_backend_graph_compute"): ([p, p], ctypes.c_int),
        (base, "ggml_backend_free"): ([p], None),
        (cpu, "ggml_backend_cpu_init"): ([], p),
        (cpu, "ggml_backend_cpu_set_n_threads"): ([p, ctypes.c_int], None),
        (cpu, "ggml_backend_cpu_set_use_ref"): ([p, ctypes.c_bool], None),
    }
    for (lib, name), (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return base, cpu


_BASE, _CPU = _load()


@dataclass(frozen=True)
class FaCase:
    head: int  # K and V head size
    gqa: int  # query heads per KV head
    n_kv: int  # KV length
    n_q: int  # query rows (tokens)
    mask: bool
    type_k: str
    type_v: str
    n_head_kv: int = 2
    seed: int = 0
    n_kv2: int = 0  # rows of the second (F16) K/V range, ggml_flash_attn_ext_add_kv; the mask covers both

    @property
    def n_head(self) -> int:
        return self.n_head_kv * self.gqa


def _fill(t: int, type_name: str, values: np.ndarray) -> None:
    """Write f32 `values` (rows of ne0) into tensor t of type `type_name`."""
    dst = _BASE.ggml_get_data(t)
    values = np.ascontiguousarray(values, dtype=np.float32)
    if type_name in ("q4_0", "q5_0", "q8_0"):
        n_per_row = values.shape[-1]
        _BASE.ggml_quantize_chunk(
            TYPE_NAMES[type_name], values.ctypes.data, dst, 0, values.size // n_per_row, n_per_row, None
        )
        return
    data = values if type_name == "f32" else values.astype(np.float16)
    assert data.nbytes == _BASE.ggml_nbytes(t)
    ctypes.memmove(dst, data.ctypes.data, data.nbytes)


def _kv_view(ctx: int, type_name: str, case: FaCase, rng: np.random.Generator,
             n_kv: int | None = None) -> int:
    """A [head, n_kv, n_head_kv] view of a buffer twice as long, filled with uniform [-1, 1] values."""
    n_kv = case.n_kv if n_kv is None else n_kv
    t = TYPE_NAMES[type_name]
    full = _BASE.ggml_new_tensor_4d(ctx, t, case.head, 2 * n_kv, case.n_head_kv, 1)
    _fill(full, type_name, rng.uniform(-1, 1, (case.n_head_kv, 2 * n_kv, case.head)))
    nb1 = _BASE.ggml_row_size(t, case.head)
    nb2, nb3 = nb1 * 2 * n_kv, nb1 * 2 * n_kv * case.n_head_kv
    return _BASE.ggml_view_4d(ctx, full, case.head, n_kv, case.n_head_kv, 1, nb1, nb2, nb3, 0)


def _read_view(t: int, type_name: str, case: FaCase, n_kv: int) -> np.ndarray:
    """The values of a _kv_view as the kernels see them (quantized rows through the type's to_float):
    [n_head_kv, n_kv, head] float32."""
    tt = TYPE_NAMES[type_name]
    nb1 = _BASE.ggml_row_size(tt, case.head)
    to_float = _BASE.ggml_get_type_traits(tt).contents.to_float
    base = _BASE.ggml_get_data(t)
    out = np.empty((case.n_head_kv, n_kv, case.head), dtype=np.float32)
    for h in range(case.n_head_kv):
        for r in range(n_kv):
            if type_name == "f32":
                out[h, r] = np.frombuffer(ctypes.string_at(base + (h * 2 * n_kv + r) * nb1, nb1),
                                          dtype=np.float32)
            else:
                to_float(base + (h * 2 * n_kv + r) * nb1, out[h, r].ctypes.data, case.head)
    return out


def causal_mask(case: FaCase, rng: np.random.Generator) -> np.ndarray:
    """Values in [-1, 1]; the queries are the last n_q positions and see no later key (-inf), which
    leaves whole KV tiles masked for the first rows; plus a few -inf blocks as upstream's test does."""
    n_kv = case.n_kv + case.n_kv2
    m = rng.uniform(-1, 1, (case.n_q, n_kv)).astype(np.float32)
    first = n_kv - case.n_q
    for i in range(case.n_q):
        m[i, first + i + 1 :] = -np.inf
    for _ in range(max(1, case.n_q * n_kv // 8192)):
        i, j = rng.integers(case.n_q), rng.integers(n_kv)
        m[i : i + 16, j : j + 48] = -np.inf
    return m


def flash_attn(case: FaCase, n_threads: int, use_ref: bool, oracle: bool = False):
    """The op's output, [n_q, n_head, head] float32; with `oracle`, also softmax attention over the same
    K/V values (both ranges) and mask in float64, (output, oracle)."""
    rng = np.random.default_rng(case.seed)
    n_kv_all = case.n_kv + case.n_kv2
    size = (
        2 * _BASE.ggml_row_size(TYPE_NAMES[case.type_k], case.head) * 2 * n_kv_all * case.n_head_kv
        + 2 * 4 * case.head * 2 * n_kv_all * case.n_head_kv
        + 2 * 4 * case.head * case.n_q * case.n_head
        + 2 * n_kv_all * case.n_q
        + 16 * _BASE.ggml_tensor_overhead()
        + _BASE.ggml_graph_overhead()
        + (1 << 16)
    )
    ctx = _BASE.ggml_init(_InitParams(size, None, False))
    assert ctx, "ggml_init failed"
    try:
        q = _BASE.ggml_new_tensor_4d(ctx, GGML_TYPE_F32, case.head, case.n_q, case.n_head, 1)
        _fill(q, "f32", rng.uniform(-1, 1, (case.n_head, case.n_q, case.head)))
        k = _kv_view(ctx, case.type_k, case, rng)
        v = _kv_view(ctx, case.type_v, case, rng)
        k2 = v2 = None
        if case.n_kv2:
            k2 = _kv_view(ctx, "f16", case, rng, case.n_kv2)
            v2 = _kv_view(ctx, "f16", case, rng, case.n_kv2)
        m = mask = None
        if case.mask:
            m = _BASE.ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv_all, case.n_q, 1, 1)
            mask = causal_mask(case, rng)
            _fill(m, "f16", mask)
        out = _BASE.ggml_flash_attn_ext(ctx, q, k, v, m, 1.0 / math.sqrt(case.head), 0.0, 0.0)
        _BASE.ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32)
        if case.n_kv2:
            _BASE.ggml_flash_attn_ext_add_kv(out, k2, v2)
        result = _compute(ctx, out, n_threads, use_ref, (case.n_q, case.n_head, case.head))
        if not oracle:
            return result
        qv = np.array((ctypes.c_float * (case.n_head * case.n_q * case.head)).from_address(
            _BASE.ggml_get_data(q)))
        qv = qv.reshape(case.n_head, case.n_q, case.head).astype(np.float64)
        ks = [_read_view(k, case.type_k, case, case.n_kv)]
        vs = [_read_view(v, case.type_v, case, case.n_kv)]
        if case.n_kv2:
            ks.append(_read_view(k2, "f16", case, case.n_kv2))
            vs.append(_read_view(v2, "f16", case, case.n_kv2))
        kk = np.concatenate(ks, axis=1).astype(np.float64)
        vv = np.concatenate(vs, axis=1).astype(np.float64)
        mm = np.zeros((case.n_q, n_kv_all)) if mask is None else mask.astype(np.float16).astype(np.float64)
        ref = np.empty((case.n_q, case.n_head, case.head))
        for h in range(case.n_head):
            hk = h // case.gqa
            s = qv[h] @ kk[hk].T / math.sqrt(case.head) + mm
            p = np.exp(s - s.max(axis=1, keepdims=True))
            ref[:, h] = (p / p.sum(axis=1, keepdims=True)) @ vv[hk]
        return result, ref
    finally:
        _BASE.ggml_free(ctx)


def _compute(ctx: int, out: int, n_threads: int, use_ref: bool, shape: tuple[int, ...]) -> np.ndarray:
    """Compute the graph of `out` (an F32 tensor of `shape`) on a fresh CPU backend; a copy of the result."""
    backend = _CPU.ggml_backend_cpu_init()
    try:
        graph = _BASE.ggml_new_graph(ctx)
        _BASE.ggml_build_forward_expand(graph, out)
        _CPU.ggml_backend_cpu_set_n_threads(backend, n_threads)
        _CPU.ggml_backend_cpu_set_use_ref(backend, use_ref)
        assert _BASE.ggml_backend_graph_compute(backend, graph) == 0
        raw = (ctypes.c_float * math.prod(shape)).from_address(_BASE.ggml_get_data(out))
        return np.array(raw, dtype=np.float32).reshape(shape)
    finally:
        _BASE.ggml_backend_free(backend)


def nmse(ref: np.ndarray, out: np.ndarray) -> float:
    """test-backend-ops' NMSE: sum((ref - out)^2) / sum(ref^2)."""
    ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
    return float(np.sum((ref64 - out64) ** 2) / np.sum(ref64**2))


def sylvester_hadamard(n: int) -> np.ndarray:
    """The n x n Sylvester Hadamard matrix times 1/sqrt(n) (n a power of two), float32."""
    h = np.ones((1, 1), dtype=np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(np.float32(n))).astype(np.float32)


def hadamard_rotate(x: np.ndarray, src_type: str, n_threads: int, use_ref: bool) -> np.ndarray:
    """ggml_mul_mat(H, x) with GGML_HINT_SRC0_IS_HADAMARD, as the KV cache rotates Q, K and V: the CPU
    backend runs its FWHT (or, with use_ref, the dense product with H). x: [rows, n] float32, stored as
    `src_type` (f32 or f16); returns [rows, n] float32."""
    rows, n = x.shape
    overhead = 8 * _BASE.ggml_tensor_overhead() + _BASE.ggml_graph_overhead() + (1 << 16)
    size = 4 * n * n + 3 * 4 * rows * n + overhead
    ctx = _BASE.ggml_init(_InitParams(size, None, False))
    assert ctx, "ggml_init failed"
    try:
        rot = _BASE.ggml_new_tensor_4d(ctx, GGML_TYPE_F32, n, n, 1, 1)
        _fill(rot, "f32", sylvester_hadamard(n))
        src = _BASE.ggml_new_tensor_4d(ctx, TYPE_NAMES[src_type], n, rows, 1, 1)
        _fill(src, src_type, x)
        out = _BASE.ggml_mul_mat(ctx, rot, src)
        _BASE.ggml_mul_mat_set_hint(out, GGML_HINT_SRC0_IS_HADAMARD)
        return _compute(ctx, out, n_threads, use_ref, (rows, n))
    finally:
        _BASE.ggml_free(ctx)
