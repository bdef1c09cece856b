"""The markdown report of the "ladder" section (bench/ladder.py): bench/results/ladder.md."""

from __future__ import annotations

from pathlib import Path

from bench.ladder import (
    LADDER_N_CTX,
    SPEED_SPAN,
    LadderPass,
    LadderResults,
    MemoryRow,
    PauseResult,
    StepResult,
)
from bench.recent import recent_section, recent_targets
from bench.report import (
    DECODE_TARGET,
    KLD_TOLERANCE,
    Results,
    Target,
    contention_warning,
    mib,
    table,
    targets_section,
    timings_section,
)

REPORT_NAME = "ladder.md"
PAUSE_TARGET = 1.5  # pause / memcpy of the bytes a step reads
LABELS = {"lazy": "lazy q8_0", "ladder": "ladder (q4_0)", "ladder_q5_0": "ladder to q5_0"}
GB = 1e9


def label(kind: str) -> str:
    return LABELS.get(kind, kind)


def memory_of(p: LadderPass, kind: str) -> MemoryRow:
    return next(row for row in p.memory if row.kind == kind)


def last_region(p: LadderPass, ladder: str) -> tuple[str, int, int]:
    return p.regions(ladder)[-1]


def kld_ratio(p: LadderPass, ladder: str) -> tuple[float, float, float]:
    """(ladder's mean KLD on its last rung, the plain cache of that type on the same positions, ratio)."""
    rung, a, b = last_region(p, ladder)
    mine, plain = p.mean_kld(ladder, a, b), p.mean_kld(rung, a, b)
    return mine, plain, mine / plain if plain > 0 else float("inf")


# --- targets ----------------------------------------------------------------------------------------------


def pass_targets(p: LadderPass) -> list[Target]:
    model = p.model.label
    ladder, q4 = memory_of(p, "ladder"), memory_of(p, "q4_0")
    f16, q8 = memory_of(p, "f16"), memory_of(p, "q8_0")
    found = [
        Target(
            model,
            "memory",
            "ladder tokens per GiB = plain q4_0's",
            f"{ladder.tokens_per_gib:,.0f} ({ladder.tokens_per_gib / f16.tokens_per_gib:.2f}x f16, "
            f"{ladder.tokens_per_gib / q8.tokens_per_gib:.2f}x q8_0)",
            f"= {q4.tokens_per_gib:,.0f}",
            ladder.tokens_per_gib >= q4.tokens_per_gib,
        )
    ]
    for kind in ("ladder", "ladder_q5_0"):
        _, a, b = p.regions(kind)[0]
        kld = p.mean_kld(kind, a, b)
        found.append(
            Target(
                model,
                "quality",
                f"{label(kind)}: mean KLD on the f16 rung (positions {a}-{b})",
                f"{kld:.3g} (bit-identical: {'yes' if p.identical_f16[kind] else 'no'})",
                "exactly 0",
                kld == 0.0 and p.identical_f16[kind],
            )
        )
        mine, plain, ratio = kld_ratio(p, kind)
        rung, a, b = last_region(p, kind)
        found.append(
            Target(
                model,
                "quality",
                f"{label(kind)}: mean KLD on the {rung} rung / plain {rung} (positions {a}-{b})",
                f"{mine:.5f} / {plain:.5f} = {ratio:.3f}",
                f"<= {KLD_TOLERANCE:.2f}",
                ratio <= KLD_TOLERANCE,
            )
        )
    for s in p.speed:
        ratio = s.ratio("decode_tok_s")
        found.append(
            Target(
                model,
                "speed",
                f"decode, ladder on {s.rung} / plain {s.rung} (depth {s.depth})",
                f"{ratio:.3f}",
                f">= {DECODE_TARGET}",
                ratio >= DECODE_TARGET,
            )
        )
    return found


def step_targets(s: StepResult) -> list[Target]:
    ratio = s.pause_s / s.memcpy_s
    return [
        Target(
            "Llama-3-8B KV shape",
            "pause",
            f"{s.step.name}: pause / memcpy of the bytes it reads",
            f"{ratio:.2f}x",
            f"<= {PAUSE_TARGET}x",
            ratio <= PAUSE_TARGET,
        ),
        Target(
            "Llama-3-8B KV shape",
            "pause",
            f"{s.step.name}: peak extra RSS",
            mib(s.extra_rss),
            f"<= one layer's K ({mib(s.layer_bytes)})",
            s.extra_rss <= s.layer_bytes,
        ),
    ]


