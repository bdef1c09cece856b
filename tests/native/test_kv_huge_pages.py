"""A host KV buffer is backed by transparent huge pages (patch 0029, ``GGML_CPU_HUGE_PAGES``, which
``native/build.py`` turns on for the wheel).

A decode reads the whole cache and a lazy cache's step converts all of it: with 4 KiB pages those passes wait
on the TLB and on the prefetchers, which stop at every page boundary. Most distributions give huge pages on
request only (the kernel's ``madvise`` mode), so ggml's CPU buffer type asks for them for every buffer of
2 MiB or more, before it is first written. Each case runs in a child process, whose huge pages are the new
context's alone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
HUGE_PAGE = 2 << 20

CHILD = """
import sys
from pathlib import Path
from tests.native.helpers import make_llama

def anon_huge_bytes():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    raise SystemExit("no AnonHugePages in smaps_rollup")

before = anon_huge_bytes()
llm = make_llama(Path(sys.argv[1]), sys.argv[2], n_ctx=8192)
print(anon_huge_bytes() - before, llm.kv_lazy_info().kv_bytes)
"""


def thp_mode() -> str:
    """The kernel's transparent huge page mode: always, madvise or never."""
    found = re.search(r"\[(\w+)\]", THP_ENABLED.read_text())
    assert found, THP_ENABLED.read_text()
    return found.group(1)


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="madvise(MADV_HUGEPAGE) is Linux's: ggml asks for huge pages on Linux only")
@pytest.mark.parametrize("kv", ["f16", "lazy"])
def test_a_host_kv_buffer_is_backed_by_huge_pages(smollm2_path: Path, kv: str) -> None:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(smollm2_path), kv], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env=dict(os.environ, PYTHONPATH=path))
    assert proc.returncode == 0, f"rc {proc.returncode}: {proc.stderr[-2000:]}"
    grown, kv_bytes = map(int, proc.stdout.split()[-2:])
    assert kv_bytes > 32 * HUGE_PAGE  # SmolLM2 at n_ctx 8192: 180 MiB in f16, 96 MiB lazy (q8_0)
    if thp_mode() == "never":
        assert grown == 0  # nothing to ask for: the cache works as before
    else:
        # all of the buffer but its partial huge pages (the compute buffers, which ask too, add theirs)
        assert grown >= kv_bytes - 2 * HUGE_PAGE, f"{grown >> 20} MiB of huge pages for {kv_bytes >> 20} MiB"
