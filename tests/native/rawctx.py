"""A thin wrapper over the engine's C API for tests the `Llama` class cannot
express: several sequences in one cache, explicit positions, raw state blobs."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp._logger import capture_errors
from llama_cpp.llama import _KV_LAZY_RUNG_TYPES as RUNG_TYPES  # the bindings' table of rung types
from llama_cpp.llama import KvLazyInfo, kv_stored_rotation


def engine_threads() -> int:
    """Engine threads for a test's own context: 2, as on the 2-core machine the suite is sized for;
    1 in a pytest-xdist worker (`tests/conftest.py` sets LAZYKV_TEST_THREADS), so that two workers
    on two cores run two engine threads, not four. Read here, not in tests/support, because child
    processes run this module as a script."""
    return int(os.environ.get("LAZYKV_TEST_THREADS", "2"))


class DecodeError(RuntimeError):
    def __init__(self, rc: int):
        super().__init__(f"llama_decode returned {rc}")
        self.rc = rc


class RawModel:
    def __init__(self, path: Path):
        self.path = path
        params = llama_cpp.llama_model_default_params()
        # the CPU only, whatever the process registered: with no list llama.cpp offloads to every registered
        # device, an RPC server of an earlier test (gone since) included
        self._no_devices = (ctypes.c_void_p * 1)(None)
        params.devices = ctypes.cast(self._no_devices, ctypes.c_void_p)
        self.ptr = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.ptr:
            raise RuntimeError(f"cannot load {path}")
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.ptr))

    def __del__(self) -> None:
        if getattr(self, "ptr", None):
            llama_cpp.llama_model_free(self.ptr)


class RawContext:
    """One context; K and V of type `kv`, flash attention on, `n_seq` sequences."""

    def __init__(self, model: RawModel, kv: int, n_ctx: int = 512, n_seq: int = 1, unified: bool = True,
                 lazy: bool = False, recent: int = 0, n_threads: int = 0):
        self.model = model
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = n_ctx
        p.n_ubatch = min(n_ctx, 512)
        p.n_seq_max = n_seq
        p.n_threads = p.n_threads_batch = n_threads or engine_threads()
        p.type_k = p.type_v = kv
        p.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        p.kv_unified = unified
        p.kv_lazy_quant = lazy
        p.kv_lazy_recent = recent
        self.ptr = llama_cpp.llama_init_from_model(model.ptr, p)
        if not self.ptr:
            raise RuntimeError("cannot create context")
        self.mem = llama_cpp.llama_get_memory(self.ptr)
        self.batch = llama_cpp.llama_batch_init(n_ctx, 0, n_seq)

    def __del__(self) -> None:
        if getattr(self, "ptr", None):
            llama_cpp.llama_batch_free(self.batch)
            llama_cpp.llama_free(self.ptr)

    def decode(self, tokens: list[int], seq_id: int = 0, pos0: int | None = None) -> np.ndarray:
        """Decode `tokens` into `seq_id` after its last position; the last token's logits."""
        if pos0 is None:
            pos0 = self.pos_max(seq_id) + 1
        b = self.batch
        b.n_tokens = len(tokens)
        for i, tok in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq_id
            b.logits[i] = i == len(tokens) - 1
        rc = llama_cpp.llama_decode(self.ptr, b)
        if rc != 0:
            raise DecodeError(rc)
        logits = llama_cpp.llama_get_logits_ith(self.ptr, len(tokens) - 1)
        return np.ctypeslib.as_array(logits, shape=(self.model.n_vocab,)).copy()

    def pos_max(self, seq_id: int) -> int:
        return llama_cpp.llama_memory_seq_pos_max(self.mem, seq_id)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None:
        llama_cpp.llama_memory_seq_rm(self.mem, seq_id, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        llama_cpp.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        llama_cpp.llama_memory_seq_keep(self.mem, seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        llama_cpp.llama_memory_seq_add(self.mem, seq_id, p0, p1, delta)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        llama_cpp.llama_memory_seq_div(self.mem, seq_id, p0, p1, d)

    def seq_state(self, seq_id: int, flags: int = 0) -> bytes:
        """The sequence's state; with LLAMA_STATE_SEQ_FLAGS_ON_DEVICE the K/V data stays in the
        context (the bytes hold only the metadata)."""
        size = llama_cpp.llama_state_seq_get_size_ext(self.ptr, seq_id, flags)
        buf = (ctypes.c_uint8 * size)()
        n = llama_cpp.llama_state_seq_get_data_ext(self.ptr, buf, size, seq_id, flags)
        assert n == size
        return bytes(buf)

    def state(self) -> bytes:
        """The whole context's state (see state_blob.parse_context_state)."""
        size = llama_cpp.llama_state_get_size(self.ptr)
        buf = (ctypes.c_uint8 * size)()
        n = llama_cpp.llama_state_get_data(self.ptr, buf, size)
        assert n == size
        return bytes(buf)

    def set_seq_state(self, blob: bytes, seq_id: int, flags: int = 0) -> tuple[bool, str]:
        buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
        with capture_errors() as errors:
            n = llama_cpp.llama_state_seq_set_data_ext(self.ptr, buf, len(blob), seq_id, flags)
        return n == len(blob), "".join(errors)

    def raw_info(self) -> llama_cpp.llama_kv_lazy_info:
        info = llama_cpp.llama_kv_lazy_info(size=ctypes.sizeof(llama_cpp.llama_kv_lazy_info))
        assert llama_cpp.llama_kv_lazy_get_info(self.ptr, ctypes.byref(info)) == 0
        return info

    def lazy_info(self) -> KvLazyInfo:
        return KvLazyInfo.from_native(self.raw_info())

    def convert(self, to: str | None = None) -> int:
        """llama_kv_lazy_convert to the rung `to` (default: the next one; the last when on it)."""
        info = self.lazy_info()
        return llama_cpp.llama_kv_lazy_convert(self.ptr, RUNG_TYPES[to or info.next or info.final or "q8_0"])

    def rot_info(self) -> tuple[int, int]:
        """The K/V rotation sizes of the cells as stored now (the bindings' rule: kv_stored_rotation)."""
        return kv_stored_rotation(self.raw_info())[:2]
