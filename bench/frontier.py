"""The frontier of KV caches (issue 49, section 2): tokens per GiB against KLD, for every plain cache type,
K and V apart, and the ladders with and without their recent f16 window and attention sinks, one with K
and V stepping apart to types of their own.

``python -m bench.frontier`` writes bench/results/frontier.md and frontier.png.

1. quality: llama.cpp's own ``llama-perplexity --kl-divergence`` (built from this tree) on the Python FAQ
   (``bench/natural_text``), as the ladder report's part 5 runs it (``bench/recent``): n_ctx 4096, 3
   chunks, batches of 64 tokens, the KLD against an f16 cache over the second half of each chunk
   (positions 2048-4095: a ladder's last rung);
2. memory: each cache's KV bytes as the engine allocates them at n_ctx 4096 (``kv_lazy_info().kv_bytes``,
   any cache), as tokens per GiB and as a multiple of plain q8_0's;
3. the frontier: a cache is on it when no other holds more tokens per GiB at a KLD no higher. The goal of
   issue 49: plain q8_0's KLD or better while holding at least 1.5x q8_0's tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from llama_cpp import Llama

from bench.engine import CACHE_KINDS, model_path
from bench.natural_text import write_faq
from bench.recent import RECENT_CHUNKS, RECENT_N_CTX, kld_run, perplexity, tools_dir
from bench.report import table
from bench.settings import MODEL_LABELS, Settings
from lazykv.core.kinds import DEFAULT_KV_RECENT, DEFAULT_KV_SINKS

RESULTS = Path(__file__).resolve().parent / "results"
RAW = RESULTS / "frontier.json"  # the measurements, so that the report can be written again (--report-only)
TOKENS_GOAL = 1.5  # x plain q8_0's tokens per GiB
NEAR_GOAL = 1.1  # x plain q8_0's KLD: "about q8_0's quality", for the sentence on the closest cache
# the app's default cache (KvMode.LAZY with its recent window and sinks): the report says where it sits
DEFAULT_NAME = f"lazy q8_0, W={DEFAULT_KV_RECENT}, S={DEFAULT_KV_SINKS} (the app's default)"
LAZY_ENV = {"LLAMA_KV_CACHE_LAZY_QUANT": "1"}  # llama.cpp's tools run the lazy cache with the seed's switch


@dataclass(frozen=True)
class Cache:
    name: str
    type_k: str
    type_v: str
    window: int = -1  # -1: a plain cache; otherwise the ladder (lazy) with this recent window
    sinks: int = 0  # and these attention sinks (each sequence's first tokens in f16)

    @property
    def lazy(self) -> bool:
        return self.window >= 0


CACHES = (
    Cache("q8_0", "q8_0", "q8_0"),
    Cache("lazy q8_0", "q8_0", "q8_0", 0),
    Cache(f"lazy q8_0, W={DEFAULT_KV_RECENT}", "q8_0", "q8_0", DEFAULT_KV_RECENT),
    Cache(DEFAULT_NAME, "q8_0", "q8_0", DEFAULT_KV_RECENT, DEFAULT_KV_SINKS),
    Cache("q5_0", "q5_0", "q5_0"),
    Cache("q4_0", "q4_0", "q4_0"),
    Cache("K q8_0, V q5_0", "q8_0", "q5_0"),
    Cache("K q8_0, V q4_0", "q8_0", "q4_0"),
    Cache("K q5_0, V q4_0", "q5_0", "q4_0"),
    Cache("ladder q5_0", "q5_0", "q5_0", 0),
    Cache("ladder q5_0, W=32", "q5_0", "q5_0", 32),
    Cache("ladder q5_0, W=64", "q5_0", "q5_0", 64),
    Cache("ladder q5_0, W=128", "q5_0", "q5_0", 128),
    Cache("ladder q5_0, W=32, S=4", "q5_0", "q5_0", 32, 4),
    Cache("ladder q5_0, W=128, S=4", "q5_0", "q5_0", 128, 4),
    Cache("ladder q4_0", "q4_0", "q4_0", 0),
    Cache("ladder q4_0, W=128", "q4_0", "q4_0", 128),
    Cache("ladder q4_0, W=128, S=4", "q4_0", "q4_0", 128, 4),
    Cache("ladder q4_0, W=128, S=16", "q4_0", "q4_0", 128, 16),
    Cache("ladder q4_0, W=512", "q4_0", "q4_0", 512),
    Cache("ladder K q8_0, V q4_0, W=128, S=4", "q8_0", "q4_0", 128, 4),
    Cache("ladder K q5_0, V q4_0, W=32, S=4", "q5_0", "q4_0", 32, 4),
    Cache("ladder K q5_0, V q4_0, W=128, S=4", "q5_0", "q4_0", 128, 4),
    Cache("ladder K q8_0, V q5_0, W=128, S=4", "q8_0", "q5_0", 128, 4),
)

@dataclass
class Point:
    cache: Cache
    kld: float
    kld_err: float
    same_top: float
    kv_bytes: int


def tokens_per_gib(kv_bytes: int, n_ctx: int = RECENT_N_CTX) -> float:
    """Tokens per GiB of a cache of kv_bytes at n_ctx."""
    return n_ctx * 2**30 / kv_bytes


@dataclass
class FrontierModel:
    key: str
    label: str
    f16_kv_bytes: int = 0
    points: list[Point] = field(default_factory=list)
    n_ctx: int = RECENT_N_CTX
    chunks: int = RECENT_CHUNKS

    @property
    def title(self) -> str:
        """The model, and the context when it is not the report's usual one."""
        if (self.n_ctx, self.chunks) == (RECENT_N_CTX, RECENT_CHUNKS):
            return self.label
        return f"{self.label} at n_ctx {self.n_ctx}, {self.chunks} chunk{'' if self.chunks == 1 else 's'}"

    def point(self, name: str) -> Point:
        return next(p for p in self.points if p.cache.name == name)

    def tokens_vs_q8(self, p: Point) -> float:
        """p's tokens per GiB over plain q8_0's."""
        return self.point("q8_0").kv_bytes / p.kv_bytes

    def on_frontier(self, p: Point) -> bool:
        return not any(o is not p and o.kv_bytes <= p.kv_bytes and o.kld <= p.kld
                       and (o.kv_bytes < p.kv_bytes or o.kld < p.kld) for o in self.points)


