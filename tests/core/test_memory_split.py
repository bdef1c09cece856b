"""The memory split: the engine's buffers per place (host, each device); the estimate with remote layers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from llama_cpp import MemoryUse

from lazykv.core.engine.memory import DeviceMemory, Fit, MiB, placed, split_by_device
from lazykv.core.engine.model_meta import ModelMeta
from lazykv.core.engine.planner import HOST_CPU, Offload, estimate

RPC = "RPC0"
ENDPOINT = "127.0.0.1:50052"


Use = MemoryUse  # what llama_cpp.Llama.memory_breakdown() gives, one per buffer type


def test_buffers_are_summed_per_place_device_memory_first() -> None:
    uses = [
        Use("CPU", "CPU_Mapped", True, 100, 0, 0),
        Use(RPC, ENDPOINT, False, 900, 48, 10),
        Use("CPU", "CPU", True, 5, 2, 30),
        Use(RPC, ENDPOINT, False, 1, 0, 0),
    ]
    assert split_by_device(uses) == (
        DeviceMemory(RPC, False, 901, 48, 10, ENDPOINT),
        DeviceMemory("CPU", True, 105, 2, 30),
    )
    assert split_by_device([]) == ()


def test_places_are_named_and_empty_parts_left_out() -> None:
    rpc, cpu = DeviceMemory(RPC, False, 0, 3 * MiB, 0, ENDPOINT), DeviceMemory("CPU", True, 0, 0, 0)
    assert rpc.place == f"device memory ({RPC}, {ENDPOINT})" and cpu.place == HOST_CPU
    assert DeviceMemory("CUDA0", False, 0, 0, 0, "CUDA0").place == "device memory (CUDA0)"
    assert placed([(rpc.place, rpc.kv), (cpu.place, cpu.kv)]) == f"3.0 MiB in {rpc.place}"


def _meta(n_layer: int = 32) -> ModelMeta:
    return ModelMeta(
        path=Path("m.gguf"), file_size=3200 * MiB, gguf_version=3, architecture="llama", name="m",
        n_params=8_000_000_000, n_ctx_train=8192, n_layer=n_layer, n_embd=4096, n_head=32, n_head_kv=8,
        head_k=128, head_v=128, n_vocab=32000, sliding_window=0, has_chat_template=True,
    )


def test_cpu_only_estimate_is_host_memory() -> None:
    est = estimate(_meta(), 8192, "f16", available=64 * 1024 * MiB)
    assert est.device == "" and est.host == est.total
    assert est.kv_cache == 8192 * 32 * 8 * 256 * 2  # f16 K and V of every layer
    assert est.summary().startswith(f"needs about 4.2 GiB of {HOST_CPU} (weights 3.1 GiB, KV cache 1.0 GiB")
    assert "device memory" not in est.summary()


def test_remote_layers_take_their_share_to_the_device() -> None:
    cpu = estimate(_meta(), 8192, "f16", available=64 * 1024 * MiB)
    everything = estimate(_meta(), 8192, "f16", available=64 * 1024 * MiB, offload=Offload(("box:1",)))
    assert (everything.device_weights, everything.device_kv) == (cpu.weights, cpu.kv_cache)
    # the output layer's logits move to the device with it; the inputs stay in host memory
    assert 0 < everything.device_compute < everything.compute
    assert everything.host == everything.compute - everything.device_compute < cpu.compute
    assert everything.device == "device memory (remote: box:1)"
    assert everything.summary().endswith(
        "and 4.2 GiB of device memory (remote: box:1) (weights 3.1 GiB, KV cache 1.0 GiB, buffers 70.5 MiB)")
    half = estimate(_meta(), 8192, "f16", available=64 * 1024 * MiB, offload=Offload(("a:1", "b:2"), 16))
    # llama.cpp's n_gpu_layers = 16 (what the engine passes): the output layer and the last 15 layers
    assert half.device_kv == cpu.kv_cache * 15 // 32 and half.device_weights == cpu.weights * 15 // 32
    assert "(remote: a:1, b:2)" in half.summary()
    more = estimate(_meta(), 8192, "f16", available=64 * 1024 * MiB, offload=Offload(("a:1",), 99))
    assert more.device_kv == cpu.kv_cache  # asking for more layers than the model has: all of them
    assert estimate(_meta(), 8192, "f16", offload=Offload((), 16)).device == ""  # no servers, no offload


def test_the_fit_is_of_what_stays_in_host_memory() -> None:
    cpu = estimate(_meta(), 8192, "f16", available=4 * 1024 * MiB)
    assert cpu.fit is Fit.RED
    offloaded = estimate(_meta(), 8192, "f16", available=5 * 1024 * MiB, offload=Offload(("box:1",)))
    assert offloaded.fit is Fit.GREEN


def test_no_layers_never_divides_by_zero() -> None:
    est = estimate(replace(_meta(), n_layer=0), 4096, "lazy", available=MiB, offload=Offload(("box:1",)))
    assert est.device_kv == est.device_weights == 0 and est.device == ""


def test_the_cpus_repacked_weights_are_host_memory() -> None:
    """CPU_REPACK (ggml's extra buffer type for repacked weights) is not a "host" buffer to ggml, but it is
    in RAM: it used to show as a device of its own ("device memory (CPU, Intel(R) Xeon(R) ...)")."""
    uses = [Use("CPU", "Intel(R) Xeon(R) Processor", False, 13, 0, 0),
            Use("CPU", "CPU_Mapped", True, 200, 0, 0), Use("CPU", "CPU", True, 0, 18, 500)]
    assert split_by_device(uses) == (DeviceMemory("CPU", True, 213, 18, 500),)
