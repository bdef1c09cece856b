"""The CPU backend's fast Walsh-Hadamard transform, which rotates Q, K and V of a quantized KV cache.

Patch 0004 does its short butterflies (lengths 1, 2 and 4) inside AVX2 registers instead of scalar passes.
The sums and differences are the same, in the same order, so the result must be bit-identical to a
float32 transform done stage by stage (scale first, as the op does); and it must agree with the dense
product by the Hadamard matrix (the reference path).
"""

from __future__ import annotations

import numpy as np
import pytest

from .ggml_fa import hadamard_rotate, sylvester_hadamard


def staged_fwht(x: np.ndarray) -> np.ndarray:
    """Scale by 1/sqrt(n), then butterflies of length 1, 2, 4, ..., n/2, all in float32."""
    rows, n = x.shape
    y = x.astype(np.float32) * (np.float32(1) / np.sqrt(np.float32(n)))
    length = 1
    while length < n:
        pairs = y.reshape(rows, n // (2 * length), 2, length)
        u, v = pairs[:, :, 0, :], pairs[:, :, 1, :]
        y = np.stack([u + v, u - v], axis=2).reshape(rows, n)
        length *= 2
    return y


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("src_type", ["f32", "f16"])
@pytest.mark.parametrize("n", [4, 8, 16, 32, 64, 128, 256])
def test_fwht_is_bit_identical_to_the_staged_transform(n: int, src_type: str, n_threads: int) -> None:
    rng = np.random.default_rng(n)
    x = rng.normal(0, 3, (37, n)).astype(np.float32)  # an odd row count: threads split it unevenly
    if src_type == "f16":
        x = x.astype(np.float16).astype(np.float32)  # what the op reads
    got = hadamard_rotate(x, src_type, n_threads, use_ref=False)
    np.testing.assert_array_equal(got, staged_fwht(x))


@pytest.mark.parametrize("n", [64, 128, 256])
def test_fwht_matches_the_dense_hadamard_product(n: int) -> None:
    x = np.random.default_rng(1).uniform(-1, 1, (64, n)).astype(np.float32)
    fast = hadamard_rotate(x, "f32", 2, use_ref=False)
    dense = hadamard_rotate(x, "f32", 2, use_ref=True)
    np.testing.assert_allclose(fast, dense, rtol=0, atol=1e-5)
    exact = x.astype(np.float64) @ sylvester_hadamard(n).astype(np.float64).T
    np.testing.assert_allclose(fast, exact, atol=1e-5)
    # H is orthogonal: rotating twice gives the input back
    np.testing.assert_allclose(hadamard_rotate(fast, "f32", 1, use_ref=False), x, atol=1e-5)