def kv_bytes(model: Path, cache: Cache, n_threads: int, n_ctx: int = RECENT_N_CTX) -> int:
    """The KV bytes the engine allocates for the cache at n_ctx (one sequence; sliding-window layers hold
    their window, as in the app and llama-perplexity)."""
    llm = Llama(str(model), n_ctx=n_ctx, n_threads=n_threads, flash_attn=True, swa_full=False,
                type_k=CACHE_KINDS[cache.type_k][0], type_v=CACHE_KINDS[cache.type_v][0],
                kv_lazy_quant=cache.lazy, kv_lazy_recent=max(cache.window, 0), kv_lazy_sinks=cache.sinks,
                verbose=False)
    try:
        return llm.kv_lazy_info().kv_bytes
    finally:
        llm.close()


def measure(key: str, n_threads: int, tools: Path, corpus: Path, work: Path,
            caches: tuple[Cache, ...] = CACHES, n_ctx: int = RECENT_N_CTX,
            chunks: int = RECENT_CHUNKS) -> FrontierModel:
    model = model_path(key)
    threads = ["-t", str(n_threads)]
    base = work / f"{key}.{n_ctx}.base"
    f16 = [*threads, "-ctk", "f16", "-ctv", "f16", "--kl-divergence-base", str(base)]
    perplexity(tools, model, corpus, f16, {}, work / f"{key}.f16.log", n_ctx, chunks)
    f16_bytes = kv_bytes(model, Cache("f16", "f16", "f16"), n_threads, n_ctx)
    result = FrontierModel(key, MODEL_LABELS[key], f16_bytes, n_ctx=n_ctx, chunks=chunks)
    for cache in caches:
        args = [*threads, "-ctk", cache.type_k, "-ctv", cache.type_v, "--kl-divergence-base", str(base),
                "--kl-divergence"]
        if cache.lazy:
            args += ["--kv-recent", str(cache.window), "--kv-sinks", str(cache.sinks)]
        text = perplexity(tools, model, corpus, args, LAZY_ENV if cache.lazy else {},
                          work / f"{key}.{cache.name.replace(' ', '_').replace(',', '')}.log", n_ctx, chunks)
        run = kld_run(text, cache.name, cache.window)
        point = Point(cache, run.kld, run.kld_err, run.same_top, kv_bytes(model, cache, n_threads, n_ctx))
        result.points.append(point)
        print(f"  {key} {cache.name}: KLD {run.kld:.5f}, {point.kv_bytes / 2**20:.2f} MiB", flush=True)
    return result


