"""The memory plan of a model × context × KV mode × devices: the one planner (the settings, the memory
panel, the model library and ``python -m lazykv estimate`` all ask it), and ``estimate``, its summary as
host and device memory.

The plan (``plan``, ``max_ctx``, ``max_ctx_per_mode``) is a pure function of (model metadata, context, KV
mode, devices, GPU layers ``"auto"`` or a count, a device memory limit); it loads nothing and runs on the GUI
thread in well under a millisecond for a real model::

    p = plan(meta, 8192, "lazy", devices=(Device("CUDA0", "RTX 4060", free=7 * GiB, total=8 * GiB),),
             gpu_layers="auto", gpu_memory=6 * GiB)
    p.fit                      # Fit.GREEN / YELLOW / RED: the host part against the RAM available, and
                               # RED when a device is over its budget (only with a fixed layer count)
    p.n_gpu_layers             # llama.cpp's n_gpu_layers: 0 none, n_layer + 1 every layer and the output
    p.host                     # Bytes(weights, kv, compute) in host memory
    p.devices[0].weights       # ... kv, compute, n_layers, output, budget, device (name, free, total)
    p.reason                   # one sentence: why this many layers
    max_ctx(meta, "ladder", devices, gpu_memory=...)   # the longest context (256s) that is not RED
    max_ctx_per_mode(meta, devices, ...)               # {KvMode: tokens} for every mode

It follows what llama.cpp itself allocates (``llama_get_memory_use``; bench/plan_accuracy.py checks it
within 5 % per buffer kind and place), and upstream's own fitter (common/fit.cpp) where the KV modes are
the same: layers offloaded from the last one down, ``n_gpu_layers = k`` puts the output layer and the last
``k - 1`` repeating layers on the devices, split between devices by their free memory, each layer's KV
cells with the layer, and ``DEVICE_HEADROOM`` (upstream's 1 GiB target) left free on every device. Unlike
upstream it knows the lazy cache and the ladder: they are allocated as their last rung's type (q8_0, q4_0),
so a lazy cache plans as q8_0 and the ladder as q4_0, with the Hadamard rotation inputs of a quantized cache.
Weights are the model's own tensors (from the GGUF header): the host maps the file range of its tensors and
the CPU backend repacks some types into a second copy (CPU_REPACK); a tied output matrix (no
``output.weight``) is loaded again with the output layer. Compute buffers follow llama.cpp's graph
allocation for one micro-batch: the output logits (n_vocab × n_ubatch f32) on the place that holds the
output layer, the feed-forward and attention activations on each place that holds layers, the inputs
(embeddings, KQ masks) in host memory.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from lazykv.core.engine import memory  # memory.available_ram: one place, for the tests too
from lazykv.core.engine.memory import (
    BASE_OVERHEAD,
    GREEN_BELOW,
    MAX_BYTES,
    N_UBATCH,
    YELLOW_BELOW,
    Fit,
    MiB,
    capped,
    ctx_limit,
    fmt_bytes,
    layer_kv_bytes,
    swa_cells,
    whole,
)
from lazykv.core.engine.model_meta import CTX_PADDING, ModelMeta, padded_ctx
from lazykv.core.kinds import KvMode

HOST_CPU = "host memory (CPU)"


@dataclass(frozen=True)
class Offload:
    """Layers placed on remote backends (llama.cpp RPC servers) when the model loads."""

    endpoints: tuple[str, ...] = ()
    n_layers: int = 0  # 0: all of them

    @classmethod
    def of(cls, endpoints: Sequence[str], n_layers: int) -> Offload:
        return cls(tuple(endpoints), n_layers)

    def layers(self, n_layer: int) -> int:
        """How many of a model's ``n_layer`` layers go to the remote backends."""
        if not self.endpoints:
            return 0
        return n_layer if self.n_layers <= 0 else min(self.n_layers, n_layer)

    @property
    def place(self) -> str:
        return f"device memory (remote: {', '.join(self.endpoints)})"


