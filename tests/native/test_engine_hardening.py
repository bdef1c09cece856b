"""Engine hardening: what a restore decides on (the saved storage layout, not rotation sizes),
when a lazy cache converts or returns to f16, on-device sequence states, old pickles, the
progress callback, and a model file with an absurd block count. Abort-prone cases run in a
child process."""

from __future__ import annotations

import pickle
import struct
import subprocess
import sys
import threading
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from llama_cpp import Llama, LlamaState, StateMismatchError

from tests.support.synthetic_gguf import SyntheticShape, write_llama_gguf

from .helpers import greedy, make_llama, prompt_tokens, random_tokens, synthetic_model
from .rawctx import RawContext, RawModel, engine_threads
from .state_blob import conversion_mismatches, parse_context_state
from .test_state_restore import native_restore

Q8 = llama_cpp.GGML_TYPE_Q8_0
F16 = llama_cpp.GGML_TYPE_F16
ON_DEVICE = llama_cpp.LLAMA_STATE_SEQ_FLAGS_ON_DEVICE

# a plain cache's sequence state of 30 cells (upstream's): magic, seq id; stream count, K/V rotation sizes;
# the cell count, each cell's position, sequence count and sequence; whether V is transposed, the layer count
SEQ_N_LAYER_OFFSET = 4 + 4 + 3 * 4 + 4 + 30 * 12 + 4


@pytest.fixture(scope="module")
def hd96(tmp_path_factory: pytest.TempPathFactory) -> RawModel:
    """Head size 96: not a multiple of 64, so a q8_0 cache is not rotated."""
    return synthetic_model(tmp_path_factory, 96)


def convert(ctx: RawContext) -> int:
    return ctx.convert()


# ------------------------------------------------------------ when a lazy cache converts


def test_an_empty_q8_0_state_leaves_a_lazy_cache_in_f16(smollm2_path: Path) -> None:
    empty_q8 = make_llama(smollm2_path, "q8_0").save_state()
    lazy = make_llama(smollm2_path, "lazy")
    lazy.load_state(empty_q8)
    assert lazy.kv_lazy_info().phase == "f16"


def test_converting_an_empty_cache_does_nothing(smollm2_path: Path) -> None:
    lazy = make_llama(smollm2_path, "lazy")
    assert lazy.kv_lazy_convert() is False
    assert lazy.kv_lazy_info().phase == "f16"


def test_a_refused_header_converts_nothing(hd96: RawModel) -> None:
    """A q8_0 state whose layer count is wrong is refused before the lazy cache converts:
    another sequence keeps its f16 cells."""
    src = RawContext(hd96, Q8, n_ctx=256)
    src.decode(random_tokens(1, 30))
    blob = bytearray(src.seq_state(0))
    assert struct.unpack_from("<I", blob, SEQ_N_LAYER_OFFSET)[0] == 2
    struct.pack_into("<I", blob, SEQ_N_LAYER_OFFSET, 3)

    lazy = RawContext(hd96, Q8, n_ctx=256, n_seq=2, lazy=True)
    lazy.decode(random_tokens(2, 20), seq_id=1)
    ok, err = lazy.set_seq_state(bytes(blob), 0)
    assert not ok and "layers" in err
    assert lazy.lazy_info().phase == "f16"
    assert lazy.pos_max(1) == 19


