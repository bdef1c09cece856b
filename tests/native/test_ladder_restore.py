"""Saved state across the ladder's rungs: a ladder saved on each rung (and a plain q4_0 cache)
restored into {f16, q8_0, q4_0, a fresh lazy q8_0 cache, a fresh ladder, a ladder on its last rung}.

Every pair either restores and continues exactly like an uninterrupted run, or is refused
cleanly. Rows are converted on read when the target stores fewer bits (f16 -> q8_0/q4_0 rotated on
the way, q8_0 -> q4_0 requantized); the uninterrupted run to compare with is then a ladder
converted the same way at the same point. A lazy cache converts itself first to the first later
rung that reads the state.
"""

from __future__ import annotations

import functools
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from llama_cpp import Llama

from .helpers import greedy, make_llama, prompt_tokens
from .test_lazy_restore import assert_refused
from .test_state_restore import restore, save

N_CTX = 1024  # ladder rungs: f16 256, q8_0 512, q4_0 1024
# the continuation: the prompt read again as one batch, then token by token; its last logits are compared
# bit for bit as well, so a few tokens prove what more tokens would (each step reads every cell)
N_CONTINUE = 4

SOURCES = ["ladder-f16", "ladder-q8", "ladder-q4", "q4_0"]
TARGETS = ["f16", "q8_0", "q4_0", "lazy-fresh", "ladder-fresh", "ladder-q4"]

STORED = {"ladder-f16": "f16", "ladder-q8": "q8_0", "ladder-q4": "q4_0", "q4_0": "q4_0"}
# what each target can hold: its layout now, and the later rungs of a lazy cache (a whole-context
# restore empties a ladder on its last rung first: it starts again from f16)
LAYOUTS = {
    "f16": ["f16"],
    "q8_0": ["q8_0"],
    "q4_0": ["q4_0"],
    "lazy-fresh": ["f16", "q8_0"],
    "ladder-fresh": ["f16", "q8_0", "q4_0"],
    "ladder-q4": ["q4_0"],
}


def expected(source: str, target: str, api: str) -> tuple[str, str]:
    """(outcome, the reference run): outcome 'same' (continues like the source), 'converted' or
    'refused'; the reference is the kind of context whose uninterrupted run the restore matches."""
    stored = STORED[source]
    layouts = LAYOUTS["ladder-fresh" if target == "ladder-q4" and api in ("memory", "file") else target]
    if stored in layouts:
        return "same", source
    # rows convert on read to the first quantized layout with fewer bits; never to more bits
    order = ["f16", "q8_0", "q4_0"]
    smaller = [layout for layout in layouts if order.index(layout) > order.index(stored)]
    if not smaller:
        return "refused", ""
    into = smaller[0]
    if into == "q8_0":
        return "converted", "ladder-q8"
    return "converted", "ladder-q4" if stored == "q8_0" else "ladder-q4-direct"


def build(path: Path, kind: str, tokens: list[int]) -> Llama:
    """A context of `kind` holding `tokens`: a ladder converted to a rung, or a plain cache."""
    ladder = kind.startswith("ladder")
    llm = make_llama(path, "ladder" if ladder else kind, n_ctx=N_CTX)
    llm.eval(tokens)
    if kind in ("ladder-q8", "ladder-q4"):
        assert llm.kv_lazy_convert()
    if kind == "ladder-q4":
        assert llm.kv_lazy_convert()
    if kind == "ladder-q4-direct":
        assert llm.kv_lazy_convert("q4_0")
    return llm


def target_context(path: Path, kind: str, filler: list[int]) -> Llama:
    if kind == "ladder-q4":
        llm = make_llama(path, "ladder", n_ctx=N_CTX)
        llm.eval(filler)  # another conversation in the cache, on the last rung
        assert llm.kv_lazy_convert("q4_0")
        return llm
    return make_llama(path, {"lazy-fresh": "lazy", "ladder-fresh": "ladder"}.get(kind, kind), n_ctx=N_CTX)


def last_logits(llm: Llama) -> np.ndarray:
    """The logits of the context's last decode (without logits_all, eval keeps no scores: the engine's)."""
    logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),)).copy()


def next_logits(llm: Llama, last: int) -> np.ndarray:
    """The logits after the prompt's last token, on top of what the context holds."""
    llm.eval([last])
    return last_logits(llm)


Run = tuple[np.ndarray, tuple[int, ...], np.ndarray]


def run(llm: Llama, prompt: list[int]) -> Run:
    """The logits after the prompt's last token, the greedy continuation and its last logits."""
    logits = next_logits(llm, prompt[-1])
    continuation = tuple(greedy(llm, prompt, N_CONTINUE, reset=False))
    return logits, continuation, last_logits(llm)


def assert_same_run(got: Run, want: Run) -> None:
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1] == want[1]
    np.testing.assert_array_equal(got[2], want[2])


@functools.lru_cache(maxsize=32)
def reference(path: Path, kind: str, prompt: tuple[int, ...]) -> Run:
    """The uninterrupted run (see `run`), compared bit for bit."""
    return run(build(path, kind, list(prompt[:-1])), list(prompt))