@dataclass(frozen=True)
class Estimate:
    """The host-and-remote summary of a ``plan`` the settings and the memory panel show."""

    weights: int
    kv_cache: int
    compute: int  # llama.cpp's compute buffers (host and devices) and BASE_OVERHEAD
    total: int
    available: int
    fit: Fit  # of the host part against the RAM available
    device_weights: int = 0  # of weights, kv_cache and compute, the part on the remote backends
    device_kv: int = 0
    device: str = ""  # where that part is ("": everything is in host memory)
    device_compute: int = 0

    @property
    def host(self) -> int:
        return self.total - self.device_weights - self.device_kv - self.device_compute

    def summary(self) -> str:
        host = (
            f"needs about {fmt_bytes(self.host)} of {HOST_CPU} (weights "
            f"{fmt_bytes(self.weights - self.device_weights)}, KV cache "
            f"{fmt_bytes(self.kv_cache - self.device_kv)}, buffers "
            f"{fmt_bytes(self.compute - self.device_compute)}) of {fmt_bytes(self.available)} available"
        )
        if not self.device:
            return host
        on_device = self.device_weights + self.device_kv + self.device_compute
        return (f"{host}, and {fmt_bytes(on_device)} of {self.device} (weights "
                f"{fmt_bytes(self.device_weights)}, KV cache {fmt_bytes(self.device_kv)}, buffers "
                f"{fmt_bytes(self.device_compute)})")


def estimate(
    meta: ModelMeta, n_ctx: int, kv_mode: str, available: int | None = None, offload: Offload = Offload(),
    gpus: Sequence[Device] = (), gpu_layers: GpuLayers = 0, gpu_memory: int | None = None, recent: int = 0,
) -> Estimate:
    """``plan`` as the engine will load it, summed as host memory and device memory: with RPC servers
    (``offload``: of unknown memory) ``offload.n_layers`` go to the servers and the ``gpus`` after them, as
    EngineSession.load does; else ``gpu_layers`` (AUTO or a count) on the ``gpus``.

    Layers offloaded take their weights, KV cells and compute buffers to the device (the token embeddings
    stay in host memory); the fit is of what stays in host memory, with BASE_OVERHEAD, and RED when a
    device is over its budget. It runs on the GUI thread and never raises whatever a file declares."""
    n_layer = whole(meta.n_layer)
    on_device = offload.layers(n_layer)
    if on_device:
        remote = tuple(Device(f"RPC{i}", endpoint) for i, endpoint in enumerate(offload.endpoints))
        devices = remote + tuple(gpus)
        ngl: GpuLayers = n_layer + 1 if on_device >= n_layer else on_device
        place = offload.place
    else:
        devices, ngl = tuple(gpus), gpu_layers if gpus else 0
        place = f"device memory ({', '.join(g.name for g in gpus)})" if gpus else ""
    p = plan(meta, n_ctx, kv_mode, devices, gpu_layers=ngl, gpu_memory=gpu_memory, available=available,
             recent=recent)
    dev_w = sum(d.weights for d in p.devices)
    dev_kv = sum(d.kv for d in p.devices)
    dev_c = sum(d.compute for d in p.devices)
    compute = capped(p.compute + BASE_OVERHEAD)
    total = capped(p.weights + p.kv + compute)
    return Estimate(p.weights, p.kv, compute, total, p.available, p.fit, dev_w, dev_kv,
                    place if dev_w + dev_kv + dev_c else "", dev_c)


AUTO = "auto"


GpuLayers = int | str  # AUTO, or llama.cpp's n_gpu_layers (0 none; n_layer + 1 every layer and the output)


DEVICE_HEADROOM = 1024 * MiB  # left free on every device: upstream's target (common_params.fit_params_target)


F32 = 4
WEIGHT_PROBE_TOKENS = 512  # the batch llama.cpp asks a device's supports_op about for each weight
OFFLOAD_MIN_BATCH = 32  # the batch from which CUDA and Vulkan run a host layer's products (their offload_op)