def report(models: list[FrontierModel], corpus: str, plot: str) -> str:
    lines = [
        "# The frontier of KV caches: tokens per GiB against KLD (issue 49, section 2)",
        "",
        "`python -m bench.frontier`: llama.cpp's own `llama-perplexity --kl-divergence` (built from this "
        f"tree) on {corpus}, n_ctx {RECENT_N_CTX} and {RECENT_CHUNKS} chunks (or as a section's title "
        "says), batches of 64 tokens; the KLD against an f16 cache over the second half of each chunk "
        f"(positions {RECENT_N_CTX // 2}-{RECENT_N_CTX - 1} at n_ctx {RECENT_N_CTX}, where a ladder is on "
        "its last rung). "
        "The lazy caches (lazy q8_0 and the ladders) run with `LLAMA_KV_CACHE_LAZY_QUANT=1 -ctk K -ctv V "
        "--kv-recent W --kv-sinks S`; a ladder of two types (\"ladder K q5_0, V q4_0\") steps K and V apart, "
        "each to its own type when its rows are full. Memory: the KV "
        "bytes the engine allocates at that n_ctx (`kv_lazy_info().kv_bytes`), as tokens per GiB. "
        "*Frontier*: no other cache holds "
        "more tokens per GiB at a KLD no higher. The goal: plain q8_0's KLD or better at "
        f">= {TOKENS_GOAL}x its tokens per GiB.",
        "",
        f"![frontier]({plot})",
        "",
    ]
    for m in models:
        q8 = m.point("q8_0")
        rows = []
        for p in sorted(m.points, key=lambda p: p.kv_bytes):
            rows.append([p.cache.name, f"{tokens_per_gib(p.kv_bytes, m.n_ctx):,.0f}",
                         f"{m.tokens_vs_q8(p):.2f}x",
                         f"{p.kld:.5f} ± {p.kld_err:.5f}",
                         f"{p.kld / q8.kld:.2f}x", f"{p.same_top:.2f} %", "yes" if m.on_frontier(p) else ""])
        lines += [f"## {m.title}", "",
                  f"f16: {tokens_per_gib(m.f16_kv_bytes, m.n_ctx):,.0f} tokens per GiB.", "",
                  table(["cache", "tokens per GiB", "/ q8_0", "mean KLD", "/ q8_0", "same top token",
                         "frontier"], rows), ""]
        goal = [p for p in m.points if m.tokens_vs_q8(p) >= TOKENS_GOAL]
        best = min(goal, key=lambda p: p.kld) if goal else None
        if best is not None:
            verdict = "holds" if best.kld <= q8.kld else "does not hold"
            lines.append(f"- At >= {TOKENS_GOAL}x q8_0's tokens per GiB the lowest KLD is "
                         f"{best.cache.name}'s, {best.kld / q8.kld:.2f}x plain q8_0's: the goal {verdict}.")
        near = [p for p in m.points if p.kld <= NEAR_GOAL * q8.kld and p is not q8]
        if near:
            most = min(near, key=lambda p: p.kv_bytes)
            lines.append(f"- The most tokens per GiB within {NEAR_GOAL}x plain q8_0's KLD: "
                         f"{most.cache.name}, {m.tokens_vs_q8(most):.2f}x q8_0's tokens at "
                         f"{most.kld / q8.kld:.2f}x its KLD.")
        default = next((p for p in m.points if p.cache.name == DEFAULT_NAME), None)
        if default is not None:
            where = "on the frontier" if m.on_frontier(default) else "off the frontier"
            name = DEFAULT_NAME.split(" (")[0]
            lines.append(f"- The app's default, {name}: {m.tokens_vs_q8(default):.2f}x "
                         f"q8_0's tokens per GiB at {default.kld / q8.kld:.2f}x its KLD, {where}.")
        lines.append("")
    return "\n".join(lines + sinks_section(models) + ideas_section(models))


