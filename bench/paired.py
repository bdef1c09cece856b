"""One cell of the depth sweep, measured longer: f16 against q8_0 in one process, many paired rounds.

    .venv/bin/python -m bench.paired --depth 1024 --what prefill --rounds 25

Both contexts live in this process (so no process-level difference enters the ratio), are filled to the
depth, then each round times the sweep's measurement (the n_batch chunk at the depth, or the median of
n_decode single-token evals) on both, back to back, their order swapped every round. Prints the median
q8_0 / f16 speed ratio over the rounds, its quartiles and its 95 % confidence interval. A check for one
sweep cell; the sweep itself (section 4) is the report.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from bench.settings import make_settings
from bench.sweep import Child, corpus_tokens, median_ci, round_order


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.paired")
    parser.add_argument("--depth", type=int, required=True)
    parser.add_argument("--what", choices=("prefill", "decode"), default="prefill")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--n-ctx", type=int, default=8192)
    args = parser.parse_args(argv)
    settings = make_settings(False, ("smollm2",), ("sweep",), args.n_ctx, args.n_ctx)
    spec = settings.models[0]
    if args.depth + settings.n_batch > spec.n_ctx:
        parser.error(f"--depth: at most n_ctx - n_batch = {spec.n_ctx - settings.n_batch}")
    tokens = corpus_tokens(spec)
    contexts = {kind: Child(spec, settings, kind, tokens) for kind in ("f16", "q8_0")}
    try:
        for child in contexts.values():
            child.fill(args.depth)
        seconds: dict[str, list[float]] = {kind: [] for kind in contexts}
        for round_no in range(args.rounds):
            for kind in round_order(round_no)[:2]:  # the sweep's f16 / q8_0 pair, order alternating
                seconds[kind].append(getattr(contexts[kind], args.what)()["seconds"])
    finally:
        for child in contexts.values():
            child.llm.close()
    ratios = [f / q for f, q in zip(seconds["f16"], seconds["q8_0"], strict=True)]
    low, _, high = statistics.quantiles(ratios, n=4)
    ci = median_ci(ratios)
    print(
        f"{spec.label}, n_ctx {spec.n_ctx}, {args.what} at depth {args.depth}, {args.rounds} paired rounds: "
        f"q8_0 / f16 median {statistics.median(ratios):.3f} (quartiles {low:.3f}-{high:.3f}"
        + ("" if ci is None else f", 95 % confidence interval of the median {ci[0]:.3f}-{ci[1]:.3f}")
        + ")"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