@dataclass(frozen=True)
class Device:
    """A device llama.cpp can offload to, as its backend reports it (free/total 0: it does not say)."""

    name: str  # "CUDA0", "Vulkan0", "RPC0[127.0.0.1:50052]"
    description: str = ""  # the GPU's name, an RPC server's address
    free: int = 0
    total: int = 0
    # the largest tensor an op on it may have, in bytes, as its supports_op answers (0: no limit known); a
    # Vulkan device without 64-bit indexing refuses an op with a tensor over maxStorageBufferRange
    max_tensor: int = 0

    @property
    def offloads_ops(self) -> bool:
        """A local GPU backend (CUDA, Vulkan) runs a large batch's matrix products of layers kept in host
        memory itself (its offload_op: the weights are copied over); an RPC server's backend does not."""
        return not self.name.startswith("RPC")


@dataclass(frozen=True)
class Bytes:
    """Bytes of one place by buffer kind, as llama_get_memory_use counts them."""

    weights: int = 0
    kv: int = 0
    compute: int = 0

    @property
    def total(self) -> int:
        return capped(self.weights + self.kv + self.compute)


@dataclass(frozen=True)
class DevicePlan:
    device: Device
    n_layers: int  # repeating layers on it
    output: bool  # it holds the output layer
    weights: int
    kv: int
    compute: int
    budget: int  # bytes the plan may use on it: free - DEVICE_HEADROOM, at most the limit (MAX_BYTES: no say)

    @property
    def total(self) -> int:
        return capped(self.weights + self.kv + self.compute)

    @property
    def fits(self) -> bool:
        return self.total <= self.budget


@dataclass(frozen=True)
class Plan:
    """Where a model × context × KV mode goes: host memory and each device (see the module docstring)."""

    n_ctx: int
    kv_mode: KvMode
    n_gpu_layers: int
    n_layer: int
    host: Bytes
    devices: tuple[DevicePlan, ...]
    available: int  # host RAM available
    fit: Fit
    reason: str  # one sentence: why this many layers (and what does not fit)
    recent: int = 0  # a lazy mode's recent window (tokens), counted with the KV cache

    @property
    def weights(self) -> int:
        return capped(self.host.weights + sum(d.weights for d in self.devices))

    @property
    def kv(self) -> int:
        return capped(self.host.kv + sum(d.kv for d in self.devices))

    @property
    def compute(self) -> int:
        return capped(self.host.compute + sum(d.compute for d in self.devices))

    @property
    def host_total(self) -> int:
        """What stays in host memory, with the engine's, Python's and Qt's own (BASE_OVERHEAD)."""
        return capped(self.host.total + BASE_OVERHEAD)

    def as_dict(self) -> dict[str, object]:
        """The JSON shape of ``python -m lazykv estimate --json`` (without max_ctx), sizes in bytes."""
        return {
            "n_gpu_layers": self.n_gpu_layers,
            "fit": self.fit.value,
            "host": {"weights": self.host.weights, "kv": self.host.kv, "compute": self.host.compute},
            "devices": [{"name": d.device.name, "free": d.device.free, "total": d.device.total,
                         "weights": d.weights, "kv": d.kv, "compute": d.compute} for d in self.devices],
        }


def device_budget(device: Device, gpu_memory: int | None = None) -> int:
    """Bytes a plan may use on ``device``: its free memory less DEVICE_HEADROOM (none left: 0), at most
    ``gpu_memory``; a device that reports no memory is held to ``gpu_memory`` alone (else not at all)."""
    limit = MAX_BYTES if gpu_memory is None or gpu_memory <= 0 else whole(gpu_memory)
    if device.free <= 0 and device.total <= 0:
        return limit
    return min(limit, max(0, whole(device.free) - DEVICE_HEADROOM))


