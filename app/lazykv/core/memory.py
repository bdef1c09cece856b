"""Memory accounting: the process's RSS, the RAM available, and what a model × context × KV mode needs."""

from __future__ import annotations

import enum
import math
import os
import resource
import sys
from dataclasses import dataclass
from pathlib import Path

from lazykv.core.model_meta import Q8_0_BLOCK, ModelMeta, padded_ctx

MiB = 1024 * 1024
N_UBATCH = 512  # llama-cpp-python's default micro-batch
BASE_OVERHEAD = 40 * MiB  # engine, Python and Qt on top of weights, KV cache and compute buffers
GREEN_BELOW = 0.6  # share of the available RAM
YELLOW_BELOW = 0.9
MAX_BYTES = 1 << 60  # no figure goes above this (1 EiB): more than any machine has


class Fit(enum.Enum):
    GREEN = "green"  # fits comfortably
    YELLOW = "yellow"  # fits, little room left for other programs
    RED = "red"  # likely to swap or fail


@dataclass(frozen=True)
class Estimate:
    weights: int
    kv_cache: int
    compute: int
    total: int
    available: int
    fit: Fit

    def summary(self) -> str:
        return (
            f"needs about {fmt_bytes(self.total)} (weights {fmt_bytes(self.weights)}, KV cache "
            f"{fmt_bytes(self.kv_cache)}, buffers {fmt_bytes(self.compute)}) of "
            f"{fmt_bytes(self.available)} available"
        )


def estimate(meta: ModelMeta, n_ctx: int, kv_mode: str, available: int | None = None) -> Estimate:
    """An estimate of the memory loading ``meta`` with this context and KV mode takes.

    The KV cache is exact (as the engine allocates it: n_ctx padded to 256 cells, a lazy
    cache as q8_0); the compute buffers are an approximation for the CPU backend: the
    attention and feed-forward activations of one micro-batch plus the output logits.
    Whole-number arithmetic, each figure capped at ``MAX_BYTES``: it runs on the GUI thread
    and must not raise whatever a file declares.
    """
    per_cell = _whole(meta.n_layer) * _whole(meta.n_head_kv) * (_whole(meta.head_k) + _whole(meta.head_v))
    elements = padded_ctx(_whole(n_ctx)) * per_cell  # K and V elements over all layers
    kv = _capped(elements * 2 if kv_mode == "f16" else elements * (2 + Q8_0_BLOCK) // Q8_0_BLOCK)
    activations = 4 * N_UBATCH * (4 * _whole(meta.n_embd) + _whole(meta.n_head) * 64)
    compute = _capped(activations + 4 * _whole(meta.n_vocab) * 2 + BASE_OVERHEAD)
    total = _capped(_whole(meta.file_size) + kv + compute)
    available = available_ram() if available is None else available
    share = total / available if available > 0 else float("inf")
    fit = Fit.GREEN if share < GREEN_BELOW else Fit.YELLOW if share < YELLOW_BELOW else Fit.RED
    return Estimate(_whole(meta.file_size), kv, compute, total, available, fit)


def _whole(x: float) -> int:
    """``x`` as a whole number of at most MAX_BYTES (NaN and negative values count as 0)."""
    if isinstance(x, float):
        if math.isnan(x) or x <= 0:
            return 0
        return MAX_BYTES if x >= MAX_BYTES else int(x)
    return _capped(max(0, x))


def _capped(n: int) -> int:
    return min(n, MAX_BYTES)


def available_ram() -> int:
    """Bytes of RAM available to new allocations without swapping (MemAvailable on Linux)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def process_rss() -> int:
    """Resident set size of this process now (Linux), else its peak as the OS reports it."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
