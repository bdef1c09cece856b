"""Old, truncated and random saved state is refused without a crash, and the
context stays usable afterwards."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import llama_cpp
import pytest
from llama_cpp import LlamaState, StateMismatchError

from .helpers import continuation, filled, greedy, make_llama, prompt_tokens

# session file, sequence file: the storage layout's own version bump, before it moved into the extension
# block (12, 5), before patch 0001 (10, 3)
PREVIOUS_VERSIONS = {None: (12, 10), 0: (5, 3)}


def test_versions_are_upstreams() -> None:
    """Upstream's numbers (PR #28498, the rotation sizes); our fields are in the extension block."""
    assert llama_cpp.LLAMA_SESSION_VERSION == 11
    assert llama_cpp.LLAMA_STATE_SEQ_VERSION == 4


def _assert_usable(llm, smollm2_path: Path) -> None:
    """Empty, and continues the prompt exactly like a fresh context (memoised)."""
    assert llm.n_tokens == 0
    prompt = prompt_tokens(llm)
    assert greedy(llm, prompt, 6) == list(continuation(smollm2_path, False, len(prompt), 6))


@pytest.mark.parametrize("age", [0, 1], ids=["previous", "older"])
@pytest.mark.parametrize("seq_id", [None, 0], ids=["session-file", "sequence-file"])
def test_previous_version_file_refused(smollm2_path: Path, tmp_path: Path, seq_id, age: int) -> None:
    path = tmp_path / "old.bin"
    filled(smollm2_path, False, 0).save_state_file(path, seq_id=seq_id)
    data = bytearray(path.read_bytes())
    data[4:8] = struct.pack("<I", PREVIOUS_VERSIONS[seq_id][age])
    path.write_bytes(bytes(data))

    target = make_llama(smollm2_path)
    with pytest.raises(StateMismatchError, match=r"unknown \(magic, version\)"):
        target.load_state_file(path, seq_id=seq_id)
    _assert_usable(target, smollm2_path)


@pytest.mark.parametrize("how", ["truncated", "random"])
@pytest.mark.parametrize("seq_id", [None, 0], ids=["session-file", "sequence-file"])
def test_damaged_file_refused(smollm2_path: Path, tmp_path: Path, seq_id, how: str) -> None:
    path = tmp_path / "state.bin"
    filled(smollm2_path, False, 0).save_state_file(path, seq_id=seq_id)
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:
        # a valid header, then noise
        path.write_bytes(data[:8] + _noise(len(data) - 8))

    target = make_llama(smollm2_path)
    with pytest.raises(StateMismatchError):
        target.load_state_file(path, seq_id=seq_id)
    _assert_usable(target, smollm2_path)


@pytest.mark.parametrize("how", ["truncated", "random"])
@pytest.mark.parametrize("seq_id", [None, 0], ids=["context", "sequence"])
def test_damaged_memory_state_refused(smollm2_path: Path, seq_id, how: str) -> None:
    good = filled(smollm2_path, False, 0).save_state(seq_id=seq_id)
    size = good.llama_state_size
    blob = good.llama_state[: size // 2] if how == "truncated" else _noise(size)
    bad = LlamaState(
        input_ids=good.input_ids,
        scores=good.scores,
        n_tokens=good.n_tokens,
        llama_state=blob,
        llama_state_size=len(blob),
        seed=good.seed,
        seq_id=seq_id,
        metadata=good.metadata,  # passes the pre-check: the engine itself must refuse
    )
    target = make_llama(smollm2_path)
    target.eval(prompt_tokens(target)[:3])
    with pytest.raises(StateMismatchError):
        target.load_state(bad)
    _assert_usable(target, smollm2_path)


def test_missing_file(smollm2_path: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        make_llama(smollm2_path).load_state_file(tmp_path / "nope.bin")


def test_state_without_metadata_refused(smollm2_path: Path) -> None:
    llm = make_llama(smollm2_path)
    llm.eval(prompt_tokens(llm))
    good = llm.save_state()
    legacy = LlamaState(
        good.input_ids, good.scores, good.n_tokens, good.llama_state, good.llama_state_size, good.seed
    )
    with pytest.raises(StateMismatchError, match="no metadata"):
        llm.load_state(legacy)


def _noise(n: int) -> bytes:
    return random.Random(n).randbytes(n)
