"""What a model is loaded with: one record, taken by every entry point (the window, ``serve``, ``estimate``,
``models``, the self-test) and by the planner, so that each plans and loads the same thing.

Built from the settings (``core.settings.load_spec``) plus an entry point's overrides; its defaults are the
settings' (``core.kinds``). Settled at the boundary: a KV mode is a ``KvMode``, sizes are bytes, the GPU
layers are ``AUTO`` or a count, the RPC servers are normalised ``host:port``. No llama_cpp here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lazykv.core.engine import memory, planner
from lazykv.core.engine.model_meta import ModelMeta
from lazykv.core.engine.planner import AUTO, Device, Estimate, GpuLayers, Offload, Plan
from lazykv.core.engine.remote import normalize_endpoints
from lazykv.core.errors import EngineError
from lazykv.core.kinds import DEFAULT_KV_MODE, DEFAULT_KV_RECENT, DEFAULT_KV_SINKS, DEFAULT_N_CTX, KvMode


class LoadSpecError(EngineError, ValueError):
    """A value no model can be loaded with: the sentence names it."""


@dataclass(frozen=True)
class LoadSpec:
    model: Path
    n_ctx: int = DEFAULT_N_CTX
    kv_mode: KvMode = DEFAULT_KV_MODE
    kv_recent: int = DEFAULT_KV_RECENT  # a lazy mode's recent f16 window, tokens (0: none)
    kv_sinks: int = DEFAULT_KV_SINKS  # and its attention sinks: each sequence's first tokens in f16 (0: none)
    context_budget: int = 0  # bytes of KV cache; > 0: the context is the longest that fits (n_ctx unused)
    gpu_layers: GpuLayers = AUTO  # AUTO: as many as the memory plan fits; or a count (0: none)
    gpu_memory: int = 0  # bytes of each GPU at most (0: its free memory less the headroom)
    rpc_servers: tuple[str, ...] = field(default=())  # llama.cpp RPC servers, host:port
    rpc_layers: int = 0  # layers on the RPC servers (0: all)
    n_threads: int = 0  # 0: one per core
    flash_attn: bool = True

    def __post_init__(self) -> None:
        settle = object.__setattr__  # frozen: the values are settled once, here
        settle(self, "model", Path(self.model))
        try:
            settle(self, "kv_mode", KvMode(self.kv_mode))
        except ValueError:
            known = ", ".join(KvMode)
            raise LoadSpecError(f"unknown KV cache mode {self.kv_mode!r} (known: {known})") from None
        if self.gpu_layers != AUTO and (not isinstance(self.gpu_layers, int) or self.gpu_layers < 0):
            raise LoadSpecError(f"GPU layers: {self.gpu_layers!r} is neither {AUTO} nor a number of layers")
        for name, least in (("n_ctx", 1), ("kv_recent", 0), ("kv_sinks", 0), ("context_budget", 0),
                            ("gpu_memory", 0),
                            ("rpc_layers", 0), ("n_threads", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise LoadSpecError(f"{name} must be a whole number of at least {least}, not {value!r}")
        try:
            settle(self, "rpc_servers", tuple(normalize_endpoints(self.rpc_servers)))
        except ValueError as err:
            raise LoadSpecError(f"RPC servers: {err}") from None

    def with_(self, **changes: Any) -> LoadSpec:
        return replace(self, **changes)

    @property
    def window(self) -> int:
        """The f16 slots per sequence the cache keeps beside its cells, the recent window's and the sinks':
        only a lazy mode has them (a plan records them; the figures per KV mode, ``context`` and
        ``max_ctx_per_mode``, take ``lazy_window`` for the lazy modes among them)."""
        return self.lazy_window if self.kv_mode.is_lazy else 0

    @property
    def lazy_window(self) -> int:
        """The f16 slots a lazy mode would keep with this spec."""
        return self.kv_recent + self.kv_sinks

    def window_words(self, n_ctx: int | None = None) -> str:
        """The tokens a lazy mode keeps in 16-bit, in words ("the last 128 tokens and the first 4"; "" for
        none), at most ``n_ctx`` of each."""
        recent, sinks = ((self.kv_recent, self.kv_sinks) if n_ctx is None
                         else (min(self.kv_recent, n_ctx), min(self.kv_sinks, n_ctx)))
        parts = [f"the last {recent:,} tokens"] if recent else []
        parts += [f"the first {sinks:,}"] if sinks else []
        if len(parts) == 1 and sinks:
            parts[0] += " tokens"
        return " and ".join(parts)

    @property
    def offload(self) -> Offload:
        return Offload.of(self.rpc_servers, self.rpc_layers)

    @property
    def gpu_memory_limit(self) -> int | None:
        """The planner's ``gpu_memory``: None without a limit."""
        return self.gpu_memory or None

    def context(self, meta: ModelMeta) -> memory.ContextPlan:
        """The context this spec gives ``meta``: ``n_ctx``, or the longest the budget holds."""
        return memory.plan_context(meta, self.n_ctx, self.kv_mode, self.context_budget, self.lazy_window)

    def layers(self, meta: ModelMeta, devices: Sequence[Device]) -> GpuLayers:
        """llama.cpp's n_gpu_layers on ``devices``: with RPC servers among them, ``rpc_layers`` (0: every
        layer and the output); else the GPU layers (AUTO: the plan's)."""
        if any(not d.offloads_ops for d in devices):
            return self.rpc_layers or meta.n_layer + 1
        return self.gpu_layers

    def plan(self, meta: ModelMeta, devices: Sequence[Device] = (), available: int | None = None,
             n_ctx: int | None = None) -> Plan:
        """The memory plan of ``meta`` loaded with this spec on ``devices`` (the RPC servers' first)."""
        n_ctx = self.context(meta).n_ctx if n_ctx is None else n_ctx
        return planner.plan(meta, n_ctx, self.kv_mode, devices, self.layers(meta, devices),
                            self.gpu_memory_limit, available, self.window)

    def estimate(self, meta: ModelMeta, gpus: Sequence[Device] = (),
                 available: int | None = None) -> Estimate:
        """``plan``'s host-and-remote summary, as the settings and the memory panel show it."""
        return planner.estimate(meta, self.context(meta).n_ctx, self.kv_mode, available, self.offload, gpus,
                                self.gpu_layers, self.gpu_memory_limit, self.window)

    def max_ctx_per_mode(self, meta: ModelMeta, devices: Sequence[Device] = (),
                         available: int | None = None) -> dict[KvMode, int]:
        return planner.max_ctx_per_mode(meta, devices, self.layers(meta, devices), self.gpu_memory_limit,
                                        available, self.lazy_window)

    def describe(self) -> dict[str, Any]:
        """The spec as JSON values (an export's, a log's)."""
        return {"model": str(self.model), "n_ctx": self.n_ctx, "kv_mode": str(self.kv_mode),
                "kv_recent": self.kv_recent, "kv_sinks": self.kv_sinks, "context_budget": self.context_budget,
                "gpu_layers": self.gpu_layers, "gpu_memory": self.gpu_memory,
                "rpc_servers": list(self.rpc_servers), "rpc_layers": self.rpc_layers,
                "n_threads": self.n_threads, "flash_attn": self.flash_attn}

