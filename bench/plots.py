"""PNG plots of the report (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from bench.conversion import ConversionResult  # noqa: E402
from bench.quality import COMPARED, QualityResult  # noqa: E402
from bench.speed import SpeedResult  # noqa: E402
from bench.sweep import SWEEP_KINDS, SweepResult  # noqa: E402

COLORS = {"f16": "tab:blue", "q8_0": "tab:orange", "lazy": "tab:green", "q8_0-ref": "tab:red"}
MB = 1024**2


def rolling_mean(values: np.ndarray, window: int, breakpoint: int) -> tuple[np.ndarray, np.ndarray]:
    """Centred rolling mean, computed separately on both sides of the breakpoint (no smearing across it)."""
    xs, ys = [], []
    for start, end in ((0, breakpoint), (breakpoint, len(values))):
        part = values[start:end].astype(np.float64)
        w = min(window, len(part))
        if w == 0:
            continue
        ys.append(np.convolve(part, np.ones(w) / w, mode="valid"))
        xs.append(np.arange(len(ys[-1])) + start + (w - 1) / 2)
        xs.append(np.array([np.nan]))  # a gap in the line at the breakpoint
        ys.append(np.array([np.nan]))
    return np.concatenate(xs), np.concatenate(ys)


def mark_breakpoint(ax: plt.Axes, result: QualityResult) -> None:
    ax.axvline(result.n_cells_f16, color="k", linestyle="--", linewidth=1, label="breakpoint (n_cells_f16)")
    if 0 <= result.conversion_pos != result.n_cells_f16:
        ax.axvline(result.conversion_pos, color="r", linestyle=":", linewidth=1, label="actual conversion")


def plot_quality(result: QualityResult, window: int, path: Path) -> None:
    breakpoint = result.conversion_pos if result.conversion_pos >= 0 else result.n_tokens
    fig, (ax_kld, ax_top) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for kind in COMPARED:
        style = {"color": COLORS[kind], "label": kind, "linewidth": 2.2 if kind == "lazy" else 1.2}
        ax_kld.plot(*rolling_mean(result.kld[kind], window, breakpoint), **style)
        x, y = rolling_mean(result.top1[kind], window, breakpoint)
        ax_top.plot(x, 100 * y, **style)
    mark_breakpoint(ax_kld, result)
    mark_breakpoint(ax_top, result)
    ax_kld.set_ylabel(f"KLD(f16 || cache), nats\nrolling mean of {window}")
    ax_kld.set_ylim(bottom=0)
    ax_top.set_ylabel(f"top-1 agreement with f16, %\nrolling mean of {window}")
    ax_top.set_xlabel("token position")
    ax_kld.set_title(f"{result.model.label}, n_ctx {result.model.n_ctx}: q8_0 and lazy caches against f16")
    ax_kld.legend(loc="upper left")
    ax_top.legend(loc="lower left")
    for ax in (ax_kld, ax_top):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_speed(result: SpeedResult, path: Path) -> None:
    fig, (ax_dec, ax_pre) = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.27
    ticks = np.arange(len(result.depths))
    for i, kind in enumerate(("f16", "q8_0", "lazy")):
        medians = [result.decode_median(kind, d) for d in result.depths]
        reps = [result.decode_reps(kind, d) for d in result.depths]
        lows = [max(m - min(r), 0) for m, r in zip(medians, reps, strict=True)]
        highs = [max(max(r) - m, 0) for m, r in zip(medians, reps, strict=True)]
        ax_dec.bar(
            ticks + (i - 1) * width,
            medians,
            width,
            yerr=[lows, highs],
            color=COLORS[kind],
            label=kind,
            capsize=3,
        )
        mids = [(a + b) / 2 for a, b in result.chunks]
        rates = [
            np.nan if busy else (b - a) / s
            for (a, b), s, busy in zip(
                result.chunks, result.chunk_s[kind], result.chunk_contended, strict=True
            )
        ]
        ax_pre.plot(mids, rates, ".-", color=COLORS[kind], label=kind)
    ax_dec.set_xticks(ticks, [f"{d}\n(lazy: {result.lazy_phase[d]})" for d in result.depths])
    ax_dec.set_xlabel("depth (cached tokens)")
    ax_dec.set_ylabel("decode tok/s (1 / median token time;\nbars: min-max of the repetitions)")
    ax_dec.set_title(f"decode: {result.n_decode} single-token evals at each depth")
    ax_pre.axvline(result.n_cells_f16, color="k", linestyle="--", linewidth=1, label="breakpoint")
    ax_pre.set_xlabel("chunk position (middle)")
    ax_pre.set_ylabel("prefill tok/s")
    logits = "all logits" if result.all_logits else "last logits"
    ax_pre.set_title(f"prefill per chunk of the pass ({logits}; contended left out)")
    ax_pre.set_ylim(bottom=0)
    top = max(
        max(r)
        for kind in ("f16", "q8_0", "lazy")
        for r in (result.decode_reps(kind, d) for d in result.depths)
    )
    ax_dec.set_ylim(0, 1.25 * top)
    ax_dec.legend(loc="upper center", ncols=3)
    ax_pre.legend(loc="best")
    for ax in (ax_dec, ax_pre):
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"{result.model.label}, n_ctx {result.model.n_ctx}, breakpoint {result.n_cells_f16}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_conversion(results: list[ConversionResult], path: Path) -> None:
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        run = result.median_run
        label = f"extra RSS ({run.n_samples} samples)"
        ax.plot(1000 * run.trace_s, run.trace_extra / MB, ".-", markersize=3, label=label)
        ax.axhline(result.layer_k_bytes / MB, color="r", linestyle="--", label="one layer's K tensor")
        if run.extra_rss_hwm >= 0:
            ax.axhline(run.extra_rss_hwm / MB, color="k", linestyle=":", label="VmHWM - RSS before")
        ax.set_xlabel("ms since kv_lazy_convert() started")
        ax.set_ylabel("RSS - RSS before, MiB")
        ax.set_title(f"{result.model.label}: pause {1000 * run.wall_s:.0f} ms (median run)")
        ax.legend(loc="best")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(result: SweepResult, path: Path, target: float = 0.95) -> None:
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5), sharex=True)
    depths = result.depths
    for col, (what, rate) in enumerate((("prefill", result.prefill_tok_s), ("decode", result.decode_tok_s))):
        ax_abs, ax_rel = axes[0][col], axes[1][col]
        for kind in SWEEP_KINDS:
            values = [rate(kind, i) for i in range(len(depths))]
            style = {"color": COLORS[kind], "label": kind, "linestyle": ":" if kind == "lazy" else "-"}
            ax_abs.plot(depths, values, "o", **style)
            if kind != "f16":
                ax_rel.plot(depths, [result.ratio(what, kind, i) for i in range(len(depths))], "o", **style)
        ax_rel.axhline(target, color="k", linestyle="--", linewidth=1, label=f"target {target:.2f}")
        ax_abs.set_title(
            f"{what} ({result.n_batch}-token chunk)" if what == "prefill" else "decode (1 token)"
        )
        ax_abs.set_ylabel(f"{what} tok/s")
        ax_rel.set_ylabel("tok/s / f16 tok/s")
        ax_rel.set_xlabel("depth (cached tokens)")
        ax_abs.set_ylim(bottom=0)
        ax_rel.set_ylim(0, max(1.2, ax_rel.get_ylim()[1]))
        for ax in (ax_abs, ax_rel):
            ax.grid(alpha=0.3)
            ax.legend(loc="best", fontsize="small")
    fig.suptitle(f"{result.model.label}, n_ctx {result.model.n_ctx}: CPU flash attention by depth")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