def _at(m: FrontierModel, p: Point) -> str:
    return f"{m.tokens_vs_q8(p):.2f}x q8_0's tokens at {p.kld / m.point('q8_0').kld:.2f}x its KLD"


def ideas_section(models: list[FrontierModel]) -> list[str]:
    """What each idea of issue 49 gave, in the points above (the per-layer one in layer_sensitivity.md)."""
    lines = ["## What each idea gave", ""]
    for m in models:
        names = {p.cache.name: p for p in m.points}
        said = [f"{what}: {_at(m, names[name])}" for what, name in (
            ("the q4_0 ladder", "ladder q4_0"), ("with the recent window (W=128)", "ladder q4_0, W=128"),
            ("with 4 attention sinks as well", "ladder q4_0, W=128, S=4"),
            ("K and V apart (plain K q5_0, V q4_0)", "K q5_0, V q4_0"),
            ("K and V apart on the ladder's last rung (K q5_0, V q4_0, W=128, S=4)",
             "ladder K q5_0, V q4_0, W=128, S=4"),
            ("K q8_0, V q4_0 there", "ladder K q8_0, V q4_0, W=128, S=4"),
            ("K q8_0, V q5_0 there", "ladder K q8_0, V q5_0, W=128, S=4")) if name in names]
        if said:
            lines.append(f"- {m.title}: " + "; ".join(said) + ".")
    return lines + [
        "- Precision per layer: `layer_sensitivity.md` (a measurement build): on SmolLM2 the 4-bit error is "
        "spread over the layers, on Gemma-3 one global layer holds 39 % of it; in q8_0 alone neither reaches "
        "the frontier.",
        "- The window's size from the budget: the W points above (W = 32-512 on the q5_0 and q4_0 ladders) "
        "are what such a rule chooses among, each W a trade of tokens for KLD along the same curve; sizing W "
        "from the budget picks a point on it and adds none, so no rule was built.",
        "",
    ]


def sinks_section(models: list[FrontierModel]) -> list[str]:
    """Each cache with attention sinks against the same cache without them (the app's DEFAULT_KV_SINKS)."""
    lines = ["## Attention sinks", "",
             "Each sequence's first S tokens in f16 beside the quantized rungs (`--kv-sinks S`, "
             "`kv_lazy_sinks`), against the same cache without them; the app keeps "
             f"{DEFAULT_KV_SINKS} (`DEFAULT_KV_SINKS`).", ""]
    rows = []
    for m in models:
        for p in m.points:
            base = next((o for o in m.points if p.cache.sinks and o.cache.lazy and o.cache.sinks == 0
                         and (o.cache.type_k, o.cache.type_v, o.cache.window)
                         == (p.cache.type_k, p.cache.type_v, p.cache.window)), None)
            if base is not None:
                rows.append([m.title, p.cache.name, f"{base.kld:.5f}", f"{p.kld:.5f}",
                             f"{p.kld / base.kld - 1:+.1%}", f"{base.kv_bytes / p.kv_bytes:.4f}"])
    if not rows:
        return []
    header = ["model", "cache", "KLD without sinks", "with", "change", "tokens per GiB / without"]
    return lines + [table(header, rows), ""]


