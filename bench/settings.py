"""Benchmark settings: one frozen object passed to every section, printed in the report."""

from __future__ import annotations

from dataclasses import dataclass

SECTIONS = ("quality", "speed", "conversion", "sweep", "ladder")


@dataclass(frozen=True)
class ModelSpec:
    key: str  # key in lazykv.core.models.model_fetch.MODELS
    label: str
    n_ctx: int


@dataclass(frozen=True)
class Settings:
    quick: bool
    models: tuple[ModelSpec, ...]
    sections: tuple[str, ...] = SECTIONS
    n_threads: int = 2
    n_batch: int = 512
    flash_attn: bool = True
    decode_tokens: int = 32  # single-token evals per decode timing
    decode_reps: int = 5  # decode timings per (cache, depth); the median is reported
    conversion_reps: int = 3  # fills + kv_lazy_convert(); the median is reported
    memcpy_reps: int = 7  # best of
    rss_interval_s: float = 0.001  # RSS sampling period during a conversion
    rolling_window: int = 256  # positions, for the quality plots
    kld_block: int = 32  # rows per float64 block when computing KLD


MODEL_LABELS = {"smollm2": "SmolLM2-135M-Instruct Q4_1", "gemma3": "Gemma-3-270M Q4_K_M"}
# full run: Gemma-3 at 4096, because filling plain q8_0 caches is slow at depth and 8192 would about double
# the run time (see bench/README.md)
FULL_N_CTX = {"smollm2": 8192, "gemma3": 4096}
QUICK_N_CTX = 2048


def make_settings(
    quick: bool,
    model_keys: tuple[str, ...],
    sections: tuple[str, ...],
    n_ctx: int | None,
    gemma_ctx: int | None,
) -> Settings:
    """Full run: FULL_N_CTX and the default repetitions; --quick: n_ctx 2048, fewer repetitions."""
    models = []
    for key in model_keys:
        ctx = n_ctx or (QUICK_N_CTX if quick else FULL_N_CTX[key])
        if key == "gemma3" and gemma_ctx:
            ctx = gemma_ctx
        models.append(ModelSpec(key, MODEL_LABELS[key], ctx))
    if quick:
        return Settings(
            quick=True,
            models=tuple(models),
            sections=sections,
            decode_tokens=16,
            decode_reps=3,
            conversion_reps=2,
            memcpy_reps=5,
            rolling_window=64,
        )
    return Settings(quick=False, models=tuple(models), sections=sections)
