"""Memory accounting: the process's RSS, the RAM available, byte sizes, the KV cache's bytes per cell and
per rung, the context a memory budget holds, and the engine's memory summed per place. The plan of a
model on host and devices is ``planner``."""

from __future__ import annotations

import enum
import math
import os
import resource
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from lazykv.core.engine.model_meta import CTX_PADDING, ModelMeta, padded_ctx
from lazykv.core.kinds import KvMode, KvPhase, StorageType

KiB = 1024
MiB = 1024 * 1024
GiB = 1024 * MiB
N_UBATCH = 512  # llama-cpp-python's default micro-batch
BASE_OVERHEAD = 40 * MiB  # engine, Python and Qt on top of weights, KV cache and compute buffers
GREEN_BELOW = 0.6  # share of the available RAM
YELLOW_BELOW = 0.9
MAX_BYTES = 1 << 60  # no figure goes above this (1 EiB): more than any machine has
MAX_CTX = 131072  # the longest context the settings offer
# bytes per K or V value of each storage type (numerator, denominator): a block of 32 values is 32
# 8-bit (q8_0), 16 4-bit (q4_0) or 16 4-bit + 4 bytes of high bits (q5_0), plus its f16 scale
BYTES_PER_VALUE: dict[str, tuple[int, int]] = {
    StorageType.F16: (2, 1), StorageType.Q8_0: (34, 32), StorageType.Q4_0: (18, 32),
    StorageType.Q5_0: (22, 32),
}
LAZY_RUNGS = {KvMode.LAZY: (KvPhase.F16, KvPhase.Q8_0),  # a lazy cache's rungs, in order
              KvMode.LADDER: (KvPhase.F16, KvPhase.Q8_0, KvPhase.Q4_0)}


class Fit(enum.Enum):
    GREEN = "green"  # fits comfortably
    YELLOW = "yellow"  # fits, little room left for other programs
    RED = "red"  # likely to swap or fail


