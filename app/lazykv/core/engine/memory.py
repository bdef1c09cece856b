"""Memory accounting: the process's RSS, the RAM available, and what a model × context × KV mode needs."""

from __future__ import annotations

import enum
import math
import os
import resource
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lazykv.core.engine.model_meta import CTX_PADDING, ModelMeta, padded_ctx
from lazykv.core.kinds import KvMode, KvPhase

MiB = 1024 * 1024
N_UBATCH = 512  # llama-cpp-python's default micro-batch
BASE_OVERHEAD = 40 * MiB  # engine, Python and Qt on top of weights, KV cache and compute buffers
GREEN_BELOW = 0.6  # share of the available RAM
YELLOW_BELOW = 0.9
MAX_BYTES = 1 << 60  # no figure goes above this (1 EiB): more than any machine has
MAX_CTX = 131072  # the longest context the settings offer
# bytes per K or V value of each storage type (numerator, denominator): a block of 32 values is 32
# 8-bit (q8_0), 16 4-bit (q4_0) or 16 4-bit + 4 bytes of high bits (q5_0), plus its f16 scale
BYTES_PER_VALUE: dict[str, tuple[int, int]] = {"f16": (2, 1), "q8_0": (34, 32), "q4_0": (18, 32),
                                               "q5_0": (22, 32)}
LAZY_STEPS = {KvMode.LAZY: (KvPhase.F16, KvPhase.Q8_0),  # a lazy cache's steps, in order
              KvMode.LADDER: (KvPhase.F16, KvPhase.Q8_0, KvPhase.Q4_0)}


class Fit(enum.Enum):
    GREEN = "green"  # fits comfortably
    YELLOW = "yellow"  # fits, little room left for other programs
    RED = "red"  # likely to swap or fail


HOST_CPU = "host memory (CPU)"


@dataclass(frozen=True)
class Offload:
    """Layers placed on remote backends (llama.cpp RPC servers) when the model loads."""

    endpoints: tuple[str, ...] = ()
    n_layers: int = 0  # 0: all of them

    @classmethod
    def of(cls, endpoints: Sequence[str], n_layers: int) -> Offload:
        return cls(tuple(endpoints), n_layers)

    def layers(self, n_layer: int) -> int:
        """How many of a model's ``n_layer`` layers go to the remote backends."""
        if not self.endpoints:
            return 0
        return n_layer if self.n_layers <= 0 else min(self.n_layers, n_layer)

    @property
    def place(self) -> str:
        return f"device memory (remote: {', '.join(self.endpoints)})"


@dataclass(frozen=True)
class Estimate:
    weights: int
    kv_cache: int
    compute: int
    total: int
    available: int
    fit: Fit  # of the host part against the RAM available
    device_weights: int = 0  # of weights and kv_cache, the part on the remote backends
    device_kv: int = 0
    device: str = ""  # where that part is ("": everything is in host memory)

    @property
    def host(self) -> int:
        return self.total - self.device_weights - self.device_kv

    def summary(self) -> str:
        host = (
            f"needs about {fmt_bytes(self.host)} of {HOST_CPU} (weights "
            f"{fmt_bytes(self.weights - self.device_weights)}, KV cache "
            f"{fmt_bytes(self.kv_cache - self.device_kv)}, buffers {fmt_bytes(self.compute)}) of "
            f"{fmt_bytes(self.available)} available"
        )
        if not self.device:
            return host
        return (f"{host}, and {fmt_bytes(self.device_weights + self.device_kv)} of {self.device} (weights "
                f"{fmt_bytes(self.device_weights)}, KV cache {fmt_bytes(self.device_kv)})")


def estimate(
    meta: ModelMeta, n_ctx: int, kv_mode: str, available: int | None = None, offload: Offload = Offload()
) -> Estimate:
    """An estimate of the memory loading ``meta`` with this context and KV mode takes.

    The KV cache is exact (as the engine allocates it: n_ctx padded to 256 cells, a lazy
    cache as q8_0, the ladder as q4_0); the compute buffers are an approximation for the CPU backend: the
    attention and feed-forward activations of one micro-batch plus the output logits.
    Layers offloaded to remote backends take their share of the weights (about: the token
    embeddings stay in host memory) and of the KV cache (exactly: each layer's cells live
    with the layer) to the device; the fit is of what stays in host memory.
    Whole-number arithmetic, each figure capped at ``MAX_BYTES``: it runs on the GUI thread
    and must not raise whatever a file declares.
    """
    kv = kv_bytes(meta, padded_ctx(_whole(n_ctx)), kv_mode)
    activations = 4 * N_UBATCH * (4 * _whole(meta.n_embd) + _whole(meta.n_head) * 64)
    compute = _capped(activations + 4 * _whole(meta.n_vocab) * 2 + BASE_OVERHEAD)
    weights = _whole(meta.file_size)
    total = _capped(weights + kv + compute)
    n_layer = _whole(meta.n_layer)
    on_device = offload.layers(n_layer)
    device_weights = weights * on_device // n_layer if n_layer else 0
    device_kv = kv * on_device // n_layer if n_layer else 0
    available = available_ram() if available is None else available
    host = total - device_weights - device_kv
    share = host / available if available > 0 else float("inf")
    fit = Fit.GREEN if share < GREEN_BELOW else Fit.YELLOW if share < YELLOW_BELOW else Fit.RED
    device = offload.place if on_device else ""
    return Estimate(weights, kv, compute, total, available, fit, device_weights, device_kv, device)


