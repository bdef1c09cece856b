"""python -m bench.layer_sensitivity: which layers' K/V need more than 4 bits (issue 49, section 2)?

Issue 49 asks whether a layer-dependent last rung moves the frontier (tokens per GiB against KLD). The series
has one K/V type for every layer, so this measures with a *measurement build* of llama.cpp's own
``llama-perplexity``: the series' tools source plus ``bench/layer_sensitivity.patch`` (an environment switch,
``LAZYKV_EXP_LAYERS`` / ``LAZYKV_EXP_TYPE``, that gives the listed layers another K/V type; never part of the
series, whose only switch is the seed's), built in a scratch directory.

For each model, the procedure of ``bench.frontier`` (the Python FAQ, n_ctx 4096, 3 chunks, batches of 64, the
KLD against an f16 cache over the second half of each chunk):

1. every layer q4_0 (rotated, as plain q4_0), and every layer q8_0;
2. every layer q4_0 but one in q8_0, for each layer: how much of q4_0's excess KLD over q8_0 that layer
   alone takes back (its *share*);
3. the k layers with the largest shares in q8_0, the rest q4_0 (``--top``): KLD, and the tokens per GiB
   of that mix (``memory.layer_kv_bytes``: a sliding-window layer holds its window) against q8_0's.

Results are kept in ``--work`` (one JSON file per model) and a run resumes from them; the report goes to
``results/layer_sensitivity.md``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from bench.engine import model_path
from bench.natural_text import write_faq
from bench.recent import RECENT_CHUNKS, RECENT_N_CTX, kld_run, perplexity
from bench.settings import MODEL_LABELS

ROOT = Path(__file__).resolve().parent.parent
PATCH = ROOT / "bench" / "layer_sensitivity.patch"
DEFAULT_WORK = ROOT / "native" / "work" / "layer-sensitivity"
# q4_0 and q8_0 blocks: 32 values in 18 and 34 bytes
BLOCK_BYTES = {"q4_0": 18, "q8_0": 34}


def build(work: Path) -> Path:
    """The measurement build's bin directory: llama-perplexity from the series' tools source + PATCH."""
    sys.path.insert(0, str(ROOT / "native"))
    import build as native_build

    src, out = work / "src", work / "build"
    stamp = work / "patch.applied"
    if not stamp.exists() or stamp.read_text() != PATCH.read_text():
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(native_build.tools_source() / "vendor" / "llama.cpp", src,
                        ignore=shutil.ignore_patterns(".git"))
        subprocess.run(["patch", "-p1", "-i", str(PATCH)], cwd=src, check=True, capture_output=True)
        stamp.write_text(PATCH.read_text())
    subprocess.run(["cmake", "-S", str(src), "-B", str(out), "-G", "Ninja", *native_build.tools_cmake_args()],
                   check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(out), "--target", "llama-perplexity"], check=True)
    return out / "bin"


class Sweep:
    """One model's runs, resumable from its JSON file."""

    def __init__(self, key: str, tools: Path, work: Path) -> None:
        self.key, self.tools, self.work = key, tools, work
        self.corpus = work / "python-faq.txt"
        if not self.corpus.exists():
            write_faq(self.corpus)
        self.base = work / f"{key}.base"
        self.path = work / f"{key}.q4_0.json"
        self.res: dict = json.loads(self.path.read_text()) if self.path.exists() else {}

    def run(self, name: str, cache: str = "q4_0", layers: list[int] | None = None) -> dict:
        if name not in self.res:
            if not self.base.exists():
                f16 = ["-t", "2", "-ctk", "f16", "-ctv", "f16", "--kl-divergence-base", str(self.base)]
                perplexity(self.tools, model_path(self.key), self.corpus, f16, {},
                           self.work / f"{self.key}.f16.log")
            env = ({"LAZYKV_EXP_LAYERS": ",".join(map(str, layers)), "LAZYKV_EXP_TYPE": "q8_0"}
                   if layers else {})
            args = ["-t", "2", "-ctk", cache, "-ctv", cache, "--kl-divergence-base", str(self.base),
                    "--kl-divergence"]
            text = perplexity(self.tools, model_path(self.key), self.corpus, args, env,
                              self.work / f"{self.key}.{name}.log")
            k = kld_run(text, name, -1)
            self.res[name] = {"kld": k.kld, "err": k.kld_err, "top": k.same_top}
            if layers:
                self.res[name]["layers"] = sorted(layers)
            self.path.write_text(json.dumps(self.res, indent=1))
            print(f"{self.key} {name}: KLD {k.kld:.6f}", flush=True)
        return self.res[name]

    def order(self, n_layer: int) -> list[int]:
        """Layers, the one whose q8_0 takes back most of q4_0's KLD first."""
        return sorted(range(n_layer), key=lambda il: self.res[f"l{il}"]["kld"])


def layer_bytes(key: str) -> list[int]:
    """Each layer's K/V bytes at RECENT_N_CTX in q8_0, as the engine allocates them."""
    sys.path.insert(0, str(ROOT / "app"))
    from lazykv.core.engine.memory import layer_kv_bytes
    from lazykv.core.engine.model_meta import read_model_meta

    return layer_kv_bytes(read_model_meta(model_path(key)), RECENT_N_CTX, "q8_0")