@pytest.mark.parametrize("rot_off", [False, True], ids=["rotated", "rotation-off"])
def test_q8_0_state_converts_a_lazy_cache_first_whatever_the_rotation(
    smollm2_path: Path, rot_off: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With rotation off both layouts report rotation 0: the storage types decide."""
    if rot_off:
        monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")
    prompt = prompt_tokens(make_llama(smollm2_path, "f16", n_ctx=64))
    src = make_llama(smollm2_path, "q8_0")
    src.eval(prompt[:-1])
    lazy = make_llama(smollm2_path, "lazy")
    lazy.load_state(src.save_state(seq_id=0))
    assert lazy.kv_lazy_info().phase == "q8_0"
    assert greedy(lazy, prompt, 8) == greedy(src, prompt, 8)


def test_head_size_96_lazy_restores_across_phases(hd96: RawModel) -> None:
    """Unrotated q8_0 (head size 96): an f16 state into a converted lazy cache converts on read,
    a q8_0 state into a fresh one converts the cache first; both continue like the source."""
    prompt = random_tokens(3, 40)
    f16_src = RawContext(hd96, Q8, n_ctx=256, lazy=True)
    f16_src.decode(prompt[:-1])
    f16_state = f16_src.seq_state(0)
    assert convert(f16_src) == 1
    want_converted = f16_src.decode(prompt[-1:])

    converted = RawContext(hd96, Q8, n_ctx=256, n_seq=2, lazy=True)
    converted.decode(random_tokens(4, 20), seq_id=1)
    assert convert(converted) == 1
    ok, err = converted.set_seq_state(f16_state, 0)
    assert ok, err
    np.testing.assert_array_equal(converted.decode(prompt[-1:]), want_converted)

    q8_src = RawContext(hd96, Q8, n_ctx=256)
    q8_src.decode(prompt[:-1])
    q8_state = q8_src.seq_state(0)
    want_q8 = q8_src.decode(prompt[-1:])
    fresh = RawContext(hd96, Q8, n_ctx=256, lazy=True)
    ok, err = fresh.set_seq_state(q8_state, 0)
    assert ok, err
    assert fresh.lazy_info().phase == "q8_0"
    np.testing.assert_array_equal(fresh.decode(prompt[-1:]), want_q8)


def test_f16_state_larger_than_the_f16_view_converts_then_reads(hd96: RawModel) -> None:
    """300 f16 cells (saved by a lazy cache of 1024 cells, still in f16) into a lazy cache of
    512 cells, whose f16 view holds 256: the cache converts and the rows convert on read."""
    prompt = random_tokens(5, 301)
    big = RawContext(hd96, Q8, n_ctx=1024, lazy=True)
    big.decode(prompt[:-1])
    assert big.lazy_info().phase == "f16"
    state = big.seq_state(0)
    assert convert(big) == 1
    want = big.decode(prompt[-1:])

    small = RawContext(hd96, Q8, n_ctx=512, lazy=True)
    assert small.lazy_info().n_cells_f16 == 256
    ok, err = small.set_seq_state(state, 0)
    assert ok, err
    assert small.lazy_info().phase == "q8_0"
    np.testing.assert_array_equal(small.decode(prompt[-1:]), want)


def test_k_q8_0_v_f16_cache_accepts_an_f16_state(smollm2_path: Path) -> None:
    prompt = prompt_tokens(make_llama(smollm2_path, "f16", n_ctx=64))
    src = make_llama(smollm2_path, "f16")
    src.eval(prompt[:-1])

    def mixed() -> Llama:
        return Llama(str(smollm2_path), n_ctx=512, n_threads=engine_threads(), flash_attn=True, type_k=Q8,
                     type_v=F16, seed=1234, verbose=False)

    dst = mixed()
    dst.load_state(src.save_state(seq_id=0))
    assert len(greedy(dst, prompt, 4)) == 4
    direct = mixed()
    assert greedy(direct, prompt, 4) == greedy(dst, prompt, 4)


def test_type_mismatch_is_not_called_a_rotation_mismatch(smollm2_path: Path) -> None:
    src = make_llama(smollm2_path, "q8_0")
    src.eval(prompt_tokens(src))
    ok, err = native_restore(make_llama(smollm2_path, "f16"), "seq_memory", src.save_state(seq_id=0))
    assert not ok
    assert "type mismatch" in err and "rotation mismatch" not in err


@pytest.mark.parametrize("head_dim", [96, 128], ids=["hd96-unrotated", "hd128"])
def test_in_place_conversion_matches_rotate_then_quantize(tmp_path: Path, head_dim: int) -> None:
    """The in-place kernel (each group read before its q8_0 bytes are written over it) against an
    independent NumPy reference, for the rotations the real models do not have: none, and 128."""
    model = RawModel(write_llama_gguf(tmp_path / "m.gguf", SyntheticShape(head_dim=head_dim)))
    ctx = RawContext(model, Q8, n_ctx=512, lazy=True)
    ctx.decode(random_tokens(9, 200))
    _, (before,) = parse_context_state(ctx.state())
    assert convert(ctx) == 1
    _, (after,) = parse_context_state(ctx.state())
    assert (after.n_rot_k, after.n_rot_v) == ((0, 0) if head_dim == 96 else (128, 64))
    off, total = conversion_mismatches(before, after)
    assert off / total < 1e-3


# ------------------------------------------------------------ on-device sequence states


def test_on_device_state_of_a_q8_0_cache_restores_exactly(hd96: RawModel) -> None:
    """The upstream path (llama_io_read_device) counted quantized elements as bytes."""
    prompt = random_tokens(6, 40)
    ctx = RawContext(hd96, Q8, n_ctx=256)
    ctx.decode(prompt[:-1])
    blob = ctx.seq_state(0, ON_DEVICE)
    want = ctx.decode(prompt[-1:])
    ctx.seq_rm(0)
    ok, err = ctx.set_seq_state(blob, 0, ON_DEVICE)
    assert ok, err
    np.testing.assert_array_equal(ctx.decode(prompt[-1:]), want)


def test_on_device_state_across_a_phase_change_is_refused_cleanly(hd96: RawModel) -> None:
    prompt = random_tokens(7, 40)
    ctx = RawContext(hd96, Q8, n_ctx=256, lazy=True)
    ctx.decode(prompt[:-1])
    blob = ctx.seq_state(0, ON_DEVICE)  # f16 cells, kept on the device
    assert convert(ctx) == 1
    ok, err = ctx.set_seq_state(blob, 0, ON_DEVICE)
    assert not ok and "on-device" in err
    assert ctx.pos_max(0) == -1
    ctx.decode(prompt)  # still usable


def test_on_device_state_for_another_sequence_is_refused(hd96: RawModel) -> None:
    ctx = RawContext(hd96, Q8, n_ctx=256, n_seq=2)
    ctx.decode(random_tokens(8, 10))
    blob = bytearray(ctx.seq_state(0, ON_DEVICE))
    struct.pack_into("<i", blob, 4, 1)  # sequence 1 saved nothing on the device
    ok, err = ctx.set_seq_state(bytes(blob), 0, ON_DEVICE)
    assert not ok and "no on-device state" in err


# ------------------------------------------------------------ the Python layer


def test_an_old_pickled_state_is_refused_not_an_attribute_error(smollm2_path: Path) -> None:
    llm = make_llama(smollm2_path)
    llm.eval(prompt_tokens(llm))
    state = llm.save_state()
    del state.seq_id, state.metadata  # what a LlamaState pickled by an older version holds
    old = pickle.loads(pickle.dumps(state))
    assert isinstance(old, LlamaState)
    with pytest.raises(StateMismatchError, match="no metadata"):
        llm.load_state(old)


def test_progress_callback_replaced_while_it_runs(smollm2_path: Path) -> None:
    llm = make_llama(smollm2_path, "lazy")
    llm.eval(prompt_tokens(llm) * 2)
    calls: list[str] = []
    stop = threading.Event()

    def replacing(info) -> None:
        calls.append(info.phase)
        llm.set_kv_lazy_progress_callback(lambda i: calls.append("second:" + i.phase))

    def churn() -> None:
        while not stop.is_set():
            llm.set_kv_lazy_progress_callback(lambda i: calls.append("thread:" + i.phase))

    llm.set_kv_lazy_progress_callback(replacing)
    thread = threading.Thread(target=churn)
    thread.start()
    try:
        assert llm.kv_lazy_convert()
    finally:
        stop.set()
        thread.join()
    assert calls and llm.kv_lazy_info().phase == "q8_0"


# ------------------------------------------------------------ model files


def _with_block_count(src: Path, dst: Path, value: int) -> Path:
    data = bytearray(src.read_bytes())
    key = b"llama.block_count"
    at = data.index(key) + len(key)
    assert struct.unpack_from("<I", data, at)[0] == 4  # GGUF_TYPE_UINT32
    struct.pack_into("<I", data, at + 4, value)
    dst.write_bytes(bytes(data))
    return dst


@pytest.mark.parametrize("block_count", [0, 0x7FFFFFFF])
def test_absurd_block_count_is_a_load_error_not_an_abort(tmp_path: Path, block_count: int) -> None:
    good = write_llama_gguf(tmp_path / "good.gguf", SyntheticShape(head_dim=64))
    bad = _with_block_count(good, tmp_path / "bad.gguf", block_count)
    script = (
        "import sys, llama_cpp\n"
        "p = llama_cpp.llama_model_default_params()\n"
        f"m = llama_cpp.llama_model_load_from_file({str(bad)!r}.encode(), p)\n"
        "sys.exit(0 if not m else 3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"rc {proc.returncode}: {proc.stderr[-2000:]}"
    assert "invalid block count" in proc.stderr