def plan(meta: ModelMeta, n_ctx: int, kv_mode: str, devices: Sequence[Device] = (),
         gpu_layers: GpuLayers = AUTO, gpu_memory: int | None = None, available: int | None = None,
         recent: int = 0) -> Plan:
    """The plan for ``meta`` with ``n_ctx`` tokens of ``kv_mode`` cache (see the module docstring).

    ``gpu_layers``: AUTO, as many layers as fit every device's budget with their KV cells and the compute
    buffers (none without devices); or llama.cpp's n_gpu_layers (0..n_layer + 1, more is all), planned as
    asked: a device over its budget makes the plan RED. ``gpu_memory`` (bytes): use at most this much of
    each device. ``recent``: a lazy cache's recent window (tokens), counted with the KV cache.
    Whole-number arithmetic, every figure capped at MAX_BYTES: it never raises whatever a file declares."""
    mode = KvMode(kv_mode)
    n_layer = whole(meta.n_layer)
    most = n_layer + 1 if n_layer else 0
    budgets = [device_budget(d, gpu_memory) for d in devices]
    if not devices:
        ngl = 0
        why = "no GPU: the model runs on the CPU"
    elif gpu_layers == AUTO:
        ngl = _most_layers(meta, n_ctx, mode, devices, budgets, most, recent)
        why = _auto_reason(meta, n_ctx, mode, devices, budgets, ngl, most, gpu_memory, recent)
    else:
        ngl = min(max(0, whole(int(gpu_layers))), most)
        why = f"{ngl} of {most} layers on the GPU, as set" if ngl < most else "every layer on the GPU, as set"
    host, placed_on = _place(meta, n_ctx, mode, devices, budgets, ngl, recent)
    refused = [d for d in devices if not _holds_output(meta, d)]
    if ngl > 0 and refused and not any(d.output for d in placed_on):
        why += (f"; the output layer stays in host memory: {refused[-1].name} takes no tensor over "
                f"{fmt_bytes(refused[-1].max_tensor)}, less than its product needs")
    available = memory.available_ram() if available is None else available
    host_need = capped(host.total + BASE_OVERHEAD)
    share = host_need / available if available > 0 else float("inf")
    fit = Fit.GREEN if share < GREEN_BELOW else Fit.YELLOW if share < YELLOW_BELOW else Fit.RED
    over = [d for d in placed_on if not d.fits]
    if over:
        fit = Fit.RED
        why += "; " + ", ".join(f"{d.device.name} needs {fmt_bytes(d.total)} of {fmt_bytes(d.budget)}"
                                 for d in over)
    return Plan(whole(n_ctx), mode, ngl, n_layer, host, placed_on, available, fit, why, whole(recent))


def max_ctx(meta: ModelMeta, kv_mode: str, devices: Sequence[Device] = (), gpu_layers: GpuLayers = AUTO,
            gpu_memory: int | None = None, available: int | None = None, recent: int = 0) -> int:
    """The longest context (a multiple of 256, at most ``ctx_limit``) whose plan is not RED; 0 if none is."""
    available = memory.available_ram() if available is None else available

    def ok(n: int) -> bool:
        return plan(meta, n, kv_mode, devices, gpu_layers, gpu_memory, available, recent).fit is not Fit.RED

    lo, hi = 0, ctx_limit(meta) // CTX_PADDING  # in steps of 256 tokens: ok(lo) holds (0: none)
    if not ok(CTX_PADDING):
        return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid * CTX_PADDING):
            lo = mid
        else:
            hi = mid - 1
    return lo * CTX_PADDING


def max_ctx_per_mode(meta: ModelMeta, devices: Sequence[Device] = (), gpu_layers: GpuLayers = AUTO,
                     gpu_memory: int | None = None, available: int | None = None,
                     recent: int = 0) -> dict[KvMode, int]:
    """``max_ctx`` of every KV mode (0 for a mode the model cannot use: see ModelMeta.kv_support)."""
    available = memory.available_ram() if available is None else available
    support = meta.kv_support()
    return {mode: max_ctx(meta, mode, devices, gpu_layers, gpu_memory, available, recent)
            if support.allows(mode) else 0 for mode in KvMode}


