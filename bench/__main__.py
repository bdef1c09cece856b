"""python -m bench: run the sections for each model and write bench/results/lazy_kv.md plus PNG plots
(the "ladder" section: bench/results/ladder.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

from bench import ladder_report, plots
from bench.conversion import run_conversion
from bench.corpus import build_tokens, unique_token_count
from bench.engine import open_vocab
from bench.ladder import LADDER_N_CTX, LadderResults, model_pass, run_pause
from bench.lockstep import run_pass
from bench.machine import WAIT_BUDGET, OtherLoad, describe, load_average, wait_for_quiet
from bench.recent import run_recent
from bench.report import Results, StepTiming, write
from bench.settings import MODEL_LABELS, SECTIONS, ModelSpec, Settings, make_settings
from bench.sweep import SWEEP_MODELS, run_sweep

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPORT_NAME = "lazy_kv.md"
RAW_NAME = "raw.json"  # every timing of the run, for a second look at the noise
T = TypeVar("T")
STEP_WAIT_S = 300.0  # longest wait for quiet before a step (within the run's wait budget)


def csv_choice(choices: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        items = tuple(item.strip() for item in text.split(",") if item.strip())
        unknown = [item for item in items if item not in choices]
        if unknown or not items:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)}")
        return items

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke run: n_ctx 2048, fewer repetitions")
    parser.add_argument(
        "--only",
        type=csv_choice(SECTIONS),
        default=SECTIONS,
        help=f"comma-separated sections to run ({','.join(SECTIONS)})",
    )
    parser.add_argument(
        "--models",
        type=csv_choice(tuple(MODEL_LABELS)),
        default=tuple(MODEL_LABELS),
        help=f"comma-separated models ({','.join(MODEL_LABELS)})",
    )
    parser.add_argument(
        "--n-ctx", type=int, help="n_ctx of every model (default: SmolLM2 8192, Gemma-3 4096; --quick 2048)"
    )
    parser.add_argument("--gemma-ctx", type=int, help="n_ctx of Gemma-3 only (overrides --n-ctx)")
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=600.0,
        help="seconds the whole run may spend waiting for other processes to go quiet, before each step "
        "and before repeating a contended timing (0: never wait)",
    )
    parser.add_argument(
        "--out", type=Path, default=RESULTS_DIR, help=f"output directory (default {RESULTS_DIR})"
    )
    return parser.parse_args(argv)


class Clock:
    """Runs the steps: waits for a quiet machine, prints progress, records time and contention."""

    def __init__(self, results: Results) -> None:
        self.results = results
        self.started = time.perf_counter()

    def run(self, what: str, fn: Callable[[], T]) -> T:
        spent = WAIT_BUDGET.spent
        waited = wait_for_quiet(STEP_WAIT_S)
        print(f"[{time.perf_counter() - self.started:6.0f} s] {what} (waited {waited:.0f} s) ...", flush=True)
        other = OtherLoad()
        step = time.perf_counter()
        value = fn()
        elapsed = time.perf_counter() - step
        timing = StepTiming(what, elapsed, WAIT_BUDGET.spent - spent, other.cores(), load_average())
        self.results.timings.append(timing)
        print(f"         {timing.seconds:.0f} s, other processes {timing.other_cores:.2f} cores", flush=True)
        return value


def model_tokens(spec: ModelSpec) -> tuple[list[int], int]:
    """The benchmark text for the model (2 x n_ctx tokens at least) and the tokens of its first chapter."""
    vocab = open_vocab(spec.key)
    try:
        # > 2x the f16 view, which is about half of n_ctx
        return build_tokens(vocab, 2 * max(spec.n_ctx, LADDER_N_CTX)), unique_token_count(vocab)
    finally:
        vocab.close()


def run_model(spec: ModelSpec, settings: Settings, results: Results, clock: Clock) -> None:
    tokens, n_unique = model_tokens(spec)
    label = f"{spec.key} (n_ctx {spec.n_ctx})"
    want_quality, want_speed = "quality" in settings.sections, "speed" in settings.sections
    if want_quality or want_speed:
        what = " + ".join(s for s in ("quality", "speed") if s in settings.sections)
        done = clock.run(
            f"{label} {what}", lambda: run_pass(spec, settings, tokens, want_quality, want_speed)
        )
        results.passes.append(done)
        if done.quality is not None:
            done.quality.n_unique_tokens = n_unique
            results.quality.append(done.quality)
        if done.speed is not None:
            results.speed.append(done.speed)
    if "conversion" in settings.sections:
        results.conversion.append(
            clock.run(f"{label} conversion", lambda: run_conversion(spec, settings, tokens))
        )
    if "sweep" in settings.sections and spec.key in SWEEP_MODELS:
        results.sweep.append(clock.run(f"{label} depth sweep", lambda: run_sweep(spec, settings)))


def make_plots(results: Results, out: Path) -> None:
    window = results.settings.rolling_window
    for q in results.quality:
        name = f"quality_{q.model.key}.png"
        plots.plot_quality(q, window, out / name)
        results.plots.setdefault("quality", []).append(name)
    for s in results.speed:
        name = f"speed_{s.model.key}.png"
        plots.plot_speed(s, out / name)
        results.plots.setdefault("speed", []).append(name)
    if results.conversion:
        plots.plot_conversion(results.conversion, out / "conversion_rss.png")
        results.plots["conversion"] = ["conversion_rss.png"]
    for w in results.sweep:
        name = "fa_sweep.png" if w.model.key == "smollm2" else f"fa_sweep_{w.model.key}.png"
        plots.plot_sweep(w, out / name)
        results.plots.setdefault("sweep", []).append(name)


def run_ladder(settings: Settings, command: str, out: Path) -> None:
    """The "ladder" section: each model's pass, then the steps' pauses; writes ladder_report.REPORT_NAME."""
    run = Results(describe(), settings, command, load_start=load_average())
    clock = Clock(run)
    ladder = LadderResults()
    for spec in settings.models:
        tokens, _ = model_tokens(spec)
        what = f"{spec.key} ladder pass (n_ctx {LADDER_N_CTX})"
        ladder.passes.append(clock.run(what, partial(model_pass, spec, settings, tokens)))
    ladder.pause = clock.run(
        "ladder steps (Llama-3-8B KV shape)", lambda: run_pause(settings, settings.conversion_reps)
    )
    ladder.recent = clock.run("recent window (llama-perplexity, paired decode)", lambda: run_recent(settings))
    run.load_end = load_average()
    run.total_s = time.perf_counter() - clock.started
    ladder_report.write(ladder, run, out / ladder_report.REPORT_NAME)
    print(f"[{run.total_s:6.0f} s] wrote {out / ladder_report.REPORT_NAME}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = make_settings(args.quick, args.models, args.only, args.n_ctx, args.gemma_ctx)
    command = ("python -m bench " + shlex.join(sys.argv[1:] if argv is None else argv)).strip()
    WAIT_BUDGET.remaining = args.wait_idle
    args.out.mkdir(parents=True, exist_ok=True)
    if any(section != "ladder" for section in settings.sections):
        run_lazy_sections(settings, command, args.out)
    if "ladder" in settings.sections:
        run_ladder(settings, command, args.out)
    return 0


def run_lazy_sections(settings: Settings, command: str, out: Path) -> None:
    """Sections quality, speed, conversion and sweep: bench/results/lazy_kv.md, raw.json and the plots."""
    results = Results(describe(), settings, command, load_start=load_average())
    clock = Clock(results)
    for spec in settings.models:
        run_model(spec, settings, results, clock)
    results.load_end = load_average()
    results.total_s = time.perf_counter() - clock.started
    make_plots(results, out)
    write(results, out / REPORT_NAME)
    raw = json.dumps(dataclasses.asdict(results), default=str)
    (out / RAW_NAME).write_text(raw + "\n", encoding="utf-8")
    print(f"[{results.total_s:6.0f} s] wrote {out / REPORT_NAME}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
