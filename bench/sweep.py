"""Section 4, sweep: prefill and decode tok/s by depth for f16, q8_0 on the reference CPU flash attention
path, q8_0 on the new paths (patches 0003, 0004) and lazy.

Two child processes (`python -m bench.sweep --child KINDS ...`) live for the whole sweep: one hosts the
f16, q8_0 and lazy contexts, the other q8_0-ref (a q8_0 context whose CPU backend runs ggml-cpu's reference
paths, `llama_set_cpu_use_ref`: the vec-only flash attention kernel q8_0 took before patch 0003, the plain
MUL_MAT for the rotation, no op fusion). They take one command at a time (JSON lines on
stdin/stdout), so nothing is timed while anything else runs. At each depth every context is filled to the
depth (untimed), then DECODE_ROUNDS rounds of decodes and PREFILL_ROUNDS rounds of the n_batch prefill chunk
that starts at the depth; in each round f16 and q8_0 run next to each other, in alternating order, then
(first LAZY_ROUNDS rounds) lazy, then (first REF_ROUNDS rounds) the slow q8_0-ref. Drift of a shared
machine then hits the compared kinds alike, and each ratio to f16 is the median of per-round ratios
(paired samples), reported with a distribution-free 95 % confidence interval; keeping the compared kinds in
one process keeps process-level differences (buffer placement, thread placement: up to ±10 % between two
processes running the same code here) out of their ratios.

Why so many rounds: on this 2-vCPU virtual machine one 512-token chunk on 2 threads varies by ±15 % from
one run to the next (the same chunk on 1 thread: ±4 %), while q8_0 and f16 differ by a few percent at
shallow depth, where the weights' matrix products dominate; a paired ratio's spread is about ±10 %, so
the median of 7 rounds moved by ±5 % between sweeps. 25 prefill rounds narrow that to about ±2.5 %.
The lazy cache is converted (untimed) before the first chunk that does not fit its f16 view; the
conversion pause is section 3's subject.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import IO, Any

import llama_cpp
from llama_cpp import Llama

from bench.corpus import build_tokens
from bench.engine import open_context, open_vocab, truncate
from bench.machine import WAIT_BUDGET, run_uncontended
from bench.settings import ModelSpec, Settings, make_settings
from bench.speed import time_decode

SWEEP_KINDS = ("f16", "q8_0-ref", "q8_0", "lazy")
PROCESS_GROUPS = (("f16", "q8_0", "lazy"), ("q8_0-ref",))  # the kinds each child process hosts
SWEEP_MODELS = ("smollm2",)  # the issue's model; Gemma-3's shapes are covered by tests/native/test_fa_q8.py
DEPTHS = (0, 1024, 2048, 4096, 8192)
PREFILL_ROUNDS = 25
DECODE_ROUNDS = 13  # a decode timing is the median of n_decode tokens already: less spread
LAZY_ROUNDS = 9  # lazy / f16 has no target here (section 2 has lazy's): fewer rounds
REF_ROUNDS = 3
QUICK_ROUNDS = 2


@dataclass
class KindSweep:
    """One cache kind's timings, by depth (the index into SweepResult.depths), one entry per round."""

    kind: str
    prefill_s: list[list[float]] = field(default_factory=list)  # seconds of the chunk, per round
    decode_s: list[list[float]] = field(default_factory=list)  # median seconds per token, per round
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
    seconds: dict[str, float]  # seconds each child spent working (fill and timings)

    def prefill_tok_s(self, kind: str, i: int) -> float:
        """n_batch / the median time of the chunk at depth index i."""
        return self.n_batch / statistics.median(self.kinds[kind].prefill_s[i])

    def decode_tok_s(self, kind: str, i: int) -> float:
        """1 / the median over rounds of the round's median time per token at depth index i."""
        return 1.0 / statistics.median(self.kinds[kind].decode_s[i])

    def ratio(self, what: str, kind: str, i: int, base: str = "f16") -> float:
        """Median over rounds of kind's speed / base's speed in the same round (`what`: prefill/decode;
        lazy and q8_0-ref have fewer rounds: their first ones)."""
        return statistics.median(self._ratios(what, kind, i, base))

    def ratio_ci(self, what: str, kind: str, i: int, base: str = "f16") -> tuple[float, float] | None:
        """A distribution-free 95 % confidence interval of that median (None: too few rounds for one)."""
        return median_ci(self._ratios(what, kind, i, base))

    def _ratios(self, what: str, kind: str, i: int, base: str) -> list[float]:
        own = getattr(self.kinds[kind], f"{what}_s")[i]
        other = getattr(self.kinds[base], f"{what}_s")[i]
        n = min(len(own), len(other))
        return [b / a for a, b in zip(own[:n], other[:n], strict=True)]


