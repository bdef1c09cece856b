"""Section 2, speed: decode and prefill tok/s of the lazy cache against the plain cache it behaves like.

Measured at fixed depths during the lockstep pass (bench/lockstep.py), where the f16, q8_0 and lazy
contexts hold the same tokens. Below the breakpoint the lazy cache is compared with f16, above it
(converted) with q8_0. Each measurement is repeated if other processes used the CPU meanwhile.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from llama_cpp import Llama

from bench.engine import KINDS, truncate
from bench.machine import run_uncontended
from bench.settings import ModelSpec, Settings


@dataclass
class SpeedResult:
    model: ModelSpec
    n_cells_f16: int
    n_decode: int
    depths: list[int]
    lazy_phase: dict[int, str] = field(default_factory=dict)  # depth -> lazy phase there
    decode: dict[str, dict[int, list[list[float]]]] = field(default_factory=dict)  # kind -> depth -> reps
    # of per-token seconds
    chunks: list[tuple[int, int]] = field(default_factory=list)  # prefill chunks of the pass (positions)
    chunk_s: dict[str, list[float]] = field(default_factory=dict)  # kind -> seconds per chunk
    chunk_region: list[str] = field(default_factory=list)  # "before" | "crossing" | "after" the conversion
    chunk_contended: list[bool] = field(default_factory=list)  # other processes used the CPU meanwhile
    all_logits: bool = False  # the pass requested the logits of every position (for the quality section)
    retries: int = 0  # measurements repeated because other processes used the CPU
    contended: int = 0  # measurements that stayed contended after the retries
    contended_at: dict[int, int] = field(default_factory=dict)  # depth -> such measurements there

    def baseline(self, depth: int) -> str:
        """The plain cache the lazy one matches at this depth."""
        return "f16" if self.lazy_phase[depth] == "f16" else "q8_0"

    def decode_median(self, kind: str, depth: int) -> float:
        """tok/s = 1 / the median time of all timed tokens (robust to a few interrupted evals)."""
        return 1.0 / statistics.median(t for rep in self.decode[kind][depth] for t in rep)

    def decode_reps(self, kind: str, depth: int) -> list[float]:
        """tok/s of each repetition (tokens / total time)."""
        return [len(rep) / sum(rep) for rep in self.decode[kind][depth]]

    def add_chunk(
        self, chunk: tuple[int, int], seconds: dict[str, float], region: str, contended: bool
    ) -> None:
        self.chunks.append(chunk)
        for kind in KINDS:
            self.chunk_s[kind].append(seconds[kind])
        self.chunk_region.append(region)
        self.chunk_contended.append(contended)

    def prefill_tok_s(self, kind: str, region: str) -> float:
        """Tokens / seconds over the uncontended chunks of a region."""
        picked = [i for i, r in enumerate(self.chunk_region) if r == region and not self.chunk_contended[i]]
        tokens = sum(self.chunks[i][1] - self.chunks[i][0] for i in picked)
        seconds = sum(self.chunk_s[kind][i] for i in picked)
        return tokens / seconds if seconds > 0 else float("nan")

    def region_positions(self, region: str) -> str:
        spans = [c for c, r in zip(self.chunks, self.chunk_region, strict=True) if r == region]
        return f"{spans[0][0]}-{spans[-1][1]}" if spans else "-"

    def record(self, depth: int, retries: int, contended: bool) -> None:
        self.retries += retries
        self.contended += contended
        self.contended_at[depth] = self.contended_at.get(depth, 0) + contended


def new_result(model: ModelSpec, settings: Settings, n_f16: int, all_logits: bool) -> SpeedResult:
    depths = depths_for(model.n_ctx, n_f16, settings.decode_tokens)
    result = SpeedResult(model, n_f16, settings.decode_tokens, depths, all_logits=all_logits)
    result.decode = {kind: {d: [] for d in depths} for kind in KINDS}
    result.chunk_s = {kind: [] for kind in KINDS}
    return result


def depths_for(n_ctx: int, n_f16: int, n_decode: int) -> list[int]:
    """Two depths below the breakpoint (room left for the decodes) and two above it."""
    margin = max(2 * n_decode, n_ctx // 32)
    return [n_ctx // 8, n_f16 - margin, n_f16 + margin, n_ctx - 2 * n_decode]


def order(index: int) -> tuple[str, ...]:
    """KINDS, reversed every other time, so that drift on a shared machine falls on all caches alike."""
    return KINDS if index % 2 == 0 else KINDS[::-1]


def time_decode(llm: Llama, tokens: list[int]) -> list[float]:
    """Seconds of each single-token eval of `tokens` (after one untimed warm-up token); then back to the
    depth."""
    depth = llm.n_tokens
    llm.eval(tokens[:1])
    truncate(llm, depth)
    seconds = []
    for token in tokens:
        started = time.perf_counter()
        llm.eval([token])
        seconds.append(time.perf_counter() - started)
    truncate(llm, depth)
    return seconds


def measure_depth(
    contexts: dict[str, Llama], tokens: list[int], depth: int, result: SpeedResult, reps: int
) -> None:
    """Decode timings of every cache at `depth` (all contexts hold tokens[:depth])."""
    index = result.depths.index(depth)
    result.lazy_phase[depth] = contexts["lazy"].kv_lazy_info().phase
    decode_tokens = tokens[depth : depth + result.n_decode]
    for rep in range(reps):
        for kind in order(index + rep):
            tok_s, retries, contended = run_uncontended(
                lambda llm=contexts[kind]: time_decode(llm, decode_tokens)
            )
            result.decode[kind][depth].append(tok_s)
            result.record(depth, retries, contended)
