"""Section 4, sweep: prefill and decode tok/s by depth for f16, q8_0 on the reference CPU flash attention
path, q8_0 on the new paths (patch 0007) and lazy.

One context per cache kind, each in a child process (`python -m bench.sweep --child ...`): the engine reads
GGML_CPU_FA_Q8_REF once per process, and that variable is what selects the reference path for
"q8_0-ref". Each child fills its cache once, chunk by chunk, and times at each depth on the way: single-token
decodes at the depth, then the n_batch prefill chunk that starts there (both repeated, back at the depth in
between). The lazy cache is converted (untimed) before the first chunk that does not fit its f16 view; the
conversion pause is section 3's subject.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial

from llama_cpp import Llama

from bench.corpus import build_tokens
from bench.engine import open_context, open_vocab, truncate
from bench.machine import WAIT_BUDGET, run_uncontended
from bench.settings import ModelSpec, Settings, make_settings
from bench.speed import time_decode

SWEEP_KINDS = ("f16", "q8_0-ref", "q8_0", "lazy")
# f16 and q8_0 back to back (their ratio is the target), the slow q8_0-ref last
RUN_ORDER = ("f16", "q8_0", "lazy", "q8_0-ref")
SWEEP_MODELS = ("smollm2",)  # the issue's model; Gemma-3's shapes are covered by tests/native/test_fa_q8.py
DEPTHS = (0, 1024, 2048, 4096, 8192)
PREFILL_REPS = 3
DECODE_REPS = 3
REF_ENV = "GGML_CPU_FA_Q8_REF"


@dataclass
class KindSweep:
    """One cache kind's timings, by depth (the index into SweepResult.depths)."""

    kind: str
    prefill_s: list[list[float]] = field(default_factory=list)  # seconds per repetition of the chunk
    decode_s: list[list[float]] = field(default_factory=list)  # seconds per timed token, all repetitions
    decode_phase: list[str] = field(default_factory=list)  # cache phase during the decodes
    prefill_phase: list[str] = field(default_factory=list)  # cache phase during the chunk
    retries: int = 0
    contended: int = 0


@dataclass
class SweepResult:
    model: ModelSpec
    n_batch: int
    n_decode: int
    depths: list[int]
    kinds: dict[str, KindSweep]
    seconds: dict[str, float]  # wall time of each child

    def prefill_tok_s(self, kind: str, i: int) -> float:
        """n_batch / the median time of the chunk at depth index i."""
        return self.n_batch / statistics.median(self.kinds[kind].prefill_s[i])

    def decode_tok_s(self, kind: str, i: int) -> float:
        """1 / the median time of all timed tokens at depth index i."""
        return 1.0 / statistics.median(self.kinds[kind].decode_s[i])


def sweep_depths(n_ctx: int, n_batch: int) -> list[int]:
    """DEPTHS, capped so that the prefill chunk still fits: 8192 becomes 7680 at n_ctx 8192."""
    return sorted({min(d, n_ctx - n_batch) for d in DEPTHS})


def fill(llm: Llama, tokens: list[int], upto: int, n_batch: int) -> None:
    """Decode tokens[llm.n_tokens:upto] in n_batch chunks (untimed)."""
    while llm.n_tokens < upto:
        llm.eval(tokens[llm.n_tokens : min(llm.n_tokens + n_batch, upto)])


def repeat(
    timer: Callable[[Llama, list[int]], float | list[float]], llm: Llama, tokens: list[int], reps: int
) -> list[float]:
    """All seconds `timer` measured over `reps` calls."""
    seconds: list[float] = []
    for _ in range(reps):
        got = timer(llm, tokens)
        seconds += got if isinstance(got, list) else [got]
    return seconds


def time_chunk(llm: Llama, chunk: list[int]) -> float:
    depth = llm.n_tokens
    started = time.perf_counter()
    llm.eval(chunk)
    seconds = time.perf_counter() - started
    truncate(llm, depth)
    return seconds


