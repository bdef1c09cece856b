"""Choosing the context by memory: a KV budget -> n_ctx per KV mode (bytes per value, 256-cell rounding,
the model's training context), and the tokens each mode holds in the same memory (issue 14)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from lazykv.core.engine.memory import (
    BYTES_PER_VALUE,
    MAX_CTX,
    MiB,
    context_for_budget,
    kv_bytes,
    plan_context,
)
from lazykv.core.engine.model_load import budget_n_ctx
from lazykv.core.engine.model_meta import ModelMeta
from lazykv.core.engine.planner import estimate
from lazykv.core.engine.types import ContextBudgetError
from lazykv.core.kinds import KvMode

GiB = 1024 * MiB


def _meta(n_ctx_train: int = MAX_CTX, n_layer: int = 32, n_head_kv: int = 8, head: int = 128) -> ModelMeta:
    """Llama-3-8B's KV shape by default: 32 layers x 8 KV heads x (128 + 128) = 65,536 values per token."""
    return ModelMeta(
        path=Path("m.gguf"), file_size=4 * GiB, gguf_version=3, architecture="llama", name="m",
        n_params=8_000_000_000, n_ctx_train=n_ctx_train, n_layer=n_layer, n_embd=4096, n_head=32,
        n_head_kv=n_head_kv, head_k=head, head_v=head, n_vocab=128256, sliding_window=0,
        has_chat_template=True,
    )


def test_bytes_per_value_of_each_storage_type() -> None:
    # a block of 32 values: 64 bytes f16, 32 + 2 (q8_0), 16 + 2 (q4_0), 16 + 4 + 2 (q5_0)
    assert {t: n * 32 // d for t, (n, d) in BYTES_PER_VALUE.items()} == {"f16": 64, "q8_0": 34, "q4_0": 18,
                                                                        "q5_0": 22}
    assert [KvMode(m).storage for m in KvMode] == ["f16", "q8_0", "q8_0", "q4_0"]


def test_two_gib_of_llama_3_8b_kv_per_mode() -> None:
    meta = _meta()
    per_mode = {mode: context_for_budget(meta, 2 * GiB, mode) for mode in KvMode}
    # 2 GiB / (65,536 values x bytes per value), down to a multiple of 256
    assert per_mode == {KvMode.F16: 16384, KvMode.Q8_0: 30720, KvMode.LAZY: 30720, KvMode.LADDER: 58112}
    assert per_mode[KvMode.LADDER] / per_mode[KvMode.F16] == pytest.approx(3.55, abs=0.01)


@pytest.mark.parametrize("mode", list(KvMode))
@pytest.mark.parametrize("budget", [7 * MiB, 100 * MiB, 333 * MiB + 17, 2 * GiB, 5 * GiB - 1])
@pytest.mark.parametrize("shape", [(32, 8, 128), (30, 3, 64), (26, 1, 256), (18, 1, 256)])
def test_the_context_is_the_longest_multiple_of_256_that_fits(
    mode: KvMode, budget: int, shape: tuple[int, int, int]
) -> None:
    meta = _meta(MAX_CTX, *shape)
    n_ctx = context_for_budget(meta, budget, mode)
    assert n_ctx % 256 == 0
    if n_ctx < MAX_CTX:
        assert kv_bytes(meta, n_ctx + 256, mode) > budget  # 256 more would not fit
    if n_ctx:
        assert kv_bytes(meta, n_ctx, mode) <= budget  # what the engine allocates for it fits
        assert estimate(meta, n_ctx, mode, available=64 * GiB).kv_cache <= budget


def test_at_most_the_models_training_context() -> None:
    assert context_for_budget(_meta(n_ctx_train=8192), 2 * GiB, KvMode.LADDER) == 8192
    assert context_for_budget(_meta(n_ctx_train=8000), 2 * GiB, KvMode.F16) == 7936  # down to 256s
    assert context_for_budget(_meta(n_ctx_train=0), 1 << 50, KvMode.F16) == MAX_CTX  # unknown: the most
    assert context_for_budget(_meta(), 1 << 62, KvMode.LADDER) == MAX_CTX


def test_too_small_a_budget_holds_no_context() -> None:
    meta = _meta()
    smallest = kv_bytes(meta, 256, KvMode.LADDER)
    assert context_for_budget(meta, smallest, KvMode.LADDER) == 256
    assert context_for_budget(meta, smallest - 1, KvMode.LADDER) == 0
    assert context_for_budget(replace(meta, n_layer=0), GiB, KvMode.F16) == 0  # no KV cache at all
    with pytest.raises(ContextBudgetError, match=r"holds fewer than 256 tokens of m.gguf with the ladder KV "
                                                 r"cache: 256 tokens need 9.0 MiB"):
        budget_n_ctx(meta, smallest - 1, KvMode.LADDER)
    assert budget_n_ctx(meta, 2 * GiB, KvMode.LADDER) == 58112


def test_the_plan_compares_every_mode_in_the_same_memory() -> None:
    meta = _meta()
    by_budget = plan_context(meta, 4096, KvMode.LADDER, budget=GiB)
    assert by_budget.n_ctx == by_budget.per_mode[KvMode.LADDER] == 28928
    assert by_budget.kv_budget == GiB and not by_budget.at_limit(KvMode.LADDER)
    # no budget: the context length as set, compared in the memory it takes in the mode chosen
    by_length = plan_context(meta, 4096, KvMode.LADDER)
    assert by_length.n_ctx == 4096 and by_length.kv_budget == kv_bytes(meta, 4096, KvMode.LADDER)
    assert by_length.per_mode == {KvMode.F16: 1024, KvMode.Q8_0: 2048, KvMode.LAZY: 2048, KvMode.LADDER: 4096}
    capped = plan_context(_meta(n_ctx_train=8192), 4096, KvMode.F16, budget=2 * GiB)
    assert capped.at_limit(KvMode.LADDER) and capped.at_limit(KvMode.F16) and capped.n_ctx == 8192


def test_the_estimate_allocates_the_ladder_as_q4_0() -> None:
    meta = _meta()
    est = {mode: estimate(meta, 8192, mode, available=64 * GiB).kv_cache for mode in KvMode}
    assert est[KvMode.LADDER] == 8192 * 65536 * 18 // 32
    assert est[KvMode.LAZY] == est[KvMode.Q8_0] == 8192 * 65536 * 34 // 32
    assert est[KvMode.F16] == 8192 * 65536 * 2