def plot(models: list[FrontierModel], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 5), squeeze=False)
    for ax, m in zip(axes[0], models, strict=True):
        q8 = m.point("q8_0")
        for p in m.points:
            x = m.tokens_vs_q8(p)
            marker = "s" if p.cache.lazy else "o"
            ax.scatter([x], [p.kld], marker=marker, color="tab:red" if m.on_frontier(p) else "tab:gray")
            ax.annotate(p.cache.name, (x, p.kld), textcoords="offset points", xytext=(4, 3), fontsize=7)
        ax.axhline(q8.kld, color="tab:blue", linewidth=0.8, linestyle="--")
        ax.axvline(TOKENS_GOAL, color="tab:blue", linewidth=0.8, linestyle="--")
        ax.set_yscale("log")
        ax.set_xlabel("tokens per GiB / plain q8_0's")
        ax.set_ylabel(f"mean KLD against f16 (positions {m.n_ctx // 2}-{m.n_ctx - 1})")
        ax.set_title(f"{m.title} (red: on the frontier; squares: lazy)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load(path: Path) -> tuple[list[FrontierModel], str]:
    """The measurements main() saved: (models, the corpus's description)."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    models = []
    for m in raw["models"]:
        points = [Point(Cache(**p.pop("cache")), **p) for p in m.pop("points")]
        models.append(FrontierModel(**m, points=points))
    return models, raw["corpus"]


def merge(kept: list[FrontierModel], measured: list[FrontierModel]) -> list[FrontierModel]:
    """The stored measurements with the new ones in their place (the same corpus and settings): a model
    measured now (at its n_ctx) keeps its stored points of the caches not measured now."""
    by_key = {(m.key, m.n_ctx): m for m in kept}
    for m in measured:
        old = by_key.get((m.key, m.n_ctx))
        names = {p.cache.name for p in m.points}
        if old is not None:
            m.points = [p for p in old.points if p.cache.name not in names] + m.points
        by_key[m.key, m.n_ctx] = m
    order = list(MODEL_LABELS)
    return sorted(by_key.values(), key=lambda m: (m.n_ctx, order.index(m.key)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.frontier", description=__doc__)
    parser.add_argument("--models", default=",".join(MODEL_LABELS), help="comma-separated model keys")
    parser.add_argument("--report-only", action="store_true", help=f"write the report again from {RAW.name}")
    parser.add_argument("--cache", action="append", choices=[c.name for c in CACHES], metavar="NAME",
                        help=f"measure only this cache (repeatable); the others keep their points in "
                             f"{RAW.name}")
    parser.add_argument("--ctx", type=int, default=RECENT_N_CTX, help="the context length (n_ctx)")
    parser.add_argument("--chunks", type=int, default=RECENT_CHUNKS, help="chunks of n_ctx tokens")
    args = parser.parse_args(argv)
    if args.report_only:
        models, what = load(RAW)
    else:
        caches = tuple(c for c in CACHES if args.cache is None or c.name in args.cache)
        n_threads = Settings(quick=False, models=()).n_threads
        tools = tools_dir()
        models = []
        with tempfile.TemporaryDirectory(prefix="lazykv-frontier-") as tmp:
            work = Path(tmp)
            corpus = write_faq(work / "python-faq.txt")
            what = f"the Python FAQ ({corpus.stat().st_size:,} bytes of Debian's python3-doc)"
            for key in args.models.split(","):
                models.append(measure(key, n_threads, tools, corpus, work, caches, args.ctx, args.chunks))
        if RAW.is_file():
            models = merge(load(RAW)[0], models)
        raw = {"corpus": what, "models": [dataclasses.asdict(m) for m in models]}
        RAW.write_text(json.dumps(raw, indent=1) + "\n", encoding="utf-8")
    plot(models, RESULTS / "frontier.png")
    (RESULTS / "frontier.md").write_text(report(models, what, "frontier.png") + "\n", encoding="utf-8")
    print(f"wrote {RESULTS / 'frontier.md'}")


if __name__ == "__main__":
    main()
