"""The engine loads by the memory plan (issue 26): Auto GPU layers, the plan kept with the model, and a model
that does not fit refused with the context that does, before llama.cpp could run out of memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from lazykv.core.engine import devices, memory
from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.memory import MiB
from lazykv.core.engine.planner import AUTO, Device
from lazykv.core.engine.types import ModelLoadError

pytestmark = pytest.mark.slow


def test_auto_on_a_cpu_build_plans_for_the_cpu(smollm2_path: Path) -> None:
    session = EngineSession()
    try:
        info = session.load(LoadSpec(smollm2_path, n_ctx=1024, kv_mode="lazy", gpu_layers=AUTO, kv_recent=0))
        assert info.plan is not None and info.plan.n_gpu_layers == 0 and info.devices == ()
        assert "runs on the CPU" in info.plan.reason and info.plan_note == ""  # a CPU build says nothing more
        host = sum(m.weights + m.kv + m.compute for m in info.memory if m.host)
        assert abs(info.plan.host.total - host) <= 0.05 * host
    finally:
        session.close()


def test_a_model_that_does_not_fit_is_refused_with_the_context_that_does(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = EngineSession()
    try:
        first = session.load(LoadSpec(smollm2_path, n_ctx=512, kv_mode="f16"))
        monkeypatch.setattr(memory, "available_ram", lambda: 400 * MiB)
        with pytest.raises(ModelLoadError) as refused:
            session.load(LoadSpec(smollm2_path, n_ctx=131072, kv_mode="f16", gpu_layers=AUTO))
        said = str(refused.value)
        assert said.startswith(f"{smollm2_path.name} with 131072 tokens of f16 KV cache needs about ")
        assert "of RAM, and 400.0 MiB is available: at most " in said and "Lower the context length." in said
        assert session.model_info() is first  # the model loaded before stays
        monkeypatch.setattr(memory, "available_ram", lambda: 100 * MiB)
        with pytest.raises(ModelLoadError, match="does not fit in this machine's memory at any context"):
            session.load(LoadSpec(smollm2_path, n_ctx=4096, kv_mode="ladder", kv_recent=0))
    finally:
        session.close()


def test_a_gpu_build_without_a_device_says_it_plans_for_the_cpu() -> None:
    assert devices.no_device_note("CUDA", ()) == (
        "This is a CUDA build, but CUDA reports no usable device: the model runs on the CPU.")
    assert devices.no_device_note("CUDA", (Device("CUDA0", "RTX", 1, 2),)) == ""
    assert devices.no_device_note("", ()) == ""


def test_a_fixed_layer_count_over_a_devices_free_memory_is_refused_with_the_count_that_fits(
    smollm2_path: Path,
) -> None:
    """Checked before llama.cpp allocates: a GPU out of memory is a sentence, never an abort."""
    from lazykv.core.engine.memory import GiB
    from lazykv.core.engine.model_load import refuse_what_does_not_fit
    from lazykv.core.engine.model_meta import read_model_meta
    from lazykv.core.engine.planner import plan

    meta = read_model_meta(smollm2_path)
    busy = (Device("CUDA0", "a 4 GiB laptop GPU", 200 * MiB, 4 * GiB),)  # the desktop holds the rest
    asked = plan(meta, 4096, "lazy", busy, 31, available=16 * GiB)
    with pytest.raises(ModelLoadError) as refused:
        refuse_what_does_not_fit(smollm2_path, meta, asked, busy, 0)
    assert str(refused.value) == (
        f"{smollm2_path.name} with 31 GPU layers needs about {memory.fmt_bytes(asked.devices[0].total)} of "
        "CUDA0, which has 200.0 MiB free: choose Auto GPU layers (the model then runs on the CPU).")
    roomy = (Device("CUDA0", "a 4 GiB laptop GPU", 1024 * MiB + 300 * MiB, 4 * GiB),)
    with pytest.raises(ModelLoadError, match=r"choose Auto GPU layers, or at most \d+\.$"):
        refuse_what_does_not_fit(smollm2_path, meta, plan(meta, 65536, "f16", roomy, 31, available=16 * GiB),
                                  roomy, 0)
    auto = plan(meta, 4096, "lazy", busy, AUTO, available=16 * GiB)
    refuse_what_does_not_fit(smollm2_path, meta, auto, busy, 0)  # Auto's plan loads (on the CPU)