def phase(llm: Llama, kind: str) -> str:
    return llm.kv_lazy_info().phase if kind == "lazy" else kind.removesuffix("-ref")


def n_cells_f16(llm: Llama) -> int:
    return llm.kv_lazy_info().n_cells_f16


def measure_kind(spec: ModelSpec, settings: Settings, kind: str) -> KindSweep:
    """The child's work: fill one context of `kind` and time at each sweep depth."""
    vocab = open_vocab(spec.key)
    try:
        tokens = build_tokens(vocab, spec.n_ctx)
    finally:
        vocab.close()
    llm = open_context(spec.key, "q8_0" if kind == "q8_0-ref" else kind, spec.n_ctx, settings)
    out = KindSweep(kind)
    try:
        for depth in sweep_depths(spec.n_ctx, settings.n_batch):
            fill(llm, tokens, depth, settings.n_batch)
            decode_tokens = tokens[depth : depth + settings.decode_tokens]
            decode, retries, busy = run_uncontended(
                partial(repeat, time_decode, llm, decode_tokens, DECODE_REPS)
            )
            out.retries, out.contended = out.retries + retries, out.contended + busy
            out.decode_phase.append(phase(llm, kind))
            chunk = tokens[depth : depth + settings.n_batch]
            if kind == "lazy" and phase(llm, kind) == "f16" and depth + len(chunk) > n_cells_f16(llm):
                llm.kv_lazy_convert()
            prefill, retries, busy = run_uncontended(partial(repeat, time_chunk, llm, chunk, PREFILL_REPS))
            out.retries, out.contended = out.retries + retries, out.contended + busy
            out.decode_s.append(decode)
            out.prefill_s.append(prefill)
            out.prefill_phase.append(phase(llm, kind))
            pre, dec = settings.n_batch / statistics.median(prefill), 1 / statistics.median(decode)
            print(f"         {kind} at {depth}: prefill {pre:.1f}, decode {dec:.1f} tok/s", file=sys.stderr)
    finally:
        llm.close()
    return out


def run_sweep(spec: ModelSpec, settings: Settings) -> SweepResult:
    """Each kind in a child process, in RUN_ORDER; the children share this run's wait budget."""
    kinds, seconds = {}, {}
    for kind in RUN_ORDER:
        env = {k: v for k, v in os.environ.items() if k != REF_ENV}
        if kind == "q8_0-ref":
            env[REF_ENV] = "1"
        cmd = [
            sys.executable,
            "-m",
            "bench.sweep",
            "--child",
            kind,
            "--model",
            spec.key,
            "--n-ctx",
            str(spec.n_ctx),
            "--wait-budget",
            str(WAIT_BUDGET.remaining),
        ]
        if settings.quick:
            cmd.append("--quick")
        started = time.perf_counter()
        done = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True)
        seconds[kind] = time.perf_counter() - started
        reply = json.loads(done.stdout)
        WAIT_BUDGET.spend(reply.pop("waited_s"))
        kinds[kind] = KindSweep(**reply)
    depths = sweep_depths(spec.n_ctx, settings.n_batch)
    ordered = {kind: kinds[kind] for kind in SWEEP_KINDS}
    return SweepResult(spec, settings.n_batch, settings.decode_tokens, depths, ordered, seconds)


def child_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sweep")
    parser.add_argument("--child", choices=SWEEP_KINDS, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--n-ctx", type=int, required=True)
    parser.add_argument("--wait-budget", type=float, default=0.0)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    settings = make_settings(args.quick, (args.model,), ("sweep",), args.n_ctx, args.n_ctx)
    WAIT_BUDGET.remaining = args.wait_budget
    result = measure_kind(settings.models[0], settings, args.child)
    print(json.dumps(asdict(result) | {"waited_s": WAIT_BUDGET.spent}))
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
