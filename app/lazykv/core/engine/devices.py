"""The devices the engine can offload to, as its ggml backends report them (Qt-free).

Local GPUs (CUDA, Vulkan, Metal devices of a GPU build) and the devices of llama.cpp RPC servers, each with
the free and total memory its backend reports (``ggml_backend_dev_memory``), as ``planner.Device`` for the
planner. The bindings expose the device list but not the memory query, so it is bound here, on the same
ggml library instance llama.cpp uses.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp

from lazykv.core.engine.model_load import remote_backends
from lazykv.core.engine.planner import Device
from lazykv.core.engine.remote import Unreachable

# enum ggml_backend_dev_type
DEV_CPU, DEV_GPU, DEV_IGPU, DEV_ACCEL = 0, 1, 2, 3
GPU_BACKENDS = ("CUDA", "Vulkan", "Metal", "ROCm", "SYCL", "MUSA", "CANN", "OpenCL")


@dataclass(frozen=True)
class Discovery:
    """The devices found: local GPUs, those of the RPC servers that answered, and those that did not."""

    gpu_build: str  # the GPU backend this engine was built with ("CUDA", "Vulkan", ...), "" for a CPU build
    local: tuple[Device, ...]
    remote: tuple[Device, ...]
    unreachable: tuple[Unreachable, ...] = ()

    @property
    def devices(self) -> tuple[Device, ...]:
        """In llama.cpp's order (Llama(rpc_servers=...)): the servers' devices, then the local GPUs."""
        return self.remote + self.local

    def note(self) -> str:
        """A sentence when a GPU build has no usable device (the plan is then for the CPU), else ""."""
        return no_device_note(self.gpu_build, self.local)


def _lib() -> ctypes.CDLL | None:
    lib = getattr(llama_cpp.llama_cpp, "_ggml_lib", None)
    if lib is None:
        return None
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                            ctypes.POINTER(ctypes.c_size_t)]
    lib.ggml_backend_dev_memory.restype = None
    lib.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_description.restype = ctypes.c_char_p
    lib.ggml_backend_reg_count.argtypes = []
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_reg_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_name.restype = ctypes.c_char_p
    return lib


def _text(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", "replace")


def _device(lib: ctypes.CDLL, dev: int) -> Device:
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return Device(_text(llama_cpp.ggml_backend_dev_name(dev)), _text(lib.ggml_backend_dev_description(dev)),
                  free.value, total.value)


def _all_devices() -> list[int]:
    if not hasattr(llama_cpp, "ggml_backend_dev_count"):
        return []
    return [llama_cpp.ggml_backend_dev_get(i) for i in range(llama_cpp.ggml_backend_dev_count())]


def gpu_build() -> str:
    """The GPU backend compiled into the engine ("CUDA", "Vulkan", "Metal", ...), "" for a CPU build."""
    lib = _lib()
    if lib is None:
        return ""
    names = [_text(lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)))
             for i in range(lib.ggml_backend_reg_count())]
    return next((n for n in names if n in GPU_BACKENDS), "")


def local_gpus() -> list[Device]:
    """This machine's GPUs the engine can offload to (none on a CPU build)."""
    lib = _lib()
    if lib is None:
        return []
    rpc = getattr(llama_cpp.llama, "_rpc_all_devices", set())
    return [_device(lib, dev) for dev in _all_devices()
            if llama_cpp.ggml_backend_dev_type(dev) in (DEV_GPU, DEV_IGPU) and dev not in rpc
            and not _text(llama_cpp.ggml_backend_dev_name(dev)).startswith("RPC")]


def rpc_devices(endpoints: Sequence[str]) -> list[Device]:
    """The devices of the RPC servers at ``endpoints`` that answer (probed first, then registered)."""
    return list(discover(endpoints).remote)


def registered(endpoints: Sequence[str]) -> list[Device]:
    """The devices of RPC servers already registered and just probed (``endpoints``), without probing."""
    lib = _lib()
    if lib is None or not endpoints:
        return []
    found: list[Device] = []
    for dev in _all_devices():
        # only the servers that answered are asked for their memory: the RPC client ends the process
        # on a server that went away (one registered earlier, since stopped)
        name = _text(llama_cpp.ggml_backend_dev_name(dev))
        if name.startswith("RPC") and _text(lib.ggml_backend_dev_description(dev)) in endpoints:
            found.append(_device(lib, dev))
    order = {endpoint: i for i, endpoint in enumerate(endpoints)}
    return sorted(found, key=lambda d: order.get(d.description, len(order)))


def no_device_note(build: str, local: Sequence[Device]) -> str:
    """A sentence when a GPU build has no usable device (the plan is then for the CPU), else ""."""
    if build and not local:
        return f"This is a {build} build, but {build} reports no usable device: the model runs on the CPU."
    return ""


def discover(endpoints: Sequence[str] = ()) -> Discovery:
    """Local GPUs and the devices of the RPC servers at ``endpoints`` (ValueError on a malformed endpoint)."""
    usable, unreachable = remote_backends(endpoints) if endpoints else ([], [])
    return Discovery(gpu_build(), tuple(local_gpus()), tuple(registered(usable)), tuple(unreachable))
