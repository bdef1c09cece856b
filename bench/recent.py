"""Part 5 of the "ladder" section: the recent f16 window (issue 28, native patches 0019, 0024).

1. quality: llama.cpp's own ``llama-perplexity --kl-divergence`` on the Python FAQ (``bench/natural_text``,
   Debian's python3-doc) at n_ctx RECENT_N_CTX, RECENT_CHUNKS chunks: an f16 base, plain q4_0, and the ladder
   (``LLAMA_KV_CACHE_LAZY_QUANT=1``, q4_0 K/V) with ``--kv-recent W`` for each W of RECENT_WINDOWS. The KLD
   llama-perplexity reports is over the second half of each chunk: positions 2048-4095, all on the ladder's
   q4_0 rung. Batches of RECENT_BATCH tokens, so that a batch's own tokens are in the window with the ones
   before them, as in a chat's decode;
2. memory: the ladder with the window allocates plain q4_0's bytes plus W f16 rows and a spare one
   (kv_lazy_info);
3. speed: decode at depth SPEED_DEPTH, the ladder with the default window against the ladder without it, in
   one process, SPEED_ROUNDS paired rounds in alternating order (the median ratio and its 95 % interval).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from llama_cpp import Llama

from bench.engine import model_path, open_vocab
from bench.natural_text import write_faq
from bench.report import Target, table
from bench.settings import ModelSpec, Settings
from bench.speed import time_decode
from bench.sweep import median_ci
from lazykv.core.kinds import DEFAULT_KV_RECENT

ROOT = Path(__file__).resolve().parents[1]
RECENT_WINDOWS = (0, 32, 64, 128, 256)
RECENT_N_CTX = 4096
RECENT_CHUNKS = 3  # 12,288 tokens of text, the KLD over 6,144 of them
RECENT_BATCH = 64
SPEED_DEPTH = 4096
SPEED_ROUNDS = 15
KLD_TARGET = 0.7  # the window's KLD / plain q4_0's, at W = 128
SPEED_TARGET = 0.95
TARGET_WINDOW = 128

_KLD = re.compile(r"Mean\s+KLD:\s+([0-9.eE+-]+)\s+±\s+([0-9.eE+-]+)")
_TOP = re.compile(r"Same top p:\s+([0-9.]+)\s+±\s+([0-9.]+) %")
_PPL = re.compile(r"Final estimate: PPL = ([0-9.]+)")


@dataclass(frozen=True)
class KldRun:
    name: str  # "q4_0" or "ladder W=<n>"
    window: int  # -1 for plain q4_0
    kld: float
    kld_err: float
    same_top: float  # % of positions whose top token is f16's


@dataclass
class SpeedPair:
    depth: int
    rounds: int
    ratios: list[float] = field(default_factory=list)  # per round: decode time without / with the window

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @property
    def ci(self) -> tuple[float, float] | None:
        return median_ci(self.ratios)


@dataclass
class RecentModel:
    key: str
    label: str
    base_ppl: float
    runs: list[KldRun] = field(default_factory=list)
    kv_bytes_plain: int = 0  # plain q4_0, n_ctx SPEED_DEPTH + 256
    kv_bytes_window: int = 0  # the ladder with TARGET_WINDOW
    # TARGET_WINDOW f16 rows (an f16 cache's bytes per cell) and the window's spare row: the rows of a
    # ubatch's tokens that no sequence's ring keeps are written there, never attended (lazy_win_n)
    window_rows_bytes: int = 0
    speed: SpeedPair | None = None

    def run(self, window: int) -> KldRun:
        return next(r for r in self.runs if r.window == window)

    def best_window(self) -> int:
        return min((r for r in self.runs if r.window > 0), key=lambda r: r.kld).window


@dataclass
class RecentResults:
    corpus: str
    models: list[RecentModel] = field(default_factory=list)


def tools_dir() -> Path:
    """llama.cpp's tools built from this tree (``make native-tools``; built here when missing)."""
    out = subprocess.run([sys.executable, str(ROOT / "native" / "build.py"), "tools"], check=True,
                         capture_output=True, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def perplexity(tools: Path, model: Path, corpus: Path, args: list[str], env: dict[str, str],
               log: Path, n_ctx: int = RECENT_N_CTX, chunks: int = RECENT_CHUNKS) -> str:
    cmd = [str(tools / "llama-perplexity"), "-m", str(model), "-f", str(corpus), "-c", str(n_ctx),
           "-b", str(RECENT_BATCH), "-ub", str(RECENT_BATCH), "--chunks", str(chunks), "-fa", "on", *args]
    done = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=3600)
    log.write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        raise RuntimeError(f"llama-perplexity failed ({done.returncode}): {' '.join(cmd)}; see {log}")
    return done.stdout + done.stderr


