"""Rotation-checked state restore (patches 0001, 0033), on both real test models.

Saved state records the K/V rotation sizes; a restore into a context that
rotates differently (LLAMA_ATTN_ROT_DISABLE, another cache type) is refused
with a clear error and leaves the context empty and usable.  A restore into
the same configuration continues exactly like an uninterrupted run.
"""

from __future__ import annotations

import os
from pathlib import Path

import llama_cpp
import pytest
from llama_cpp import Llama, StateMismatchError
from llama_cpp._logger import capture_errors

from .helpers import continuation, filled, greedy, make_llama, prompt_tokens, q8_llama

N_CONTINUE = 32
APIS = ["memory", "file", "seq_memory", "seq_file"]


def save(llm: Llama, api: str, tmp_path: Path):
    """Save through one of the four state APIs; returns what `restore` needs."""
    if api == "memory":
        return llm.save_state()
    if api == "seq_memory":
        return llm.save_state(seq_id=0)
    target = tmp_path / f"state-{api}.bin"
    llm.save_state_file(target, seq_id=0 if api == "seq_file" else None)
    return target


def restore(llm: Llama, api: str, saved) -> None:
    if api in ("memory", "seq_memory"):
        llm.load_state(saved)
    else:
        llm.load_state_file(saved, seq_id=0 if api == "seq_file" else None)


def native_restore(llm: Llama, api: str, saved) -> tuple[bool, str]:
    """Hand the saved bytes to the C API directly (no Python pre-check)."""
    ctx = llm.ctx
    with capture_errors() as errors:
        if api in ("memory", "seq_memory"):
            buf = (llama_cpp.ctypes.c_uint8 * saved.llama_state_size).from_buffer_copy(saved.llama_state)
            if api == "memory":
                ok = llama_cpp.llama_state_set_data(ctx, buf, saved.llama_state_size) != 0
            else:
                ok = llama_cpp.llama_state_seq_set_data(ctx, buf, saved.llama_state_size, 0) != 0
        else:
            cap = llm.n_ctx()
            toks = (llama_cpp.llama_token * cap)()
            n = llama_cpp.ctypes.c_size_t(0)
            ref = llama_cpp.ctypes.byref(n)
            if api == "file":
                ok = llama_cpp.llama_state_load_file(ctx, os.fsencode(saved), toks, cap, ref)
            else:
                ok = llama_cpp.llama_state_seq_load_file(ctx, os.fsencode(saved), 0, toks, cap, ref) != 0
    return bool(ok), "".join(errors)


def cells_used(llm: Llama) -> int:
    mem = llama_cpp.llama_get_memory(llm.ctx)
    return max(0, llama_cpp.llama_memory_seq_pos_max(mem, 0) + 1)


def test_rotation_sizes_reported(smollm2_path: Path, gemma3_path: Path) -> None:
    assert q8_llama(smollm2_path).state_metadata()["n_rot_k"] == 64  # head dim 64
    meta = q8_llama(gemma3_path).state_metadata()  # head dim 256, iSWA
    assert (meta["n_rot_k"], meta["n_rot_v"], meta["n_rot_k_swa"], meta["n_rot_v_swa"]) == (256, 64, 256, 64)
    off = q8_llama(gemma3_path, rot_off=True).state_metadata()
    assert (off["n_rot_k"], off["n_rot_v"], off["n_rot_k_swa"], off["n_rot_v_swa"]) == (0, 0, 0, 0)
    f16 = make_llama(smollm2_path, "f16").state_metadata()
    assert (f16["n_rot_k"], f16["n_rot_v"]) == (0, 0)


@pytest.mark.parametrize("api", APIS)
def test_same_config_restore_continues_identically(model_path: Path, api: str, tmp_path: Path) -> None:
    expected = list(continuation(model_path, False, 1, N_CONTINUE))  # an uninterrupted run
    saved = save(filled(model_path, False, 1), api, tmp_path)

    restored = q8_llama(model_path)
    prompt = prompt_tokens(restored)
    restore(restored, api, saved)
    assert restored.n_tokens == len(prompt) - 1
    assert greedy(restored, prompt, N_CONTINUE) == expected


@pytest.mark.parametrize("saved_rot_off", [False, True], ids=["rotated->unrotated", "unrotated->rotated"])
@pytest.mark.parametrize("api", APIS)
def test_rotation_mismatch_refused(model_path: Path, api: str, saved_rot_off: bool, tmp_path: Path) -> None:
    saved = save(filled(model_path, saved_rot_off, 0), api, tmp_path)

    target = q8_llama(model_path, rot_off=not saved_rot_off)
    prompt = prompt_tokens(target)
    target.eval(prompt[:4])  # something cached that a refusal must not leave half-overwritten
    with pytest.raises(StateMismatchError, match="rotation") as refused:
        restore(target, api, saved)
    assert isinstance(refused.value, RuntimeError)
    # in memory, by the engine's check before the restore (Llama.state_refusal); a file, by the restore itself
    assert "K/V rotation mismatch" in refused.value.reason
    assert target.n_tokens == 0
    assert cells_used(target) == 0

    # still usable: continues exactly like a fresh context of its own configuration
    assert greedy(target, prompt, 8) == list(continuation(model_path, not saved_rot_off, len(prompt), 8))


