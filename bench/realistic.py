"""python -m bench.realistic: the lazy cache at the size a laptop user runs, written to
bench/results/realistic_kv.md.

A synthetic model with Llama-3-8B's KV shape (bench/synthetic.py: 32 layers, 8 KV heads of 128) at
n_ctx 32768. Reported: the KV bytes of f16 / q8_0 / lazy caches, allocated (the engine's
``memory_breakdown()`` and the growth of resident memory when the context is created) and as the
engine reports them (``kv_lazy_info().kv_bytes``); the lazy conversion pause inside the decode that
does not fit the full f16 view, the engine's own figure for it and the GB/s of f16 it converted; the
same decode on a plain q8_0 cache holding the same cells (the wall cost of the conversion is the
difference); the peak extra resident memory during the conversion.

The f16 view (17,408 cells) is filled by restoring a whole-context state: the K/V rows of 512 tokens
really decoded, repeated to every cell. Decoding 17k tokens through 32 layers of 32 heads of 128
takes over an hour on a 2-core CPU (the attention is quadratic in the depth) and would measure the
prefill, not the conversion, which reads and writes the same bytes whatever the rows hold.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import statistics
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import Llama

from bench.engine import cache_params
from bench.machine import CONTENTION_CORES, OtherLoad, describe, load_average, wait_for_quiet
from bench.memory import RssSampler, peak_rss_bytes, reset_peak_rss, rss_bytes
from bench.synthetic import LLAMA3_8B_KV, KvShape, kv_bytes_per_cell, synthetic_model

RESULTS = Path(__file__).resolve().parent / "results" / "realistic_kv.md"
N_CTX = 32768
N_SEED = 512  # tokens really decoded; their rows fill the f16 view
KINDS = ("f16", "q8_0", "lazy")
BYTES_PER_VALUE = {"f16": 2.0, "q8_0": 34 / 32, "lazy": 34 / 32}  # a lazy cache is allocated as q8_0
GB = 1e9
GIB = 1024**3


def open_context(model: Path, kind: str, n_threads: int, n_ctx: int = N_CTX) -> Llama:
    """A context over the synthetic model whose K and V cache is `kind` (see bench.engine.CACHE_KINDS)."""
    return Llama(str(model), n_ctx=n_ctx, n_batch=N_SEED, n_ubatch=N_SEED, n_threads=n_threads,
                 n_threads_batch=n_threads, flash_attn=True, seed=1234, verbose=False, **cache_params(kind))


@dataclass
class Allocation:
    kind: str
    expected: int  # n_ctx cells of K and V at the type's bytes per value
    breakdown: int  # KV bytes of memory_breakdown(), summed over its buffers
    engine: int  # kv_lazy_info().kv_bytes
    rss_growth: int  # resident memory the context added (the cache is cleared, so touched, at creation;
    # the compute and output buffers too)


def measure_allocation(model: Path, kind: str, shape: KvShape, n_threads: int) -> Allocation:
    gc.collect()
    before = rss_bytes()
    llm = open_context(model, kind, n_threads)
    try:
        grown = rss_bytes() - before
        info = llm.kv_lazy_info()
        breakdown = sum(use.kv for use in llm.memory_breakdown())
        expected = round(N_CTX * kv_bytes_per_cell(shape, BYTES_PER_VALUE[kind]))
        return Allocation(kind, expected, breakdown, info.kv_bytes, grown)
    finally:
        llm.close()


STATE_EXT_TAG = 0x6C6B7678  # LLAMA_STATE_EXT_TAG ('lkvx'): a state's extension block starts with it


def _u32(blob: bytes | bytearray, off: int) -> tuple[int, int]:
    return struct.unpack_from("<I", blob, off)[0], off + 4


@dataclass
class SeedState:
    """A whole-context state split into the parts a longer one is built from."""

    header: bytes  # architecture, stream count, rotation sizes, storage types, layer count
    v_trans: int
    n_layer: int
    tensors: list[tuple[int, int, np.ndarray]]  # (ggml type, row bytes, rows [n_cells, row]): K, then V

    @classmethod
    def parse(cls, blob: bytes) -> SeedState:
        n_arch, off = _u32(blob, 0)
        off += n_arch  # the architecture
        first, after = _u32(blob, off)
        if first == STATE_EXT_TAG:  # extension block (storage types, lazy phase): tag, version, size, entries
            off = after + 4 + 4 + _u32(blob, after + 4)[0]
        off += 4 * 3  # n_stream, n_rot_k, n_rot_v
        header = blob[:off]
        n_cells, off = _u32(blob, off)
        for _ in range(n_cells):
            n_seq, off = _u32(blob, off + 4)  # position, then the sequence ids
            off += 4 * n_seq
        v_trans, off = _u32(blob, off)
        n_layer, off = _u32(blob, off)
        tensors = []
        for _ in range(2 * n_layer):
            ggml_type, row = struct.unpack_from("<iQ", blob, off)
            off += 12
            rows = np.frombuffer(blob, np.uint8, n_cells * row, off).reshape(n_cells, row)
            tensors.append((ggml_type, row, rows))
            off += n_cells * row
        if off != len(blob) or v_trans != 0:
            raise RuntimeError("realistic bench: the seed state is not a single non-transposed cache")
        return cls(header, v_trans, n_layer, tensors)

    def repeated(self, n_cells: int) -> bytearray:
        """The same cache with n_cells cells of sequence 0 at positions 0..n_cells-1, rows repeated."""
        cells = np.zeros(n_cells, dtype=[("pos", "<i4"), ("n_seq", "<u4"), ("seq", "<i4")])
        cells["pos"], cells["n_seq"] = np.arange(n_cells), 1
        size = (len(self.header) + 4 + cells.nbytes + 8
                + sum(12 + n_cells * row for _, row, _ in self.tensors))
        blob = bytearray(size)
        off = len(self.header)
        blob[:off] = self.header
        struct.pack_into("<I", blob, off, n_cells)
        off += 4
        blob[off : off + cells.nbytes] = cells.tobytes()
        off += cells.nbytes
        struct.pack_into("<II", blob, off, self.v_trans, self.n_layer)
        off += 8
        picks = np.arange(n_cells) % len(self.tensors[0][2])
        for ggml_type, row, rows in self.tensors:
            struct.pack_into("<iQ", blob, off, ggml_type, row)
            off += 12
            np.frombuffer(blob, np.uint8, n_cells * row, off).reshape(n_cells, row)[:] = rows[picks]
            off += n_cells * row
        return blob


def whole_state(llm: Llama) -> bytes:
    size = llama_cpp.llama_state_get_size(llm.ctx)
    buf = (ctypes.c_uint8 * size)()
    if llama_cpp.llama_state_get_data(llm.ctx, buf, size) != size:
        raise RuntimeError("realistic bench: the state was not written whole")
    return bytes(buf)


def seed_state(model: Path, n_threads: int) -> SeedState:
    """The f16 rows of N_SEED decoded tokens (a small lazy context, still in its f16 phase)."""
    llm = open_context(model, "lazy", n_threads, n_ctx=4 * N_SEED)
    try:
        llm.eval([(7 * i + 3) % LLAMA3_8B_KV.n_vocab for i in range(N_SEED)])
        if llm.kv_lazy_info().phase != "f16":
            raise RuntimeError("realistic bench: the seed context left its f16 phase")
        return SeedState.parse(whole_state(llm))
    finally:
        llm.close()


def restore(llm: Llama, blob: bytearray, n_cells: int) -> None:
    """The cache holds the blob's n_cells cells; the next eval decodes at position n_cells."""
    llm.reset()
    buf = (ctypes.c_uint8 * len(blob)).from_buffer(blob)
    if llama_cpp.llama_state_set_data(llm.ctx, buf, len(blob)) != len(blob):
        raise RuntimeError("realistic bench: the engine refused the filled state")
    llm.n_tokens = n_cells
    last = llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(llm.ctx), 0)
    if last != n_cells - 1:
        raise RuntimeError(f"realistic bench: last position {last} after restoring {n_cells} cells")


