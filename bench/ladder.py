"""Section "ladder": the lazy ladder f16 -> q8_0 -> q4_0 (issue 14), written to bench/results/ladder.md.

1. memory: tokens per GiB of KV memory of every cache kind (kv_bytes and the capacity of the last rung);
2. quality: one lockstep pass over the benchmark text of f16, q8_0, q4_0, q5_0, ladder and q5_0-ladder
   contexts at n_ctx LADDER_N_CTX; per position KLD against f16 and top-1 agreement, summarized per region
   (the rung a ladder was on when it decoded the position);
3. pause: each step of the ladder (f16 -> q8_0, q8_0 -> q4_0 or q5_0, f16 -> q4_0 directly) on the
   Llama-3-8B KV shape of bench/realistic.py, against a memcpy of the bytes it reads, with the peak extra RSS;
4. speed: during the pass, decode and prefill of the ladder in each rung against the plain cache of that
   rung's type at the same depth, paired repetitions;
5. the recent f16 window: bench/recent.py.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from llama_cpp import Llama

from bench import realistic
from bench.conversion import RepeatedConversions
from bench.engine import eval_with_logits, open_context
from bench.lockstep import chunk_bounds
from bench.machine import run_uncontended
from bench.memory import memcpy_seconds
from bench.quality import compare_rows
from bench.recent import RecentResults
from bench.settings import ModelSpec, Settings
from bench.speed import time_decode
from bench.sweep import time_chunk
from bench.synthetic import LLAMA3_8B_KV, kv_bytes_per_cell, synthetic_model

LADDER_N_CTX = 2048  # rungs of the q4_0 ladder at 512 / 1024 / 2048 cells: every region has many tokens
MEMORY_KINDS = ("f16", "q8_0", "q4_0", "q5_0", "lazy", "ladder", "ladder_q5_0")
PASS_KINDS = ("f16", "q8_0", "q4_0", "q5_0", "ladder", "ladder_q5_0")
LADDERS = ("ladder", "ladder_q5_0")
SPEED_SPAN = 256  # tokens of a prefill timing; each rung is timed at depth (its capacity - SPEED_SPAN)
BYTES_PER_VALUE = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q5_0": 22 / 32}
GIB = 1024**3


# --- 1. memory --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryRow:
    kind: str
    kv_bytes: int
    rungs: tuple[tuple[str, int], ...]  # (type the cells are stored in, cells it holds), f16 first

    @property
    def capacity(self) -> int:
        """Cells the cache holds on its last rung."""
        return self.rungs[-1][1]

    @property
    def tokens_per_gib(self) -> float:
        return self.capacity * GIB / self.kv_bytes


def memory_row(llm: Llama, kind: str, n_ctx: int) -> MemoryRow:
    info = llm.kv_lazy_info()
    if not info.rungs:
        return MemoryRow(kind, info.kv_bytes, ((kind, n_ctx),))
    caps = {"f16": info.n_cells_f16, "q8_0": info.n_cells_q8, info.final: info.n_cells_total}
    return MemoryRow(kind, info.kv_bytes, tuple((rung, caps[rung]) for rung in info.rungs))


def measure_memory(spec: ModelSpec, settings: Settings, n_ctx: int) -> list[MemoryRow]:
    rows = []
    for kind in MEMORY_KINDS:
        llm = open_context(spec.key, kind, n_ctx, settings)
        try:
            rows.append(memory_row(llm, kind, n_ctx))
        finally:
            llm.close()
    return rows


# --- 2 + 4. the lockstep pass: quality per region, speed per rung -----------------------------------------


@dataclass
class RungSpeed:
    """Paired timings of the ladder and the plain cache of its rung's type at one depth."""

    rung: str
    depth: int
    decode_tok_s: dict[str, list[float]]  # kind -> per repetition
    prefill_tok_s: dict[str, list[float]]

    def median(self, what: str, kind: str) -> float:
        return statistics.median(getattr(self, what)[kind])

    def ratio(self, what: str) -> float:
        """Median over repetitions of ladder / plain, each pair timed back to back."""
        series = getattr(self, what)
        return statistics.median(a / b for a, b in zip(series["ladder"], series[self.rung], strict=True))