def _most_layers(meta: ModelMeta, n_ctx: int, mode: KvMode, devices: Sequence[Device], budgets: list[int],
                 most: int, recent: int = 0) -> int:
    """The largest n_gpu_layers whose devices all stay within budget (the need grows with the count)."""

    def fits(ngl: int) -> bool:
        return all(d.fits for d in _place(meta, n_ctx, mode, devices, budgets, ngl, recent)[1])

    lo, hi = 0, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _auto_reason(meta: ModelMeta, n_ctx: int, mode: KvMode, devices: Sequence[Device], budgets: list[int],
                 ngl: int, most: int, gpu_memory: int | None, recent: int = 0) -> str:
    room = " + ".join(fmt_bytes(b) for b in budgets)
    limit = f" (at most {fmt_bytes(gpu_memory)} each, as set)" if gpu_memory else ""
    if ngl >= most:
        return f"every layer fits on the GPU: {room} to use{limit}"
    if ngl == 0:
        need = sum(d.total for d in _place(meta, n_ctx, mode, devices, budgets, 1, recent)[1])
        return (f"no layer fits on the GPU: the output layer with its buffers alone needs {fmt_bytes(need)}, "
                f"{room} to use{limit}; the model runs on the CPU")
    return (f"{ngl} of {most} layers fit on the GPU ({room} to use{limit}, leaving "
            f"{fmt_bytes(DEVICE_HEADROOM)} free); the rest run on the CPU")


