"""Saved state across KV modes: {f16, q8_0, lazy before/after conversion} saved,
restored into {f16, q8_0, fresh lazy, converted lazy}, through every state API.

Every pair either restores and continues exactly like an uninterrupted run, or is
refused cleanly. Restoring cells stored as f16 into a q8_0 layout converts them on
read; the uninterrupted run to compare with is then a lazy context converted at the
same point (its f16 cells are bit-identical to those of an f16 context).

The matrix runs again with rotation off (LLAMA_ATTN_ROT_DISABLE=1: both lazy phases then
report rotation 0 and only the storage types tell them apart), and with more cells than
the target's f16 view holds (the lazy cache converts, then converts the rows on read).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from llama_cpp import Llama, StateMismatchError

from .helpers import greedy, make_llama, prompt_tokens
from .test_state_restore import APIS, restore, save

N_CTX = 1024
N_CONTINUE = 10

SOURCES = ["f16", "q8_0", "lazy-before", "lazy-after"]
TARGETS = ["f16", "q8_0", "lazy-fresh", "lazy-converted"]

# how the cells are stored at save time / in the target before the restore
SOURCE_LAYOUT = {"f16": "f16", "q8_0": "q8", "lazy-before": "f16", "lazy-after": "q8"}


def expected_outcome(source: str, target: str, api: str) -> str:
    """'same' (continues like the source), 'converted' (like the source converted), or 'refused'."""
    stored = SOURCE_LAYOUT[source]
    whole = api in ("memory", "file")
    if target == "f16":
        return "same" if stored == "f16" else "refused"
    if target == "lazy-fresh" or (target == "lazy-converted" and whole):
        # a whole-context restore empties the cache first: the lazy cache starts again in f16
        return "same"
    # q8_0 layout: q8 cells as they are, f16 cells converted on read
    return "same" if stored == "q8" else "converted"


def build(path: Path, kind: str, tokens: list[int], n_ctx: int = N_CTX) -> Llama:
    """A context of `kind` holding `tokens`."""
    llm = make_llama(path, "lazy" if kind.startswith("lazy") else kind, n_ctx=n_ctx)
    llm.eval(tokens)
    if kind in ("lazy-after", "lazy-converted"):
        assert llm.kv_lazy_convert()
    return llm


def target_context(path: Path, kind: str, filler: list[int], n_ctx: int = N_CTX) -> Llama:
    if kind == "lazy-converted":
        llm = make_llama(path, "lazy", n_ctx=n_ctx)
        llm.eval(filler)  # another conversation in the cache, converted
        assert llm.kv_lazy_convert()
        return llm
    return make_llama(path, "lazy" if kind == "lazy-fresh" else kind, n_ctx=n_ctx)


def reference(path: Path, source: str, outcome: str, prompt: list[int], n_ctx: int = N_CTX) -> list[int]:
    """The continuation of an uninterrupted run (memoised: it depends only on these and the rotation)."""
    kind = "lazy-after" if outcome == "converted" else source
    return list(_reference(path, kind, tuple(prompt), n_ctx, os.environ.get("LLAMA_ATTN_ROT_DISABLE")))


@functools.lru_cache(maxsize=64)
def _reference(
    path: Path, kind: str, prompt: tuple[int, ...], n_ctx: int, _rot_env: str | None
) -> tuple[int, ...]:
    return tuple(greedy(build(path, kind, list(prompt[:-1]), n_ctx), list(prompt), N_CONTINUE))


@functools.lru_cache(maxsize=8)
def short_prompt(path: Path) -> tuple[int, ...]:
    return tuple(prompt_tokens(make_llama(path, "f16", n_ctx=64)))


SavedState = Callable[..., object]


@pytest.fixture(scope="module")
def saved_state(tmp_path_factory: pytest.TempPathFactory) -> SavedState:
    """``saved_state(path, source, api, tokens, n_ctx)``: what ``save`` returns for a context of
    ``source`` holding ``tokens``, saved through ``api``. Built once per module for every target that
    restores it (a restore only reads it; the source depends on these and on the rotation). One source
    context serves every API: saving reads the context and changes nothing."""
    sources: dict[tuple, Llama] = {}
    states: dict[tuple, object] = {}
    folder = tmp_path_factory.mktemp("saved-states")

    def get(path: Path, source: str, api: str, tokens: list[int], n_ctx: int = N_CTX) -> object:
        context = (path, source, tuple(tokens), n_ctx, os.environ.get("LLAMA_ATTN_ROT_DISABLE"))
        if context not in sources:
            sources[context] = build(path, source, tokens, n_ctx)
        if (context, api) not in states:
            (where := folder / str(len(states))).mkdir()
            states[context, api] = save(sources[context], api, where)
        return states[context, api]

    return get


def assert_refused(dst: Llama, api: str, saved: object, prompt: list[int]) -> None:
    """The restore raises StateMismatchError and leaves an empty, usable context."""
    with pytest.raises(StateMismatchError):
        restore(dst, api, saved)
    assert dst.n_tokens == 0
    assert len(greedy(dst, prompt, 4)) == 4


def check_pair(path: Path, source: str, target: str, api: str, saved_state: SavedState) -> None:
    outcome = expected_outcome(source, target, api)
    prompt = list(short_prompt(path))
    saved = saved_state(path, source, api, prompt[:-1])
    dst = target_context(path, target, filler=prompt[5:40])

    if outcome == "refused":
        assert_refused(dst, api, saved, prompt)
        return

    restore(dst, api, saved)
    assert greedy(dst, prompt, N_CONTINUE) == reference(path, source, outcome, prompt)
    if target.startswith("lazy"):
        phase = dst.kv_lazy_info().phase
        assert phase == ("f16" if outcome == "same" and SOURCE_LAYOUT[source] == "f16" else "q8_0")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("api", APIS)
def test_restore_matrix_smollm2(
    smollm2_path: Path, source: str, target: str, api: str, saved_state: SavedState
) -> None:
    check_pair(smollm2_path, source, target, api, saved_state)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("source", SOURCES)
def test_restore_matrix_gemma3(gemma3_path: Path, source: str, target: str, saved_state: SavedState) -> None:
    check_pair(gemma3_path, source, target, "seq_memory", saved_state)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("api", ["seq_memory"])
def test_restore_matrix_rotation_off(
    smollm2_path: Path, source: str, target: str, api: str, saved_state: SavedState, attn_rot_disabled: None
) -> None:
    """Both lazy phases report rotation 0 here: the restore decides on the storage types."""
    check_pair(smollm2_path, source, target, api, saved_state)


N_CTX_BIG = 2048  # its f16 view holds 1024 cells; the targets' (N_CTX) 512
N_OVERSIZE = 600


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("api", ["memory", "seq_file"])
def test_more_cells_than_the_f16_view(
    smollm2_path: Path, target: str, api: str, saved_state: SavedState
) -> None:
    """600 f16 cells from a lazy cache of 2048 cells (still in f16) into caches of 1024 cells: an
    f16 cache takes them as they are; the others hold them only as q8_0 and convert them on read."""
    long_prompt = list(long_prompt_tokens(smollm2_path))
    assert len(long_prompt) == N_OVERSIZE + 1
    saved = saved_state(smollm2_path, "lazy-before", api, long_prompt[:-1], N_CTX_BIG)
    dst = target_context(smollm2_path, target, filler=long_prompt[5:40])
    restore(dst, api, saved)
    outcome = "same" if target == "f16" else "converted"
    source = "f16" if outcome == "same" else "lazy-before"
    want = reference(smollm2_path, source, outcome, long_prompt, N_CTX_BIG)
    assert greedy(dst, long_prompt, N_CONTINUE) == want
    if target.startswith("lazy"):
        assert dst.kv_lazy_info().phase == "q8_0"


@functools.lru_cache(maxsize=2)
def long_prompt_tokens(path: Path) -> tuple[int, ...]:
    return tuple(make_llama(path, "f16", n_ctx=64).tokenize(PROMPT_LONG)[: N_OVERSIZE + 1])


PROMPT_LONG = b" ".join(
    b"Entry %d: the lamp was lit at dusk, the glass was clean, and the sea ran high from the west." % i
    for i in range(60)
)