def swa_cells(meta: ModelMeta, n_cells: int) -> int:
    """The cells of a sliding-window layer's cache beside a context of ``n_cells``: the window and a
    micro-batch, padded, at most the context (llama.cpp's iSWA cache without swa_full)."""
    window = whole(meta.sliding_window) + N_UBATCH
    return min(whole(n_cells), -(-window // CTX_PADDING) * CTX_PADDING)


def layer_cells(meta: ModelMeta, n_cells: int) -> int:
    """Cells over all layers: the global layers hold ``n_cells``, the sliding-window ones their window."""
    n_swa = min(whole(meta.swa_layers), whole(meta.n_layer))
    return (whole(meta.n_layer) - n_swa) * whole(n_cells) + n_swa * swa_cells(meta, n_cells)


def kv_bytes(meta: ModelMeta, n_cells: int, kv_mode: str, recent: int = 0) -> int:
    """Bytes of K and V over all layers for ``n_cells`` cells, stored as ``kv_mode`` allocates them (a
    sliding-window layer holds only its window: layer_cells), with a lazy cache's recent window of
    ``recent`` tokens (window_bytes)."""
    numerator, denominator = BYTES_PER_VALUE[KvMode(kv_mode).storage]
    cells = capped(layer_cells(meta, n_cells) * _layer_values(meta) * numerator // denominator)
    return capped(cells + window_bytes(meta, n_cells, kv_mode, recent))


def layer_kv_bytes(meta: ModelMeta, n_cells: int, kv_mode: str, recent: int = 0) -> list[int]:
    """kv_bytes per repeating layer, as llama.cpp allocates them: a sliding-window layer's cells are its
    window's (swa_cells), the others' ``n_cells``; the recent window's rows alike on every layer. They sum
    to kv_bytes (what rounding leaves goes to the last layer), so a plan that puts some layers on a device
    splits the cache where the engine does."""
    n_layer = whole(meta.n_layer)
    if n_layer <= 0:
        return []
    full, windowed = whole(n_cells), swa_cells(meta, n_cells)
    cells = [windowed if swa else full for swa in meta.swa_flags()]
    rows, window = kv_bytes(meta, n_cells, kv_mode), window_bytes(meta, n_cells, kv_mode, recent)
    total_cells = sum(cells)
    out = [(rows * c // total_cells if total_cells else 0) + window // n_layer for c in cells]
    out[-1] += rows + window - sum(out)
    return out


def window_bytes(meta: ModelMeta, n_cells: int, kv_mode: str, recent: int) -> int:
    """The recent window's f16 K/V rows beside a lazy cache of ``n_cells`` cells (kv_lazy_recent, native
    patch 0024): ``recent`` tokens' worth (at most the cells), one sequence, and the row that takes a
    batch's tokens the window does not keep; 0 for a plain cache."""
    if not KvMode(kv_mode).is_lazy or recent <= 0:
        return 0
    numerator, denominator = BYTES_PER_VALUE[StorageType.F16]
    rows = min(whole(recent), whole(n_cells)) + 1
    return capped(rows * _values_per_cell(meta) * numerator // denominator)


def context_for_budget(meta: ModelMeta, budget: int, kv_mode: str, recent: int = 0) -> int:
    """The context length (tokens) whose KV cache fits in ``budget`` bytes in ``kv_mode`` (with its recent
    window of ``recent`` tokens, a lazy cache): rounded down to the engine's 256-cell padding, at most
    the model's training context (else MAX_CTX); 0 when not even 256 tokens fit (or the model has no KV
    cache)."""
    numerator, denominator = BYTES_PER_VALUE[KvMode(kv_mode).storage]
    per_cell = _values_per_cell(meta) * numerator
    if per_cell <= 0:
        return 0
    budget = whole(budget) - window_bytes(meta, MAX_CTX, kv_mode, recent)
    cells = max(0, budget) * denominator // per_cell // CTX_PADDING * CTX_PADDING
    n_swa, n_layer = min(whole(meta.swa_layers), whole(meta.n_layer)), whole(meta.n_layer)
    if n_swa and cells >= swa_cells(meta, MAX_CTX):  # past the window only the global layers grow
        held = swa_cells(meta, MAX_CTX)
        fixed = n_swa * held * _layer_values(meta) * numerator // denominator
        per_global = (n_layer - n_swa) * _layer_values(meta) * numerator
        cells = (max(0, budget - fixed) * denominator // per_global if per_global else MAX_CTX)
        cells = max(held, cells) // CTX_PADDING * CTX_PADDING
    return min(cells, ctx_limit(meta))


def ctx_limit(meta: ModelMeta) -> int:
    """The longest context offered for this model: its training context (else MAX_CTX), down to 256s."""
    limit = min(whole(meta.n_ctx_train) or MAX_CTX, MAX_CTX)
    return max(CTX_PADDING, limit // CTX_PADDING * CTX_PADDING)


@dataclass(frozen=True)
class ContextPlan:
    """The context a load will use, and how many tokens each KV mode holds in the same KV memory."""

    kv_mode: KvMode  # the one chosen
    n_ctx: int  # tokens (0: the budget holds fewer than the smallest context)
    kv_budget: int  # bytes of KV memory: the budget chosen, else what n_ctx takes in the KV mode chosen
    per_mode: dict[KvMode, int]  # tokens each mode holds in kv_budget (context_for_budget)
    limit: int  # ctx_limit: no mode is given more
    rungs: tuple[tuple[KvPhase, int], ...] = ()  # the chosen lazy mode's rungs and their tokens (rung_cells)
    per_gib: dict[KvMode, int] = field(default_factory=dict)  # tokens per GiB of each mode at this context

    def at_limit(self, kv_mode: str) -> bool:
        """The mode holds the longest context offered (it might hold more: the model's limit caps it)."""
        return self.per_mode[KvMode(kv_mode)] >= self.limit

    def figures(self, kv_mode: str | None = None) -> str:
        """``lazy q8_0 (f16 until half full): 82,815 tokens per GiB · exact until …``: a mode (the one
        chosen) in figures and words, as Settings, the memory panel, estimate and the Models page say it."""
        mode = KvMode(kv_mode or self.kv_mode)
        return f"{mode.choice}: {self.per_gib[mode]:,} tokens per GiB · {mode.quality}"


def plan_context(meta: ModelMeta, n_ctx: int, kv_mode: str, budget: int = 0, recent: int = 0) -> ContextPlan:
    """``budget`` > 0 (bytes): the context is the longest that fits it; else ``n_ctx`` as it is. The lazy
    modes keep a recent window of ``recent`` tokens in the same memory."""
    kv_budget = budget if budget > 0 else kv_bytes(meta, padded_ctx(whole(n_ctx)), kv_mode, recent)
    per_mode = {mode: context_for_budget(meta, kv_budget, mode, recent) for mode in KvMode}
    chosen = per_mode[KvMode(kv_mode)] if budget > 0 else n_ctx
    rungs = rung_cells(padded_ctx(chosen), kv_mode) if chosen > 0 else ()
    at = padded_ctx(chosen) if chosen > 0 else CTX_PADDING
    per_gib = {mode: tokens_per_gib(meta, at, mode, recent) for mode in KvMode}
    return ContextPlan(KvMode(kv_mode), chosen, kv_budget, per_mode, ctx_limit(meta), rungs, per_gib)


def tokens_per_gib(meta: ModelMeta, n_cells: int, kv_mode: str, recent: int = 0) -> int:
    """The tokens a GiB of KV memory holds in ``kv_mode`` at a context of ``n_cells`` (padded): what
    kv_bytes allocates, the recent window and the sliding-window layers' cells counted; 0 without a cache."""
    n = padded_ctx(whole(n_cells))
    total = kv_bytes(meta, n, kv_mode, recent)
    return round(n * GiB / total) if total else 0


def rung_cells(n_cells: int, kv_mode: str) -> tuple[tuple[KvPhase, int], ...]:
    """A lazy cache of ``n_cells`` cells (padded): each rung and the tokens it holds, as the engine lays
    them out (native patch 0015, ``lazy_attach``): a rung holds as many cells as its rows fit in the
    cache's memory, rounded down to the 256-cell padding from 256 on; the last rung holds them all.
    () for a plain cache. The memory panel shows the same figures as the engine reports them."""
    rungs = LAZY_RUNGS.get(KvMode(kv_mode), ())
    if not rungs:
        return ()
    final_num, final_den = BYTES_PER_VALUE[KvMode(kv_mode).storage]
    out = []
    for phase in rungs[:-1]:
        num, den = BYTES_PER_VALUE[phase.value]
        n = whole(n_cells) * final_num * den // (final_den * num)
        out.append((phase, n - n % CTX_PADDING if n >= CTX_PADDING else n))
    return (*out, (rungs[-1], whole(n_cells)))


def _values_per_cell(meta: ModelMeta) -> int:
    """K and V values one cell (token position) holds over all layers."""
    return whole(meta.n_layer) * _layer_values(meta)


def _layer_values(meta: ModelMeta) -> int:
    """K and V values one cell holds in one layer."""
    return whole(meta.n_head_kv) * (whole(meta.head_k) + whole(meta.head_v))


class MemoryUseLike(Protocol):
    """One buffer type in use, as ``llama_cpp.Llama.memory_breakdown()`` reports it."""

    device: str
    description: str
    host: bool
    weights: int
    kv: int
    compute: int


@dataclass(frozen=True)
class DeviceMemory:
    """Bytes a loaded model uses in one place: host memory, or one device's own memory."""

    device: str  # "CPU", "RPC0", "CUDA0"
    host: bool  # True: host RAM (also a device's pinned host buffers)
    weights: int
    kv: int
    compute: int
    description: str = ""  # of a device: which one ("192.168.1.20:50052" for an RPC server, the GPU's name)

    @property
    def place(self) -> str:
        if self.host:
            return f"host memory ({self.device})"
        detail = f", {self.description}" if self.description and self.description != self.device else ""
        return f"device memory ({self.device}{detail})"


def split_by_device(uses: Iterable[MemoryUseLike]) -> tuple[DeviceMemory, ...]:
    """The engine's buffers summed per place, device memory first, then host memory (each in engine order).

    A device's place keeps its description (an RPC server's address); host memory's are buffer kinds."""
    totals: dict[tuple[bool, str], list[int]] = {}
    described: dict[tuple[bool, str], str] = {}
    for use in uses:
        # the CPU's own extra buffer types (CPU_REPACK: repacked weights) are not "host" buffers to ggml, but
        # they are host memory
        key = (use.host or use.device == "CPU", use.device)
        sums = totals.setdefault(key, [0, 0, 0])
        described.setdefault(key, "" if key[0] else use.description)
        for i, n in enumerate((use.weights, use.kv, use.compute)):
            sums[i] += n
    places = [DeviceMemory(device, host, *sums, described[host, device])
              for (host, device), sums in totals.items()]
    return tuple(sorted(places, key=lambda p: p.host))


def placed(parts: Iterable[tuple[str, int]]) -> str:
    """``12.0 MiB in device memory (RPC0[…]), 1.0 MiB in host memory (CPU)``: the non-zero parts."""
    return ", ".join(f"{fmt_bytes(n)} in {place}" for place, n in parts if n > 0)


def whole(x: float) -> int:
    """``x`` as a whole number of at most MAX_BYTES (NaN and negative values count as 0)."""
    if isinstance(x, float):
        if math.isnan(x) or x <= 0:
            return 0
        return MAX_BYTES if x >= MAX_BYTES else int(x)
    return capped(max(0, x))


def capped(n: int) -> int:
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
