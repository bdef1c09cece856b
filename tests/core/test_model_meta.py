"""GGUF metadata read without loading, KV mode support, and the memory estimate vs the engine."""

from __future__ import annotations

import ctypes
from dataclasses import replace
from pathlib import Path

import llama_cpp
import pytest

from lazykv.core.engine.memory import MAX_BYTES, Fit, GiB, fmt_bytes, process_rss, tokens_per_gib
from lazykv.core.engine.model_meta import GGML_BLOCKS, GGUFError, padded_ctx, read_model_meta
from lazykv.core.engine.planner import estimate
from lazykv.core.kinds import DEFAULT_KV_RECENT, DEFAULT_KV_SINKS
from tests.support.synthetic_gguf import SyntheticShape, write_llama_gguf


def test_smollm2_metadata(smollm2_path: Path) -> None:
    meta = read_model_meta(smollm2_path)
    assert meta.architecture == "llama"
    assert 130e6 < meta.n_params < 140e6
    assert meta.n_ctx_train == 8192
    assert (meta.n_layer, meta.n_head, meta.n_head_kv, meta.head_k, meta.head_v) == (30, 9, 3, 64, 64)
    assert meta.n_vocab == 49152
    assert meta.has_chat_template and meta.sliding_window == 0
    assert meta.kv_support().lazy


def test_gemma3_metadata(gemma3_path: Path) -> None:
    meta = read_model_meta(gemma3_path)
    assert meta.architecture == "gemma3"
    assert (meta.head_k, meta.head_v, meta.n_layer) == (256, 256, 18)
    assert meta.sliding_window == 512
    assert meta.kv_support().q8_0


def test_params_match_the_engine(smollm2_path: Path) -> None:
    llama = llama_cpp.Llama(model_path=str(smollm2_path), n_ctx=256, verbose=False, vocab_only=False)
    try:
        assert read_model_meta(smollm2_path).n_params == llama_cpp.llama_model_n_params(llama.model)
    finally:
        llama.close()


@pytest.mark.parametrize("kv_mode", ["f16", "q8_0", "lazy"])
def test_kv_estimate_is_what_the_engine_allocates(model_path: Path, kv_mode: str) -> None:
    n_ctx = 1000  # padded to 1024 by the engine
    meta = read_model_meta(model_path)
    params: dict[str, object] = {"flash_attn": True}
    if kv_mode != "f16":
        params.update(type_k=llama_cpp.GGML_TYPE_Q8_0, type_v=llama_cpp.GGML_TYPE_Q8_0)
    llama = llama_cpp.Llama(model_path=str(model_path), n_ctx=n_ctx, verbose=False,
                            kv_lazy_quant=kv_mode == "lazy", **params)
    try:
        assert estimate(meta, n_ctx, kv_mode).kv_cache == llama.kv_lazy_info().kv_bytes
        if kv_mode == "lazy":
            assert meta.lazy_f16_cells(n_ctx) == llama.kv_lazy_info().n_cells_f16
    finally:
        llama.close()


@pytest.mark.parametrize("kv_mode", ["lazy", "ladder"])
def test_tokens_per_gib_is_what_the_engine_allocates(model_path: Path, kv_mode: str) -> None:
    """The figure Settings, estimate and the Models page give for the app's defaults (a 4,096-token context,
    the 128-token recent window and 4 sinks, sliding-window layers holding their window): the engine's own
    bytes."""
    ggml_type = llama_cpp.GGML_TYPE_Q8_0 if kv_mode == "lazy" else llama_cpp.GGML_TYPE_Q4_0
    llama = llama_cpp.Llama(model_path=str(model_path), n_ctx=4096, verbose=False, flash_attn=True,
                            swa_full=False, type_k=ggml_type, type_v=ggml_type, kv_lazy_quant=True,
                            kv_lazy_recent=DEFAULT_KV_RECENT, kv_lazy_sinks=DEFAULT_KV_SINKS)
    try:
        engine = round(4096 * GiB / llama.kv_lazy_info().kv_bytes)
    finally:
        llama.close()
    window = DEFAULT_KV_RECENT + DEFAULT_KV_SINKS
    assert tokens_per_gib(read_model_meta(model_path), 4096, kv_mode, window) == engine


def test_head_size_not_a_multiple_of_32_rules_out_q8_0(tmp_path: Path) -> None:
    path = write_llama_gguf(tmp_path / "odd.gguf", SyntheticShape(head_dim=80))
    support = read_model_meta(path).kv_support()
    assert support.f16 and not support.q8_0 and not support.lazy
    assert "head size 80 not a multiple of 32" in support.reason


def test_no_flash_attention_rules_out_q8_0(smollm2_path: Path) -> None:
    support = read_model_meta(smollm2_path).kv_support(flash_attn=False)
    assert not support.allows("lazy") and support.allows("f16")
    assert "flash attention" in support.reason


