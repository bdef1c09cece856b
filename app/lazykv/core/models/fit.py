"""What fits this machine: a model at a context in a KV mode, and the longest context in each KV mode.

No planner of its own: every figure is the engine's memory plan (``core.engine.memory``), the same one
``python -m lazykv estimate`` and the window's memory panel show.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lazykv.core.engine import memory
from lazykv.core.engine.memory import Fit
from lazykv.core.engine.model_meta import ModelMeta
from lazykv.core.kinds import KvMode

WORDS = {Fit.GREEN: "fits", Fit.YELLOW: "tight", Fit.RED: "does not fit"}
ORDER = {Fit.GREEN: 0, Fit.YELLOW: 1, Fit.RED: 2}  # for sorting by fit


@dataclass(frozen=True)
class FitReport:
    n_ctx: int
    kv_mode: KvMode
    estimate: memory.Estimate  # of n_ctx in kv_mode
    max_ctx: dict[KvMode, int]  # the longest context that is not "does not fit", per KV mode (0: none)

    @property
    def fit(self) -> Fit:
        return self.estimate.fit

    @property
    def word(self) -> str:
        return WORDS[self.fit]

    def to_json(self) -> dict[str, Any]:
        return {"n_ctx": self.n_ctx, "kv_mode": str(self.kv_mode), "fit": self.fit.value, "word": self.word,
                "total": self.estimate.total, "available": self.estimate.available,
                "max_ctx": {str(mode): n for mode, n in self.max_ctx.items()}}


def fit_report(meta: ModelMeta, n_ctx: int, kv_mode: str, available: int | None = None,
               flash_attn: bool = True) -> FitReport:
    """``meta`` at ``n_ctx`` in ``kv_mode`` against the RAM ``available`` (now, when None)."""
    available = memory.available_ram() if available is None else available
    estimate = memory.estimate(meta, n_ctx, kv_mode, available)
    support = meta.kv_support(flash_attn)
    return FitReport(n_ctx, KvMode(kv_mode), estimate,
                     {mode: max_ctx(meta, mode, available) if support.allows(mode) else 0 for mode in KvMode})


def max_ctx(meta: ModelMeta, kv_mode: str, available: int) -> int:
    """The longest context (in the engine's 256-token steps, at most the model's limit) whose plan is not
    RED: ``memory.max_ctx`` (the compute buffers grow with the context up to one micro-batch, so the
    planner searches rather than dividing what is left)."""
    return memory.max_ctx(meta, kv_mode, available=available)