def median_ci(samples: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """The order-statistic confidence interval of a median: (x_(k), x_(n+1-k)) for the largest k whose
    two-sided binomial(n, 1/2) tail stays within 1 - level; None when even (min, max) covers less."""
    n = len(samples)
    tail, k = 0.0, 0
    while True:
        tail += math.comb(n, k) / 2**n  # P(fewer than k + 1 samples below the median)
        if 2 * tail > 1 - level:
            break
        k += 1
    if k == 0:
        return None
    ordered = sorted(samples)
    return ordered[k - 1], ordered[n - k]


def sweep_depths(n_ctx: int, n_batch: int) -> list[int]:
    """DEPTHS, capped so that the prefill chunk still fits: 8192 becomes 7680 at n_ctx 8192."""
    return sorted({min(d, n_ctx - n_batch) for d in DEPTHS})


def round_order(round_no: int) -> list[str]:
    """The kinds timed in a round: f16 and q8_0 (whose ratio is the target) always next to each other,
    their order swapped every round; then lazy in the first LAZY_ROUNDS rounds; then q8_0-ref in the first
    REF_ROUNDS rounds (it is the slow baseline, no target)."""
    pair = ["f16", "q8_0"] if round_no % 2 == 0 else ["q8_0", "f16"]
    lazy = ["lazy"] if round_no < LAZY_ROUNDS else []
    return [*pair, *lazy, *(["q8_0-ref"] if round_no < REF_ROUNDS else [])]


# --- the child: one context, one command at a time ----------------------------------------------------


def time_chunk(llm: Llama, chunk: list[int]) -> float:
    depth = llm.n_tokens
    started = time.perf_counter()
    llm.eval(chunk)
    seconds = time.perf_counter() - started
    truncate(llm, depth)
    return seconds


def phase(llm: Llama, kind: str) -> str:
    return llm.kv_lazy_info().phase if kind == "lazy" else kind.removesuffix("-ref")


class Child:
    """The child's state: the context of one cache kind, filled with the corpus up to the current depth."""

    def __init__(self, spec: ModelSpec, settings: Settings, kind: str, tokens: list[int]) -> None:
        self.kind, self.settings, self.tokens = kind, settings, tokens
        self.llm = open_context(spec.key, "q8_0" if kind == "q8_0-ref" else kind, spec.n_ctx, settings)
        if kind == "q8_0-ref" and not llama_cpp.llama_set_cpu_use_ref(self.llm.ctx, True):
            raise RuntimeError("the q8_0-ref context has no CPU backend")

    def fill(self, depth: int) -> dict[str, Any]:
        """Decode the corpus up to `depth` in n_batch chunks (untimed)."""
        llm, n_batch = self.llm, self.settings.n_batch
        while llm.n_tokens < depth:
            llm.eval(self.tokens[llm.n_tokens : min(llm.n_tokens + n_batch, depth)])
        return {"phase": phase(llm, self.kind)}

    def decode(self) -> dict[str, Any]:
        """The median seconds per token of n_decode single-token evals at the depth."""
        depth = self.llm.n_tokens
        tokens = self.tokens[depth : depth + self.settings.decode_tokens]
        seconds, retries, busy = run_uncontended(partial(time_decode, self.llm, tokens))
        return {"seconds": statistics.median(seconds), "retries": retries, "contended": busy,
                "phase": phase(self.llm, self.kind)}

    def prefill(self) -> dict[str, Any]:
        """Seconds of the n_batch chunk that starts at the depth (then back at the depth)."""
        depth = self.llm.n_tokens
        chunk = self.tokens[depth : depth + self.settings.n_batch]
        info = self.llm.kv_lazy_info() if self.kind == "lazy" else None
        if info is not None and info.phase == "f16" and depth + len(chunk) > info.n_cells_f16:
            self.llm.kv_lazy_convert()  # untimed: section 3 measures the pause
        seconds, retries, busy = run_uncontended(partial(time_chunk, self.llm, chunk))
        return {"seconds": seconds, "retries": retries, "contended": busy,
                "phase": phase(self.llm, self.kind)}


def corpus_tokens(spec: ModelSpec) -> list[int]:
    """The bench corpus, n_ctx tokens of it."""
    vocab = open_vocab(spec.key)
    try:
        return build_tokens(vocab, spec.n_ctx)
    finally:
        vocab.close()


def serve(children: dict[str, Child], commands: IO[str], replies: IO[str]) -> None:
    """Answer commands ({"op": ..., "kind": ..., "budget": seconds, ...}) until "quit" or end of input."""
    for line in commands:
        command = json.loads(line)
        op = command.pop("op")
        if op == "quit":
            break
        child = children[command.pop("kind")]
        ops: dict[str, Callable[..., dict[str, Any]]] = {
            "fill": child.fill, "decode": child.decode, "prefill": child.prefill
        }
        WAIT_BUDGET.remaining, WAIT_BUDGET.spent = command.pop("budget"), 0.0
        started = time.perf_counter()
        reply = ops[op](**command)
        reply |= {"waited_s": WAIT_BUDGET.spent, "busy_s": time.perf_counter() - started - WAIT_BUDGET.spent}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    for child in children.values():
        child.llm.close()


def child_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sweep")
    parser.add_argument("--child", required=True, help="the cache kinds this process hosts, comma-separated")
    parser.add_argument("--model", required=True)
    parser.add_argument("--n-ctx", type=int, required=True)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    kinds = args.child.split(",")
    if not set(kinds) <= set(SWEEP_KINDS):
        parser.error(f"--child: kinds are {', '.join(SWEEP_KINDS)}")
    # the protocol keeps the original stdout; anything the engine prints goes to stderr
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    settings = make_settings(args.quick, (args.model,), ("sweep",), args.n_ctx, args.n_ctx)
    spec = settings.models[0]
    tokens = corpus_tokens(spec)
    children = {kind: Child(spec, settings, kind, tokens) for kind in kinds}
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    serve(children, sys.stdin, replies)
    return 0


# --- the parent: interleave the children ----------------------------------------------------------------


class ChildProcess:
    """A child hosting the contexts of `kinds`: one for the slow q8_0-ref, and one for the three compared
    kinds, so that no process-level difference (where the allocator put the buffers, how the threads were
    placed) enters their ratios."""

    def __init__(self, spec: ModelSpec, settings: Settings, kinds: tuple[str, ...]) -> None:
        cmd = [sys.executable, "-m", "bench.sweep", "--child", ",".join(kinds), "--model", spec.key,
               "--n-ctx", str(spec.n_ctx)]
        if settings.quick:
            cmd.append("--quick")
        self.kinds = kinds
        self.busy_s = dict.fromkeys(kinds, 0.0)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._read()  # "ready": the model is loaded before anything is timed

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"sweep child {','.join(self.kinds)} exited with {self.proc.wait()}")
        return json.loads(line)

    def ask(self, op: str, kind: str, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        command = {"op": op, "kind": kind, "budget": WAIT_BUDGET.remaining} | args
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        WAIT_BUDGET.spend(reply.pop("waited_s"))
        self.busy_s[kind] += reply.pop("busy_s")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        if self.proc.wait(timeout=60) != 0:
            raise RuntimeError(f"sweep child {','.join(self.kinds)} exited with {self.proc.returncode}")


def record(out: KindSweep, reply: dict[str, Any], series: list[float], phases: list[str]) -> None:
    out.retries += reply["retries"]
    out.contended += int(reply["contended"])
    series.append(reply["seconds"])
    if len(series) == 1:
        phases.append(reply["phase"])


def run_sweep(spec: ModelSpec, settings: Settings) -> SweepResult:
    """Start the four children, then per depth: fill each, decode rounds, prefill rounds."""
    rounds = {"decode": DECODE_ROUNDS, "prefill": PREFILL_ROUNDS}
    depths = sweep_depths(spec.n_ctx, settings.n_batch)
    processes: list[ChildProcess] = []
    try:
        for kinds in PROCESS_GROUPS:  # one at a time: two model loads at once would contend
            processes.append(ChildProcess(spec, settings, kinds))
        host = {kind: proc for proc in processes for kind in proc.kinds}
        out = {kind: KindSweep(kind) for kind in SWEEP_KINDS}
        for depth in depths:
            for kind in SWEEP_KINDS:
                host[kind].ask("fill", kind, depth=depth)
                out[kind].decode_s.append([])
                out[kind].prefill_s.append([])
            for what in ("decode", "prefill"):
                for round_no in range(QUICK_ROUNDS if settings.quick else rounds[what]):
                    for kind in round_order(round_no):
                        series = getattr(out[kind], f"{what}_s")[-1]
                        reply = host[kind].ask(what, kind)
                        record(out[kind], reply, series, getattr(out[kind], f"{what}_phase"))
            report_depth(out, depth, settings.n_batch)
    finally:
        for proc in processes:
            proc.close()
    seconds = {kind: proc.busy_s[kind] for proc in processes for kind in proc.kinds}
    return SweepResult(spec, settings.n_batch, settings.decode_tokens, depths, out, seconds)


def report_depth(kinds: dict[str, KindSweep], depth: int, n_batch: int) -> None:
    for kind, out in kinds.items():
        pre = n_batch / statistics.median(out.prefill_s[-1])
        dec = 1 / statistics.median(out.decode_s[-1])
        print(f"         {kind} at {depth}: prefill {pre:.1f}, decode {dec:.1f} tok/s", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