def kld_run(text: str, name: str, window: int) -> KldRun:
    kld, top = _KLD.search(text), _TOP.search(text)
    if not kld or not top:
        raise RuntimeError(f"no KLD in llama-perplexity's output for {name}")
    return KldRun(name, window, float(kld.group(1)), float(kld.group(2)), float(top.group(1)))


def measure_quality(spec: ModelSpec, settings: Settings, tools: Path, corpus: Path,
                    work: Path) -> RecentModel:
    model = model_path(spec.key)
    threads = ["-t", str(settings.n_threads)]
    base = work / f"{spec.key}.base"
    text = perplexity(tools, model, corpus, [*threads, "-ctk", "f16", "-ctv", "f16", "--kl-divergence-base",
                                              str(base)], {}, work / f"{spec.key}.f16.log")
    ppl = _PPL.search(text)
    result = RecentModel(spec.key, spec.label, float(ppl.group(1)) if ppl else float("nan"))
    q4 = ["-ctk", "q4_0", "-ctv", "q4_0", "--kl-divergence-base", str(base), "--kl-divergence", *threads]
    text = perplexity(tools, model, corpus, q4, {}, work / f"{spec.key}.q4_0.log")
    result.runs.append(kld_run(text, "q4_0", -1))
    for window in RECENT_WINDOWS:
        name = f"ladder W={window}"
        text = perplexity(tools, model, corpus, [*q4, "--kv-recent", str(window)],
                          {"LLAMA_KV_CACHE_LAZY_QUANT": "1"}, work / f"{spec.key}.ladder-{window}.log")
        result.runs.append(kld_run(text, name, window))
        print(f"  {spec.key} {name}: KLD {result.runs[-1].kld:.5f}", flush=True)
    return result


def ladder_context(spec: ModelSpec, settings: Settings, window: int, kind: str = "q4_0") -> Llama:
    import llama_cpp

    t = {"q4_0": llama_cpp.GGML_TYPE_Q4_0, "f16": llama_cpp.GGML_TYPE_F16}[kind]
    return Llama(str(model_path(spec.key)), n_ctx=SPEED_DEPTH + 256, n_batch=settings.n_batch,
                 n_threads=settings.n_threads, n_threads_batch=settings.n_threads, flash_attn=True,
                 type_k=t, type_v=t, kv_lazy_quant=window >= 0, kv_lazy_recent=max(window, 0), seed=1234,
                 verbose=False)


def measure_memory_and_speed(spec: ModelSpec, settings: Settings, tokens: list[int],
                             result: RecentModel) -> None:
    plain = ladder_context(spec, settings, -1)
    result.kv_bytes_plain = plain.kv_lazy_info().kv_bytes
    plain.close()
    f16 = ladder_context(spec, settings, -1, "f16")
    result.window_rows_bytes = f16.kv_lazy_info().kv_bytes // (SPEED_DEPTH + 256) * (TARGET_WINDOW + 1)
    f16.close()
    contexts = {w: ladder_context(spec, settings, w) for w in (0, TARGET_WINDOW)}
    try:
        result.kv_bytes_window = contexts[TARGET_WINDOW].kv_lazy_info().kv_bytes
        for llm in contexts.values():
            for i in range(0, SPEED_DEPTH, settings.n_batch):
                llm.eval(tokens[i : min(i + settings.n_batch, SPEED_DEPTH)])
        pair = SpeedPair(SPEED_DEPTH, SPEED_ROUNDS)
        decode = tokens[SPEED_DEPTH : SPEED_DEPTH + settings.decode_tokens]
        for round_no in range(SPEED_ROUNDS):
            order = (0, TARGET_WINDOW) if round_no % 2 == 0 else (TARGET_WINDOW, 0)
            seconds = {w: statistics.median(time_decode(contexts[w], decode)) for w in order}
            pair.ratios.append(seconds[0] / seconds[TARGET_WINDOW])
        result.speed = pair
    finally:
        for llm in contexts.values():
            llm.close()