@dataclass
class TimedRun:
    wall_s: float
    engine_s: float  # the conversion as the engine timed it (0: none happened)
    extra_rss: int  # the larger of the sampled peak and VmHWM, minus RSS right before
    other_cores: float  # CPU other processes used meanwhile


def timed(
    llm: Llama, action: Callable[[], object], interval_s: float = 0.002, sample: bool = True
) -> TimedRun:
    """``action`` (a decode after the restored cells, or a conversion alone) timed, RSS sampled meanwhile.

    ``sample=False`` leaves the sampling thread out (extra_rss is then VmHWM's alone): on 2 cores its wake-ups
    every interval_s take time from the threads of a conversion, which a user's pause does not have.
    """
    gc.collect()
    conversions = llm.kv_lazy_info().n_conversions
    with RssSampler(interval_s) if sample else contextlib.nullcontext() as sampler:
        time.sleep(0.02)
        before = rss_bytes()
        hwm_ok = reset_peak_rss()
        other = OtherLoad()
        started = time.perf_counter()
        action()
        ended = time.perf_counter()
        cores = other.cores()
        hwm = peak_rss_bytes() if hwm_ok else 0
    info = llm.kv_lazy_info()
    engine_s = info.last_conversion_s if info.n_conversions > conversions else 0.0
    extra = max(sampler.peak_between(started, ended) if sampler else 0, hwm) - before
    return TimedRun(ended - started, engine_s, max(extra, 0), cores)