def tokens_vs_q8(q8_bytes: list[int], upgraded: list[int]) -> float:
    """Tokens per GiB of a mix (``upgraded`` layers q8_0, the rest q4_0) over all-q8_0's."""
    q4 = BLOCK_BYTES["q4_0"] / BLOCK_BYTES["q8_0"]
    mix = sum(b if il in upgraded else b * q4 for il, b in enumerate(q8_bytes))
    return sum(q8_bytes) / mix


def measure(key: str, tools: Path, work: Path, top: list[int]) -> None:
    sweep = Sweep(key, tools, work)
    sweep.run("all")
    sweep.run("q8_0", cache="q8_0")
    n_layer = len(layer_bytes(key))
    for il in range(n_layer):
        sweep.run(f"l{il}", layers=[il])
    order = sweep.order(n_layer)
    for k in top:
        sweep.run(f"top{k}", layers=order[:k])


def report(keys: list[str], work: Path, bytes_of=layer_bytes) -> str:  # noqa: ANN001 - key -> q8_0 layer bytes
    lines = [
        "# Which layers' K/V need more than 4 bits (issue 49, section 2)",
        "",
        "`python -m bench.layer_sensitivity` (the procedure in its docstring): llama.cpp's "
        "`llama-perplexity --kl-divergence`, a measurement build (the series' tools + "
        f"`bench/layer_sensitivity.patch`), on the Python FAQ at n_ctx {RECENT_N_CTX}, {RECENT_CHUNKS} "
        "chunks, the KLD against f16 over the second half of each chunk. *Share*: of the KLD q4_0 adds over "
        "q8_0, the part that one layer in q8_0 takes back, "
        "(KLD(q4_0) - KLD(that layer q8_0)) / (KLD(q4_0) - KLD(q8_0)); the shares of all layers would sum to "
        "about 1 if the layers' errors added up.",
    ]
    for key in keys:
        sweep = Sweep(key, Path(), work)
        q8_bytes = bytes_of(key)
        n_layer = len(q8_bytes)
        done = [il for il in range(n_layer) if f"l{il}" in sweep.res]
        if "all" not in sweep.res or "q8_0" not in sweep.res or len(done) < n_layer:
            lines += ["", f"## {MODEL_LABELS[key]}", "", f"not measured ({len(done)} of {n_layer} layers)"]
            continue
        q4, q8 = sweep.res["all"]["kld"], sweep.res["q8_0"]["kld"]
        share = {il: (q4 - sweep.res[f"l{il}"]["kld"]) / (q4 - q8) for il in range(n_layer)}
        order = sweep.order(n_layer)
        lines += ["", f"## {MODEL_LABELS[key]}", "",
                  f"Every layer q4_0: KLD {q4:.5f}; every layer q8_0: {q8:.5f}. Shares summed over the "
                  f"{n_layer} layers: {sum(share.values()):.2f}.", "",
                  "| layer | KLD, that layer q8_0 | share |", "|---:|---:|---:|"]
        lines += [f"| {il} | {sweep.res[f'l{il}']['kld']:.5f} | {share[il]:+.3f} |" for il in order]
        lines += ["", "| mix | layers in q8_0 | tokens per GiB / q8_0 | KLD | KLD / q8_0 |",
                  "|---|---|---:|---:|---:|",
                  f"| q4_0 | - | {tokens_vs_q8(q8_bytes, []):.2f}x | {q4:.5f} | {q4 / q8:.2f}x |"]
        for name in sorted((n for n in sweep.res if n.startswith("top")), key=lambda n: int(n[3:])):
            r = sweep.res[name]
            tokens = tokens_vs_q8(q8_bytes, r["layers"])
            lines.append(f"| {name[:3]} {name[3:]} | {', '.join(map(str, r['layers']))} | "
                         f"{tokens:.2f}x | {r['kld']:.5f} | {r['kld'] / q8:.2f}x |")
        lines += [f"| q8_0 | all | 1.00x | {q8:.5f} | 1.00x |", ""]
        for name in sorted((n for n in sweep.res if n.startswith("top")), key=lambda n: int(n[3:])):
            r = sweep.res[name]
            back = (q4 - r["kld"]) / (q4 - q8)
            summed = sum(share[il] for il in r["layers"])
            part = len(r["layers"]) / n_layer
            lines.append(f"- {name[3:]} layer(s) in q8_0 ({part:.0%} of them) take back "
                         f"{back:.0%} of the KLD q4_0 adds over q8_0 (their shares summed: {summed:.0%}).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2,gemma3")
    parser.add_argument("--top", default="1,2,4,8", help="mixes: the k most sensitive layers in q8_0")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--tools", type=Path, help="an existing measurement build's bin directory")
    parser.add_argument("--report-only", action="store_true", help="write the report from --work's results")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "layer_sensitivity.md")
    args = parser.parse_args(argv)
    keys = args.models.split(",")
    args.work.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        tools = args.tools or build(args.work)
        for key in keys:
            measure(key, tools, args.work, [int(k) for k in args.top.split(",")])
    args.out.write_text(report(keys, args.work), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
