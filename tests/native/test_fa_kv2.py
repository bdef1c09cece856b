"""FLASH_ATTN_EXT with a second, F16 K/V range (ggml_flash_attn_ext_add_kv), the recent window's attention:
the output equals softmax attention over the two ranges concatenated, on every CPU path (vec-only
reference, one chunk per query row, tiled, split-KV) and for every body type the lazy ladder uses."""

from __future__ import annotations

import pytest

from .ggml_fa import FLASH_ATTN_EXT_MAX_NMSE, FaCase, flash_attn, nmse

# (n_kv, n_q): one query row over a long cache takes the split-KV path (>= 512 rows in all), a few rows the
# one-chunk path, 64 rows the tiled one
SHAPES = [(640, 1), (96, 3), (192, 64)]


@pytest.mark.parametrize("type_k,type_v",
                         [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q5_0", "q8_0")])
@pytest.mark.parametrize("n_kv,n_q", SHAPES)
@pytest.mark.parametrize("n_kv2", [32, 128])
@pytest.mark.parametrize("use_ref", [False, True])
def test_second_range_is_attended_as_a_concatenation(type_k, type_v, n_kv, n_q, n_kv2, use_ref):
    case = FaCase(head=64, gqa=2, n_kv=n_kv, n_q=n_q, mask=True, type_k=type_k, type_v=type_v, n_kv2=n_kv2)
    out, ref = flash_attn(case, n_threads=2, use_ref=use_ref, oracle=True)
    assert nmse(ref, out) < FLASH_ATTN_EXT_MAX_NMSE


def test_second_range_carries_weight():
    """The oracle is not blind to the second range: dropping it (all of its columns masked) changes the
    output well beyond the tolerance."""
    case = FaCase(head=64, gqa=1, n_kv=96, n_q=3, mask=True, type_k="q4_0", type_v="q4_0", n_kv2=128)
    out, ref = flash_attn(case, n_threads=1, use_ref=False, oracle=True)
    short = FaCase(head=64, gqa=1, n_kv=96, n_q=3, mask=True, type_k="q4_0", type_v="q4_0")
    body_only = flash_attn(short, n_threads=1, use_ref=False)
    assert nmse(ref, out) < FLASH_ATTN_EXT_MAX_NMSE
    assert nmse(ref, body_only) > 100 * FLASH_ATTN_EXT_MAX_NMSE


@pytest.mark.parametrize("n_kv,n_q", SHAPES)
def test_threads_agree(n_kv, n_q):
    case = FaCase(head=64, gqa=2, n_kv=n_kv, n_q=n_q, mask=True, type_k="q8_0", type_v="q4_0", n_kv2=64,
                  seed=3)
    one = flash_attn(case, n_threads=1, use_ref=False)
    two = flash_attn(case, n_threads=2, use_ref=False)
    assert nmse(one, two) < 1e-10
