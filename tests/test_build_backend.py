"""native/build.py picks the backend from the machine's GPU (issue 26): fake tools on PATH, no build."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.native_scripts import load_native_script

ROOT = Path(__file__).resolve().parents[1]
BUILD_PY = ROOT / "native" / "build.py"

NVIDIA_SMI_ONE_GPU = "GPU 0: NVIDIA GeForce RTX 4060 Laptop GPU (UUID: GPU-0b1c2d3e-0000-1111-2222-3333)\n"
VULKAN_LAVAPIPE = """\
==========
VULKANINFO
==========

Devices:
========
GPU0:
\tapiVersion         = 1.3.255
\tdriverVersion      = 0.0.1
\tvendorID           = 0x10005
\tdeviceID           = 0x0000
\tdeviceType         = PHYSICAL_DEVICE_TYPE_CPU
\tdeviceName         = llvmpipe (LLVM 15.0.6, 256 bits)
\tdriverID           = DRIVER_ID_MESA_LLVMPIPE
"""
VULKAN_INTEL_AND_LAVAPIPE = VULKAN_LAVAPIPE + """\
GPU1:
\tapiVersion         = 1.3.255
\tdeviceType         = PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU
\tdeviceName         = Intel(R) Graphics (RPL-P)
\tdriverID           = DRIVER_ID_INTEL_OPEN_SOURCE_MESA
"""


def _load() -> ModuleType:
    return load_native_script("build.py", "lazykv_native_build_backend")


class Machine:
    """A fake machine: a PATH holding only the given tools (shell scripts), Vulkan dirs in tmp, no libcuda."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bin = tmp / "bin"
        self.bin.mkdir()
        self.vulkan = tmp / "vulkan"
        self.build = _load()
        self.build.VULKAN_INCLUDE_DIRS = [self.vulkan / "include"]
        self.build.VULKAN_LIBRARY_DIRS = [self.vulkan / "lib"]
        self.build.libcuda_device_count = lambda: self.libcuda_devices
        self.libcuda_devices = 0
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("PATH", str(self.bin))
        for var in ("CMAKE_ARGS", "LAZYKV_BACKEND", "CUDA_HOME", "CUDA_PATH", "VULKAN_SDK"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setattr(sys, "platform", "linux")

    def tool(self, name: str, output: str = "", rc: int = 0) -> None:
        script = self.bin / name
        script.write_text(f"#!/bin/sh\n/bin/cat <<'EOF'\n{output}EOF\nexit {rc}\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)

    def vulkan_sdk(self) -> None:
        (self.vulkan / "include" / "vulkan").mkdir(parents=True)
        (self.vulkan / "include" / "vulkan" / "vulkan.h").write_text("/* fake */\n")
        (self.vulkan / "lib").mkdir()
        (self.vulkan / "lib" / "libvulkan.so").write_text("")
        self.tool("glslc")

    def backend(self) -> tuple[str, str]:
        found = self.build.detect_backend()
        return found.name, found.reason


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Machine:
    return Machine(tmp_path, monkeypatch)


def test_nothing_builds_for_the_cpu(machine: Machine) -> None:
    name, reason = machine.backend()
    assert name == "cpu"
    assert "no CUDA GPU" in reason and "no vulkaninfo" in reason


def test_the_cuda_toolkit_without_a_gpu_builds_for_the_cpu(machine: Machine) -> None:
    """This project's development and CI machines: nvcc, no driver (nvidia-smi fails), no GPU."""
    machine.tool("nvcc")
    machine.tool("nvidia-smi", "NVIDIA-SMI has failed: it couldn't communicate with the driver.\n", rc=9)
    name, reason = machine.backend()
    assert name == "cpu"
    assert "nvcc is installed but no CUDA GPU" in reason


def test_a_gpu_and_nvcc_build_for_cuda(machine: Machine) -> None:
    machine.tool("nvcc")
    machine.tool("nvidia-smi", NVIDIA_SMI_ONE_GPU)
    name, reason = machine.backend()
    assert name == "cuda"
    assert "nvidia-smi -L lists 1 GPU" in reason


def test_libcuda_counts_a_gpu_when_nvidia_smi_is_missing(machine: Machine, tmp_path: Path) -> None:
    machine.libcuda_devices = 2
    machine.monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert machine.backend() == ("cuda", f"libcuda reports 2 device(s), builds with CUDA_HOME={tmp_path}")


def test_a_gpu_without_a_toolkit_builds_for_the_cpu_and_says_what_is_missing(machine: Machine) -> None:
    machine.tool("nvidia-smi", NVIDIA_SMI_ONE_GPU)
    name, reason = machine.backend()
    assert name == "cpu"
    assert "lists 1 GPU(s) but no nvcc or CUDA_HOME" in reason


def test_lavapipe_alone_is_not_a_vulkan_gpu(machine: Machine) -> None:
    machine.vulkan_sdk()
    machine.tool("vulkaninfo", VULKAN_LAVAPIPE)
    name, reason = machine.backend()
    assert name == "cpu"
    assert "only a CPU device: llvmpipe" in reason


def test_a_vulkan_gpu_with_glslc_headers_and_loader_builds_for_vulkan(machine: Machine) -> None:
    machine.vulkan_sdk()
    machine.tool("vulkaninfo", VULKAN_INTEL_AND_LAVAPIPE)
    name, reason = machine.backend()
    assert name == "vulkan"
    assert "Intel(R) Graphics (RPL-P)" in reason and "llvmpipe" not in reason


def test_a_vulkan_gpu_without_the_sdk_says_what_is_missing(machine: Machine) -> None:
    machine.tool("vulkaninfo", VULKAN_INTEL_AND_LAVAPIPE)
    name, reason = machine.backend()
    assert name == "cpu"
    assert "no glslc, the Vulkan headers, the Vulkan loader" in reason


def test_cuda_wins_over_vulkan_when_both_are_there(machine: Machine) -> None:
    machine.tool("nvcc")
    machine.tool("nvidia-smi", NVIDIA_SMI_ONE_GPU)
    machine.vulkan_sdk()
    machine.tool("vulkaninfo", VULKAN_INTEL_AND_LAVAPIPE)
    assert machine.backend()[0] == "cuda"


def test_macos_on_arm64_builds_for_metal(machine: Machine) -> None:
    machine.monkeypatch.setattr(sys, "platform", "darwin")
    machine.monkeypatch.setattr(machine.build.platform, "machine", lambda: "arm64")
    assert machine.backend()[0] == "metal"


def test_lazykv_backend_and_cmake_args_override_detection(machine: Machine) -> None:
    machine.tool("nvcc")
    machine.tool("nvidia-smi", NVIDIA_SMI_ONE_GPU)
    machine.monkeypatch.setenv("LAZYKV_BACKEND", "cpu")
    assert machine.backend() == ("cpu", "LAZYKV_BACKEND=cpu")
    machine.monkeypatch.setenv("CMAKE_ARGS", "-DGGML_VULKAN=on")
    assert machine.backend()[0] == "vulkan"  # CMAKE_ARGS wins over both
    machine.monkeypatch.setenv("LAZYKV_BACKEND", "rocm")
    machine.monkeypatch.delenv("CMAKE_ARGS")
    with pytest.raises(machine.build.BuildError, match="not one of cpu, cuda, vulkan, metal"):
        machine.backend()


def test_the_cpu_keeps_its_cache_key_and_version_a_gpu_backend_gets_its_own(machine: Machine) -> None:
    """The CPU key hashes what it did before backends existed: no CPU rebuild on any machine."""
    build = machine.build
    build._BACKEND = build.Backend("cpu", "test")
    cpu_key, cpu_version = build.cache_key(), build.wheel_version()
    h = build.hashlib.sha256()
    for part in (build.SDIST_SHA256, build.series_hash(), "", build.python_tag(), build.platform.machine(),
                 " ".join(build.BASE_CMAKE_ARGS + build.X86_64_CMAKE_ARGS)):
        h.update(part.encode() + b"\0")
    assert cpu_key == h.hexdigest()[:16]
    assert cpu_version == f"{build.SDIST_VERSION}+lazykv.{build.series_hash()[:10]}"
    assert "-DGGML_CUDA=ON" not in build.cmake_args()
    build._BACKEND = build.Backend("cuda", "test")
    assert build.cache_key() != cpu_key
    assert build.wheel_version() == cpu_version + ".cuda"
    assert "-DGGML_CUDA=ON" in build.cmake_args()
    machine.monkeypatch.setenv("CMAKE_ARGS", "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=89")
    assert build.cmake_args().count("-DGGML_CUDA=ON") == 1  # the user's own, not a second one


def test_each_backend_builds_in_its_own_dir(machine: Machine) -> None:
    """Building Vulkan (make vulkan-check) beside the CPU engine reconfigures neither build dir."""
    build = machine.build
    build._BACKEND = build.Backend("cpu", "test")
    assert build.build_dir() == build.WORK / "build"
    build._BACKEND = build.Backend("vulkan", "test")
    assert build.build_dir() == build.WORK / "build-vulkan"


def test_the_backend_command_prints_one_line(machine: Machine) -> None:
    machine.tool("nvcc")
    env = dict(os.environ, PATH=f"{machine.bin}:/usr/bin:/bin", LAZYKV_BACKEND="cpu")
    out = subprocess.run([sys.executable, str(BUILD_PY), "backend"], capture_output=True, text=True, env=env,
                         check=True, timeout=30).stdout
    assert out == "cpu: LAZYKV_BACKEND=cpu\n"
