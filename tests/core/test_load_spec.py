"""LoadSpec's f16 slots beside a lazy cache: the recent window and the attention sinks (issue 49)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lazykv.core.engine.load_spec import LoadSpec, LoadSpecError
from lazykv.core.engine.model_load import kv_cache_params
from lazykv.core.kinds import DEFAULT_KV_RECENT, DEFAULT_KV_SINKS, KvMode


def test_the_lazy_modes_keep_the_window_and_the_sinks() -> None:
    spec = LoadSpec(Path("m.gguf"))
    assert (spec.kv_recent, spec.kv_sinks) == (DEFAULT_KV_RECENT, DEFAULT_KV_SINKS)
    for mode in KvMode:
        window = spec.with_(kv_mode=mode).window
        assert window == (DEFAULT_KV_RECENT + DEFAULT_KV_SINKS if mode.is_lazy else 0), mode
    assert spec.with_(kv_recent=0, kv_sinks=0).window == 0
    assert spec.describe()["kv_sinks"] == DEFAULT_KV_SINKS


def test_negative_sinks_are_refused() -> None:
    with pytest.raises(LoadSpecError, match="kv_sinks must be a whole number of at least 0"):
        LoadSpec(Path("m.gguf"), kv_sinks=-1)


@pytest.mark.parametrize(("recent", "sinks", "n_ctx", "words"), [
    (128, 4, None, "the last 128 tokens and the first 4"),
    (128, 0, None, "the last 128 tokens"),
    (0, 4, None, "the first 4 tokens"),
    (0, 0, None, ""),
    (4096, 4, 1024, "the last 1,024 tokens and the first 4"),
])
def test_window_words(recent: int, sinks: int, n_ctx: int | None, words: str) -> None:
    assert LoadSpec(Path("m.gguf"), kv_recent=recent, kv_sinks=sinks).window_words(n_ctx) == words


def test_the_engine_gets_the_sinks_only_for_a_lazy_cache() -> None:
    lazy = kv_cache_params(KvMode.LAZY, True, 128, 4)
    assert (lazy["kv_lazy_recent"], lazy["kv_lazy_sinks"]) == (128, 4)
    assert "kv_lazy_sinks" not in kv_cache_params(KvMode.LAZY, True, 128, 0)
    assert "kv_lazy_sinks" not in kv_cache_params(KvMode.Q8_0, True, 128, 4)
