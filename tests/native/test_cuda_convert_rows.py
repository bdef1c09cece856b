"""ggml-cuda's kernel of GGML_OP_CONVERT_ROWS (patch 0021), tested where there is no GPU.

`convert-rows-cuda-sim` (native/gpu_check/cuda_sim, built beside the tools by `native/build.py tools`) runs
the kernel's own source on the host: every thread is a coroutine that meets the others of its warp at each
shuffle or __syncwarp, each block has its shared memory (random bytes at its start), and a few blocks are
resident at once, run by a scheduler that lets blocks overtake each other, stops blocks half way and runs a
block's threads in a new order each pass, so that an in-place conversion writing over source bytes another
block has yet to read would read them overwritten, and a lane reading what another lane of its warp has yet
to write to shared memory would read it unwritten. In place, each case runs under 8 such schedules. It
compares the bytes with the CPU backend's for every case of llama.cpp's test-backend-ops for the op and a few
more (rotations of 256, strided rows, hostile blocks). The kernel writes the CPU backend's bytes, so every
case must be identical. On a GPU, `make gpu-check` runs the kernel itself against the CPU (native/README.md,
"GPU check").
"""

from __future__ import annotations

import re
import subprocess

from .test_upstream_state_suite import tools_dir


def run_simulator() -> str:
    proc = subprocess.run([str(tools_dir() / "convert-rows-cuda-sim")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    return proc.stdout


def test_the_cuda_kernel_writes_the_cpu_backends_bytes() -> None:
    out = run_simulator()
    summary = re.search(r"cases (\d+), identical (\d+), warp shuffles (\d+)", out)
    assert summary is not None, out[-4000:]
    assert summary.group(1) == summary.group(2)
    assert int(summary.group(1)) >= 45
    assert int(summary.group(3)) > 0  # the rotations and the blocks' scales went through the shuffles

    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| conversion")]
    assert len(rows) == int(summary.group(1))
    cases = {(r[0], r[1], r[2], r[3]) for r in rows}
    for conversion in ("f16 -> q8_0", "f16 -> q4_0", "f16 -> q5_0", "q8_0 -> q4_0", "q8_0 -> q5_0"):
        assert any(c[0] == conversion and c[3] == "yes" for c in cases), conversion
    assert ("f16 -> q8_0", "128 x 1000 x 1 x 1", "128", "yes") in cases
    # destinations with rows past the source's, zeroed: in place over the source's stale bytes, and apart
    assert {c[3] for c in cases if "rows zeroed" in c[1]} == {"yes", "no"}

    # in place, rows of the destination smaller than the source's (by a factor r): two launches straight over
    # the source, the first r^2 of the rows staged in the device's pool (28 % of the destination for
    # f16 -> q8_0, 42 % for q8_0 -> q5_0), each under 8 schedules of the blocks; rows of the same size: all
    # staged
    for conversion, _shape, _rot, in_place, schedules, size, differ, launches, staged in rows:
        assert differ == "0"
        assert schedules == ("8" if in_place == "yes" else "1")
        if in_place == "yes" and conversion != "f16 -> f16":
            assert launches == "3" and 0 < int(staged) <= 0.45 * int(size), (conversion, launches, staged)
        elif in_place == "yes":
            assert launches == "1" and int(staged) == int(size)
        else:
            assert launches == "1" and staged == "0"
