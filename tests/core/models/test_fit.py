"""What fits: the library's fit and largest contexts are the memory planner's own figures."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from lazykv.core.engine import memory, planner
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.memory import Fit
from lazykv.core.engine.model_meta import CTX_PADDING, ModelMeta, read_model_meta
from lazykv.core.kinds import KvMode
from lazykv.core.models.fit import fit_report
from lazykv.core.models.scan import Places, scan

GiB = 1024**3


def spec(meta: ModelMeta, n_ctx: int, kv_mode: str, **more: object) -> LoadSpec:
    """The fit of ``meta`` at ``n_ctx`` in ``kv_mode``, without a recent window or sinks unless ``more`` says
    them."""
    return LoadSpec(meta.path, n_ctx=n_ctx, kv_mode=kv_mode, **{"kv_recent": 0, "kv_sinks": 0, **more})


@pytest.mark.parametrize("available", [int(0.05 * GiB), int(0.2 * GiB), 2 * GiB, 64 * GiB])
@pytest.mark.parametrize("kv_mode", list(KvMode))
def test_the_fit_and_largest_contexts_are_the_planner_s(tiny_gguf: Path, available: int,
                                                        kv_mode: KvMode) -> None:
    # the tiny model's header with a long training context and real-model weights, so the limits bite
    meta = replace(read_model_meta(tiny_gguf), n_ctx_train=131072, file_size=int(0.03 * GiB))
    report = fit_report(meta, spec(meta, 4096, kv_mode), available)
    assert report.plan == planner.plan(meta, 4096, kv_mode, available=available)
    assert report.word == {Fit.GREEN: "fits", Fit.YELLOW: "tight", Fit.RED: "does not fit"}[report.fit]
    for mode, n in report.max_ctx.items():
        limit = memory.ctx_limit(meta)
        if n:
            assert planner.plan(meta, n, mode, available=available).fit is not Fit.RED
        if n < limit:  # one step more does not fit
            assert planner.plan(meta, n + CTX_PADDING, mode, available=available).fit is Fit.RED
    assert report.max_ctx[KvMode.F16] <= report.max_ctx[KvMode.Q8_0] <= report.max_ctx[KvMode.LADDER]
    assert report.max_ctx[KvMode.LAZY] == report.max_ctx[KvMode.Q8_0]  # allocated as q8_0


def test_a_model_without_a_q8_0_cache_has_no_context_in_those_modes(tiny_gguf: Path) -> None:
    meta = replace(read_model_meta(tiny_gguf), head_k=80, head_v=80)  # not a multiple of the q8_0 block
    report = fit_report(meta, spec(meta, 4096, "f16"), 8 * GiB)
    assert report.max_ctx[KvMode.F16] > 0
    assert report.max_ctx[KvMode.Q8_0] == report.max_ctx[KvMode.LAZY] == report.max_ctx[KvMode.LADDER] == 0


def test_the_real_test_models_are_listed_with_the_planner_s_fit(model_path: Path) -> None:
    """SmolLM2 and Gemma-3 as the scan finds them: the record's plan input is the file's header, and its
    fit in every mode is the planner's plan for that header."""
    (record,) = [r for r in scan(Places(model_path.parent, {}, (model_path.parent,))).records
                 if r.path == model_path]
    assert record.usable and record.meta is not None
    assert record.meta == read_model_meta(model_path)
    available = 2 * GiB
    for mode in KvMode:
        report = fit_report(record.meta, spec(record.meta, 8192, mode), available)
        assert report.plan == planner.plan(read_model_meta(model_path), 8192, mode, available=available)
        assert report.max_ctx == planner.max_ctx_per_mode(record.meta, available=available)


def test_a_gpu_takes_layers_and_the_fit_is_the_planner_s_with_it(tiny_gguf: Path) -> None:
    # 3 GiB of weights (no tensor table: the planner spreads the file's bytes over the layers)
    meta = replace(read_model_meta(tiny_gguf), n_ctx_train=131072, file_size=int(3 * GiB), tensors=None)
    gpu = planner.Device("CUDA0", "a GPU", free=6 * GiB, total=8 * GiB)
    report = fit_report(meta, spec(meta, 8192, "ladder"), int(1 * GiB), devices=[gpu])
    assert report.plan == planner.plan(meta, 8192, "ladder", [gpu], planner.AUTO, available=int(1 * GiB))
    assert report.plan.n_gpu_layers > 0
    assert report.max_ctx == planner.max_ctx_per_mode(meta, [gpu], available=int(1 * GiB))
    on_cpu = fit_report(meta, spec(meta, 8192, "ladder"), int(1 * GiB))
    assert on_cpu.fit is Fit.RED and report.fit is not Fit.RED  # 3 GiB of weights: only with the GPU


def test_the_fit_counts_the_recent_window_and_the_gpu_memory_limit(tiny_gguf: Path) -> None:
    """The Models page and `models list` plan what the app loads: its window, its GPU memory limit."""
    meta = replace(read_model_meta(tiny_gguf), n_ctx_train=131072, file_size=int(3 * GiB), tensors=None)
    gpu = planner.Device("CUDA0", "a GPU", free=6 * GiB, total=8 * GiB)
    report = fit_report(meta, spec(meta, 8192, "ladder", kv_recent=128, gpu_memory=GiB), int(1 * GiB),
                        [gpu])
    assert report.plan == planner.plan(meta, 8192, "ladder", [gpu], planner.AUTO, GiB, int(1 * GiB), 128)
    assert report.plan.host.kv + sum(d.kv for d in report.plan.devices) > \
        fit_report(meta, spec(meta, 8192, "ladder"), int(1 * GiB), [gpu]).plan.host.kv
    assert report.max_ctx == planner.max_ctx_per_mode(meta, [gpu], planner.AUTO, GiB, int(1 * GiB), 128)