def kv_bytes(meta: ModelMeta, n_cells: int, kv_mode: str) -> int:
    """Bytes of K and V over all layers for ``n_cells`` cells, stored as ``kv_mode`` allocates them."""
    numerator, denominator = BYTES_PER_VALUE[KvMode(kv_mode).storage]
    return _capped(_whole(n_cells) * _values_per_cell(meta) * numerator // denominator)


def context_for_budget(meta: ModelMeta, budget: int, kv_mode: str) -> int:
    """The context length (tokens) whose KV cache fits in ``budget`` bytes in ``kv_mode``: rounded down
    to the engine's 256-cell padding, at most the model's training context (else MAX_CTX); 0 when not
    even 256 tokens fit (or the model has no KV cache)."""
    numerator, denominator = BYTES_PER_VALUE[KvMode(kv_mode).storage]
    per_cell = _values_per_cell(meta) * numerator
    if per_cell <= 0:
        return 0
    cells = _whole(budget) * denominator // per_cell // CTX_PADDING * CTX_PADDING
    return min(cells, ctx_limit(meta))


def ctx_limit(meta: ModelMeta) -> int:
    """The longest context offered for this model: its training context (else MAX_CTX), down to 256s."""
    limit = min(_whole(meta.n_ctx_train) or MAX_CTX, MAX_CTX)
    return max(CTX_PADDING, limit // CTX_PADDING * CTX_PADDING)


@dataclass(frozen=True)
class ContextPlan:
    """The context a load will use, and how many tokens each KV mode holds in the same KV memory."""

    kv_mode: KvMode  # the one chosen
    n_ctx: int  # tokens (0: the budget holds fewer than the smallest context)
    kv_budget: int  # bytes of KV memory: the budget chosen, else what n_ctx takes in the KV mode chosen
    per_mode: dict[KvMode, int]  # tokens each mode holds in kv_budget (context_for_budget)
    limit: int  # ctx_limit: no mode is given more
    steps: tuple[tuple[KvPhase, int], ...] = ()  # the chosen lazy mode's steps and their tokens (step_cells)

    def at_limit(self, kv_mode: str) -> bool:
        """The mode holds the longest context offered (it might hold more: the model's limit caps it)."""
        return self.per_mode[KvMode(kv_mode)] >= self.limit


def plan_context(meta: ModelMeta, n_ctx: int, kv_mode: str, budget: int = 0) -> ContextPlan:
    """``budget`` > 0 (bytes): the context is the longest that fits it; else ``n_ctx`` as it is."""
    kv_budget = budget if budget > 0 else kv_bytes(meta, padded_ctx(_whole(n_ctx)), kv_mode)
    per_mode = {mode: context_for_budget(meta, kv_budget, mode) for mode in KvMode}
    chosen = per_mode[KvMode(kv_mode)] if budget > 0 else n_ctx
    steps = step_cells(padded_ctx(chosen), kv_mode) if chosen > 0 else ()
    return ContextPlan(KvMode(kv_mode), chosen, kv_budget, per_mode, ctx_limit(meta), steps)


def step_cells(n_cells: int, kv_mode: str) -> tuple[tuple[KvPhase, int], ...]:
    """A lazy cache of ``n_cells`` cells (padded): each step and the tokens it holds, as the engine lays
    them out (native patch 0024, ``lazy_attach``): a step holds as many cells as its rows fit in the
    cache's memory, rounded down to the 256-cell padding from 256 on; the last step holds them all.
    () for a plain cache. The memory panel shows the same figures as the engine reports them."""
    steps = LAZY_STEPS.get(KvMode(kv_mode), ())
    if not steps:
        return ()
    final_num, final_den = BYTES_PER_VALUE[KvMode(kv_mode).storage]
    out = []
    for phase in steps[:-1]:
        num, den = BYTES_PER_VALUE[phase.value]
        n = _whole(n_cells) * final_num * den // (final_den * num)
        out.append((phase, n - n % CTX_PADDING if n >= CTX_PADDING else n))
    return (*out, (steps[-1], _whole(n_cells)))


def _values_per_cell(meta: ModelMeta) -> int:
    """K and V values one cell (token position) holds over all layers."""
    return _whole(meta.n_layer) * _whole(meta.n_head_kv) * (_whole(meta.head_k) + _whole(meta.head_v))


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
        key = (use.host, use.device)
        sums = totals.setdefault(key, [0, 0, 0])
        described.setdefault(key, "" if use.host else use.description)
        for i, n in enumerate((use.weights, use.kv, use.compute)):
            sums[i] += n
    places = [DeviceMemory(device, host, *sums, described[host, device])
              for (host, device), sums in totals.items()]
    return tuple(sorted(places, key=lambda p: p.host))


def placed(parts: Iterable[tuple[str, int]]) -> str:
    """``12.0 MiB in device memory (RPC0[…]), 1.0 MiB in host memory (CPU)``: the non-zero parts."""
    return ", ".join(f"{fmt_bytes(n)} in {place}" for place, n in parts if n > 0)


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
