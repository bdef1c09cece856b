"""The memory panel shows each device beside host RSS; model information shows the plan and why (issue 26)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtWidgets import QLabel
from pytestqt.qtbot import QtBot

from lazykv.core.engine.memory import DeviceMemory, GiB, MiB, fmt_bytes
from lazykv.core.engine.model_meta import read_model_meta
from lazykv.core.engine.planner import AUTO, Device, plan
from lazykv.core.engine.types import ModelInfo
from lazykv.core.kinds import KvMode
from lazykv.qt.memory_panel import MemoryPanel
from lazykv.qt.model_info_dialog import ModelInfoDialog

GPU = Device("CUDA0", "NVIDIA GeForce RTX 4060 Laptop GPU", 7 * GiB, 8 * GiB)


def _info(fake_model: Path, devices: tuple[Device, ...], note: str = "") -> ModelInfo:
    meta = read_model_meta(fake_model)
    p = plan(meta, 4096, "lazy", devices, AUTO, available=16 * GiB)
    on_gpu = tuple(DeviceMemory(d.device.name, False, d.weights, d.kv, d.compute, d.device.description)
                   for d in p.devices)
    memory = (*on_gpu, DeviceMemory("CPU", True, p.host.weights, p.host.kv, p.host.compute))
    return ModelInfo(fake_model, "llama", 1000, 4096, 64 * MiB, 4096, KvMode.LAZY, 2, meta, memory=memory,
                     plan=p, devices=devices, plan_note=note)


def test_the_panel_shows_each_device_its_memory_and_what_is_on_it(qtbot: QtBot, fake_model: Path) -> None:
    panel = MemoryPanel()
    qtbot.addWidget(panel)
    info = _info(fake_model, (GPU,))
    panel.set_model(info)
    lines = panel.devices_label.text().splitlines()
    gpu = info.memory[0]
    assert lines[0] == (f"CUDA0 (NVIDIA GeForce RTX 4060 Laptop GPU): 7.0 GiB free of 8.0 GiB; weights "
                        f"{fmt_bytes(gpu.weights)}, KV {fmt_bytes(gpu.kv)}, buffers {fmt_bytes(gpu.compute)}")
    assert lines[1].startswith(f"{info.plan.n_gpu_layers} of ") and "fits on the GPU" in lines[1]
    panel.set_model(replace(_info(fake_model, ()), plan_note="This is a CUDA build, but CUDA reports no "
                            "usable device: the model runs on the CPU."))
    text = panel.devices_label.text()
    assert "0 of " in text and "runs on the CPU" in text and "This is a CUDA build" in text


def test_model_information_shows_the_plan_and_why(qtbot: QtBot, fake_model: Path) -> None:
    info = _info(fake_model, (GPU,))
    dialog = ModelInfoDialog(info.meta, None, info.plan, info.plan_note)
    qtbot.addWidget(dialog)
    text = " | ".join(label.text() for label in dialog.findChildren(QLabel))
    assert f"GPU layers: | {info.plan.n_gpu_layers} of " in text and "fits on the GPU" in text
    assert "Host memory (CPU): | weights " in text
    assert "CUDA0, NVIDIA GeForce RTX 4060 Laptop GPU: | weights " in text
    assert "7.0 GiB free of 8.0 GiB before loading" in text


def test_the_settings_estimate_plans_auto_layers_on_the_gpu_of_the_last_load(
    qtbot: QtBot, fake_model: Path
) -> None:
    from lazykv.core.settings import Settings
    from lazykv.qt.settings_dialog import SettingsDialog

    dialog = SettingsDialog(Settings(), read_model_meta(fake_model), gpus=(GPU,))
    qtbot.addWidget(dialog)
    assert "device memory (CUDA0)" in dialog.estimate_label.text()  # Auto, the default
    dialog.set_value("n_gpu_layers", 0)
    assert "device memory" not in dialog.estimate_label.text()