@dataclass
class LadderPass:
    model: ModelSpec
    n_ctx: int
    memory: list[MemoryRow]
    kld: dict[str, np.ndarray]  # kind -> per position KLD(f16 || kind), nats
    top1: dict[str, np.ndarray]  # kind -> per position argmax equal to f16's
    rung_at: dict[str, np.ndarray]  # ladder kind -> per position the rung it was on when decoding it
    identical_f16: dict[str, bool]  # ladder kind -> logits bit-identical to f16's on its f16 rung
    speed: list[RungSpeed] = field(default_factory=list)
    retries: int = 0  # timings repeated because other processes used the CPU
    contended: int = 0  # timings still contended after the retries

    def regions(self, ladder: str) -> list[tuple[str, int, int]]:
        """(rung, first position, end) of each rung of `ladder`, in order."""
        rungs = self.rung_at[ladder]
        found = []
        for rung in dict.fromkeys(rungs.tolist()):
            where = np.flatnonzero(rungs == rung)
            found.append((rung, int(where[0]), int(where[-1]) + 1))
        return found

    def mean_kld(self, kind: str, start: int, end: int) -> float:
        return float(self.kld[kind][start:end].mean())

    def top1_rate(self, kind: str, start: int, end: int) -> float:
        return float(self.top1[kind][start:end].mean())


def speed_depths(llm: Llama) -> dict[int, str]:
    """Depth -> rung of the ladder there: SPEED_SPAN cells below the end of each rung."""
    info = llm.kv_lazy_info()
    caps = (info.n_cells_f16, info.n_cells_q8, info.n_cells_total)
    return {cap - SPEED_SPAN: rung for cap, rung in zip(caps, info.rungs, strict=True)}


def measure_rung(
    contexts: dict[str, Llama],
    tokens: list[int],
    depth: int,
    rung: str,
    settings: Settings,
    result: LadderPass,
) -> None:
    """Decode and prefill timings of the ladder and the plain `rung` cache, all holding tokens[:depth]."""
    if contexts["ladder"].kv_lazy_info().phase != rung:
        raise RuntimeError(f"ladder bench: the ladder is not on its {rung} rung at depth {depth}")
    out = RungSpeed(rung, depth, {"ladder": [], rung: []}, {"ladder": [], rung: []})
    decode_tokens = tokens[depth : depth + settings.decode_tokens]
    chunk = tokens[depth : depth + SPEED_SPAN]
    for rep in range(settings.decode_reps):
        for kind in ("ladder", rung) if rep % 2 == 0 else (rung, "ladder"):
            llm = contexts[kind]
            seconds, tries, busy = run_uncontended(lambda llm=llm: time_decode(llm, decode_tokens))
            out.decode_tok_s[kind].append(1.0 / statistics.median(seconds))
            result.retries, result.contended = result.retries + tries, result.contended + busy
            elapsed, tries, busy = run_uncontended(lambda llm=llm: time_chunk(llm, chunk))
            out.prefill_tok_s[kind].append(len(chunk) / elapsed)
            result.retries, result.contended = result.retries + tries, result.contended + busy
    result.speed.append(out)


def run_ladder_pass(spec: ModelSpec, settings: Settings, tokens: list[int], n_ctx: int) -> LadderPass:
    contexts = {kind: open_context(spec.key, kind, n_ctx, settings) for kind in PASS_KINDS}
    try:
        return _run_pass(contexts, spec, settings, tokens[:n_ctx], n_ctx)
    finally:
        for llm in contexts.values():
            llm.close()


def _run_pass(
    contexts: dict[str, Llama], spec: ModelSpec, settings: Settings, tokens: list[int], n_ctx: int
) -> LadderPass:
    n = len(tokens)
    compared = PASS_KINDS[1:]
    result = LadderPass(
        spec,
        n_ctx,
        [],
        kld={kind: np.zeros(n) for kind in compared},
        top1={kind: np.zeros(n, dtype=bool) for kind in compared},
        rung_at={kind: np.empty(n, dtype=object) for kind in LADDERS},
        identical_f16={kind: True for kind in LADDERS},
    )
    depths = speed_depths(contexts["ladder"])
    cuts = [*depths, *(c for k in LADDERS for c in rung_ends(contexts[k]))]
    for index, (a, b) in enumerate(chunk_bounds(n, settings.n_batch, cuts)):
        order = PASS_KINDS if index % 2 == 0 else PASS_KINDS[::-1]
        logits = {kind: eval_with_logits(contexts[kind], tokens[a:b]) for kind in order}
        for kind in LADDERS:
            rung = contexts[kind].kv_lazy_info().phase
            result.rung_at[kind][a:b] = rung
            if rung == "f16":
                result.identical_f16[kind] &= bool(np.array_equal(logits["f16"], logits[kind]))
        for kind in compared:
            result.kld[kind][a:b], result.top1[kind][a:b] = compare_rows(
                logits["f16"], logits[kind], settings.kld_block
            )
        print(f"         {spec.key}: {b}/{n} positions (ladder on {result.rung_at['ladder'][a]})", flush=True)
        if b in depths:
            measure_rung(contexts, tokens, b, depths[b], settings, result)
    return result


def rung_ends(llm: Llama) -> tuple[int, int]:
    """The cells of the f16 and q8_0 rungs: the pass splits its chunks there so that each fills exactly."""
    info = llm.kv_lazy_info()
    return info.n_cells_f16, info.n_cells_q8


