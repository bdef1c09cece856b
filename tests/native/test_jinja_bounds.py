"""llama.cpp's own test-jinja on the series' common library, on a thread stack of 512 KiB (a thread's
default on macOS): patch 0025 bounds how deep a chat template nests, so that a crafted one (a GGUF's) is
refused with an error instead of overflowing the stack. Its "nesting bounds" case renders 20 hostile
templates that each crashed before, and the depths real templates use; the rest of test-jinja checks that
nothing else changed. Built by `native/build.py tools` (`make native-tools`).
"""

from __future__ import annotations

import re
import resource
import subprocess

from .test_upstream_state_suite import _build_module

STACK = 512 * 1024


def _small_stack() -> None:
    resource.setrlimit(resource.RLIMIT_STACK, (STACK, STACK))


def test_test_jinja_passes_on_a_512_kib_stack_hostile_nesting_included() -> None:
    program = _build_module().tools_dir() / "test-jinja"
    assert program.is_file(), f"test-jinja is not built for this series ({program}): run `make native-tools`"
    proc = subprocess.run([str(program)], capture_output=True, text=True, timeout=300,
                          preexec_fn=_small_stack)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(r"nesting bounds \(24 assertion\(s\)\)\s+\[PASS\]", proc.stdout), proc.stdout[-4000:]
    assert re.search(r"failures\s*:\s*0", proc.stdout), proc.stdout[-2000:]
