"""The pass shared by sections 1 and 2: f16, q8_0 and lazy contexts decode the same text in lockstep.

The text is decoded in n_batch chunks, split at the breakpoint (n_cells_f16, so that the f16 view is filled
exactly) and at the speed depths. Each chunk's time is recorded per cache (prefill speed) and the quality
accumulator compares the logits of every position; at each speed depth the decode timings run before the
pass continues.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from llama_cpp import Llama

from bench.engine import KINDS, eval_with_logits, open_context
from bench.machine import CONTENTION_CORES, OtherLoad
from bench.quality import QualityAccumulator, QualityResult
from bench.settings import ModelSpec, Settings
from bench.speed import SpeedResult, measure_depth, new_result, order


@dataclass
class PassResult:
    model: ModelSpec
    quality: QualityResult | None
    speed: SpeedResult | None
    n_cells_f16: int
    conversion_chunk: tuple[int, int]  # the chunk during which the lazy cache converted ((-1, -1): none)
    conversion_s: float  # the engine's timing of that automatic conversion


def progress(spec: ModelSpec, done: int, total: int, seconds: dict[str, float], region: str) -> None:
    took = ", ".join(f"{kind} {s:.1f} s" for kind, s in seconds.items())
    print(f"         {spec.key}: {done}/{total} positions (lazy {region}; last chunk {took})", flush=True)


def chunk_bounds(n_tokens: int, n_batch: int, cuts: list[int]) -> list[tuple[int, int]]:
    """n_batch-sized chunks of 0..n_tokens, also split at each of `cuts`."""
    points = set(range(0, n_tokens, n_batch)) | {n_tokens} | {c for c in cuts if 0 < c < n_tokens}
    ordered = sorted(points)
    return list(zip(ordered[:-1], ordered[1:], strict=True))


def decode_chunk(llm: Llama, tokens: list[int], all_logits: bool) -> np.ndarray | None:
    if all_logits:
        return eval_with_logits(llm, tokens)
    llm.eval(tokens)
    return None


def run_pass(
    spec: ModelSpec, settings: Settings, tokens: list[int], want_quality: bool, want_speed: bool
) -> PassResult:
    contexts = {kind: open_context(spec.key, kind, spec.n_ctx, settings) for kind in KINDS}
    try:
        return _run(contexts, spec, settings, tokens, want_quality, want_speed)
    finally:
        for llm in contexts.values():
            llm.close()


def _run(
    contexts: dict[str, Llama],
    spec: ModelSpec,
    settings: Settings,
    tokens: list[int],
    want_quality: bool,
    want_speed: bool,
) -> PassResult:
    lazy = contexts["lazy"]
    n_f16 = lazy.kv_lazy_info().n_cells_f16
    n = min(len(tokens), spec.n_ctx)
    speed = new_result(spec, settings, n_f16, want_quality) if want_speed else None
    quality = QualityAccumulator(n, settings.kld_block) if want_quality else None
    result = PassResult(spec, None, speed, n_f16, (-1, -1), 0.0)
    for index, (a, b) in enumerate(
        chunk_bounds(n, settings.n_batch, [n_f16, *(speed.depths if speed else [])])
    ):
        was_f16 = lazy.kv_lazy_info().phase == "f16"
        logits, seconds, other = {}, {}, OtherLoad()
        for kind in order(index):
            started = time.perf_counter()
            logits[kind] = decode_chunk(contexts[kind], tokens[a:b], want_quality)
            seconds[kind] = time.perf_counter() - started
        contended = other.cores() > CONTENTION_CORES
        info = lazy.kv_lazy_info()
        region = "before" if info.phase == "f16" else ("crossing" if was_f16 else "after")
        if region == "crossing":
            result.conversion_chunk, result.conversion_s = (a, b), info.last_conversion_s
        if quality is not None:
            quality.add(a, logits, lazy_was_f16=region == "before")
        if speed is not None:
            speed.add_chunk((a, b), seconds, region, contended)
            if b in speed.depths:
                measure_depth(contexts, tokens, b, speed, settings.decode_reps)
        progress(spec, b, n, seconds, region)
    if quality is not None:
        result.quality = quality.result(spec, len(tokens), n_f16, result.conversion_chunk[0])
    return result