@dataclass
class PauseResult:
    n_cells: int
    f16_bytes: int  # the f16 view the conversion read
    lazy: list[TimedRun] = field(default_factory=list)  # the decode that converts
    q8_0: list[TimedRun] = field(default_factory=list)  # the same decode on a plain q8_0 cache
    convert: list[TimedRun] = field(default_factory=list)  # kv_lazy_convert() alone, no decode

    def median(self, runs: list[TimedRun], what: str) -> float:
        return statistics.median(getattr(run, what) for run in runs)

    @property
    def wall_cost_s(self) -> float:
        """What the conversion added to the decode: lazy minus plain q8_0 (medians)."""
        return self.median(self.lazy, "wall_s") - self.median(self.q8_0, "wall_s")


def measure_pause(model: Path, seed: SeedState, shape: KvShape, n_threads: int, reps: int) -> PauseResult:
    lazy = open_context(model, "lazy", n_threads)
    n_cells = lazy.kv_lazy_info().n_cells_f16
    blob = seed.repeated(n_cells)
    result = PauseResult(n_cells, round(n_cells * kv_bytes_per_cell(shape, 2.0)))
    try:
        actions = ((result.lazy, lambda: lazy.eval([1])), (result.convert, lazy.kv_lazy_convert))
        for _ in range(reps):
            for runs, action in actions:
                restore(lazy, blob, n_cells)
                if lazy.kv_lazy_info().phase != "f16":
                    raise RuntimeError("realistic bench: the restored lazy cache is not in its f16 phase")
                wait_for_quiet(60.0)
                runs.append(timed(lazy, action))
                if lazy.kv_lazy_info().phase != "q8_0":
                    raise RuntimeError("realistic bench: the full f16 view did not convert")
    finally:
        lazy.close()
    q8_0 = open_context(model, "q8_0", n_threads)
    try:
        for _ in range(reps):
            restore(q8_0, blob, n_cells)
            wait_for_quiet(60.0)
            result.q8_0.append(timed(q8_0, lambda: q8_0.eval([1])))
    finally:
        q8_0.close()
    return result


def _gib(n: float) -> str:
    return f"{n / GIB:.3f} GiB"


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def _allocation_lines(allocations: list[Allocation], pause: PauseResult) -> list[str]:
    lines = [
        "## KV bytes",
        "",
        "| cache | expected (n_ctx × bytes a cell) | allocated: memory_breakdown() | allocated: RSS growth "
        "at creation | engine: kv_lazy_info().kv_bytes |",
        "|---|---|---|---|---|",
    ]
    for a in allocations:
        lines.append(f"| {a.kind} | {_gib(a.expected)} | {_gib(a.breakdown)} | {_gib(a.rss_growth)} | "
                     f"{_gib(a.engine)} |")
    return [*lines, "",
            "RSS growth also counts the compute and output buffers the context allocates. A lazy cache is "
            "allocated as q8_0 (34 bytes per 32 values) and holds its f16 phase in the first bytes of that "
            f"memory: {pause.n_cells} cells of {N_CTX} before it converts.", ""]


