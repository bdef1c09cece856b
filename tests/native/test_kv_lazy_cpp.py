"""llama.cpp's own test-kv-lazy (issue 46, section 4): the lazy cache's C++ tests that travel with the series
(patches 0008, 0015 and 0024 each add their cases), on a random tiny LLaMA model built in memory, no
download. The f16 phase against an f16 cache, a step against a restore's conversion, an overflowing batch
against a step asked for, states across rungs, the ladder's steps and compact states, the recent window
with two sequences, across a seq_rm and in states. Built by `native/build.py tools` (`make native-tools`).
"""

from __future__ import annotations

import subprocess

from .test_upstream_state_suite import _build_module


def test_test_kv_lazy_passes() -> None:
    program = _build_module().tools_dir() / "test-kv-lazy"
    assert program.is_file(), f"test-kv-lazy is not built for this series ({program}): `make native-tools`"
    proc = subprocess.run([str(program)], capture_output=True, text=True, timeout=300)
    output = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), output
