"""The markdown report: machine and settings, targets with PASS/MISS, one table per section, plots."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from bench.conversion import ConversionResult
from bench.lockstep import PassResult
from bench.machine import CONTENTION_CORES, RETRIES, Machine
from bench.quality import COMPARED, QualityResult
from bench.settings import Settings
from bench.speed import SpeedResult
from bench.sweep import SweepResult

MIB = 1024**2
DECODE_TARGET = 0.97
KLD_TOLERANCE = 1.10
PAUSE_TARGET = 2.0
SWEEP_TARGET = 0.95


@dataclass(frozen=True)
class StepTiming:
    what: str
    seconds: float
    waited_s: float  # waited for other processes to go quiet, before and during the step
    other_cores: float  # CPU used by other processes during the step, in cores
    load: str  # load average after the step


@dataclass
class Results:
    machine: Machine
    settings: Settings
    command: str
    quality: list[QualityResult] = field(default_factory=list)
    speed: list[SpeedResult] = field(default_factory=list)
    conversion: list[ConversionResult] = field(default_factory=list)
    sweep: list[SweepResult] = field(default_factory=list)
    passes: list[PassResult] = field(default_factory=list)
    timings: list[StepTiming] = field(default_factory=list)
    load_start: str = ""
    load_end: str = ""
    total_s: float = 0.0
    plots: dict[str, list[str]] = field(default_factory=dict)  # section -> PNG file names


@dataclass(frozen=True)
class Target:
    model: str
    section: str
    metric: str
    measured: str
    target: str
    passed: bool


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(passed: bool) -> str:
    return "PASS" if passed else "**MISS**"


def mib(n_bytes: float) -> str:
    return f"{n_bytes / MIB:.2f} MiB"


def quality_targets(q: QualityResult) -> list[Target]:
    before = q.mean_kld("lazy", after=False)
    lazy_after, q8_after = q.mean_kld("lazy", after=True), q.mean_kld("q8_0", after=True)
    ratio = lazy_after / q8_after if q8_after > 0 else float("inf")
    return [
        Target(
            q.model.label,
            "quality",
            "lazy mean KLD before the breakpoint",
            f"{before:.3g}",
            "exactly 0",
            before == 0.0,
        ),
        Target(
            q.model.label,
            "quality",
            "lazy / q8_0 mean KLD after the breakpoint",
            f"{ratio:.3f} ({lazy_after:.3g} / {q8_after:.3g})",
            f"<= {KLD_TOLERANCE:.2f}",
            lazy_after <= KLD_TOLERANCE * q8_after,
        ),
    ]


def speed_targets(s: SpeedResult) -> list[Target]:
    rows = []
    for depth in s.depths:
        base = s.baseline(depth)
        ratio = s.decode_median("lazy", depth) / s.decode_median(base, depth)
        busy = s.contended_at.get(depth, 0)
        measured = f"{ratio:.3f}" + (f" ({busy} timings contended)" if busy else "")
        metric = f"decode at depth {depth}: lazy ({s.lazy_phase[depth]}) / {base}"
        rows.append(
            Target(
                s.model.label, "speed", metric, measured, f">= {DECODE_TARGET:.2f}", ratio >= DECODE_TARGET
            )
        )
    return rows


def conversion_targets(c: ConversionResult) -> list[Target]:
    ratio = c.wall_s / c.memcpy_s
    return [
        Target(
            c.model.label,
            "conversion",
            "pause / memcpy of the f16 view",
            f"{ratio:.1f}x ({1000 * c.wall_s:.0f} ms / {1000 * c.memcpy_s:.1f} ms)",
            f"<= {PAUSE_TARGET:.0f}x",
            ratio <= PAUSE_TARGET,
        ),
        Target(
            c.model.label,
            "conversion",
            "peak extra RSS during the conversion",
            mib(c.extra_rss),
            f"<= one layer's K ({mib(c.layer_k_bytes)})",
            c.extra_rss <= c.layer_k_bytes,
        ),
    ]


def sweep_targets(w: SweepResult) -> list[Target]:
    rows = []
    for what in ("prefill", "decode"):
        for i, depth in enumerate(w.depths):
            ratio = w.ratio(what, "q8_0", i)
            rows.append(
                Target(
                    w.model.label,
                    "sweep",
                    f"{what} at depth {depth}: q8_0 / f16",
                    f"{ratio:.3f}{ci_text(w.ratio_ci(what, 'q8_0', i))}",
                    f">= {SWEEP_TARGET:.2f}",
                    ratio >= SWEEP_TARGET,
                )
            )
    return rows


def all_targets(r: Results) -> list[Target]:
    found: list[Target] = []
    for q in r.quality:
        found += quality_targets(q)
    for s in r.speed:
        found += speed_targets(s)
    for c in r.conversion:
        found += conversion_targets(c)
    for w in r.sweep:
        found += sweep_targets(w)
    return found


def header_section(r: Results) -> str:
    m, s = r.machine, r.settings
    title = "# Lazy q8_0 KV cache: benchmark report"
    if s.quick:
        title += "\n\n**QUICK SMOKE RUN (`--quick`): small n_ctx and few repetitions, not for decisions.**"
    models = ", ".join(f"{spec.label} (n_ctx {spec.n_ctx})" for spec in s.models)
    rows = [
        ["date", m.date],
        ["CPU", f"{m.cpu_model}, {m.n_cpus} logical CPUs"],
        ["RAM", f"{m.mem_total_gb:.1f} GiB"],
        ["OS", m.os],
        ["engine", m.engine],
        ["Python / numpy", f"{m.python} / {m.numpy}"],
        ["project revision", m.git],
        ["command", f"`{r.command}`"],
        ["models", models],
        [
            "context settings",
            f"n_threads {s.n_threads}, n_batch {s.n_batch} (= n_ubatch), "
            f"flash_attn {s.flash_attn}, K and V of the same type",
        ],
        ["caches", "f16 (plain), q8_0 (plain), lazy (q8_0 with kv_lazy_quant=True)"],
        [
            "quality/speed pass",
            "f16, q8_0 and lazy contexts decode the same text in lockstep, in n_batch chunks split at the "
            "breakpoint and at the decode depths",
        ],
        [
            "decode timing",
            f"{s.decode_tokens} single-token evals after 1 untimed one, {s.decode_reps} repetitions; "
            "tok/s = 1 / median time of all timed tokens",
        ],
        [
            "conversion",
            f"{s.conversion_reps} repetitions (median pause, largest memory), "
            f"RSS sampled every {1000 * s.rss_interval_s:g} ms, memcpy best of {s.memcpy_reps}",
        ],
        ["load average (1/5/15 min)", f"start {r.load_start}, end {r.load_end}"],
        [
            "run time",
            f"{r.total_s:.0f} s, of which {sum(t.waited_s for t in r.timings):.0f} s waiting for quiet",
        ],
    ]
    return (
        title
        + "\n\nGenerated by `python -m bench`; see `bench/README.md` for what each number means.\n\n"
        + table(["", ""], rows)
    )


def targets_section(targets: list[Target]) -> str:
    rows = [[t.model, t.section, t.metric, t.measured, t.target, verdict(t.passed)] for t in targets]
    n_miss = sum(not t.passed for t in targets)
    return f"## Targets: {len(targets) - n_miss} PASS, {n_miss} MISS\n\n" + table(
        ["model", "section", "metric", "measured", "target", "result"], rows
    )


def quality_section(results: list[QualityResult], plots: list[str]) -> str:
    rows = []
    for q in results:
        for kind in COMPARED:
            rows.append(
                [
                    q.model.label,
                    kind,
                    f"{q.mean_kld(kind, False):.3g}",
                    f"{q.mean_kld(kind, True):.3g}",
                    f"{100 * q.top1_rate(kind, False):.2f} %",
                    f"{100 * q.top1_rate(kind, True):.2f} %",
                ]
            )
    notes = [
        f"- {q.model.label}: {q.n_tokens} positions evaluated (n_ctx) of a {q.n_corpus_tokens}-token text; "
        f"breakpoint n_cells_f16 = {q.n_cells_f16}; the lazy cache converted when position "
        f"{q.conversion_pos} was decoded; lazy logits before it bit-identical to f16: "
        f"{'yes' if q.lazy_identical_before else 'NO'} (max |diff| {q.lazy_max_abs_diff_before:.3g}). "
        f"The first {q.n_unique_tokens} tokens are new text; the later chapters repeat its paragraphs (other "
        f"order, other name), which the model can copy from the context, so every cache's KLD is lower "
        f"there: compare caches within a region, not the regions."
        for q in results
    ]
    body = table(["model", "cache", "mean KLD before", "mean KLD after", "top-1 before", "top-1 after"], rows)
    return (
        "## 1. Quality against f16\n\nKLD(f16 || cache) per position in nats, from float64 softmax of the "
        "logits; before = positions decoded while the lazy cache was still f16, after = the rest.\n\n"
        + body
        + "\n\n"
        + "\n".join(notes)
        + "\n\n"
        + images(plots)
    )


def decode_rows(s: SpeedResult) -> list[list[str]]:
    rows = []
    for d in s.depths:
        base = s.baseline(d)
        lazy, f16 = s.decode_median("lazy", d), s.decode_median("f16", d)
        rows.append(
            [
                s.model.label,
                str(d),
                s.lazy_phase[d],
                f"{f16:.1f}",
                f"{s.decode_median('q8_0', d):.1f}",
                f"{lazy:.1f}",
                base,
                f"{lazy / s.decode_median(base, d):.3f}",
                paired_spread(s, d, base),
                f"{lazy / f16:.3f}",
            ]
        )
    return rows


def paired_spread(s: SpeedResult, depth: int, base: str) -> str:
    """min-max over the repetitions of lazy / baseline tok/s (each repetition times both back to back)."""
    ratios = [a / b for a, b in zip(s.decode_reps("lazy", depth), s.decode_reps(base, depth), strict=True)]
    return f"{min(ratios):.2f}-{max(ratios):.2f}"


PREFILL_REGIONS = {  # region -> (baseline, description)
    "before": ("f16", "lazy still f16"),
    "crossing": ("q8_0", "the chunk during which lazy converts (pause included)"),
    "after": ("q8_0", "lazy converted"),
}


def prefill_rows(s: SpeedResult) -> list[list[str]]:
    rows = []
    for region, (base, note) in PREFILL_REGIONS.items():
        lazy, f16 = s.prefill_tok_s("lazy", region), s.prefill_tok_s("f16", region)
        rows.append(
            [
                s.model.label,
                s.region_positions(region),
                note,
                f"{f16:.0f}",
                f"{s.prefill_tok_s('q8_0', region):.0f}",
                f"{lazy:.0f}",
                base,
                f"{lazy / s.prefill_tok_s(base, region):.3f}",
                f"{lazy / f16:.3f}",
            ]
        )
    return rows


def speed_section(results: list[SpeedResult], plots: list[str]) -> str:
    decode = table(
        [
            "model",
            "depth",
            "lazy phase",
            "f16 tok/s",
            "q8_0 tok/s",
            "lazy tok/s",
            "baseline",
            "lazy / baseline",
            "per repetition",
            "lazy / f16",
        ],
        [row for s in results for row in decode_rows(s)],
    )
    prefill = table(
        [
            "model",
            "positions",
            "region",
            "f16 tok/s",
            "q8_0 tok/s",
            "lazy tok/s",
            "baseline",
            "lazy / baseline",
            "lazy / f16",
        ],
        [row for s in results for row in prefill_rows(s)],
    )
    notes = "\n".join(
        f"- {s.model.label}: {s.retries} decode timings repeated because other processes used the CPU, "
        f"{s.contended} still contended after {RETRIES} tries; {sum(s.chunk_contended)} of {len(s.chunks)} "
        f"prefill chunks contended (left out)."
        for s in results
    )
    logits = (
        "the logits of every position were requested (for the quality section), which adds the output layer "
        "for each token: about 20 % more work for SmolLM2, about 2.5x for Gemma-3 and its 262k vocabulary, "
        "so differences between caches look smaller than in a plain prompt"
        if results[0].all_logits
        else "only the last position's logits were requested, as for a prompt"
    )
    return (
        "## 2. Speed at equal depth\n\nThe three caches hold the same tokens (the quality pass); at each "
        "depth every one times single-token decodes, in an order reversed every other repetition. "
        "Baseline: the plain cache the lazy one currently is (f16 before the breakpoint, q8_0 after).\n\n"
        f"### Decode (tok/s = 1 / median token time; {results[0].n_decode} single-token evals x repetitions)"
        "\n\n"
        + decode
        + "\n\n### Prefill (tok/s over the n_batch chunks of the pass)\n\n"
        + f"Tokens / seconds summed over the chunks of each region; {logits}.\n\n"
        + prefill
        + "\n\n"
        + notes
        + "\n\n"
        + images(plots)
    )


def conversion_rows(c: ConversionResult) -> list[list[str]]:
    return [
        [
            c.model.label,
            str(c.runs[0].n_cells_used),
            f"{1000 * c.wall_s:.1f}",
            f"{1000 * c.engine_s:.1f}",
            mib(c.f16_view_bytes),
            f"{c.f16_view_bytes / c.wall_s / 1e9:.2f}",
            f"{1000 * c.memcpy_s:.2f}",
            f"{c.wall_s / c.memcpy_s:.1f}x",
            mib(c.extra_rss),
            mib(c.layer_k_bytes),
            mib(c.kv_bytes),
            f"{1000 * c.low_fill.wall_s:.1f} ({c.low_fill.n_cells_used} cells)",
        ]
    ]


def automatic_conversion_notes(passes: list[PassResult]) -> str:
    return "\n".join(
        f"- {p.model.label}: in the quality/speed pass the lazy cache converted by itself while decoding "
        f"positions {p.conversion_chunk[0]}-{p.conversion_chunk[1]} (engine: {1000 * p.conversion_s:.1f} ms)."
        for p in passes
        if p.conversion_chunk[0] >= 0
    )


def conversion_section(results: list[ConversionResult], plots: list[str], passes: list[PassResult]) -> str:
    body = table(
        [
            "model",
            "cells used",
            "pause ms (wall)",
            "engine ms",
            "f16 view",
            "GB/s",
            "memcpy ms",
            "pause / memcpy",
            "extra RSS",
            "one layer K",
            "whole cache",
            "pause ms, low fill",
        ],
        [row for c in results for row in conversion_rows(c)],
    )
    runs = "\n".join(
        f"- {c.model.label}: pauses {', '.join(f'{1000 * run.wall_s:.1f}' for run in c.runs)} ms; extra RSS "
        f"sampled {', '.join(mib(run.extra_rss_sampled) for run in c.runs)}, by VmHWM "
        f"{', '.join(mib(run.extra_rss_hwm) if run.extra_rss_hwm >= 0 else 'n/a' for run in c.runs)}; "
        f"{c.n_layers} layers; n_cells {c.n_cells_f16} (f16) / {c.n_cells_total} (q8_0); q8_0 bytes written "
        f"for the converted cells {mib(c.q8_0_converted_bytes)}; {c.retries} conversions repeated because "
        f"other processes used the CPU, {c.contended} still contended after {RETRIES} tries."
        for c in results
    )
    automatic = automatic_conversion_notes(passes)
    return (
        "## 3. Conversion pause\n\n`kv_lazy_convert()` on a lazy cache filled to just below the breakpoint. "
        "GB/s and the memcpy are over the bytes of the f16 view (what the conversion reads); extra RSS is "
        "the larger of the highest sampled RSS and VmHWM, minus RSS right before the call.\n\n"
        + body
        + "\n\n"
        + runs
        + ("\n" + automatic if automatic else "")
        + "\n\n"
        + images(plots)
    )


def rounds_of(w: SweepResult, kind: str, what: str) -> int:
    return len(getattr(w.kinds[kind], f"{what}_s")[0])


def ci_text(ci: tuple[float, float] | None) -> str:
    return "" if ci is None else f" ({ci[0]:.3f}-{ci[1]:.3f})"


def sweep_rows(w: SweepResult) -> list[list[str]]:
    rows = []
    for what, rate in (("prefill", w.prefill_tok_s), ("decode", w.decode_tok_s)):
        for i, depth in enumerate(w.depths):
            lazy_phase = (
                w.kinds["lazy"].prefill_phase[i] if what == "prefill" else w.kinds["lazy"].decode_phase[i]
            )
            rows.append(
                [
                    what,
                    str(depth),
                    *(f"{rate(kind, i):.1f}" for kind in ("f16", "q8_0-ref", "q8_0", "lazy")),
                    lazy_phase,
                    f"{w.ratio(what, 'q8_0-ref', i):.3f}",
                    f"**{w.ratio(what, 'q8_0', i):.3f}**{ci_text(w.ratio_ci(what, 'q8_0', i))}",
                    f"{w.ratio(what, 'lazy', i):.3f}",
                ]
            )
    return rows


def sweep_section(results: list[SweepResult], plots: list[str]) -> str:
    parts = []
    for w in results:
        body = table(
            [
                "phase",
                "depth",
                "f16 tok/s",
                "q8_0-ref tok/s",
                "q8_0 tok/s",
                "lazy tok/s",
                "lazy is",
                "q8_0-ref / f16",
                "q8_0 / f16",
                "lazy / f16",
            ],
            sweep_rows(w),
        )
        busy = sum(k.contended for k in w.kinds.values())
        retried = sum(k.retries for k in w.kinds.values())
        took = ", ".join(f"{kind} {s:.0f} s" for kind, s in w.seconds.items())
        n = partial(rounds_of, w)
        parts.append(
            f"### {w.model.label}, n_ctx {w.model.n_ctx}\n\n{body}\n\n"
            f"- Rounds per depth: prefill {n('f16', 'prefill')}, decode {n('f16', 'decode')} (lazy: the "
            f"first {n('lazy', 'prefill')} / {n('lazy', 'decode')}, q8_0-ref: the first "
            f"{n('q8_0-ref', 'prefill')}); each round times f16 and q8_0 next to each other in alternating "
            f"order, then lazy, then q8_0-ref; prefill: the {w.n_batch}-token chunk starting at the depth, "
            f"n_batch / median seconds; decode: 1 / median over rounds of the round's median seconds per "
            f"token ({w.n_decode} single-token evals); ratios: median over rounds of the kind's speed / "
            f"f16's speed in the same round, for q8_0 with its 95 % confidence interval (order statistics "
            f"of the per-round ratios; the spread of a single paired ratio here is about ±10 %).\n"
            f"- {retried} timings repeated because other processes used the CPU, {busy} still contended; "
            f"children worked {took}."
        )
    return (
        "## 4. Depth sweep: CPU flash attention over q8_0\n\n"
        "q8_0-ref: a q8_0 cache on ggml-cpu's reference paths (`llama_set_cpu_use_ref`: the vec-only "
        "flash attention kernel, which dequantizes V per query, as the engine did before patch 0003; "
        "also the plain MUL_MAT for the rotation and no op fusion); q8_0: the tiled prefill and "
        "split-KV decode paths of patch 0003. "
        "f16, q8_0 and lazy share one process, q8_0-ref has its own; the kinds are timed interleaved, so "
        "drift of the shared machine hits all of them alike; the lazy cache is converted (untimed) "
        "before the first chunk that does not fit its f16 view.\n\n"
        + "\n\n".join(parts)
        + "\n\n"
        + images(plots)
    )


def timings_section(r: Results) -> str:
    rows = [
        [t.what, f"{t.seconds:.0f}", f"{t.waited_s:.0f}", f"{t.other_cores:.2f}", t.load] for t in r.timings
    ]
    return "## Run time per step\n\n" + table(
        [
            "step",
            "seconds (after the first wait)",
            "waited for quiet, s",
            "other processes' CPU, cores",
            "load average after",
        ],
        rows,
    )


def contention_warning(r: Results) -> str:
    busy = [t.what for t in r.timings if t.other_cores > CONTENTION_CORES]
    if not busy:
        return ""
    return (
        f"**WARNING: other processes used more than {CONTENTION_CORES} cores during: {', '.join(busy)}. "
        f"With n_threads = 2 on a 2-core machine such contention slows decoding many-fold; treat those "
        f"timings as unreliable (see the last table).**"
    )


def images(names: list[str]) -> str:
    return "\n\n".join(f"![{name}]({name})" for name in names)


def render(r: Results) -> str:
    parts = [header_section(r), contention_warning(r), targets_section(all_targets(r))]
    parts = [part for part in parts if part]
    if r.quality:
        parts.append(quality_section(r.quality, r.plots.get("quality", [])))
    if r.speed:
        parts.append(speed_section(r.speed, r.plots.get("speed", [])))
    if r.conversion:
        parts.append(conversion_section(r.conversion, r.plots.get("conversion", []), r.passes))
    if r.sweep:
        parts.append(sweep_section(r.sweep, r.plots.get("sweep", [])))
    parts.append(timings_section(r))
    return "\n\n".join(parts) + "\n"


def write(r: Results, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(r), encoding="utf-8")