def all_targets(r: LadderResults) -> list[Target]:
    found = [t for p in r.passes for t in pass_targets(p)]
    if r.pause is not None:
        found += [t for s in r.pause.steps for t in step_targets(s)]
    if r.recent is not None:
        found += recent_targets(r.recent)
    return found


# --- tables -----------------------------------------------------------------------------------------------


def memory_section(passes: list[LadderPass]) -> str:
    rows = []
    for p in passes:
        f16, q8 = memory_of(p, "f16"), memory_of(p, "q8_0")
        for row in p.memory:
            rungs = " / ".join(f"{rung} {cells}" for rung, cells in row.rungs)
            rows.append(
                [
                    p.model.label,
                    label(row.kind),
                    rungs,
                    mib(row.kv_bytes),
                    f"{row.tokens_per_gib:,.0f}",
                    f"{row.tokens_per_gib / f16.tokens_per_gib:.2f}x",
                    f"{row.tokens_per_gib / q8.tokens_per_gib:.2f}x",
                ]
            )
    return (
        f"## 1. Tokens per GiB of KV memory (n_ctx {LADDER_N_CTX})\n\n"
        "The KV bytes the engine allocated (`kv_lazy_info().kv_bytes`) and the cells each rung holds in "
        "them (`n_cells_f16` / `n_cells_q8` / `n_cells_total`; a plain cache: n_ctx). Tokens per GiB = "
        "cells of the last rung / kv_bytes.\n\n"
        + table(["model", "cache", "rungs (cells)", "KV bytes", "tokens per GiB", "vs f16", "vs q8_0"], rows)
    )


def region_table(p: LadderPass, ladder: str, kinds: tuple[str, ...]) -> str:
    regions = p.regions(ladder)
    header = ["cache"] + [f"{rung} rung ({a}-{b}): KLD / top-1" for rung, a, b in regions]
    rows = [
        [label(kind)]
        + [f"{p.mean_kld(kind, a, b):.5f} / {100 * p.top1_rate(kind, a, b):.1f} %" for _, a, b in regions]
        for kind in kinds
    ]
    return table(header, rows)


def quality_section(passes: list[LadderPass]) -> str:
    parts = [
        f"## 2. KLD against f16 per region (n_ctx {LADDER_N_CTX}, `bench/corpus.txt`)\n\n"
        "One pass over the text's first n_ctx tokens: f16, q8_0, q4_0, q5_0, ladder and q5_0-ladder "
        "contexts decode the same n_batch chunks in lockstep (chunks split where a rung fills, so that "
        "each fills exactly), every position's logits compared with f16's: mean KL(f16 || cache) in "
        "nats and the share of positions with f16's top-1 token. A region is the positions a ladder "
        "decoded while on that rung; the plain caches are shown over the same positions."
    ]
    for p in passes:
        parts.append(
            f"### {p.model.label}\n\nRegions of the q4_0 ladder:\n\n"
            + region_table(p, "ladder", ("q8_0", "q4_0", "q5_0", "ladder"))
            + "\n\nRegions of the q5_0 ladder:\n\n"
            + region_table(p, "ladder_q5_0", ("q8_0", "q5_0", "q4_0", "ladder_q5_0"))
        )
    return "\n\n".join(parts)