def _place(meta: ModelMeta, n_ctx: int, mode: KvMode, devices: Sequence[Device], budgets: list[int],
           ngl: int, recent: int = 0) -> tuple[Bytes, tuple[DevicePlan, ...]]:
    """The bytes in host memory and on each device with ``ngl`` layers offloaded, as llama.cpp places them."""
    n_layer = whole(meta.n_layer)
    cells = padded_ctx(whole(n_ctx))
    kv_layers = layer_kv_bytes(meta, cells, mode, recent)  # a sliding-window layer's cache is smaller
    layout = _layout(meta)
    weights = layout.weights
    n_dev = len(devices)
    dev_w, dev_kv, dev_layers = [0] * n_dev, [0] * n_dev, [0] * n_dev
    # llama.cpp keeps the layers before the first offloaded one on the CPU: the host's are a prefix
    start = n_layer + 1 - min(ngl, n_layer + 1) if devices and ngl > 0 else n_layer + 1
    n_host = min(start, n_layer)
    host_kv = sum(kv_layers[:n_host])
    if n_dev == 1:
        dev_layers[0] = n_layer - n_host
        dev_w[0] = sum(weights[n_host:n_layer])
        dev_kv[0] = sum(kv_layers[n_host:n_layer])
        out_dev = 0 if start <= n_layer else -1
    else:
        owner = _layer_owners(n_layer, ngl, devices)  # per layer and the output: device index, -1 host
        for il in range(n_host, n_layer):
            where = owner[il]
            dev_w[where] += weights[il]
            dev_kv[where] += kv_layers[il]
            dev_layers[where] += 1
        out_dev = owner[n_layer]
    # the device of the first offloaded layer, the one the host layers' output goes to
    first_dev = -1 if n_host >= n_layer else 0 if n_dev == 1 else owner[n_host]
    if out_dev >= 0 and not _holds_output(meta, devices[out_dev]):
        out_dev = -1
    host_layers = range(n_host)
    output_w = weights[n_layer]
    if out_dev >= 0:
        dev_w[out_dev] += output_w
    # host weights: the file range its tensors span (memory-mapped), and the CPU's repacked copies
    tensors = meta.tensors
    if tensors is not None:
        k = min(len(host_layers), len(tensors.layers))
        groups = [tensors.token_embd, tensors.other] + ([tensors.output] if out_dev < 0 else [])
        prefix = layout.prefix_span[k]
        spans = [(g.start, g.end) for g in groups if g.nbytes] + ([prefix] if prefix is not None else [])
        mapped = max(e for _, e in spans) - min(b for b, _ in spans) if spans else 0
        host_w = mapped + layout.prefix_repack[k] + (tensors.output.repack if out_dev < 0 else 0)
    else:
        host_w = whole(meta.file_size) - sum(dev_w)
    # compute buffers of one micro-batch (n_ubatch tokens)
    n_ub = min(N_UBATCH, cells)
    per_token = F32 * n_ub
    n_embd, n_vocab = whole(meta.n_embd), whole(meta.n_vocab)
    # a layer's activations: the feed-forward's three n_ff rows, the residual and the attention's queries;
    # with a quantized cache llama.cpp's allocator overlaps more of them (fitted on SmolLM2 and Gemma-3:
    # within 5 % on both, bench/plan_accuracy.py)
    layer_floats = 3 * whole(meta.n_ff) + n_embd + whole(meta.n_head) * whole(meta.head_k)
    # not on a local GPU's buffer: Gemma-3 and SmolLM2 on lavapipe are within 5 % without it, under with it
    gpu_layer_act = layer_floats * per_token
    if mode is not KvMode.F16:
        layer_floats -= n_embd // 2
    layer_act = layer_floats * per_token
    iswa = whole(meta.sliding_window) > 0
    # f16 KQ masks: the full one and the sliding window's (over the window's cells, swa_cells)
    masks = (cells + (swa_cells(meta, cells) if iswa else 0)) * n_ub * 2
    rotations = _rotation_bytes(meta, mode) * (2 if iswa else 1)
    inputs = 2 * n_embd * per_token + masks + rotations
    logits = n_vocab * per_token
    if out_dev < 0:  # the output on the CPU, with every layer (ngl 0 or no device)
        host_compute = max(logits + 2 * n_embd * per_token, inputs + layer_act)
    else:
        # the layers kept in host memory compute there, unless the local GPU that holds the others runs
        # their products itself (its offload_op: CUDA, Vulkan)
        offloaded = devices[out_dev].offloads_ops and n_ub >= OFFLOAD_MIN_BATCH
        host_compute = inputs + (layer_act if host_layers and not offloaded else 0)
    # the local GPU that runs the host layers' products (the first one the scheduler asks): one such layer at
    # a time, with what it copies in, the layer's K/V cells and its largest weight (GGML_SCHED_DEBUG, Gemma-3
    # on lavapipe with 9 of 18 layers in host memory: cache_k_l5, cache_v_l5 and the feed-forward's matrices)
    in_use = [bool(dev_layers[i]) or i == out_dev for i in range(n_dev)]
    runner = -1
    if n_host and n_ub >= OFFLOAD_MIN_BATCH:
        runner = next((i for i, d in enumerate(devices) if d.offloads_ops and in_use[i]), -1)
    host_layer = 0
    if runner >= 0:
        largest = (max(g.largest for g in tensors.layers[:n_host]) if tensors is not None and tensors.layers
                   else whole(meta.n_ff) * n_embd * 2)
        host_layer = gpu_layer_act + masks + rotations + max(kv_layers[:n_host]) + largest
    plans = []
    for i, dev in enumerate(devices):
        act = (gpu_layer_act if dev.offloads_ops else layer_act) + masks if dev_layers[i] else 0
        if i == out_dev:
            compute = max(logits + n_embd * per_token, act)
        elif dev_layers[i]:
            # without the output layer's logits to overlap with, the inputs copied in for its layers show: the
            # hidden state and the cache's rotation matrices (Gemma-3 on lavapipe, whose output layer stays in
            # host memory: within 5 % with every layer on it). After layers in host memory the hidden state is
            # two tensors: the scheduler puts the last host layer's residual add with the device's first
            # layer, so both of its operands are copied in (GGML_SCHED_DEBUG: sa_out and ffn_post_norm of
            # Gemma-3)
            states = 2 if n_host and i == first_dev else 1
            compute = act + states * n_embd * per_token + rotations
        else:
            compute = act
        if i == runner:
            compute = max(compute, host_layer)
        plans.append(DevicePlan(dev, dev_layers[i], i == out_dev, capped(dev_w[i]), capped(dev_kv[i]),
                                capped(compute if in_use[i] else 0), budgets[i]))
    return Bytes(capped(host_w), capped(host_kv), capped(host_compute)), tuple(plans)


