"""What fits this machine: a model at a context in a KV mode, and the longest context in each KV mode.

No planner of its own: every figure is the engine's memory plan of a ``LoadSpec`` (the app's settings:
context, KV mode, recent window, GPU layers and memory limit), the one ``python -m lazykv estimate``
shows, with this machine's GPUs (``devices``: none on a CPU build).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lazykv.core.engine import memory, planner
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.memory import Fit
from lazykv.core.engine.model_meta import ModelMeta
from lazykv.core.engine.planner import Device
from lazykv.core.kinds import KvMode

WORDS = {Fit.GREEN: "fits", Fit.YELLOW: "tight", Fit.RED: "does not fit"}
ORDER = {Fit.GREEN: 0, Fit.YELLOW: 1, Fit.RED: 2}  # for sorting by fit


@dataclass(frozen=True)
class FitReport:
    plan: planner.Plan  # of the context and KV mode asked
    max_ctx: dict[KvMode, int]  # the longest context whose plan is not "does not fit", per KV mode (0: none)
    context: memory.ContextPlan  # the context asked: each mode's tokens per GiB and quality (figures)

    @property
    def n_ctx(self) -> int:
        return self.plan.n_ctx

    @property
    def kv_mode(self) -> KvMode:
        return self.plan.kv_mode

    @property
    def fit(self) -> Fit:
        return self.plan.fit

    @property
    def word(self) -> str:
        return WORDS[self.fit]

    def to_json(self) -> dict[str, Any]:
        return {"n_ctx": self.n_ctx, "kv_mode": str(self.kv_mode), "fit": self.fit.value, "word": self.word,
                "n_gpu_layers": self.plan.n_gpu_layers, "host": self.plan.host_total,
                "available": self.plan.available, "reason": self.plan.reason,
                "max_ctx": {str(mode): n for mode, n in self.max_ctx.items()},
                "tokens_per_gib": {str(mode): n for mode, n in self.context.per_gib.items()}}


def fit_report(meta: ModelMeta, spec: LoadSpec, available: int | None = None,
               devices: Sequence[Device] = ()) -> FitReport:
    """``meta`` loaded as ``spec`` says (its context, KV mode, window, GPU layers and memory limit; its model
    is not used) against the RAM ``available`` (now, when None) and ``devices``."""
    available = memory.available_ram() if available is None else available
    support = meta.kv_support(spec.flash_attn)
    longest = spec.max_ctx_per_mode(meta, devices, available)
    return FitReport(spec.plan(meta, devices, available),
                     {mode: n if support.allows(mode) else 0 for mode, n in longest.items()},
                     spec.context(meta))


def local_devices() -> list[Device]:
    """This machine's GPUs as the engine sees them (loads the engine; none on a CPU build or without it)."""
    try:
        from lazykv.core.engine.devices import local_gpus
    except ImportError:
        return []
    return local_gpus()
