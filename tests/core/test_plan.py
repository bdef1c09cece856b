"""The memory plan (issue 26): host and devices, layer by layer, auto offload within budgets, max context."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from bench import plan_accuracy

from lazykv.core.engine.memory import MAX_BYTES, Fit, GiB, MiB
from lazykv.core.engine.model_meta import ModelMeta, TensorBytes, TensorGroup
from lazykv.core.engine.planner import (
    AUTO,
    DEVICE_HEADROOM,
    Device,
    _layer_owners,
    max_ctx,
    max_ctx_per_mode,
    plan,
)
from lazykv.core.kinds import KvMode
from tests.support.rpc_server import rpc_server

RAM = 64 * GiB
LAYER = 200 * MiB


def _meta(n_layer: int = 32, tied: bool = False) -> ModelMeta:
    """An 8B-like model: 32 layers of 200 MiB, 500 MiB of embeddings, a 500 MiB output matrix."""
    first = 500 * MiB
    layers = tuple(TensorGroup(LAYER, 0, first + i * LAYER, first + (i + 1) * LAYER) for i in range(n_layer))
    end = 500 * MiB + n_layer * LAYER
    output = TensorGroup(MiB if tied else 501 * MiB, 0, end, end + 501 * MiB)
    tensors = TensorBytes(TensorGroup(500 * MiB, 0, 0, 500 * MiB), layers, output, TensorGroup(), tied)
    return ModelMeta(
        path=Path("m.gguf"), file_size=tensors.total + MiB, gguf_version=3, architecture="llama", name="m",
        n_params=8_000_000_000, n_ctx_train=131072, n_layer=n_layer, n_embd=4096, n_head=32, n_head_kv=8,
        head_k=128, head_v=128, n_vocab=128256, sliding_window=0, has_chat_template=True, tensors=tensors,
        n_ff=14336,
    )


def gpu(free_gib: float, total_gib: float = 8, name: str = "CUDA0") -> Device:
    return Device(name, "NVIDIA GeForce RTX 4060 Laptop GPU", int(free_gib * GiB), int(total_gib * GiB))


def test_without_a_device_everything_is_in_host_memory() -> None:
    p = plan(_meta(), 8192, "f16", available=RAM)
    assert p.n_gpu_layers == 0 and p.devices == () and "CPU" in p.reason
    assert p.host.weights == _meta().tensors.total  # the mapped file range of every tensor
    assert p.host.kv == 8192 * 32 * 8 * 256 * 2
    assert p.host.compute >= 128256 * 512 * 4  # the logits of one micro-batch
    assert p.fit is Fit.GREEN


def test_llama_cpp_places_the_output_layer_and_the_last_layers() -> None:
    """n_gpu_layers = k: the output layer and the last k - 1 repeating layers (llama_model::load_tensors)."""
    one = (gpu(8),)
    assert _layer_owners(4, 0, one) == [-1, -1, -1, -1, -1]
    assert _layer_owners(4, 1, one) == [-1, -1, -1, -1, 0]
    assert _layer_owners(4, 3, one) == [-1, -1, 0, 0, 0]
    assert _layer_owners(4, 5, one) == [0, 0, 0, 0, 0] == _layer_owners(4, 99, one)
    # two devices: split by free memory, the output on the last
    assert _layer_owners(4, 5, (gpu(3, name="CUDA0"), gpu(1, name="CUDA1"))) == [0, 0, 0, 0, 1]


def test_auto_offloads_as_many_layers_as_fit_leaving_headroom() -> None:
    meta = _meta()
    roomy = plan(meta, 8192, "f16", (gpu(24, 24),), AUTO, available=RAM)
    assert roomy.n_gpu_layers == 33 and "every layer" in roomy.reason
    assert roomy.host.kv == 0 and roomy.devices[0].kv == roomy.kv
    assert roomy.host.weights == 500 * MiB  # the token embeddings stay in host memory
    small = plan(meta, 8192, "f16", (gpu(6, 8),), AUTO, available=RAM)
    assert 0 < small.n_gpu_layers < 33
    dev = small.devices[0]
    assert dev.total <= 5 * GiB == dev.budget == 6 * GiB - DEVICE_HEADROOM
    one_more = plan(meta, 8192, "f16", (gpu(6, 8),), small.n_gpu_layers + 1, available=RAM)
    assert one_more.devices[0].total > dev.budget and one_more.fit is Fit.RED  # auto took the most that fit
    assert f"{small.n_gpu_layers} of 33 layers fit on the GPU" in small.reason


def test_the_gpu_memory_limit_caps_every_device() -> None:
    p = plan(_meta(), 8192, "q8_0", (gpu(22, 24),), AUTO, gpu_memory=3 * GiB, available=RAM)
    assert 0 < p.n_gpu_layers < 33 and p.devices[0].total <= 3 * GiB
    assert "at most 3.0 GiB each, as set" in p.reason


def test_a_device_too_small_for_the_output_layer_plans_for_the_cpu_and_says_so() -> None:
    p = plan(_meta(), 8192, "f16", (gpu(1.2, 2),), AUTO, available=RAM)
    assert p.n_gpu_layers == 0 and p.devices[0].total == 0
    assert "no layer fits on the GPU" in p.reason and "runs on the CPU" in p.reason


def test_a_fixed_layer_count_over_budget_is_red_and_says_which_device() -> None:
    p = plan(_meta(), 8192, "f16", (gpu(4, 8),), 33, available=RAM)
    assert p.n_gpu_layers == 33 and p.fit is Fit.RED
    assert "CUDA0 needs" in p.reason


def test_the_lazy_cache_plans_as_q8_0_and_the_ladder_as_q4_0() -> None:
    meta = _meta()
    kv = {mode: plan(meta, 8192, mode, available=RAM).kv for mode in KvMode}
    assert kv[KvMode.LAZY] == kv[KvMode.Q8_0] == kv[KvMode.F16] * 34 // 64
    assert kv[KvMode.LADDER] == kv[KvMode.F16] * 18 // 64
    small = (gpu(7, 8),)
    layers = {mode: plan(meta, 32768, mode, small, AUTO, available=RAM).n_gpu_layers for mode in KvMode}
    assert layers[KvMode.F16] < layers[KvMode.Q8_0] == layers[KvMode.LAZY] <= layers[KvMode.LADDER]


def test_max_ctx_is_the_longest_context_that_is_not_red() -> None:
    meta = _meta()
    ram = 16 * GiB
    per_mode = max_ctx_per_mode(meta, available=ram)
    assert 0 < per_mode[KvMode.F16] < per_mode[KvMode.Q8_0] == per_mode[KvMode.LAZY] < per_mode[KvMode.LADDER]
    for mode, n in per_mode.items():
        assert n % 256 == 0
        assert plan(meta, n, mode, available=ram).fit is not Fit.RED
        if n < 131072:
            assert plan(meta, n + 256, mode, available=ram).fit is Fit.RED
    assert max_ctx(meta, "f16", available=GiB) == 0  # not even the weights fit
    assert max_ctx(meta, "ladder", available=1 << 50) == 131072  # the model's limit


def test_two_devices_share_the_layers_and_the_output_goes_to_the_last() -> None:
    p = plan(_meta(), 4096, "q8_0", (gpu(12, 16, "CUDA0"), gpu(6, 8, "CUDA1")), 33, available=RAM)
    first, second = p.devices
    assert first.n_layers + second.n_layers == 32 and second.output and not first.output
    assert first.n_layers > second.n_layers


def test_a_device_that_reports_no_memory_is_held_to_the_limit_alone() -> None:
    unknown = Device("RPC0", "10.0.0.7:50052")
    assert plan(_meta(), 4096, "f16", (unknown,), AUTO, available=RAM).n_gpu_layers == 33
    capped = plan(_meta(), 4096, "f16", (unknown,), AUTO, gpu_memory=2 * GiB, available=RAM)
    assert 0 < capped.n_gpu_layers < 33 and capped.devices[0].total <= 2 * GiB


def test_a_tied_output_matrix_is_loaded_again_with_the_output_layer() -> None:
    tied = _meta(tied=True)
    p = plan(tied, 4096, "f16", (gpu(24, 24),), 1, available=RAM)
    assert p.devices[0].weights == MiB + 500 * MiB  # the output norm and the token embeddings again
    assert p.host.weights == tied.tensors.total - MiB  # the host keeps mapping the embeddings


def test_a_local_gpu_runs_the_host_layers_products_an_rpc_server_does_not() -> None:
    """With half of the layers offloaded, llama.cpp's scheduler hands a micro-batch's products of the layers
    kept in host memory to a local GPU (its offload_op: CUDA, Vulkan; measured on Vulkan in make
    vulkan-check), so the host's compute buffer holds the inputs only; over RPC they compute on the CPU."""
    server = Device("RPC0[10.0.0.7:50052]", "10.0.0.7:50052", 64 * GiB, 64 * GiB)
    local = plan(_meta(), 4096, "q8_0", (gpu(64),), gpu_layers=17, available=RAM)
    remote = plan(_meta(), 4096, "q8_0", (server,), gpu_layers=17, available=RAM)
    assert local.devices[0].n_layers == remote.devices[0].n_layers == 16
    assert local.devices[0].compute == remote.devices[0].compute
    activations = (3 * 14336 + 4096 + 32 * 128 - 4096 // 2) * 4 * 512  # a layer's, with a quantized cache
    assert remote.host.compute - local.host.compute == activations


def test_the_plan_never_raises_on_absurd_values() -> None:
    meta = replace(_meta(), n_embd=1e308, head_k=10**400, n_layer=float("nan"), n_vocab=-1, n_ff=10**30)
    for mode in KvMode:
        p = plan(meta, 10**30, mode, (gpu(8),), AUTO, gpu_memory=10**40, available=10**10)
        assert p.fit is Fit.RED and p.weights <= MAX_BYTES and p.host.total <= MAX_BYTES
        assert max_ctx(meta, mode, (gpu(8),), available=10**10) >= 0


def test_the_json_shape() -> None:
    p = plan(_meta(), 4096, "lazy", (gpu(6, 8),), AUTO, available=RAM)
    d = p.as_dict()
    assert set(d) == {"n_gpu_layers", "fit", "host", "devices"}
    assert set(d["host"]) == {"weights", "kv", "compute"}
    assert set(d["devices"][0]) == {"name", "free", "total", "weights", "kv", "compute"}
    assert d["fit"] in ("green", "yellow", "red")


@pytest.mark.parametrize(("model", "n_ctx", "kv_mode", "placement"), [
    ("smollm2", 1024, "q8_0", "cpu"),
    ("smollm2", 4096, "lazy", "rpc-half"),
    ("gemma3", 4096, "ladder", "rpc-all"),
    ("gemma3", 8192, "f16", "cpu"),
])
def test_the_plan_is_within_5_percent_of_what_llama_cpp_allocates(
    model: str, n_ctx: int, kv_mode: str, placement: str, smollm2_path: Path, gemma3_path: Path,
    tmp_path: Path,
) -> None:
    """A sample of bench/plan_accuracy.py's matrix (make bench runs all of it)."""
    case = plan_accuracy.Case(model, n_ctx, KvMode(kv_mode), placement)
    if placement == "cpu":
        rows = plan_accuracy.measure(case, None)
    else:
        with rpc_server(tmp_path / "rpc.log") as endpoint:
            rows = plan_accuracy.measure(case, endpoint)
    off = [(r.place, r.kind, r.measured, r.planned) for r in rows if abs(r.error) > plan_accuracy.TOLERANCE]
    assert rows and not off


def test_the_estimate_plans_auto_layers_on_the_gpus_and_rpc_before_them() -> None:
    """The settings' and the panel's estimate is this plan, as EngineSession.load will lay it out."""
    from lazykv.core.engine.planner import Offload, estimate

    meta = _meta()
    cpu = estimate(meta, 8192, "q8_0", available=RAM)
    on_gpu = estimate(meta, 8192, "q8_0", available=RAM, gpus=(gpu(6, 8),), gpu_layers=AUTO)
    p = plan(meta, 8192, "q8_0", (gpu(6, 8),), AUTO, available=RAM)
    assert on_gpu.device == "device memory (CUDA0)" and on_gpu.host < cpu.host
    assert on_gpu.device_weights == p.devices[0].weights and on_gpu.device_kv == p.devices[0].kv
    assert estimate(meta, 8192, "q8_0", available=RAM, gpus=(gpu(6, 8),), gpu_layers=0).device == ""
    both = estimate(meta, 8192, "q8_0", available=RAM, offload=Offload(("box:1",), 10), gpus=(gpu(6, 8),))
    assert both.device == "device memory (remote: box:1)" and both.device_kv == 9 * (p.kv // 32)


def test_a_device_that_refuses_the_output_matrix_leaves_the_output_layer_in_host_memory() -> None:
    """llama.cpp asks the output device's supports_op about the output's product over 512 tokens and keeps
    the layer in host memory when refused: a Vulkan device refuses any op with a tensor over its storage
    buffer range (Mesa's lavapipe: 128 MiB), here the logits (128256 x 512 f32 = 250.5 MiB)."""
    tied = _meta(tied=True)
    limited = Device("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", 64 * GiB, 64 * GiB, max_tensor=128 * MiB)
    unlimited = replace(limited, max_tensor=0)
    kept = plan(tied, 4096, "q8_0", (limited,), gpu_layers=AUTO, available=RAM)
    moved = plan(tied, 4096, "q8_0", (unlimited,), gpu_layers=AUTO, available=RAM)
    assert kept.n_gpu_layers == moved.n_gpu_layers == 33  # every layer, and the output layer asked for
    assert moved.devices[0].output and not kept.devices[0].output
    assert "the output layer stays in host memory: Vulkan0 takes no tensor over 128.0 MiB" in kept.reason
    assert "host memory" not in moved.reason
    assert kept.devices[0].n_layers == moved.devices[0].n_layers == 32
    # the output matrix (the token embeddings again) is not loaded a second time; its logits are the host's
    assert moved.devices[0].weights - kept.devices[0].weights == MiB + 500 * MiB
    assert kept.host.compute >= 128256 * 512 * 4 > moved.host.compute
    # a limit that the matrix and the logits fit under changes nothing
    roomy = plan(tied, 4096, "q8_0", (replace(limited, max_tensor=1 * GiB),), gpu_layers=AUTO, available=RAM)
    assert roomy.host == moved.host and replace(roomy.devices[0], device=unlimited) == moved.devices[0]


def test_the_tensor_limit_probe_finds_the_largest_tensor_the_device_takes() -> None:
    """devices.max_tensor bisects supports_op over the sum of two f32 vectors, allocating nothing."""
    from lazykv.core.engine import devices

    class FakeGgml:
        """supports_op as a Vulkan device without 64-bit indexing answers it: no tensor over the limit."""

        def __init__(self, limit: int) -> None:
            self.limit, self.asked = limit, 0
            for name in ("ggml_tensor_overhead", "ggml_init", "ggml_free", "ggml_new_tensor_1d", "ggml_add",
                         "ggml_backend_dev_supports_op"):
                method = getattr(self, "_" + name)
                # a plain function takes argtypes, as ctypes' do
                setattr(self, name, lambda *args, method=method: method(*args))

        def _ggml_tensor_overhead(self) -> int:
            return 368

        def _ggml_init(self, params: object) -> int:
            return 1

        def _ggml_free(self, ctx: int) -> None:
            pass

        def _ggml_new_tensor_1d(self, ctx: int, type_: int, n: int) -> int:
            return 4 * n  # "the tensor": its bytes

        def _ggml_add(self, ctx: int, a: int, b: int) -> int:
            return a

        def _ggml_backend_dev_supports_op(self, dev: int, op: int) -> bool:
            self.asked += 1
            return op <= self.limit

    for limit in (128 * MiB, 4 * GiB - 1, 2 * MiB + 12345):
        fake = FakeGgml(limit)
        found = devices.max_tensor(fake, 0)  # type: ignore[arg-type]
        assert limit - devices.PROBE_STEP < found <= limit, (limit, found)
        assert fake.asked <= 30
    assert devices.max_tensor(FakeGgml(2 << 40), 0) == 0  # type: ignore[arg-type]  # no limit
    assert devices.max_tensor(FakeGgml(1024), 0) == 0  # type: ignore[arg-type]  # refuses the op at any size


@pytest.mark.parametrize("kv_mode", ["f16", "q8_0", "ladder"])
def test_a_sliding_window_model_splits_its_cache_where_its_global_layers_are(gemma3_path: Path,
                                                                          kv_mode: str) -> None:
    """Gemma-3 270M with 10 of 19 layers offloaded (its last 9 and the output): layers 5, 11 and 17 attend
    globally (4,096 cells at n_ctx 4096), the others their window (1,024), so the device holds two global
    layers and the host one. What the engine allocated on lavapipe (make vulkan-check's plan accuracy): 12.0
    and 15.0 MiB of f16 (a layer-count split gave 13.5 and 13.5)."""
    from lazykv.core.engine.memory import kv_bytes, layer_kv_bytes
    from lazykv.core.engine.model_meta import read_model_meta

    meta = read_model_meta(gemma3_path)
    assert [il for il, swa in enumerate(meta.swa_flags()) if not swa] == [5, 11, 17]
    layers = layer_kv_bytes(meta, 4096, kv_mode)
    assert sum(layers) == kv_bytes(meta, 4096, kv_mode) and layers[5] == layers[11] == 4 * layers[0]
    p = plan(meta, 4096, kv_mode, [gpu(6)], gpu_layers=10)
    assert (p.host.kv, p.devices[0].kv) == (sum(layers[:9]), sum(layers[9:]))
    if kv_mode == "f16":
        assert (p.host.kv, p.devices[0].kv) == (12 * MiB, 15 * MiB)
    # metadata built by hand (no pattern read): the global layers spread evenly, the same three here
    assert replace(meta, swa_pattern=()).swa_flags() == meta.swa_flags()


@pytest.mark.parametrize(("kv_mode", "measured"), [("f16", 25.93), ("q8_0", 24.50), ("ladder", 23.43)])
def test_a_gpu_that_runs_the_host_layers_products_holds_their_cells(gemma3_path: Path, kv_mode: str,
                                                                    measured: float) -> None:
    """Gemma-3 270M at 4096 with 10 of 19 layers on Mesa's lavapipe (its output layer stays in host memory:
    lavapipe's 128 MiB tensor limit). For a batch of 32 tokens or more the GPU also runs the products of the
    9 layers kept in host memory, one layer at a time, with that layer's K/V cells and weights copied in: the
    global layer 5's 4 MiB of f16 cells make its compute buffer 25.93 MiB (make vulkan-check's plan
    accuracy), where the device's own layers alone need 22.75."""
    from lazykv.core.engine.model_meta import read_model_meta

    meta = read_model_meta(gemma3_path)
    lavapipe = Device("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", 2 * GiB, 2 * GiB, max_tensor=128 * MiB)
    p = plan(meta, 4096, kv_mode, [lavapipe], gpu_layers=10)
    assert not p.devices[0].output
    assert abs(p.devices[0].compute / MiB - measured) / measured <= plan_accuracy.TOLERANCE
    # over RPC the host layers compute in host memory: nothing of theirs is copied to the server
    rpc = replace(lavapipe, name="RPC0[127.0.0.1:50052]")
    assert plan(meta, 4096, kv_mode, [rpc], gpu_layers=10).devices[0].compute < p.devices[0].compute
