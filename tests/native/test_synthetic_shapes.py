"""Rotation-checked restore on shapes the real models do not cover: a head dim of
128 (K rotated in blocks of 128) and several sequences in one unified cache."""

from __future__ import annotations

import os

import llama_cpp
import numpy as np
import pytest

from .helpers import random_tokens, synthetic_model
from .rawctx import RawContext, RawModel

Q8 = llama_cpp.GGML_TYPE_Q8_0
F16 = llama_cpp.GGML_TYPE_F16


@pytest.fixture(scope="module")
def hd128(tmp_path_factory: pytest.TempPathFactory) -> RawModel:
    return synthetic_model(tmp_path_factory, 128)


def _ctx(model: RawModel, kv: int = Q8, rot_off: bool = False, n_seq: int = 2) -> RawContext:
    old = os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
    try:
        if rot_off:
            os.environ["LLAMA_ATTN_ROT_DISABLE"] = "1"
        return RawContext(model, kv, n_ctx=256, n_seq=n_seq)
    finally:
        os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
        if old is not None:
            os.environ["LLAMA_ATTN_ROT_DISABLE"] = old


def test_head_dim_128_rotates_k_in_blocks_of_128(hd128: RawModel) -> None:
    assert _ctx(hd128).rot_info() == (128, 64)
    assert _ctx(hd128, rot_off=True).rot_info() == (0, 0)
    assert _ctx(hd128, kv=F16).rot_info() == (0, 0)


def test_sequence_restored_into_another_sequence_continues_exactly(hd128: RawModel) -> None:
    a, b = random_tokens(1, 40), random_tokens(2, 30)
    src = _ctx(hd128)
    src.decode(a, seq_id=0)
    src.decode(b[:-1], seq_id=1)
    blob = src.seq_state(1)
    expected = src.decode(b[-1:], seq_id=1)

    dst = _ctx(hd128)
    dst.decode(random_tokens(3, 25), seq_id=0)  # another conversation already in the cache
    ok, errors = dst.set_seq_state(blob, seq_id=1)
    assert ok, errors
    assert dst.pos_max(1) == len(b) - 2
    np.testing.assert_array_equal(dst.decode(b[-1:], seq_id=1), expected)


def test_sequence_mismatch_refused_and_other_sequences_untouched(hd128: RawModel) -> None:
    src = _ctx(hd128)
    src.decode(random_tokens(4, 20), seq_id=0)
    blob = src.seq_state(0)

    dst = _ctx(hd128, rot_off=True)
    keep = random_tokens(5, 16)
    dst.decode(keep[:-1], seq_id=0)
    dst.decode(random_tokens(6, 12), seq_id=1)
    ok, errors = dst.set_seq_state(blob, seq_id=1)
    assert not ok
    assert "saved with rotation sizes K = 128, V = 64 but this cache uses K = 0, V = 0" in errors
    assert dst.pos_max(1) == -1  # the destination sequence is empty ...
    assert dst.pos_max(0) == len(keep) - 2  # ... and the other one intact

    reference = _ctx(hd128, rot_off=True)
    reference.decode(keep[:-1], seq_id=0)
    np.testing.assert_array_equal(dst.decode(keep[-1:], seq_id=0), reference.decode(keep[-1:], seq_id=0))
