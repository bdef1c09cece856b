"""python -m bench.lavapipe_ab: whose is the intermittent abort of test-backend-ops' kv2 set on lavapipe?

``test-backend-ops -b Vulkan0 -o FLASH_ATTN_EXT -p kv2=`` (``make vulkan-check``) sometimes dies with a heap
corruption on Debian 12's lavapipe (Mesa 22.3.6). The smallest set that reproduces it is the three
``gqa=4,kv=512,kv2=32,nb=1`` cases followed by the ``mm_around`` case, in one process. This runs that set with
the same test-backend-ops against the system's lavapipe and against another Mesa's (``--driver-files``: the
ICD JSON of a lavapipe unpacked elsewhere, e.g. bookworm-backports' ``mesa-vulkan-drivers`` extracted with
``dpkg-deb -x``), the two in turn, and prints a Markdown table: if the other lavapipe never aborts where the
system's does, the fault is the driver's, not ggml-vulkan's.

    python -m bench.lavapipe_ab --driver-files /tmp/mesa25/lvp25.json --runs 10
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# built by bench.vulkan_check (make vulkan-check)
PROGRAM = ROOT / "native" / "work" / "build-vktools" / "bin" / "test-backend-ops"
CASES = "gqa=4,kv=512,kv2=32,nb=1|mm_around"


def one_run(driver_files: str | None) -> str:
    """How one run of the set ended: "passed", or the signal and the last line on stderr."""
    env = {**os.environ, "GGML_VK_VISIBLE_DEVICES": "0"}
    env.pop("VK_DRIVER_FILES", None)
    if driver_files:
        env["VK_DRIVER_FILES"] = driver_files
    proc = subprocess.run([str(PROGRAM), "test", "-b", "Vulkan0", "-o", "FLASH_ATTN_EXT", "-p", CASES],
                          capture_output=True, text=True, env=env, timeout=600)
    summary = re.search(r"(\d+)/(\d+) tests passed", proc.stdout)
    if proc.returncode == 0 and summary and summary[1] == summary[2]:
        return "passed"
    how = signal.Signals(-proc.returncode).name if proc.returncode < 0 else f"exit {proc.returncode}"
    last = (proc.stderr.strip().splitlines() or ["nothing on stderr"])[-1]
    return f"{how}: {last}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--driver-files", required=True, help="the other lavapipe's ICD JSON")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args(argv)
    drivers = {"system lavapipe": None, Path(args.driver_files).name: args.driver_files}
    ended: dict[str, list[str]] = {name: [] for name in drivers}
    for _ in range(args.runs):
        for name, files in drivers.items():
            ended[name].append(one_run(files))
    print(f"`test-backend-ops test -b Vulkan0 -o FLASH_ATTN_EXT -p \"{CASES}\"`, {args.runs} runs each, "
          "in turn\n")
    print("| lavapipe | passed | died | how |\n|---|---:|---:|---|")
    for name, runs in ended.items():
        died = [r for r in runs if r != "passed"]
        how = "; ".join(sorted(set(died))) or "-"
        print(f"| {name} | {runs.count('passed')} | {len(died)} | {how} |")


if __name__ == "__main__":
    main()
