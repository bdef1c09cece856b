"""CPU flash attention over a q8_0 KV cache: the tiled prefill and split-KV decode paths (patch 0007)
against the reference path.

Op level: ggml's FLASH_ATTN_EXT on the CPU backend against the same graph with `use_ref` (the vec-only
implementation q8_0 K/V always took before the patch), within test-backend-ops' tolerance. End to end: the
logits of a q8_0-cache context against those of a child process with GGML_CPU_FA_Q8_REF=1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .ggml_fa import FLASH_ATTN_EXT_MAX_NMSE, FaCase, flash_attn, nmse

HERE = Path(__file__).resolve().parent
KV_TYPES = [("q8_0", "q8_0"), ("q8_0", "f16")]
# (n_q, n_kv): prefill rows (tiled kernel: n_q >= 64, here not a multiple of the 64-row Q tile) over KV
# lengths that are / are not a multiple of the 64-cell KV tile; decode below 512 cells (one chunk) and
# above (split-KV)
SHAPES = [(70, 256), (70, 333), (1, 333), (1, 1000)]
# logits of the reference and the new path: NMSE bound (the paths differ in rounding only: Q is not
# quantized to q8_0 in the tiled kernel; the decode path accumulates V in another order)
LOGITS_MAX_NMSE = 1e-4


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("mask", [True, False], ids=["mask", "nomask"])
@pytest.mark.parametrize("gqa", [1, 3, 8])
@pytest.mark.parametrize("head", [64, 128, 256])
@pytest.mark.parametrize("types", KV_TYPES, ids=["K q8_0 V q8_0", "K q8_0 V f16"])
def test_fa_q8_0_matches_reference(
    types: tuple[str, str], head: int, gqa: int, mask: bool, n_threads: int
) -> None:
    for n_q, n_kv in SHAPES:
        case = FaCase(head, gqa, n_kv, n_q, mask, *types, seed=head * 1000 + gqa * 10 + n_q)
        ref = flash_attn(case, n_threads, use_ref=True)
        out = flash_attn(case, n_threads, use_ref=False)
        err = nmse(ref, out)
        assert np.isfinite(out).all(), case
        assert err <= FLASH_ATTN_EXT_MAX_NMSE, (case, err)
        if rounds_differently(case):
            # the new path ran: otherwise the comparison would prove nothing
            assert not np.array_equal(ref, out), case


def rounds_differently(case: FaCase) -> bool:
    """Every new path rounds differently from the reference, except for short decodes with f16 V: they
    stay on the vec-only kernel, whose f16 V accumulation the patch leaves as it is."""
    return case.n_q >= 64 or case.n_kv >= 512 or case.type_v == "q8_0"


def run_logits(model: Path, out: Path, ref: bool) -> np.ndarray:
    env = {k: v for k, v in os.environ.items() if k != "GGML_CPU_FA_Q8_REF"}
    if ref:
        env["GGML_CPU_FA_Q8_REF"] = "1"
    subprocess.run([sys.executable, str(HERE / "fa_logits.py"), str(model), str(out)], env=env, check=True)
    return np.load(out)


def test_fa_q8_0_env_selects_reference_path() -> None:
    """With GGML_CPU_FA_Q8_REF=1 the fast paths are off for q8_0: bit-identical to use_ref."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import numpy as np; "
        "from ggml_fa import FaCase, flash_attn; "
        "c = FaCase(64, 3, 1000, 1, True, 'q8_0', 'q8_0'); p = FaCase(64, 3, 333, 70, True, 'q8_0', 'q8_0'); "
        "assert all(np.array_equal(flash_attn(x, 2, True), flash_attn(x, 2, False)) for x in (c, p))"
    )
    env = dict(os.environ, GGML_CPU_FA_Q8_REF="1")
    subprocess.run([sys.executable, "-c", script, str(HERE)], env=env, check=True)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_fa_q8_0_logits_match_reference(
    name: str, smollm2_path: Path, gemma3_path: Path, tmp_path: Path
) -> None:
    model = smollm2_path if name == "smollm2" else gemma3_path
    ref = run_logits(model, tmp_path / "ref.npy", ref=True)
    new = run_logits(model, tmp_path / "new.npy", ref=False)
    err = nmse(ref, new)
    print(f"{name}: logits NMSE new vs reference path {err:.3g} over {ref.shape[0]} positions")
    assert ref.shape == new.shape
    assert err <= LOGITS_MAX_NMSE
    assert (ref.argmax(axis=1) == new.argmax(axis=1)).mean() >= 0.9
