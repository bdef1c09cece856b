"""Saved state across KV modes: {f16, q8_0, lazy before/after conversion} saved,
restored into {f16, q8_0, fresh lazy, converted lazy}, through every state API.

Every pair either restores and continues exactly like an uninterrupted run, or is
refused cleanly. Restoring cells stored as f16 into a q8_0 layout converts them on
read; the uninterrupted run to compare with is then a lazy context converted at the
same point (its f16 cells are bit-identical to those of an f16 context).
"""

from __future__ import annotations

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


def build(path: Path, kind: str, tokens: list[int]) -> Llama:
    """A context of `kind` holding `tokens`."""
    llm = make_llama(path, "lazy" if kind.startswith("lazy") else kind, n_ctx=N_CTX)
    llm.eval(tokens)
    if kind in ("lazy-after", "lazy-converted"):
        assert llm.kv_lazy_convert()
    return llm


def target_context(path: Path, kind: str, filler: list[int]) -> Llama:
    if kind == "lazy-converted":
        llm = make_llama(path, "lazy", n_ctx=N_CTX)
        llm.eval(filler)  # another conversation in the cache, converted
        assert llm.kv_lazy_convert()
        return llm
    return make_llama(path, "lazy" if kind == "lazy-fresh" else kind, n_ctx=N_CTX)


def reference(path: Path, source: str, outcome: str, prompt: list[int]) -> list[int]:
    """The continuation of an uninterrupted run."""
    if outcome == "converted":
        llm = build(path, "lazy-after", prompt[:-1])
    else:
        llm = build(path, source, prompt[:-1])
    return greedy(llm, prompt, N_CONTINUE)


def check_pair(path: Path, source: str, target: str, api: str, tmp_path: Path) -> None:
    outcome = expected_outcome(source, target, api)
    prompt = list(prompt_tokens(make_llama(path, "f16", n_ctx=64)))
    saved = save(build(path, source, prompt[:-1]), api, tmp_path)
    dst = target_context(path, target, filler=prompt[5:40])

    if outcome == "refused":
        with pytest.raises(StateMismatchError):
            restore(dst, api, saved)
        assert dst.n_tokens == 0
        assert len(greedy(dst, prompt, 4)) == 4  # still usable
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
    smollm2_path: Path, source: str, target: str, api: str, tmp_path: Path
) -> None:
    check_pair(smollm2_path, source, target, api, tmp_path)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("source", SOURCES)
def test_restore_matrix_gemma3(gemma3_path: Path, source: str, target: str, tmp_path: Path) -> None:
    check_pair(gemma3_path, source, target, "seq_memory", tmp_path)
