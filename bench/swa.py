"""Sliding-window models' context memory and going back through window checkpoints (issue 49, section 1).

``python -m bench.swa`` (part of ``make bench``) writes bench/results/swa.md for Gemma-3-270M (15 of its 18
layers attend through a 512-token window):

- the KV cache the app allocates at n_ctx 8192 and 32768 (``memory.kv_bytes``, checked against llama.cpp's
  own breakdown after a load), against the full-size sliding-window cache the app allocated before
  (``swa_full``), and the longest context the old 32k bytes now hold;
- a regenerate and an edit at depth 4k: the tokens read again and the time, against a re-read of the whole
  prompt (what a window-sized cache without checkpoints would need), median of 3;
- how far the window-sized cache's next-token logits are from the full-size cache's, against how far the
  same model's logits move between reading a prompt in one batch and token by token on one cache.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import replace
from pathlib import Path

import llama_cpp
import numpy as np

from lazykv.core.engine import memory
from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.model_meta import read_model_meta
from lazykv.core.engine.types import SamplingSettings
from lazykv.core.models import model_fetch

RESULTS = Path(__file__).resolve().parent / "results" / "swa.md"
TEXT = Path("/usr/share/common-licenses/GPL-3")
GREEDY = SamplingSettings(temperature=0.0, top_p=1.0, top_k=1, min_p=0.0, repeat_penalty=1.0, seed=1)
REPEATS = 3
MiB = 1024 * 1024


def _reply(s: EngineSession, tokens: list[int], max_tokens: int = 32) -> tuple[int, float]:
    t0 = time.perf_counter()
    stream = s.stream_tokens(tokens, [], GREEDY, threading.Event(), max_tokens=max_tokens)
    while True:
        try:
            next(stream)
        except StopIteration as end:
            return end.value.n_reused, time.perf_counter() - t0


def memory_rows(path: Path) -> list[str]:
    meta = read_model_meta(path)
    full = replace(meta, swa_layers=0)  # the full-size sliding-window cache
    rows = []
    for n_ctx in (8192, 32768):
        for mode in ("q8_0", "lazy"):
            s = EngineSession()
            info = s.load(LoadSpec(path, n_ctx=n_ctx, kv_mode=mode, n_threads=2))
            allocated = sum(m.kv for m in info.memory)
            s.close()
            recent = 128 if mode == "lazy" else 0
            planned = memory.kv_bytes(meta, n_ctx, mode, recent)
            before = memory.kv_bytes(full, n_ctx, mode, recent)
            rows.append(f"| {n_ctx} | {mode} | {allocated / MiB:.1f} | {planned / MiB:.1f} "
                        f"| {100 * (planned - allocated) / allocated:+.1f} % | {before / MiB:.1f} "
                        f"| {before / planned:.1f}x |")
    big = replace(meta, n_ctx_train=1 << 22)
    budget = memory.kv_bytes(full, 32768, "q8_0")
    longest = memory.context_for_budget(big, budget, "q8_0")
    rows.append("")
    rows.append(f"In the {budget / MiB:.0f} MiB the full-size cache took at 32k (q8_0) the window-sized one "
                f"holds {longest} tokens: {longest / 32768:.1f}x (the settings offer at most "
                f"{memory.MAX_CTX}, Gemma-3-270M was trained on {meta.n_ctx_train}).")
    return rows


def going_back(path: Path) -> list[str]:
    s = EngineSession()
    s.load(LoadSpec(path, n_ctx=8192, kv_mode="lazy", n_threads=2))
    text = s.tokenize(TEXT.read_text())
    rows = []
    try:
        for what in ("regenerate", "edit"):
            kept, took, whole = [], [], []
            for _ in range(REPEATS):
                s.clear_kv()
                _reply(s, text[:3400])  # a long first turn and its reply: a checkpoint at its end
                first = s.cached_tokens()
                turn = first + text[3400:4000]  # a 600-token turn past the window
                _reply(s, turn + text[5000:5600], 1)  # and 600 tokens after it: past the prompt's end
                again = turn if what == "regenerate" else first + text[4100:4700]
                n, seconds = _reply(s, again, 1)
                kept.append(n)
                took.append(seconds)
                s.clear_kv()
                whole.append(_reply(s, again, 1)[1])
            n_prompt = len(again)
            rows.append(f"| {what} | {n_prompt} | {n_prompt - statistics.median(kept):.0f} "
                        f"| {statistics.median(took):.2f} | {statistics.median(whole):.2f} "
                        f"| {statistics.median(whole) / statistics.median(took):.1f}x |")
    finally:
        s.close()
    return rows


def _logits(llama: llama_cpp.Llama) -> np.ndarray:
    return np.array(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama.ctx, -1),
                                          shape=(llama.n_vocab(),)))


def _kl(a: np.ndarray, b: np.ndarray) -> float:
    pa, pb = np.exp(a - a.max()), np.exp(b - b.max())
    pa, pb = pa / pa.sum(), pb / pb.sum()
    return float((pa * (np.log(pa) - np.log(pb))).sum())


def exactness(path: Path) -> list[str]:
    text = TEXT.read_text()
    rows = []
    for n in (800, 1100, 3000):
        out = {}
        cases = (("full", True, None), ("window", False, None), ("full, by token", True, 1))
        for label, swa_full, step in cases:
            llama = llama_cpp.Llama(str(path), n_ctx=4096, n_threads=2, verbose=False, swa_full=swa_full,
                                    flash_attn=True)
            tokens = llama.tokenize(text.encode())[:n]
            for start in range(0, n, step or n):
                llama.eval(tokens[start:start + (step or n)])
            out[label] = _logits(llama)
            llama.close()
        ref = out["full"]
        window, by_token = out["window"], out["full, by token"]
        rows.append(f"| {n} | {float(np.abs(window - ref).max()):.3f} | {_kl(ref, window):.5f} "
                    f"| {float(np.abs(by_token - ref).max()):.3f} | {_kl(ref, by_token):.5f} | "
                    f"{'yes' if window.argmax() == ref.argmax() else 'no'} |")
    return rows


def main() -> int:
    path = model_fetch.models_dir() / model_fetch.MODELS["gemma3"].filename
    lines = [
        "# Sliding-window models: their window's cells, and going back through window checkpoints",
        "",
        "`python -m bench.swa`: Gemma-3-270M (15 of 18 layers attend through a 512-token window), 2 CPU "
        "threads. The app loads without `swa_full`: a sliding layer's cache holds the window and a batch "
        "(1,024 cells), as llama.cpp's tools and server do.",
        "",
        "## Context memory",
        "",
        "| n_ctx | KV | allocated MiB (llama.cpp's breakdown) | planned MiB | plan off by "
        "| full-size cache MiB (before) | less |",
        "|---|---|---|---|---|---|---|",
        *memory_rows(path),
        "",
        "## Going back at depth 4k (lazy q8_0, n_ctx 8192)",
        "",
        "A 3.4k-token turn and its reply (a window checkpoint at its end), a 600-token turn and a 600-token "
        "reply (the window passes the prompt's end), then the reply regenerated, or the turn edited. *Read* "
        "counts the tokens read again (the prompt less what the cache kept); *whole* reads the prompt into "
        f"an empty cache, what a window-sized cache without checkpoints would need. Median of {REPEATS}.",
        "",
        "| going back | prompt tokens | read | seconds | whole s | faster |",
        "|---|---|---|---|---|---|",
        *going_back(path),
        "",
        "## Next-token logits: window-sized against full-size cache (f16)",
        "",
        "The same prompt read in one batch into a full-size and a window-sized cache; beside it, how far the "
        "same model's logits move between one batch and token by token on the full-size cache. Up to the "
        "window and a batch (1,024 tokens) the two caches are bit-equal; past it the attention runs over "
        "another cache shape (other cells, another order) and the kernels round differently: the difference "
        "is of the size of a changed batch, and no masked cell is counted (the argmax agrees).",
        "",
        "| tokens | max abs diff | KL | max abs diff, one batch vs by token | KL, by token | same argmax |",
        "|---|---|---|---|---|---|",
        *exactness(path),
        "",
    ]
    RESULTS.write_text("\n".join(lines), encoding="utf-8")
    print(RESULTS.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
