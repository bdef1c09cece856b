"""What loading a model checks and decides before llama.cpp sees it: the file (llama.cpp reports a
non-GGUF file only as a generic failure, and aborts on some absurd values), the KV mode's cache
parameters, the context a memory budget holds, a plan that does not fit, and the remote backends
that answer."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import llama_cpp

from lazykv.core.engine.memory import context_for_budget, fmt_bytes, kv_bytes
from lazykv.core.engine.model_meta import CTX_PADDING, GGUFError, ModelMeta, read_model_meta
from lazykv.core.engine.planner import AUTO, Device, Plan, max_ctx, plan
from lazykv.core.engine.remote import Unreachable, normalize_endpoints, probe_all
from lazykv.core.engine.shards import merged_meta, shard_paths
from lazykv.core.engine.types import (
    ContextBudgetError,
    ModelFileError,
    ModelLoadError,
    ModelNotFoundError,
    NotGGUFError,
)
from lazykv.core.errors import EngineError
from lazykv.core.kinds import KvMode, StorageType

GGUF_MAGIC = b"GGUF"


TYPE_NAMES = {
    llama_cpp.GGML_TYPE_F16: StorageType.F16, llama_cpp.GGML_TYPE_Q8_0: StorageType.Q8_0,
    llama_cpp.GGML_TYPE_F32: StorageType.F32, llama_cpp.GGML_TYPE_Q4_0: StorageType.Q4_0,
    llama_cpp.GGML_TYPE_Q5_0: StorageType.Q5_0,
}


GGML_TYPES = {name: ggml_type for ggml_type, name in TYPE_NAMES.items()}


def check_model_file(path: Path) -> None:
    """Raise a ModelFileError unless ``path`` is a readable file starting with the GGUF magic.

    Checked here because llama.cpp reports a non-GGUF file only as a generic load failure.
    """
    if not path.is_file():
        raise ModelNotFoundError(f"model file not found: {path}")
    try:
        with path.open("rb") as f:
            magic = f.read(len(GGUF_MAGIC))
    except OSError as err:
        raise ModelFileError(f"cannot read model file {path}: {err.strerror}") from err
    if magic != GGUF_MAGIC:
        raise NotGGUFError(f"{path.name} is not a GGUF model file.",
                           f"{path}: it starts with {magic!r}, not the GGUF magic {GGUF_MAGIC!r}")


def read_checked_meta(path: Path) -> ModelMeta:
    """The model's metadata, or the ModelFileError to show (stdlib only: safe before loading). A split
    model's first shard stands for all of them, as llama.cpp opens it: every shard is checked and their
    metadata merged (the weights of every shard, which the memory plan counts)."""
    paths = shard_paths(path)
    for i, shard in enumerate(paths):
        if i and not shard.is_file():
            raise ModelNotFoundError(
                f"{shard.name} is missing: {path.name} is the first of {len(paths)} files of one model, "
                "which must lie in the same folder.", f"expected at {shard}")
        check_model_file(shard)
    try:
        return merged_meta([read_model_meta(shard) for shard in paths])
    except GGUFError as err:
        raise ModelFileError(str(err), err.details) from err


def kv_mode_of(kv_mode: str) -> KvMode:
    try:
        return KvMode(kv_mode)
    except ValueError:
        known = ", ".join(KvMode)
        raise EngineError(f"unknown KV cache mode {kv_mode!r} (known: {known})") from None


def kv_cache_params(kv_mode: KvMode, flash_attn: bool, recent: int = 0, sinks: int = 0) -> dict[str, object]:
    """A lazy cache is allocated as its last rung's type: q8_0 for lazy q8_0, q4_0 for the ladder; it keeps
    the last ``recent`` tokens and the first ``sinks`` in f16 as well. A sliding-window layer's cache holds
    its window and a batch, not the whole context (``swa_full`` off, as llama.cpp's tools and server run
    them)."""
    params: dict[str, object] = {"flash_attn": flash_attn, "swa_full": False}
    if kv_mode is not KvMode.F16:
        storage = GGML_TYPES[kv_mode.storage]
        params.update(type_k=storage, type_v=storage)
    if kv_mode.is_lazy:
        params["kv_lazy_quant"] = True
        if recent > 0:
            params["kv_lazy_recent"] = recent
        if sinks > 0:
            params["kv_lazy_sinks"] = sinks
    return params


def budget_n_ctx(meta: ModelMeta, budget: int, kv_mode: KvMode, recent: int = 0) -> int:
    """The context length a KV memory budget (bytes) holds, or ContextBudgetError saying what it takes."""
    n_ctx = context_for_budget(meta, budget, kv_mode, recent)
    if n_ctx < CTX_PADDING:
        raise ContextBudgetError(
            f"{fmt_bytes(budget)} of context memory holds fewer than {CTX_PADDING} tokens of "
            f"{meta.path.name} with the {kv_mode} KV cache: {CTX_PADDING} tokens need "
            f"{fmt_bytes(kv_bytes(meta, CTX_PADDING, kv_mode, recent))}. Raise the budget, or set it to 0 "
            "to use the context length."
        )
    return n_ctx


def refuse_what_does_not_fit(path: Path, meta: ModelMeta, chosen: Plan, devices: Sequence[Device],
                              gpu_memory: int) -> None:
    """ModelLoadError with what would fit when the plan needs more RAM than there is, or more of a device
    than it has free (llama.cpp would run out of memory, or the machine would swap)."""
    for d in chosen.devices:
        if 0 < d.device.free < d.total:
            auto = plan(meta, chosen.n_ctx, chosen.kv_mode, devices, AUTO, gpu_memory or None,
                        chosen.available, chosen.recent).n_gpu_layers
            fits = f", or at most {auto}" if auto else " (the model then runs on the CPU)"
            raise ModelLoadError(
                f"{path.name} with {chosen.n_gpu_layers} GPU layers needs about {fmt_bytes(d.total)} of "
                f"{d.device.name}, which has {fmt_bytes(d.device.free)} free: choose Auto GPU layers{fits}.")
    if chosen.host_total <= chosen.available:
        return
    kv_mode = chosen.kv_mode
    args = (devices, AUTO, gpu_memory or None, chosen.available, chosen.recent)
    same = max_ctx(meta, kv_mode, *args)
    ladder = max_ctx(meta, KvMode.LADDER, *args) if meta.kv_support().allows(KvMode.LADDER) else 0
    need = (f"{path.name} with {chosen.n_ctx} tokens of {kv_mode} KV cache needs about "
            f"{fmt_bytes(chosen.host_total)} of RAM, and {fmt_bytes(chosen.available)} is available")
    if same:
        better = f"; with the ladder KV cache {ladder} tokens fit" if ladder > same else ""
        raise ModelLoadError(f"{need}: at most {same} tokens fit{better}. Lower the context length.")
    if ladder:
        raise ModelLoadError(f"{need}: with the ladder KV cache {ladder} tokens fit. Choose the ladder.")
    raise ModelLoadError(f"{need}: it does not fit in this machine's memory at any context length.")


_registered: set[str] = set()  # RPC servers registered with the engine: process-wide, as in ggml


def remote_backends(endpoints: Sequence[str]) -> tuple[list[str], list[Unreachable]]:
    """The endpoints the engine may use (they answered, and the engine registered them), and the others.

    Probed first: llama.cpp's RPC client aborts the process on a server that does not answer."""
    reachable, unreachable = probe_all(normalize_endpoints(endpoints), in_use=frozenset(_registered))
    usable: list[str] = []
    for endpoint in reachable:
        try:
            llama_cpp.rpc_add_server(endpoint)
        except (RuntimeError, ConnectionError) as err:  # no RPC in this build; gone since the probe
            unreachable.append(Unreachable(endpoint, str(err)))
        else:
            _registered.add(endpoint)
            usable.append(endpoint)
    return usable, unreachable
