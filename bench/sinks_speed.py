"""python -m bench.sinks_speed: decode speed with attention sinks (issue 49: the default's decode at depth
4096 >= 0.95x the cache without the change, paired, interleaved, with a confidence interval).

For each model and each pair below, two contexts in one process read the same SPEED_DEPTH tokens of the Python
FAQ (batches of the settings' n_batch), then SPEED_ROUNDS rounds in alternating order time
``decode_tokens`` single-token evals each (bench.speed.time_decode: back to the depth after each round); a
round's ratio is the median time without sinks over the median time with them (>= 1: the sinks are as fast
or faster). The report gives the median ratio and its 95 % order-statistic interval (bench.sweep.median_ci).

Pairs: the app's default (lazy q8_0 with its recent window and DEFAULT_KV_SINKS sinks) against the same
without sinks (the default before them), and the q4_0 ladder with the window and the sinks against it without.

And the step pause, where the sinks' rows are copied: lazy q8_0 with the window at n_ctx PAUSE_N_CTX, its f16
rung filled to PAUSE_FILL tokens (Gemma-3: its sliding-window cache's f16 rung is smaller), then
``kv_lazy_convert()``; PAUSE_ROUNDS alternating rounds with and without the sinks, a fresh context each,
the engine's own time of the step (``last_conversion_s``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
from llama_cpp import Llama

from bench.engine import model_path, open_vocab
from bench.natural_text import write_faq
from bench.recent import SPEED_DEPTH, SPEED_ROUNDS, SPEED_TARGET
from bench.report import table
from bench.settings import MODEL_LABELS, make_settings
from bench.speed import time_decode
from bench.sweep import median_ci
from lazykv.core.kinds import DEFAULT_KV_RECENT, DEFAULT_KV_SINKS

RESULT = Path(__file__).resolve().parent / "results" / "sinks_speed.md"
PAUSE_N_CTX = 8192
PAUSE_FILL = {"smollm2": 3000, "gemma3": 400}
PAUSE_ROUNDS = 6
PAIRS = (("lazy q8_0", llama_cpp.GGML_TYPE_Q8_0), ("ladder q4_0", llama_cpp.GGML_TYPE_Q4_0))


@dataclass
class Pair:
    model: str
    cache: str
    ratios: list[float] = field(default_factory=list)  # per round: seconds without sinks / with

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)


def context(key: str, ggml_type: int, sinks: int, n_threads: int, n_batch: int,
            n_ctx: int = SPEED_DEPTH + 256) -> Llama:
    return Llama(str(model_path(key)), n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
                 n_threads_batch=n_threads, flash_attn=True, swa_full=False, type_k=ggml_type,
                 type_v=ggml_type, kv_lazy_quant=True, kv_lazy_recent=DEFAULT_KV_RECENT, kv_lazy_sinks=sinks,
                 seed=1234, verbose=False)


def measure(key: str, tokens: list[int], n_threads: int, n_batch: int, decode_tokens: int) -> list[Pair]:
    pairs = []
    for name, ggml_type in PAIRS:
        contexts = {s: context(key, ggml_type, s, n_threads, n_batch) for s in (0, DEFAULT_KV_SINKS)}
        try:
            for llm in contexts.values():
                for i in range(0, SPEED_DEPTH, n_batch):
                    llm.eval(tokens[i : min(i + n_batch, SPEED_DEPTH)])
            pair = Pair(key, name)
            decode = tokens[SPEED_DEPTH : SPEED_DEPTH + decode_tokens]
            for round_no in range(SPEED_ROUNDS):
                order = (0, DEFAULT_KV_SINKS) if round_no % 2 == 0 else (DEFAULT_KV_SINKS, 0)
                seconds = {s: statistics.median(time_decode(contexts[s], decode)) for s in order}
                pair.ratios.append(seconds[0] / seconds[DEFAULT_KV_SINKS])
            pairs.append(pair)
            print(f"  {key} {name}: {pair.median:.3f}", flush=True)
        finally:
            for llm in contexts.values():
                llm.close()
    return pairs


def pause_ms(key: str, tokens: list[int], sinks: int, n_threads: int, n_batch: int) -> float:
    """The step f16 -> q8_0 of lazy q8_0 with the window and ``sinks``, in milliseconds."""
    llm = context(key, llama_cpp.GGML_TYPE_Q8_0, sinks, n_threads, n_batch, PAUSE_N_CTX)
    try:
        fill = tokens[: PAUSE_FILL[key]]
        for i in range(0, len(fill), n_batch):
            llm.eval(fill[i : i + n_batch])
        assert llm.kv_lazy_info().phase == "f16", llm.kv_lazy_info().phase
        llm.kv_lazy_convert()
        return llm.kv_lazy_info().last_conversion_s * 1000
    finally:
        llm.close()


def measure_pause(key: str, tokens: list[int], n_threads: int, n_batch: int) -> dict[int, list[float]]:
    times: dict[int, list[float]] = {0: [], DEFAULT_KV_SINKS: []}
    for round_no in range(PAUSE_ROUNDS):
        for sinks in (0, DEFAULT_KV_SINKS) if round_no % 2 == 0 else (DEFAULT_KV_SINKS, 0):
            times[sinks].append(pause_ms(key, tokens, sinks, n_threads, n_batch))
    print(f"  {key} pause: {statistics.median(times[0]):.2f} ms without sinks, "
          f"{statistics.median(times[DEFAULT_KV_SINKS]):.2f} with", flush=True)
    return times


def report(pairs: list[Pair], n_threads: int, decode_tokens: int,
           pauses: dict[str, dict[int, list[float]]] | None = None) -> str:
    rows = []
    for p in pairs:
        ci = median_ci(p.ratios)
        interval = f" ({ci[0]:.3f}-{ci[1]:.3f})" if ci else ""
        verdict = "PASS" if p.median >= SPEED_TARGET else "MISS"
        rows.append([MODEL_LABELS[p.model], f"{p.cache}, W={DEFAULT_KV_RECENT}", f"{p.median:.3f}{interval}",
                     f">= {SPEED_TARGET}", verdict])
    return "\n".join([
        "# Decode speed with attention sinks (issue 49)",
        "",
        f"`python -m bench.sinks_speed`: decode at depth {SPEED_DEPTH} (the Python FAQ), {n_threads} "
        "threads, "
        f"{SPEED_ROUNDS} paired rounds in alternating order, each the median of {decode_tokens} single-token "
        f"evals; the ratio is the time without sinks over the time with {DEFAULT_KV_SINKS} "
        "(>= 1: no slower), its median and 95 % interval.",
        "",
        table(["model", "cache", f"speed with {DEFAULT_KV_SINKS} sinks / without", "target", ""], rows),
        "",
        *pause_section(pauses or {}),
    ])


def pause_section(pauses: dict[str, dict[int, list[float]]]) -> list[str]:
    if not pauses:
        return []
    rows = []
    for key, times in pauses.items():
        without, with_ = statistics.median(times[0]), statistics.median(times[DEFAULT_KV_SINKS])
        rows.append([MODEL_LABELS[key], f"{PAUSE_FILL[key]:,}", f"{without:.2f} ({min(times[0]):.2f}-"
                     f"{max(times[0]):.2f})", f"{with_:.2f} ({min(times[DEFAULT_KV_SINKS]):.2f}-"
                     f"{max(times[DEFAULT_KV_SINKS]):.2f})", f"{with_ - without:+.2f}"])
    return [
        "## The step pause",
        "",
        f"lazy q8_0 with W={DEFAULT_KV_RECENT} at n_ctx {PAUSE_N_CTX}, the f16 rung filled, then one step to "
        f"q8_0 (`kv_lazy_convert()`, the engine's `last_conversion_s`); {PAUSE_ROUNDS} alternating rounds, a "
        "fresh context each: the medians (ranges). The sinks' copy is a constant few rows per layer, so on "
        "a fuller rung its share is smaller.",
        "",
        table(["model", "tokens on the f16 rung", "ms without sinks", f"ms with {DEFAULT_KV_SINKS}",
               "difference ms"], rows),
        "",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sinks_speed", description=__doc__)
    parser.add_argument("--models", default=",".join(MODEL_LABELS), help="comma-separated model keys")
    args = parser.parse_args(argv)
    settings = make_settings(False, tuple(args.models.split(",")), (), None, None)
    pairs, pauses = [], {}
    with tempfile.TemporaryDirectory(prefix="lazykv-sinks-") as tmp:
        corpus = write_faq(Path(tmp) / "python-faq.txt")
        for spec in settings.models:
            vocab = open_vocab(spec.key)
            try:
                tokens = vocab.tokenize(corpus.read_bytes())
            finally:
                vocab.close()
            pairs += measure(spec.key, tokens, settings.n_threads, settings.n_batch, settings.decode_tokens)
            pauses[spec.key] = measure_pause(spec.key, tokens, settings.n_threads, settings.n_batch)
    RESULT.write_text(report(pairs, settings.n_threads, settings.decode_tokens, pauses), encoding="utf-8")
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