@pytest.mark.parametrize("api", APIS)
def test_engine_refuses_rotation_mismatch_itself(smollm2_path: Path, api: str, tmp_path: Path) -> None:
    """Even without the Python pre-check, the engine refuses and empties the destination."""
    saver = q8_llama(smollm2_path)
    prompt = prompt_tokens(saver)
    saver.eval(prompt)
    saved = save(saver, api, tmp_path)

    target = q8_llama(smollm2_path, rot_off=True)
    target.eval(prompt[:4])
    ok, errors = native_restore(target, api, saved)
    assert not ok
    assert "K/V rotation mismatch: the state was saved with rotation sizes K = 64, V = 64" in errors
    assert "this cache uses K = 0, V = 0" in errors
    assert cells_used(target) == 0


def test_iswa_swa_mismatch_keeps_both_caches_empty(gemma3_path: Path) -> None:
    """A Gemma-3 state whose SWA part is refused leaves neither sub-cache half restored."""
    saver = q8_llama(gemma3_path)
    prompt = prompt_tokens(saver)
    saver.eval(prompt)
    saved = saver.save_state()

    target = q8_llama(gemma3_path, rot_off=True)
    ok, errors = native_restore(target, "memory", saved)
    assert not ok and "rotation mismatch" in errors
    assert cells_used(target) == 0
    fresh = q8_llama(gemma3_path, rot_off=True)
    assert greedy(target, prompt, 8) == greedy(fresh, prompt, 8)


def test_restore_reevaluates_only_the_last_token(smollm2_path: Path) -> None:
    saver = q8_llama(smollm2_path)
    prompt = prompt_tokens(saver)
    saver.eval(prompt)
    saved = saver.save_state()

    restored = q8_llama(smollm2_path)
    restored.load_state(saved)
    llama_cpp.llama_perf_context_reset(restored.ctx)
    greedy(restored, prompt, 1)
    assert llama_cpp.llama_perf_context(restored.ctx).n_p_eval == 1


def test_generate_nothing_after_load_state_continues(smollm2_path: Path) -> None:
    """Unpatched, this aborted the process with GGML_ASSERT(logits != nullptr)."""
    saver = q8_llama(smollm2_path)
    prompt = prompt_tokens(saver)
    saver.eval(prompt[:-1])
    expected = greedy(saver, prompt, 8)
    saver.reset()
    saver.eval(prompt)
    saved = saver.save_state()

    restored = q8_llama(smollm2_path)
    restored.load_state(saved)
    assert greedy(restored, [], 8, reset=False) == expected


def test_misuse_raises_instead_of_aborting(smollm2_path: Path) -> None:
    llm = q8_llama(smollm2_path)
    with pytest.raises(ValueError, match="at least one token"):
        greedy(llm, [], 1, reset=False)
    with pytest.raises(RuntimeError, match="needs logits"):
        llm.sample()
    # and the context still works afterwards
    assert len(greedy(llm, prompt_tokens(llm), 4)) == 4


def test_whole_and_sequence_states_not_interchangeable(smollm2_path: Path) -> None:
    llm = q8_llama(smollm2_path)
    llm.eval(prompt_tokens(llm))
    whole = llm.save_state()
    with pytest.raises(StateMismatchError, match="not interchangeable"):
        llm.load_state(whole, seq_id=0)


def test_state_of_other_cache_type_refused_by_the_check(smollm2_path: Path) -> None:
    q8 = q8_llama(smollm2_path)
    q8.eval(prompt_tokens(q8))
    saved = q8.save_state()
    f16 = make_llama(smollm2_path, "f16")
    assert "K/V type mismatch: the state stores K/V as q8_0/q8_0" in f16.state_refusal(saved)
    with pytest.raises(StateMismatchError, match="K/V type mismatch"):
        f16.load_state(saved)


def test_state_of_other_model_refused(smollm2_path: Path, gemma3_path: Path) -> None:
    smol = q8_llama(smollm2_path)
    smol.eval(prompt_tokens(smol))
    saved = smol.save_state()
    with pytest.raises(StateMismatchError, match="model: saved"):
        q8_llama(gemma3_path).load_state(saved)


def test_state_larger_than_context_refused(smollm2_path: Path) -> None:
    big = q8_llama(smollm2_path, n_ctx=1024)
    tokens = prompt_tokens(big) * 16  # ~600 tokens
    big.eval(tokens)
    saved = big.save_state()
    small = q8_llama(smollm2_path, n_ctx=256)
    with pytest.raises(StateMismatchError, match="do not fit a context of 256"):
        small.load_state(saved)