def pause_section(pause: PauseResult) -> str:
    rows = []
    for s in pause.steps:
        rows.append(
            [
                s.step.name,
                f"{s.n_cells:,}",
                mib(s.bytes_read),
                f"{1000 * s.pause_s:.0f}",
                f"{1000 * s.wall_s:.0f}",
                f"{1000 * s.engine_s:.0f}",
                f"{1000 * s.memcpy_s:.0f}",
                f"{s.pause_s / s.memcpy_s:.2f}x",
                f"{s.bytes_read / s.pause_s / GB:.2f}",
                mib(s.extra_rss),
                mib(s.layer_bytes),
            ]
        )
    runs = "; ".join(
        f"{s.step.name}: "
        + ", ".join(f"{1000 * r.wall_s:.0f} ms ({r.other_cores:.2f} cores)" for r in s.runs)
        + " sampled, "
        + ", ".join(f"{1000 * r.wall_s:.0f} ms" for r in s.unsampled)
        + " not"
        for s in pause.steps
    )
    return (
        f"## 3. The pause of each step (Llama-3-8B KV shape, n_ctx {pause.n_ctx})\n\n"
        "The synthetic model of `bench/realistic.py` (32 layers, 8 KV heads of 128), its cache as a "
        "ladder; the rung a step reads is filled whole by restoring a state built from 512 decoded "
        "tokens (restoring more cells than the f16 rung holds puts the cache on the q8_0 rung), then "
        '`kv_lazy_convert()` (one step) or `kv_lazy_convert("q4_0")` (direct) is timed, alternately with '
        "RSS sampled and without the sampling thread (its wake-ups every 2 ms can take time from the "
        "conversion's threads on 2 cores). The pause is the fastest of all "
        f"{len(pause.steps[0].runs) + len(pause.steps[0].unsampled)} runs; the median of the sampled ones is "
        f"shown beside it. {pause.n_threads} threads. memcpy: numpy `copyto` of "
        "the bytes the step reads, best of 7, on as many threads as the step (issue 28). Extra RSS: the "
        "larger of the sampled peak and VmHWM, minus RSS before, the largest of the sampled repetitions.\n\n"
        + table(
            [
                "step",
                "cells read",
                "bytes read",
                "pause ms (fastest)",
                "wall ms (median, sampled)",
                "engine ms (median, sampled)",
                "memcpy ms",
                "pause / memcpy",
                "GB/s read",
                "extra RSS",
                "one layer's K",
            ],
            rows,
        )
        + f"\n\nEach run (other processes' CPU): {runs}. Timings repeated for contention: "
        f"{pause.retries}, still contended: {pause.contended}."
    )


def speed_section(passes: list[LadderPass]) -> str:
    rows = []
    for p in passes:
        for s in p.speed:
            rows.append(
                [
                    p.model.label,
                    s.rung,
                    str(s.depth),
                    f"{s.median('decode_tok_s', 'ladder'):.1f}",
                    f"{s.median('decode_tok_s', s.rung):.1f}",
                    f"{s.ratio('decode_tok_s'):.3f}",
                    f"{s.median('prefill_tok_s', 'ladder'):.0f}",
                    f"{s.median('prefill_tok_s', s.rung):.0f}",
                    f"{s.ratio('prefill_tok_s'):.3f}",
                ]
            )
    contended = sum(p.contended for p in passes)
    retried = sum(p.retries for p in passes)
    return (
        "## 4. Decode and prefill per rung against the plain cache of that type\n\n"
        f"During the pass of section 2, {SPEED_SPAN} cells below the end of each rung of the q4_0 "
        "ladder, the ladder and the plain cache of the rung's type (holding the same tokens) are timed "
        "in alternating order: decode = 1 untimed + the next tokens of the text one at a time (tok/s = "
        f"1 / median token time); prefill = the next {SPEED_SPAN} tokens in one eval (last logits only); "
        "both cut back to the depth after. Ratio = median over repetitions of ladder / plain, each pair "
        f"back to back. Timings repeated for contention: {retried}, still contended: {contended}.\n\n"
        + table(
            [
                "model",
                "rung",
                "depth",
                "decode ladder tok/s",
                "decode plain tok/s",
                "decode ratio",
                "prefill ladder tok/s",
                "prefill plain tok/s",
                "prefill ratio",
            ],
            rows,
        )
    )


# --- what this says -------------------------------------------------------------------------------------


def last_rung_sentence(p: LadderPass) -> str:
    """q4_0 against q5_0 as the last rung: tokens gained against KLD paid, on the same positions."""
    q4, q5 = memory_of(p, "ladder"), memory_of(p, "ladder_q5_0")
    gain = q4.tokens_per_gib / q5.tokens_per_gib
    _, a, b = last_region(p, "ladder")
    cost = p.mean_kld("q4_0", a, b) / p.mean_kld("q5_0", a, b)
    better = "q5_0" if cost > gain else "q4_0"
    mine4, _, ratio4 = kld_ratio(p, "ladder")
    mine5, _, ratio5 = kld_ratio(p, "ladder_q5_0")
    return (
        f"The q4_0 last rung holds {gain:.2f}x the tokens of q5_0 in the same memory, at "
        f"{cost:.2f}x q5_0's KLD on the same positions ({a}-{b}); the ladders' own last rungs: "
        f"q4_0 {mine4:.5f} ({ratio4:.2f}x plain q4_0), q5_0 {mine5:.5f} ({ratio5:.2f}x plain q5_0). "
        f"Counting the KLD factor against the token factor, **{better}** is the better trade here."
    )


