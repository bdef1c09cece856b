"""Section 3, the conversion pause: kv_lazy_convert() on a cache filled up to just below the breakpoint.

Measured: wall-clock pause, the engine's own timing, throughput over the f16 view, its ratio to a memcpy of
the same bytes (timed in the same run) and the peak extra resident memory during the conversion.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from llama_cpp import Llama

from bench.engine import n_layers, open_context
from bench.machine import run_uncontended
from bench.memory import RssSampler, memcpy_seconds, peak_rss_bytes, reset_peak_rss, rss_bytes
from bench.settings import ModelSpec, Settings

Q8_0_BYTES_PER_VALUE = 34 / 32  # a q8_0 block: 32 int8 values and one f16 scale
BELOW_BREAKPOINT = 16  # cells left free in the f16 view


@dataclass
class ConversionRun:
    n_cells_used: int
    wall_s: float
    engine_s: float
    extra_rss_sampled: int  # peak sampled RSS during the conversion minus RSS right before
    extra_rss_hwm: int  # VmHWM after the conversion minus RSS right before (-1: VmHWM reset refused)
    n_samples: int
    trace_s: np.ndarray = field(repr=False)
    trace_extra: np.ndarray = field(repr=False)

    @property
    def extra_rss(self) -> int:
        return max(self.extra_rss_sampled, self.extra_rss_hwm)


class TimedConversion(Protocol):
    """One timed conversion: ConversionRun here, realistic.TimedRun for bench/ladder.py."""

    @property
    def wall_s(self) -> float: ...

    @property
    def engine_s(self) -> float: ...

    @property
    def extra_rss(self) -> int: ...


class RepeatedConversions:
    """Median pause and largest extra RSS of repeated conversions."""

    runs: Sequence[TimedConversion]

    @property
    def wall_s(self) -> float:
        return statistics.median(run.wall_s for run in self.runs)

    @property
    def engine_s(self) -> float:
        return statistics.median(run.engine_s for run in self.runs)

    @property
    def extra_rss(self) -> int:
        """The largest extra RSS of all repetitions (a peak, so not the median)."""
        return max(run.extra_rss for run in self.runs)


@dataclass
class ConversionResult(RepeatedConversions):
    model: ModelSpec
    n_cells_f16: int
    n_cells_total: int
    kv_bytes: int
    n_layers: int
    runs: list[ConversionRun]
    low_fill: ConversionRun  # the same conversion with only n_batch cells used (information)
    memcpy_s: float = 0.0
    retries: int = 0  # conversions repeated because other processes used the CPU
    contended: int = 0  # measurements that stayed contended after the retries

    @property
    def f16_view_bytes(self) -> int:
        """Bytes of the f16 view (n_cells_f16 cells at 2 bytes a value): what a conversion reads."""
        values_per_cell = self.kv_bytes / (self.n_cells_total * Q8_0_BYTES_PER_VALUE)
        return round(self.n_cells_f16 * values_per_cell * 2)

    @property
    def q8_0_converted_bytes(self) -> int:
        """q8_0 bytes of the converted cells (kv_bytes * n_cells_f16 / n_cells_total): what it writes."""
        return self.kv_bytes * self.n_cells_f16 // self.n_cells_total

    @property
    def layer_k_bytes(self) -> float:
        """One layer's K tensor (kv_bytes / (2 * n_layers))."""
        return self.kv_bytes / (2 * self.n_layers)

    @property
    def median_run(self) -> ConversionRun:
        return sorted(self.runs, key=lambda run: run.wall_s)[len(self.runs) // 2]


def fill_f16(llm: Llama, tokens: list[int], n_cells: int) -> None:
    """Empty the cache (which returns it to the f16 view) and prefill n_cells tokens."""
    llm.reset()
    llm.eval(tokens[:n_cells])
    info = llm.kv_lazy_info()
    if info.phase != "f16" or info.n_cells_used != n_cells:
        raise RuntimeError(f"conversion bench: expected {n_cells} cells in the f16 view, got {info}")


def convert_once(llm: Llama, interval: float) -> ConversionRun:
    """Time kv_lazy_convert() while sampling RSS from a background thread."""
    used = llm.kv_lazy_info().n_cells_used
    gc.collect()
    with RssSampler(interval) as sampler:
        time.sleep(0.02)
        before = rss_bytes()
        hwm_ok = reset_peak_rss()
        started = time.perf_counter()
        if not llm.kv_lazy_convert():
            raise RuntimeError("conversion bench: kv_lazy_convert() had nothing to convert")
        ended = time.perf_counter()
        hwm = peak_rss_bytes() if hwm_ok else -1
        time.sleep(0.005)
    trace_s, trace_rss = sampler.trace(started, ended)
    return ConversionRun(
        n_cells_used=used,
        wall_s=ended - started,
        engine_s=llm.kv_lazy_info().last_conversion_s,
        extra_rss_sampled=max(sampler.peak_between(started, ended) - before, 0),
        extra_rss_hwm=hwm - before if hwm_ok else -1,
        n_samples=len(trace_s),
        trace_s=trace_s,
        trace_extra=trace_rss - before,
    )


def run_conversion(spec: ModelSpec, settings: Settings, tokens: list[int]) -> ConversionResult:
    llm = open_context(spec.key, "lazy", spec.n_ctx, settings)
    try:
        info = llm.kv_lazy_info()
        n_fill = info.n_cells_f16 - BELOW_BREAKPOINT
        runs, retries, contended = [], 0, 0
        for _ in range(settings.conversion_reps):
            run, tries, busy = run_uncontended(
                lambda: convert_once(llm, settings.rss_interval_s),
                prepare=lambda: fill_f16(llm, tokens, n_fill),
            )
            runs.append(run)
            retries, contended = retries + tries, contended + busy
        fill_f16(llm, tokens, min(settings.n_batch, n_fill))
        low_fill = convert_once(llm, settings.rss_interval_s)
        result = ConversionResult(
            spec, info.n_cells_f16, info.n_cells_total, info.kv_bytes, n_layers(llm), runs, low_fill
        )
    finally:
        llm.close()
    result.memcpy_s, tries, busy = run_uncontended(
        lambda: memcpy_seconds(result.f16_view_bytes, settings.memcpy_reps)
    )
    result.retries, result.contended = retries + tries, contended + busy
    return result