@functools.lru_cache(maxsize=4)
def short_prompt(path: Path) -> tuple[int, ...]:
    return tuple(prompt_tokens(make_llama(path, "f16", n_ctx=64)))


@pytest.fixture(scope="module")
def saved_state(tmp_path_factory: pytest.TempPathFactory):
    """The source's state saved through an API, memoised; one source context serves every API (saving
    reads the context and changes nothing)."""
    sources: dict[tuple, Llama] = {}
    states: dict[tuple, object] = {}
    folder = tmp_path_factory.mktemp("ladder-states")

    def get(path: Path, source: str, api: str, tokens: list[int]) -> object:
        context = (path, source, tuple(tokens))
        if context not in sources:
            sources[context] = build(path, source, tokens)
        if (context, api) not in states:
            (where := folder / str(len(states))).mkdir()
            states[context, api] = save(sources[context], api, where)
        return states[context, api]

    return get


def check_pair(path: Path, source: str, target: str, api: str, saved_state) -> None:
    outcome, ref_kind = expected(source, target, api)
    prompt = list(short_prompt(path))
    saved = saved_state(path, source, api, prompt[:-1])
    dst = target_context(path, target, filler=prompt[5:40])

    if outcome == "refused":
        assert_refused(dst, api, saved, prompt)
        return

    restore(dst, api, saved)
    assert_same_run(run(dst, prompt), reference(path, ref_kind, tuple(prompt)))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("api", ["memory", "seq_memory", "seq_file"])
def test_ladder_restore_matrix_smollm2(
    smollm2_path: Path, source: str, target: str, api: str, saved_state
) -> None:
    check_pair(smollm2_path, source, target, api, saved_state)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("source", SOURCES)
def test_ladder_restore_matrix_gemma3(gemma3_path: Path, source: str, target: str, saved_state) -> None:
    check_pair(gemma3_path, source, target, "seq_memory", saved_state)


def test_restore_lands_on_the_rung_that_holds_the_cells(smollm2_path: Path, saved_state) -> None:
    """A fresh ladder reads q8_0 cells on its q8_0 rung and q4_0 cells on its last: it converts first."""
    prompt = list(short_prompt(smollm2_path))
    for source, rung in (("ladder-f16", "f16"), ("ladder-q8", "q8_0"), ("ladder-q4", "q4_0")):
        dst = target_context(smollm2_path, "ladder-fresh", filler=[])
        restore(dst, "seq_memory", saved_state(smollm2_path, source, "seq_memory", prompt[:-1]))
        assert dst.kv_lazy_info().phase == rung


# ---------------------------------------------------------------- compact snapshots


@pytest.mark.parametrize(
    ("source", "ref_kind"), [("ladder-f16", "ladder-q4-direct"), ("ladder-q8", "ladder-q4")]
)
@pytest.mark.parametrize("target", ["q4_0", "ladder-fresh"])
def test_compact_snapshot(smollm2_path: Path, source: str, ref_kind: str, target: str) -> None:
    """A ladder still in f16 or q8_0 saves its cells as q4_0 on request: the snapshot is smaller, the
    live cache is unchanged, and the restore continues exactly like the ladder converted at that point."""
    prompt = list(short_prompt(smollm2_path))
    llm = build(smollm2_path, source, prompt[:-1])
    phase = llm.kv_lazy_info().phase
    full = llm.save_state(seq_id=0)
    compact = llm.save_state(seq_id=0, rung="q4_0")
    assert llm.kv_lazy_info().phase == phase and llm.kv_lazy_info().n_conversions == (phase == "q8_0")
    assert (compact.metadata["type_k"], compact.metadata["type_v"]) == (llama_cpp.GGML_TYPE_Q4_0,) * 2
    assert (compact.metadata["n_rot_k"], compact.metadata["n_rot_v"]) == (64, 64)
    # the K/V rows shrink by 18/64 (from f16) or 18/34 (from q8_0); the cell metadata stays
    shrink = 18 / 64 if phase == "f16" else 18 / 34
    assert compact.llama_state_size < full.llama_state_size * (shrink + 0.05)

    dst = target_context(smollm2_path, target, filler=[])
    restore(dst, "seq_memory", compact)
    assert_same_run(run(dst, prompt), reference(smollm2_path, ref_kind, tuple(prompt)))

    # the live cache goes on as it was
    logits = reference(smollm2_path, source, tuple(prompt))[0]
    np.testing.assert_array_equal(next_logits(llm, prompt[-1]), logits)


def test_compact_snapshot_needs_the_rung(smollm2_path: Path) -> None:
    lazy = make_llama(smollm2_path, "lazy", n_ctx=N_CTX)
    lazy.eval([1, 2, 3])
    with pytest.raises(ValueError, match="no lazy KV cache with a rung 'q4_0'"):
        lazy.save_state(seq_id=0, rung="q4_0")
    assert lazy.save_state(seq_id=0, rung="q8_0").metadata["type_k"] == llama_cpp.GGML_TYPE_Q8_0
    with pytest.raises(ValueError, match="no lazy KV cache"):
        make_llama(smollm2_path, "q8_0", n_ctx=256).save_state(seq_id=0, rung="q8_0")