def test_recurrent_models_have_no_kv_modes(smollm2_path: Path) -> None:
    meta = replace(read_model_meta(smollm2_path), architecture="mamba")
    assert not meta.kv_support().f16 and "recurrent" in meta.kv_support().reason


def test_not_gguf_and_truncated_files_are_refused(tmp_path: Path, smollm2_path: Path) -> None:
    not_gguf = tmp_path / "a.gguf"
    not_gguf.write_bytes(b"PK\x03\x04zip")
    with pytest.raises(GGUFError) as refused:
        read_model_meta(not_gguf)
    assert str(refused.value) == "a.gguf is not a GGUF model file."  # the magic bytes in the details
    assert "magic" in refused.value.details and "magic" not in str(refused.value)
    whole = smollm2_path.read_bytes()
    for cut in (5000, len(whole) // 2):  # inside the header, inside the tensor data
        truncated = tmp_path / "b.gguf"
        truncated.write_bytes(whole[:cut])
        with pytest.raises(GGUFError) as refused:
            read_model_meta(truncated)
        assert str(refused.value).startswith("b.gguf is incomplete: the file ends before the model does")
        assert "download it again" in str(refused.value) and "truncated" in refused.value.details


def test_estimate_is_coloured_against_available_ram(smollm2_path: Path) -> None:
    meta = read_model_meta(smollm2_path)
    need = estimate(meta, 4096, "lazy", available=10**12).total
    assert estimate(meta, 4096, "lazy", available=10 * need).fit is Fit.GREEN
    assert estimate(meta, 4096, "lazy", available=int(1.4 * need)).fit is Fit.YELLOW
    assert estimate(meta, 4096, "lazy", available=need).fit is Fit.RED
    assert estimate(meta, 8192, "f16", 10**12).kv_cache == 2 * estimate(meta, 4096, "f16", 10**12).kv_cache
    assert estimate(meta, 4096, "lazy", 10**12).kv_cache < estimate(meta, 4096, "f16", 10**12).kv_cache


def test_estimate_never_raises_on_absurd_values(smollm2_path: Path) -> None:
    """It runs on the GUI thread: 1e308 (a float in a crafted file) used to raise OverflowError."""
    absurd = replace(read_model_meta(smollm2_path), n_embd=1e308, head_k=10**400, n_layer=float("nan"),
                     n_vocab=-1)
    for kv_mode in ("f16", "q8_0", "lazy"):
        est = estimate(absurd, 10**30, kv_mode, available=10**10)
        assert est.fit is Fit.RED and est.total <= MAX_BYTES
        assert "GiB" in est.summary()


def test_helpers() -> None:
    assert padded_ctx(1) == 256 and padded_ctx(1000) == 1024 and padded_ctx(4096) == 4096
    assert fmt_bytes(1536) == "1.5 KiB" and fmt_bytes(3 * 1024**3) == "3.0 GiB"
    assert process_rss() > 10 * 1024 * 1024


def test_ggml_block_sizes_are_the_engines() -> None:
    """model_meta's table (to find files shorter than their tensors) is ggml's own, type by type."""
    lib = ctypes.CDLL(str(next((Path(llama_cpp.__file__).parent / "lib").glob("libggml-base.*"))))
    lib.ggml_blck_size.restype, lib.ggml_blck_size.argtypes = ctypes.c_int64, [ctypes.c_int]
    lib.ggml_type_size.restype, lib.ggml_type_size.argtypes = ctypes.c_size_t, [ctypes.c_int]
    engine = {t: (lib.ggml_blck_size(t), lib.ggml_type_size(t)) for t in range(max(GGML_BLOCKS) + 1)}
    assert GGML_BLOCKS == {t: sizes for t, sizes in engine.items() if sizes[0] > 0}


def test_a_split_model_is_read_from_all_its_shards(
    tmp_path: Path, split_shards: dict[str, bytes], tiny_gguf: Path
) -> None:
    """The app loads a split model by its first shard, as llama.cpp does: the metadata (what the memory plan
    and the estimate read) covers every shard, and a missing shard is named before llama.cpp is asked."""
    from lazykv.core.engine.model_load import read_checked_meta
    from lazykv.core.engine.types import ModelNotFoundError

    for name, data in split_shards.items():
        (tmp_path / name).write_bytes(data)
    first, *rest = sorted(tmp_path.glob("split-Q8_0-*.gguf"))
    meta = read_checked_meta(first)
    assert meta.file_size == sum(p.stat().st_size for p in (first, *rest))
    one_file = read_checked_meta(tiny_gguf)  # the same shape in one file
    assert meta.n_params == one_file.n_params
    assert meta.tensors is not None and one_file.tensors is not None
    assert meta.tensors.total == one_file.tensors.total

    rest[-1].unlink()
    missing = f"{rest[-1].name} is missing: {first.name} is the first of 3"
    with pytest.raises(ModelNotFoundError, match=missing):
        read_checked_meta(first)
