"""llama.cpp's own tools reach the lazy cache through a flag (patch 0015), not only the environment.

`llama-perplexity --kv-lazy-quant` over a text longer than the f16 view converts the cache in place, as
`LLAMA_KV_CACHE_LAZY_QUANT=1` does; without either, a q8_0 cache is a plain one and converts nothing.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .test_upstream_state_suite import _build_module

N_CTX = 1024  # a lazy q8_0 cache of 1024 cells holds 512 as f16: each 1024-token chunk converts once
CONVERTED = "converted the lazy KV cache from f16 to q8_0"


def perplexity(model: Path, text: Path, *flags: str, env: dict[str, str] | None = None) -> str:
    program = _build_module().tools_dir() / "llama-perplexity"
    # -lv 4: llama's own info log, where the conversion is reported
    cmd = [str(program), "-m", str(model), "-f", str(text), "-c", str(N_CTX), "-b", "512", "--chunks", "1",
           "-t", "1", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "-lv", "4", *flags]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "LLAMA_KV_"))}
    for _ in range(2):  # once seen under load: a run that exits 0 with its log cut after the chunk's ETA
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**base, **(env or {})})
        assert proc.returncode == 0, proc.stderr[-3000:]
        if "Final estimate: PPL" in proc.stdout + proc.stderr:
            return proc.stderr
    raise AssertionError(f"llama-perplexity gave no estimate twice: {proc.stderr[-3000:]}")


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ppl") / "text.txt"
    line = "The keeper climbed the stairs at dusk, checked the lamp and wrote one line about the weather."
    path.write_text(" ".join(f"{i}. {line}" for i in range(400)))
    return path


def test_kv_lazy_quant_flag_converts_like_the_environment_variable(smollm2_path: Path, text: Path) -> None:
    assert CONVERTED in perplexity(smollm2_path, text, "--kv-lazy-quant")
    assert CONVERTED in perplexity(smollm2_path, text, env={"LLAMA_KV_CACHE_LAZY_QUANT": "1"})
    assert CONVERTED not in perplexity(smollm2_path, text)
