"""python -m bench.pause_ab: the ladder's step pauses of two engines, in alternating rounds on one machine.

A ladder report compares each step's pause with a memcpy of the bytes it reads in the same run; between two
reports the machine may differ. This runs the pause part of the ladder section (``bench.ladder.run_pause``:
the Llama-3-8B KV shape) with this tree and its engine, and with another tree and its engine (``--base-tree``,
``--base-engine``: a checkout of an older commit and its engine installed with ``pip install --target``),
each round in a child process of its own, the two in turn, and writes a Markdown table of the medians.

    git worktree add /tmp/base 91a673c && python /tmp/base/native/build.py wheel
    pip install --no-deps --target /tmp/base-engine <that wheel>
    python -m bench.pause_ab --base-tree /tmp/base --base-engine /tmp/base-engine --base-name 91a673c
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/app"]
import llama_cpp
from bench.ladder import run_pause
from bench.settings import Settings
result = run_pause(Settings(quick=False, models=()), int(sys.argv[2]))
print(json.dumps({"engine": llama_cpp.__version__,
                  "steps": {s.step.name: [s.pause_s, s.memcpy_s] for s in result.steps}}))
"""


def one_round(tree: Path, engine: Path | None, reps: int) -> dict:
    env = dict(os.environ)
    if engine is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(engine), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(reps)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def table(runs: dict[str, list[dict]], base_name: str) -> str:
    base, now = runs["base"], runs["now"]
    lines = [f"| step | {base_name}: pause ms | now: pause ms | now / {base_name} "
             f"| {base_name}: pause / memcpy | now: pause / memcpy |", "|---|---:|---:|---:|---:|---:|"]
    for step in base[0]["steps"]:
        b = [r["steps"][step][0] * 1e3 for r in base]
        n = [r["steps"][step][0] * 1e3 for r in now]
        br = statistics.median(r["steps"][step][0] / r["steps"][step][1] for r in base)
        nr = statistics.median(r["steps"][step][0] / r["steps"][step][1] for r in now)
        lines.append(f"| {step} | {statistics.median(b):.1f} ({min(b):.1f}-{max(b):.1f}) | "
                     f"{statistics.median(n):.1f} ({min(n):.1f}-{max(n):.1f}) | "
                     f"{statistics.median(n) / statistics.median(b):.2f}x | {br:.2f}x | {nr:.2f}x |")
    engines = f"engines {base[0]['engine']} ({base_name}) and {now[0]['engine']} (now)"
    return (f"Medians of {len(base)} alternating rounds (ranges in brackets), {engines}; each round's pause "
            "is the fastest of its repetitions, as in the ladder report.\n\n" + "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-tree", type=Path, required=True, help="a checkout of the commit to compare")
    parser.add_argument("--base-engine", type=Path, required=True, help="its engine (pip install --target)")
    parser.add_argument("--base-name", default="base")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each step in a round")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict]] = {"base": [], "now": []}
    for _ in range(args.rounds):
        runs["base"].append(one_round(args.base_tree, args.base_engine, args.reps))
        runs["now"].append(one_round(ROOT, None, args.reps))
    print(table(runs, args.base_name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
