"""CPU flash attention over a q8_0 or q4_0 KV cache: the tiled prefill and split-KV decode paths
(patch 0003) against the reference path.

Op level: ggml's FLASH_ATTN_EXT on the CPU backend against the same graph with `use_ref` (the vec-only
implementation q8_0 K/V always took before the patch), within test-backend-ops' tolerance. End to end: the
logits of a q8_0-cache context against those of one on ggml-cpu's reference paths (llama_set_cpu_use_ref).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .ggml_fa import FLASH_ATTN_EXT_MAX_NMSE, FaCase, flash_attn, nmse

HERE = Path(__file__).resolve().parent
# q8_0, q4_0 and q5_0 K/V (patch 0003), alone and mixed
KV_TYPES = [("q8_0", "q8_0"), ("q8_0", "f16"), ("q4_0", "q4_0"), ("q4_0", "q8_0"), ("f16", "q4_0"),
            ("q5_0", "q5_0"), ("q5_0", "q8_0")]
# (n_q, n_kv): prefill rows (tiled kernel: n_q >= 64, here not a multiple of the 64-row Q tile) over KV
# lengths that are / are not a multiple of the 64-cell KV tile; decode below 512 cells (one chunk) and
# above (split-KV)
SHAPES = [(70, 256), (70, 333), (1, 333), (1, 1000)]
# end to end, the paths differ in rounding only (the tiled kernel does not quantize Q to q8_0; decode
# accumulates V in another order), but 30 layers amplify any rounding change to a logits NMSE of about
# 1e-3 (measured: new vs reference 0.9e-3 SmolLM2, 2.3e-3 Gemma-3; f16 vs q8_0 1.1e-3, 2.2e-3)
LOGITS_NMSE_VS_F16 = 2.0


# the op-level cases: a covering subset, in which every value of each parameter meets every value of each
# other one (all pairs: 21 of the 252 combinations). test-backend-ops runs the full product of types, head
# sizes, GQA and shapes in C++ (tests/native/test_backend_ops.py); these add the threads and the check that
# the fast path ran
AXES = {"types": KV_TYPES, "head": [64, 128, 256], "gqa": [1, 3, 8], "mask": [True, False],
        "n_threads": [1, 2]}


def all_pairs(axes: dict[str, list]) -> set[tuple]:
    """Index tuples of a small set of combinations covering every pair of values of two axes (greedy:
    each pick covers the most pairs still missing, the first such combination in product order)."""
    sizes = [len(values) for values in axes.values()]
    combos = list(itertools.product(*(range(n) for n in sizes)))
    missing = {(a, i, b, j) for a, b in itertools.combinations(range(len(sizes)), 2)
               for i in range(sizes[a]) for j in range(sizes[b])}
    chosen: set[tuple] = set()
    while missing:
        best = max(combos, key=lambda c: sum((a, c[a], b, c[b]) in missing
                                             for a, b in itertools.combinations(range(len(c)), 2)))
        chosen.add(best)
        missing -= {(a, best[a], b, best[b]) for a, b in itertools.combinations(range(len(best)), 2)}
    return chosen


def fa_cases() -> list:
    cases = []
    for index in sorted(all_pairs(AXES)):
        types, head, gqa, mask, n_threads = (axis[i] for axis, i in zip(AXES.values(), index, strict=True))
        case_id = f"K {types[0]} V {types[1]}-{head}-{gqa}-{'mask' if mask else 'nomask'}-{n_threads}"
        cases.append(pytest.param(types, head, gqa, mask, n_threads, id=case_id))
    return cases


@pytest.mark.parametrize(("types", "head", "gqa", "mask", "n_threads"), fa_cases())
def test_fa_quantized_kv_matches_reference(
    types: tuple[str, str], head: int, gqa: int, mask: bool, n_threads: int
) -> None:
    for n_q, n_kv in SHAPES:
        case = FaCase(head, gqa, n_kv, n_q, mask, *types, seed=head * 1000 + gqa * 10 + n_q)
        ref = flash_attn(case, n_threads, use_ref=True)
        out = flash_attn(case, n_threads, use_ref=False)
        err = nmse(ref, out)
        assert np.isfinite(out).all(), case
        assert err <= FLASH_ATTN_EXT_MAX_NMSE, (case, err)
        if rounds_differently(case, n_threads):
            # the new path ran: otherwise the comparison would prove nothing
            assert not np.array_equal(ref, out), case


def rounds_differently(case: FaCase, n_threads: int) -> bool:
    """Every new path rounds differently from the reference, except for decodes with f16 V on one
    thread: the vec-only kernel's f16 V accumulation is left as it is, and split-KV has one chunk."""
    return case.n_q >= 64 or case.type_v != "f16" or (case.n_kv >= 512 and n_threads > 1)


def run_logits(model: Path, out: Path, kv: str, ref: bool = False) -> np.ndarray:
    cmd = [sys.executable, str(HERE / "fa_logits.py"), str(model), str(out), kv, "ref" if ref else "fast"]
    subprocess.run(cmd, check=True)
    return np.load(out)


def test_no_environment_variable_selects_the_reference_path() -> None:
    """The reference path is chosen per context (use_ref), never by the environment: the variable the
    engine once read changes nothing."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import numpy as np; "
        "from ggml_fa import FaCase, flash_attn; "
        "c = FaCase(64, 3, 1000, 1, True, 'q8_0', 'q8_0'); p = FaCase(64, 3, 333, 70, True, 'q8_0', 'q8_0'); "
        "assert not any(np.array_equal(flash_attn(x, 2, True), flash_attn(x, 2, False)) for x in (c, p))"
    )
    env = dict(os.environ, GGML_CPU_FA_Q8_REF="1")
    subprocess.run([sys.executable, "-c", script, str(HERE)], env=env, check=True)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_fa_q8_0_logits_match_reference(
    name: str, smollm2_path: Path, gemma3_path: Path, tmp_path: Path
) -> None:
    """The new paths move a q8_0 context's logits about as much as any rounding change does: less than
    LOGITS_NMSE_VS_F16 x what the q8_0 cache itself moves them from f16's."""
    model = smollm2_path if name == "smollm2" else gemma3_path
    ref = run_logits(model, tmp_path / "ref.npy", "q8_0", ref=True)
    new = run_logits(model, tmp_path / "new.npy", "q8_0")
    f16 = run_logits(model, tmp_path / "f16.npy", "f16")
    err, err_f16 = nmse(ref, new), nmse(ref, f16)
    print(
        f"{name}: logits NMSE over {ref.shape[0]} positions: q8_0 new vs reference path {err:.3g}, "
        f"f16 vs q8_0 reference path {err_f16:.3g}"
    )
    assert ref.shape == new.shape
    assert not np.array_equal(ref, new)  # llama_set_cpu_use_ref reached the CPU backend: the paths differ
    assert err <= LOGITS_NMSE_VS_F16 * err_f16
    assert (ref.argmax(axis=1) == new.argmax(axis=1)).mean() >= 0.9