def _pause_lines(pause: PauseResult) -> list[str]:
    engine_s = pause.median(pause.lazy, "engine_s")
    cost = pause.wall_cost_s
    ratio = f"{engine_s / cost:.2f}" if cost > 0 else "n/a (the difference is below the decodes' noise)"
    speed = f"{pause.f16_bytes / engine_s / GB:.2f} GB/s" if engine_s > 0 else "n/a"
    convert_wall = pause.median(pause.convert, "wall_s")
    convert_engine = pause.median(pause.convert, "engine_s")
    runs = ", ".join(f"lazy {1000 * r.wall_s:.0f} ms (engine {1000 * r.engine_s:.0f} ms, other processes "
                     f"{r.other_cores:.2f} cores)" for r in pause.lazy)
    plain = ", ".join(f"{1000 * r.wall_s:.0f} ms (other processes {r.other_cores:.2f} cores)"
                      for r in pause.q8_0)
    alone = ", ".join(f"{1000 * r.wall_s:.0f} ms (engine {1000 * r.engine_s:.0f} ms, other processes "
                      f"{r.other_cores:.2f} cores)" for r in pause.convert)
    busiest = max(r.other_cores for r in pause.lazy + pause.q8_0 + pause.convert)
    warning = (f"**Other processes used up to {busiest:.2f} cores during these timings** (more than "
               f"{CONTENTION_CORES} is contended on this machine): the figures are not worth comparing "
               "with a quiet run." if busiest > CONTENTION_CORES else "")
    return [
        "## The conversion pause",
        "",
        *([warning, ""] if warning else []),
        f"The f16 view filled ({pause.n_cells} cells, {_gib(pause.f16_bytes)} of f16 K and V; rows of "
        f"{N_SEED} decoded tokens restored into every cell, see the module's docstring), then one token "
        "decoded: it does not fit the view, so the cache converts to q8_0 inside that decode. The same "
        "decode on a plain q8_0 cache holding the same cells is the reference. "
        f"Medians of {len(pause.lazy)}.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| decode that converts (wall) | {1000 * pause.median(pause.lazy, 'wall_s'):.0f} ms |",
        f"| same decode, plain q8_0 cache (wall) | {1000 * pause.median(pause.q8_0, 'wall_s'):.0f} ms |",
        f"| wall cost of the conversion (difference) | {1000 * cost:.0f} ms |",
        f"| conversion as the engine reports it (kv_lazy_info) | {1000 * engine_s:.0f} ms |",
        f"| reported / wall cost | {ratio} |",
        f"| f16 converted per second (engine's figure) | {speed} |",
        f"| kv_lazy_convert() alone, no decode (wall / engine) | {1000 * convert_wall:.0f} ms / "
        f"{1000 * convert_engine:.0f} ms ({pause.f16_bytes / convert_wall / GB:.2f} GB/s wall) |",
        f"| peak extra RSS during kv_lazy_convert() | {_mib(max(r.extra_rss for r in pause.convert))} |",
        f"| peak extra RSS during the converting decode | {_mib(max(r.extra_rss for r in pause.lazy))} |",
        f"| peak extra RSS during the plain q8_0 decode | {_mib(max(r.extra_rss for r in pause.q8_0))} |",
        "",
        f"Each run: {runs}; plain q8_0: {plain}; kv_lazy_convert() alone: {alone}.",
        "",
        "One token at depth 17,408 through 32 heads of 128 in 32 layers takes seconds on a CPU, so the "
        "difference between the two decodes is only meaningful on a quiet machine; kv_lazy_convert() "
        "alone times the same conversion without a decode around it.",
        "",
    ]


def report(allocations: list[Allocation], pause: PauseResult, shape: KvShape, command: str,
           n_threads: int, seconds: float) -> str:
    machine = describe()
    head = [
        "# The lazy KV cache at a realistic scale (Llama-3-8B KV shape, n_ctx 32768)",
        "",
        f"`{command}` on {machine.cpu_model} ({machine.n_cpus} CPUs, {machine.mem_total_gb:.0f} GB), "
        f"{machine.engine}, git {machine.git}, {machine.date}; {n_threads} threads; {seconds:.0f} s in all; "
        f"load average at the end {load_average()}.",
        "",
        f"Model: synthetic (bench/synthetic.py), {shape.n_layer} layers, {shape.n_head} query heads, "
        f"{shape.n_head_kv} KV heads of {shape.head_dim} (Llama-3-8B's KV cache: "
        f"{kv_bytes_per_cell(shape, 2.0) / 1024:.0f} KiB a token in f16), n_embd {shape.n_embd}, "
        f"vocabulary {shape.n_vocab}; flash attention; K and V of the same type.",
        "",
    ]
    return "\n".join(head + _allocation_lines(allocations, pause) + _pause_lines(pause))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.realistic", description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="conversions timed (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="engine threads (default 2)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"report file (default {RESULTS})")
    args = parser.parse_args(argv)
    command = "python -m bench.realistic " + " ".join(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    model = synthetic_model(LLAMA3_8B_KV)
    allocations = [measure_allocation(model, kind, LLAMA3_8B_KV, args.threads) for kind in KINDS]
    seed = seed_state(model, args.threads)
    pause = measure_pause(model, seed, LLAMA3_8B_KV, args.threads, args.reps)
    text = report(allocations, pause, LLAMA3_8B_KV, command.strip(), args.threads,
                  time.perf_counter() - started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