def q8_rung_sentence(p: LadderPass) -> str:
    _, a, b = p.regions("ladder")[1]
    return (
        f"On its q8_0 rung ({a}-{b}) the ladder's KLD is {p.mean_kld('ladder', a, b):.5f}, plain q8_0's "
        f"{p.mean_kld('q8_0', a, b):.5f} on the same positions."
    )


def model_summary(p: LadderPass) -> str:
    ladder, f16, q8 = memory_of(p, "ladder"), memory_of(p, "f16"), memory_of(p, "q8_0")
    q5 = memory_of(p, "ladder_q5_0")
    speed = "; ".join(
        f"{s.rung} rung decode {s.ratio('decode_tok_s'):.2f}, prefill {s.ratio('prefill_tok_s'):.2f}"
        for s in p.speed
    )
    return (
        f"- {p.model.label}: the ladder holds {ladder.tokens_per_gib / f16.tokens_per_gib:.2f}x the "
        f"tokens of f16 and {ladder.tokens_per_gib / q8.tokens_per_gib:.2f}x those of q8_0 per GiB "
        f"(q5_0 ladder {q5.tokens_per_gib / f16.tokens_per_gib:.2f}x f16); its f16 rung is "
        f"{'' if p.identical_f16['ladder'] else '**not** '}bit-identical to f16. "
        + q8_rung_sentence(p)
        + " "
        + last_rung_sentence(p)
        + f" Speed, ladder / plain cache of the rung's type: {speed}."
    )


def summary_section(r: LadderResults, run: Results) -> str:
    lines = ["## What this says", ""]
    lines += [model_summary(p) for p in r.passes]
    lines.append(
        "- The better trade: q4_0 is called the better last rung when its KLD factor over q5_0 (plain "
        "caches, same positions) is at most its token factor (22/18 = 1.22x, a q5_0 block over a q4_0 "
        "block), q5_0 otherwise."
    )
    if r.pause is not None:
        worst = max(r.pause.steps, key=lambda s: s.pause_s / s.memcpy_s)
        best = min(r.pause.steps, key=lambda s: s.pause_s / s.memcpy_s)
        lines.append(
            f"- Pauses (Llama-3-8B KV shape): from {best.pause_s / best.memcpy_s:.1f}x memcpy "
            f"({best.step.name}, {1000 * best.pause_s:.0f} ms for {mib(best.bytes_read)}) to "
            f"{worst.pause_s / worst.memcpy_s:.1f}x ({worst.step.name}, {1000 * worst.pause_s:.0f} ms for "
            f"{mib(worst.bytes_read)}); largest extra RSS {mib(max(s.extra_rss for s in r.pause.steps))}. "
            "The memcpy runs on as many threads as the steps."
        )
    if contention_warning(run):
        lines.append(
            "- Other processes used the CPU during the steps the warning above names: their timings are not "
            "worth comparing with a quiet run; memory and KLD do not depend on it."
        )
    return "\n".join(lines)


def header(run: Results) -> str:
    m = run.machine
    models = ", ".join(spec.label for spec in run.settings.models)
    return (
        f"# The lazy ladder f16 -> q8_0 -> q4_0: benchmark report (issue 14)\n\n"
        f'Generated by `{run.command}` (the "ladder" section of `make bench`, `bench/README.md`) on '
        f"{m.cpu_model} ({m.n_cpus} CPUs, {m.mem_total_gb:.0f} GiB), {m.os}, {m.engine}, git {m.git}, "
        f"{m.date}. Models: {models}; n_threads {run.settings.n_threads}, n_batch {run.settings.n_batch}, "
        f"flash attention, K and V of the same type. Load average at the start {run.load_start}, at the "
        f"end {run.load_end}; {run.total_s:.0f} s in all, "
        f"{sum(t.waited_s for t in run.timings):.0f} s of it waiting for quiet."
    )


def render(r: LadderResults, run: Results) -> str:
    parts = [header(run), contention_warning(run), targets_section(all_targets(r)), summary_section(r, run)]
    if r.passes:
        parts += [memory_section(r.passes), quality_section(r.passes)]
    if r.pause is not None:
        parts.append(pause_section(r.pause))
    if r.passes:
        parts.append(speed_section(r.passes))
    if r.recent is not None:
        parts.append(recent_section(r.recent))
    parts.append(timings_section(run))
    return "\n\n".join(part for part in parts if part) + "\n"


def write(r: LadderResults, run: Results, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(r, run), encoding="utf-8")
