"""llama.cpp's own test-backend-ops for what the series adds to ggml, on the CPU: GGML_OP_CONVERT_ROWS
(patch 0005) and flash attention over quantized K/V (0003).

`test-backend-ops -b CPU` compares the CPU backend with the CPU backend on its reference paths (`use_ref`):
for CONVERT_ROWS the plain product with the Hadamard matrix and each type's reference quantization,
against the FWHT and the CPU's own quantization; for FLASH_ATTN_EXT the vec-only kernel. The CONVERT_ROWS
cases are the lazy KV cache's conversions (f16 rows rotated by 0, 32, 64 or 128 and quantized to q8_0,
q4_0 or q5_0; q8_0 rows requantized to q4_0 or q5_0), in place and not, and a few other types. Built by
`native/build.py tools` (`make native-tools`) from the exported series.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from .test_upstream_state_suite import _build_module


def backend_ops_program() -> Path:
    path = _build_module().tools_dir() / "test-backend-ops"
    if not path.is_file():
        raise RuntimeError(f"test-backend-ops is not built for this patch series (expected {path}): "
                           "run `make native-tools`")
    return path


def test_convert_rows_matches_the_reference_implementation() -> None:
    proc = subprocess.run([str(backend_ops_program()), "test", "-b", "CPU", "-o", "CONVERT_ROWS"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    passed = re.search(r"(\d+)/(\d+) tests passed", proc.stdout)
    assert passed is not None, proc.stdout[-4000:]
    assert passed.group(1) == passed.group(2)
    # the cases of make_test_cases_eval(): the lazy cache's steps in place and not, the ladder's steps over
    # the next rung, other types, rotation groups of 256-1024 values in place and not
    assert int(passed.group(2)) == 2 * (3 * 4 + 2 * 2 + 2) + 4 + 3 + 2 * 3
    for case in ("type_src=f16,type_dst=q8_0,ne=[128,5000,1,1],n_rot=128,in_place=1,n_extra=0",
                 # a destination over the next rung, its rows past the source's zeroed, as the ladder's steps
                 # from a quantized rung use it
                 "type_src=q5_0,type_dst=q4_0,ne=[256,1001,1,1],n_rot=0,in_place=1,n_extra=500"):
        assert f"CONVERT_ROWS({case})" in proc.stdout


def test_flash_attention_over_quantized_kv_matches_the_reference_path() -> None:
    """The CPU's tiled and split-KV flash attention paths over K and V each f16, q8_0, q5_0 or q4_0 (patch
    0003's cases, `nh=2`), against the reference kernel, within the op's tolerance (NMSE 5e-4)."""
    cmd = [str(backend_ops_program()), "test", "-b", "CPU", "-o", "FLASH_ATTN_EXT", "-p", "nh=2,"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    passed = re.search(r"(\d+)/(\d+) tests passed", proc.stdout)
    assert passed is not None, proc.stdout[-4000:]
    assert passed.group(1) == passed.group(2)
    # 0003: 15 K/V type pairs (all but f16/f16) x 2 head sizes x 2 GQA x 4 shapes; upstream has a few nh=2 too
    assert int(passed.group(2)) >= 15 * 2 * 2 * 4
    for case in ("type_K=q5_0,type_V=q5_0", "type_K=q8_0,type_V=f16", "type_K=f16,type_V=q4_0"):
        assert case in proc.stdout


def test_flash_attention_over_a_second_kv_range_matches_the_reference_path() -> None:
    """ggml_flash_attn_ext_add_kv (0019), the recent window's attention: a quantized or F16 first range and an
    F16 second one, decodes and batches, grouped-query attention and sinks, and a MUL_MAT before and after the
    attention on one src1 in one graph (test_flash_attn_ext_kv2, patch 0019). The CPU's tiled and split-KV
    paths against its one-chunk path; on lavapipe, `make vulkan-check`'s build compares ggml-vulkan's (0019)
    with the CPU (its mask copy once left a converted src1 behind for the MUL_MAT after it)."""
    cmd = [str(backend_ops_program()), "test", "-b", "CPU", "-o", "FLASH_ATTN_EXT", "-p", "kv2="]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    passed = re.search(r"(\d+)/(\d+) tests passed", proc.stdout)
    assert passed is not None, proc.stdout[-4000:]
    assert passed.group(1) == passed.group(2) == "22"
    for case in ("kv2=128,nb=33,type_KV=q4_0", "kv2=32,nb=1,type_KV=q8_0", "type_KV=q8_0,sinks=1",
                 "mm_around=1"):
        assert case in proc.stdout