def _holds_output(meta: ModelMeta, device: Device) -> bool:
    """Whether llama.cpp puts the output layer on ``device``: it asks the device's supports_op for the
    output's matrix product over a batch of 512 tokens (llama_model_loader's weight_buft_supported) and keeps
    the layer in host memory when refused. A device with a tensor size limit refuses it when the matrix or the
    logits exceed the limit (Gemma-3's 262k vocabulary on Mesa's lavapipe, whose limit is 128 MiB)."""
    limit = whole(device.max_tensor)
    if limit <= 0:
        return True
    tensors = meta.tensors
    if tensors is not None:
        matrix = tensors.token_embd.nbytes if tensors.tied else tensors.output.nbytes
    else:
        matrix = whole(meta.n_vocab) * whole(meta.n_embd) * 2  # no tensor table: as if f16
    batch = F32 * WEIGHT_PROBE_TOKENS
    return max(matrix, whole(meta.n_vocab) * batch, whole(meta.n_embd) * batch) <= limit


def _rotation_bytes(meta: ModelMeta, mode: KvMode) -> int:
    """The Hadamard rotation inputs of a quantized K and V cache (llama_kv_cache: attn_rot_k, attn_rot_v)."""
    if mode is KvMode.F16:
        return 0
    head_k, head_v = whole(meta.head_k), whole(meta.head_v)
    total = 0
    if head_k and head_k % 64 == 0:
        n = 64
        while head_k % (2 * n) == 0 and n < 1 << 16:
            n *= 2
        total += n * n * F32
    if head_v and head_v % 64 == 0:
        total += 64 * 64 * F32
    return total


@dataclass(frozen=True)
class _Layout:
    """A model's layers as the planner sums them, computed once per model (max_ctx plans it many times)."""

    weights: list[int]  # each repeating layer's bytes on a device, then the output layer's
    prefix_span: list[tuple[int, int] | None]  # [k]: the file range of layers 0..k-1 (None: no bytes)
    prefix_repack: list[int]  # [k]: the CPU's repacked bytes of layers 0..k-1


_last_layout: tuple[ModelMeta, _Layout] | None = None


def _layout(meta: ModelMeta) -> _Layout:
    global _last_layout
    last = _last_layout
    if last is not None and last[0] is meta:
        return last[1]
    spans: list[tuple[int, int] | None] = [None]
    repack = [0]
    layers = meta.tensors.layers if meta.tensors is not None else ()
    for g in layers:
        last_span = spans[-1]
        if g.nbytes:
            last_span = (g.start, g.end) if last_span is None else (min(last_span[0], g.start),
                                                                    max(last_span[1], g.end))
        spans.append(last_span)
        repack.append(repack[-1] + g.repack)
    layout = _Layout(_layer_weights(meta), spans, repack)
    _last_layout = (meta, layout)
    return layout


def _layer_weights(meta: ModelMeta) -> list[int]:
    """Bytes of each repeating layer, then of the output layer, on a device (a tied output matrix: the token
    embeddings again). Without tensor data (metadata built by hand): the file's bytes over the layers."""
    n_layer = whole(meta.n_layer)
    tensors = meta.tensors
    if tensors is None:
        share = whole(meta.file_size) // n_layer if n_layer else 0
        return [share] * n_layer + [0]
    layers = [tensors.layers[i].nbytes if i < len(tensors.layers) else 0 for i in range(n_layer)]
    output = tensors.output.nbytes + (tensors.token_embd.nbytes if tensors.tied else 0)
    return layers + [output]


def _layer_owners(n_layer: int, ngl: int, devices: Sequence[Device]) -> list[int]:
    """For each repeating layer and the output layer (index n_layer): the device index that holds it, -1 for
    the CPU (llama_model::load_tensors: the last ``ngl`` of the n_layer + 1, split by free memory)."""
    if not devices or ngl <= 0:
        return [-1] * (n_layer + 1)
    act = min(ngl, n_layer + 1)
    start = n_layer + 1 - act
    if len(devices) == 1:
        return [-1] * start + [0] * act
    frees = [float(d.free if d.free > 0 else 1) for d in devices]
    total = sum(frees)
    splits, acc = [], 0.0
    for f in frees:
        acc += f
        splits.append(acc / total)
    owners = []
    for il in range(n_layer + 1):
        if il < start:
            owners.append(-1)
            continue
        frac = (il - start) / act
        owners.append(min(bisect.bisect_right(splits, frac), len(devices) - 1))
    return owners