# --- 3. the pause of each step ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    name: str
    kind: str  # the ladder cache kind
    source: str  # rung it reads
    fill: str  # "f16" | "q8_0": the rung filled (all its cells) before the step
    to: str | None  # kv_lazy_convert(to): None = one step


STEPS = (
    Step("f16 -> q8_0", "ladder", "f16", "f16", None),
    Step("q8_0 -> q4_0", "ladder", "q8_0", "q8_0", None),
    Step("f16 -> q4_0 (direct)", "ladder", "f16", "f16", "q4_0"),
    Step("q8_0 -> q5_0 (q5_0 ladder)", "ladder_q5_0", "q8_0", "q8_0", None),
)


@dataclass
class StepResult(RepeatedConversions):
    step: Step
    n_cells: int  # cells of the rung read (all used)
    bytes_read: int
    n_layers: int
    runs: list[realistic.TimedRun]  # RSS sampled meanwhile
    memcpy_s: float = 0.0
    unsampled: list[realistic.TimedRun] = field(default_factory=list)  # the same step with no sampling thread

    @property
    def pause_s(self) -> float:
        """The step's pause: the fastest wall-clock time of all its runs, with RSS sampled or not (the
        memcpy's is the fastest of its runs too)."""
        return min(run.wall_s for run in [*self.runs, *self.unsampled])

    @property
    def layer_bytes(self) -> float:
        """One layer's K (or V) of the rung read: the bound on the extra memory of an in-place step."""
        return self.bytes_read / (2 * self.n_layers)


@dataclass
class PauseResult:
    n_ctx: int
    n_threads: int
    steps: list[StepResult]
    retries: int = 0
    contended: int = 0


def measure_step(
    model: Path, seed: realistic.SeedState, step: Step, reps: int, n_threads: int, result: PauseResult
) -> StepResult:
    llm = realistic.open_context(model, step.kind, n_threads)
    try:
        info = llm.kv_lazy_info()
        n_cells = info.n_cells_f16 if step.fill == "f16" else info.n_cells_q8
        blob = seed.repeated(n_cells)
        bytes_read = round(n_cells * kv_bytes_per_cell(LLAMA3_8B_KV, BYTES_PER_VALUE[step.source]))
        out = StepResult(step, n_cells, bytes_read, LLAMA3_8B_KV.n_layer, [])
        convert = lambda: llm.kv_lazy_convert(step.to)  # noqa: E731
        for _ in range(reps):
            for sample, runs in ((True, out.runs), (False, out.unsampled)):
                run, tries, busy = run_uncontended(
                    lambda sample=sample: realistic.timed(llm, convert, sample=sample),
                    prepare=lambda: filled(llm, blob, n_cells, step.fill),
                )
                if llm.kv_lazy_info().phase == step.fill or run.engine_s == 0:
                    raise RuntimeError(f"ladder bench: {step.name} did not convert")
                runs.append(run)
                result.retries, result.contended = result.retries + tries, result.contended + busy
    finally:
        llm.close()
    out.memcpy_s, tries, busy = run_uncontended(lambda: memcpy_seconds(bytes_read, 7, n_threads))
    result.retries, result.contended = result.retries + tries, result.contended + busy
    return out


def filled(llm: Llama, blob: bytearray, n_cells: int, rung: str) -> None:
    """The cache holds n_cells cells on `rung` (restoring more cells than the f16 rung holds converts)."""
    realistic.restore(llm, blob, n_cells)
    if llm.kv_lazy_info().phase != rung:
        raise RuntimeError(f"ladder bench: {n_cells} restored cells are not on the {rung} rung")


def run_pause(settings: Settings, reps: int) -> PauseResult:
    model = synthetic_model(LLAMA3_8B_KV)
    seed = realistic.seed_state(model, settings.n_threads)
    result = PauseResult(realistic.N_CTX, settings.n_threads, [])
    for step in STEPS:
        result.steps.append(measure_step(model, seed, step, reps, settings.n_threads, result))
    return result


# --- the section -------------------------------------------------------------------------------------------


@dataclass
class LadderResults:
    passes: list[LadderPass] = field(default_factory=list)
    pause: PauseResult | None = None
    recent: RecentResults | None = None  # part 5, bench/recent.py


def model_pass(spec: ModelSpec, settings: Settings, tokens: list[int]) -> LadderPass:
    """Memory, quality and speed of one model at LADDER_N_CTX (whatever n_ctx the other sections use)."""
    memory = measure_memory(spec, settings, LADDER_N_CTX)
    result = run_ladder_pass(spec, settings, tokens, LADDER_N_CTX)
    result.memory = memory
    return result
