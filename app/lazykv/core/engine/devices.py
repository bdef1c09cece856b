"""The devices the engine can offload to, as its ggml backends report them (Qt-free).

Local GPUs (CUDA, Vulkan, Metal devices of a GPU build) and the devices of llama.cpp RPC servers, each with
the free and total memory its backend reports (``ggml_backend_dev_memory``), as ``planner.Device`` for the
planner. The bindings expose the device list but not the memory query, so it is bound here, on the same
ggml library instance llama.cpp uses.
"""

from __future__ import annotations

import ctypes
import functools
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


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _bind_probe(lib: ctypes.CDLL) -> None:
    p = ctypes.c_void_p
    for name, args, res in (("ggml_tensor_overhead", [], ctypes.c_size_t), ("ggml_init", [_InitParams], p),
                            ("ggml_free", [p], None),
                            ("ggml_new_tensor_1d", [p, ctypes.c_int, ctypes.c_int64], p),
                            ("ggml_add", [p, p, p], p),
                            ("ggml_backend_dev_supports_op", [p, p], ctypes.c_bool)):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res


PROBE_MIN, PROBE_MAX = 1 << 20, 1 << 40  # bytes
PROBE_STEP = 1 << 16
GGML_TYPE_F32 = 0


def max_tensor(lib: ctypes.CDLL, dev: int) -> int:
    """The largest tensor (bytes, to 64 KiB) that an op on ``dev`` may have, as its supports_op answers for
    the sum of two f32 vectors; 0 when it takes 1 TiB (no limit). No memory is allocated: the tensors have
    no data. A Vulkan device without 64-bit indexing refuses any op with a tensor over maxStorageBufferRange,
    and llama.cpp keeps a weight whose product it refuses (a large vocabulary's output) in host memory."""
    _bind_probe(lib)
    ctx = lib.ggml_init(_InitParams(96 * lib.ggml_tensor_overhead(), None, True))
    if not ctx:
        return 0
    try:
        def takes(nbytes: int) -> bool:
            a = lib.ggml_new_tensor_1d(ctx, GGML_TYPE_F32, nbytes // 4)
            return bool(lib.ggml_backend_dev_supports_op(dev, lib.ggml_add(ctx, a, a)))

        if takes(PROBE_MAX) or not takes(PROBE_MIN):
            # no limit, or one below any weight's size (the op itself is refused): nothing to plan by
            return 0
        lo, hi = PROBE_MIN, PROBE_MAX  # takes(lo), not takes(hi)
        while hi - lo > PROBE_STEP:
            mid = (lo + hi) // 2 // 4 * 4
            lo, hi = (mid, hi) if takes(mid) else (lo, mid)
        return lo
    finally:
        lib.ggml_free(ctx)


@functools.cache
def _device_max_tensor(lib: ctypes.CDLL, dev: int) -> int:
    """max_tensor of a device, asked once per process: the limit is the device's, its free memory is not."""
    return max_tensor(lib, dev)


def _text(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", "replace")


def _device(lib: ctypes.CDLL, dev: int, probe: bool = False) -> Device:
    """The device as the planner sees it; ``probe``: with its tensor size limit (local GPUs: an RPC server
    would be asked over the network once per probe)."""
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return Device(_text(llama_cpp.ggml_backend_dev_name(dev)), _text(lib.ggml_backend_dev_description(dev)),
                  free.value, total.value, _device_max_tensor(lib, dev) if probe else 0)


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
    return [_device(lib, dev, probe=True) for dev in _all_devices()
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
