"""Start-up benchmark of the Linux bundle: its size and the time to the first window and first token.

``python -m bench.startup`` (the last step of ``make bench``, after ``make dist``) unpacks
dist/LazyKV-Chat-<version>-linux-<arch>.tar.gz into a temp dir and runs the bundled
``lazykv --self-test`` RUNS times with ``LAZYKV_T0`` set to the time just before it is started,
so its figures count from the launch (exec, PyInstaller bootloader, imports): the first window
(the main window built and exposed, offscreen) and the first token (SmolLM2 loaded with the lazy
cache, a short prompt read, the first piece of the reply streamed). Writes bench/results/startup.md.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bench.machine import describe, load_average
from lazykv import __version__

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "startup.md"
RUNS = 5
NAME = f"LazyKV-Chat-{__version__}-linux-{os.uname().machine}"
TARBALL = ROOT / "dist" / f"{NAME}.tar.gz"


def tree_bytes(path: Path) -> int:
    """Bytes on disk of the files under path (symlinks counted as links, not their targets)."""
    return sum(p.lstat().st_blocks * 512 for p in path.rglob("*") if not p.is_dir() or p.is_symlink())


def self_test(binary: Path, cwd: Path) -> dict[str, float]:
    env = {
        "HOME": os.environ["HOME"], "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
        "QT_QPA_PLATFORM": "offscreen", **({"XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"]}
                                           if "XDG_CACHE_HOME" in os.environ else {}),
    }
    env["LAZYKV_T0"] = repr(time.time())
    t0 = time.perf_counter()
    run = subprocess.run([str(binary), "--self-test"], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=300)
    total = time.perf_counter() - t0
    if run.returncode != 0:
        raise SystemExit(f"{binary} --self-test failed:\n{run.stdout}{run.stderr}")
    line = next(x for x in run.stdout.splitlines() if x.startswith("times: "))
    times = {k: float(v) for k, v in (item.split("=") for item in line.removeprefix("times: ").split())}
    return {**times, "total": total}


def main() -> int:
    if not TARBALL.exists():
        print(f"{TARBALL} is missing: run `make dist` first", file=sys.stderr)
        return 1
    machine = describe()
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="lazykv-bench-startup-") as tmp:
        with tarfile.open(TARBALL) as tar:
            tar.extractall(tmp, filter="tar")
        package = Path(tmp) / NAME
        bundle = package / "lazykv"
        sizes = {"tarball": TARBALL.stat().st_size, "unpacked": tree_bytes(package),
                 "bundle": tree_bytes(bundle), "internal_files": sum(1 for _ in bundle.rglob("*"))}
        runs = [self_test(bundle / "lazykv", Path(tmp)) for _ in range(RUNS)]
    load_after = load_average()
    RESULTS.write_text(report(machine, sizes, runs, load_before, load_after), encoding="utf-8")
    print(f"wrote {RESULTS}")
    return 0


def report(machine: object, sizes: dict[str, int], runs: list[dict[str, float]], before: str,
           after: str) -> str:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    mib = 2**20
    rows = "\n".join(
        f"| {i + 1} | {r['first_window']:.2f} | {r['first_token']:.2f} | {r['total']:.2f} |"
        for i, r in enumerate(runs)
    )
    return f"""# Start-up of the Linux bundle

`python -m bench.startup` (in `make bench`): `{TARBALL.name}` unpacked into a temp dir, its
`lazykv --self-test` run {len(runs)} times offscreen, timed from just before each launch (exec,
PyInstaller bootloader, imports included). *First window*: the main window built, shown and
exposed. *First token*: then SmolLM2-135M (Q4_1) loaded with the lazy KV cache (n_ctx 2048), a
43-token prompt read and the first piece of the reply streamed. *Whole self-test*: also the
forced conversion, the snapshot save and restore and three more short replies.

| | size |
|---|---|
| tarball (`make dist`) | {sizes['tarball'] / mib:.0f} MiB |
| unpacked (bundle + desktop files) | {sizes['unpacked'] / mib:.0f} MiB |
| the bundle (`lazykv/`) | {sizes['bundle'] / mib:.0f} MiB in {sizes['internal_files']} files |

| | median of {len(runs)} | fastest |
|---|---|---|
| first window | {med('first_window'):.2f} s | {min(r['first_window'] for r in runs):.2f} s |
| first token | {med('first_token'):.2f} s | {min(r['first_token'] for r in runs):.2f} s |
| whole self-test | {med('total'):.2f} s | {min(r['total'] for r in runs):.2f} s |

| run | first window (s) | first token (s) | whole self-test (s) |
|---|---|---|---|
{rows}

Machine: {machine.cpu_model}, {machine.n_cpus} CPUs, {machine.mem_total_gb:.0f} GB, {machine.os},
{machine.engine}, git {machine.git}, {machine.date}. Load average before / after: {before} / {after}
(the engine's threads spin while they wait, so other processes on the cores slow the first token most).
"""


if __name__ == "__main__":
    sys.exit(main())