def run_recent(settings: Settings) -> RecentResults:
    tools = tools_dir()
    with tempfile.TemporaryDirectory(prefix="lazykv-recent-") as tmp:
        work = Path(tmp)
        corpus = write_faq(work / "python-faq.txt")
        results = RecentResults(f"the Python FAQ ({corpus.stat().st_size:,} bytes of Debian's python3-doc)")
        for spec in settings.models:
            result = measure_quality(spec, settings, tools, corpus, work)
            vocab = open_vocab(spec.key)
            try:
                tokens = vocab.tokenize(corpus.read_bytes())
            finally:
                vocab.close()
            measure_memory_and_speed(spec, settings, tokens, result)
            results.models.append(result)
    return results


# --- the report (bench/ladder_report.py puts it in ladder.md) ---------------------------------------------


def recent_targets(r: RecentResults) -> list[Target]:
    found = []
    for m in r.models:
        plain, window = m.run(-1), m.run(TARGET_WINDOW)
        ratio = window.kld / plain.kld
        found.append(Target(m.label, "recent window", f"KLD at the q4_0 rung, W={TARGET_WINDOW} / plain q4_0 "
                            f"(llama-perplexity, n_ctx {RECENT_N_CTX})",
                            f"{window.kld:.5f} / {plain.kld:.5f} = {ratio:.3f}", f"<= {KLD_TARGET}",
                            ratio <= KLD_TARGET))
        extra = m.kv_bytes_window - m.kv_bytes_plain
        found.append(Target(m.label, "recent window", f"KV bytes, W={TARGET_WINDOW} - plain q4_0",
                            f"{extra / 2**20:.2f} MiB", f"<= {TARGET_WINDOW} f16 rows and the spare one "
                            f"({m.window_rows_bytes / 2**20:.2f} MiB)", extra <= m.window_rows_bytes))
        if m.speed is not None:
            ci = m.speed.ci
            interval = f" (95 % CI {ci[0]:.3f}-{ci[1]:.3f})" if ci else ""
            found.append(Target(m.label, "recent window",
                                f"decode at depth {m.speed.depth}, W={TARGET_WINDOW} "
                                f"/ W=0 ({m.speed.rounds} paired rounds)", f"{m.speed.median:.3f}{interval}",
                                f">= {SPEED_TARGET}", m.speed.median >= SPEED_TARGET))
    return found


def recent_section(r: RecentResults) -> str:
    lines = [
        "## 5. The recent f16 window (issue 28)",
        "",
        f"`llama-perplexity --kl-divergence` (llama.cpp's own, built from this tree) on {r.corpus}: "
        f"n_ctx {RECENT_N_CTX}, {RECENT_CHUNKS} chunks, batches of {RECENT_BATCH} tokens; the KLD is against "
        "an f16 cache over the second half of each chunk (positions 2048-4095: the ladder's q4_0 rung). "
        "The ladder runs with `LLAMA_KV_CACHE_LAZY_QUANT=1 -ctk q4_0 -ctv q4_0 --kv-recent W`.",
        "",
    ]
    rows = []
    for m in r.models:
        plain = m.run(-1)
        for run in m.runs:
            rows.append([m.label, "plain q4_0" if run.window < 0 else run.name,
                         f"{run.kld:.5f} ± {run.kld_err:.5f}", f"{run.kld / plain.kld:.3f}",
                         f"{run.same_top:.2f} %"])
    lines.append(table(["model", "cache", "mean KLD", "/ plain q4_0", "same top token"], rows))
    lines.append("")
    for m in r.models:
        best = m.best_window()
        lines.append(f"- {m.label}: f16 PPL {m.base_ppl:.3f}; the window that measures best here is W={best} "
                     f"(KLD {m.run(best).kld / m.run(-1).kld:.3f}x plain q4_0). "
                     f"Memory with W={TARGET_WINDOW}: "
                     f"{m.kv_bytes_window / 2**20:.2f} MiB against plain q4_0's "
                     f"{m.kv_bytes_plain / 2**20:.2f} MiB "
                     f"(n_ctx {SPEED_DEPTH + 256}).")
    lines.append(f"- The app's default window (`DEFAULT_KV_RECENT`) is {DEFAULT_KV_RECENT} tokens.")
    return "\n".join(lines)
