"""The saved state format next to upstream's (issue 25, sections 4 and 6; issue 46, section 1; patches
0007, 0015, 0016).

Upstream's fields and version numbers (11 / 4, PR #28498) stay as they are, and a plain cache's state is
upstream's, byte for byte. What this series adds for a lazy cache (its storage layout, rungs and window)
is one extension block before its stream count: tag, version, size, then entries of id, size, data. A
reader skips an entry it does not know unless the entry is marked required; a state without the block
(upstream's, a plain cache's) is read with the K/V types its rows carry. The engine's own check
(llama_state_seq_check_data) answers what the bindings used to guess, without changing the context.
"""

from __future__ import annotations

import ctypes
import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from .helpers import make_llama, prompt_tokens, random_tokens, synthetic_model
from .rawctx import RawContext, RawModel
from .state_blob import (
    EXT_LAYOUT,
    EXT_LAZY,
    EXT_REQUIRED,
    EXT_TAG,
    parse_context_state,
    parse_ext_block,
    parse_seq_state,
)

F16, Q8, Q4 = llama_cpp.GGML_TYPE_F16, llama_cpp.GGML_TYPE_Q8_0, llama_cpp.GGML_TYPE_Q4_0
SEQ_HEADER = 8  # a sequence state: the magic and the sequence id, then the cache's state
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hd64(tmp_path_factory: pytest.TempPathFactory) -> RawModel:
    return synthetic_model(tmp_path_factory, 64)


def check(ctx: RawContext, blob: bytes, seq_id: int) -> tuple[int, str]:
    """The engine's verdict on a sequence state, as llama_state_seq_check_data gives it."""
    reason = ctypes.create_string_buffer(256)
    rc = llama_cpp.llama_state_seq_check_data(ctx.ptr, blob, len(blob), seq_id, reason, len(reason))
    return rc, reason.value.decode()


def ext_size(blob: bytes, at: int = SEQ_HEADER) -> int:
    """The bytes of the extension block that starts at ``at`` (0: none)."""
    version, entries = parse_ext_block(blob[at:])
    return 12 + sum(8 + len(d) for d in entries.values()) if version else 0


def with_block(blob: bytes, entries: list[tuple[int, bytes]] | None) -> bytes:
    """The sequence state with its extension block replaced by one of ``entries`` (None: no block)."""
    rest = blob[SEQ_HEADER + ext_size(blob) :]
    if entries is None:
        return blob[:SEQ_HEADER] + rest
    data = b"".join(struct.pack("<II", i, len(d)) + d for i, d in entries)
    return blob[:SEQ_HEADER] + struct.pack("<III", EXT_TAG, 1, len(data)) + data + rest


def layout_entry(blob: bytes) -> tuple[int, bytes]:
    return EXT_LAYOUT, parse_ext_block(blob[SEQ_HEADER:])[1][EXT_LAYOUT]


def filled(model: RawModel, kv: int, n: int = 40, lazy: bool = False, n_seq: int = 1) -> RawContext:
    ctx = RawContext(model, kv, n_ctx=512, n_seq=n_seq, lazy=lazy)
    ctx.decode(random_tokens(1, n))
    return ctx


# ---------------------------------------------------------------- the block


@pytest.mark.parametrize("kv", [F16, Q8])
def test_a_plain_cache_writes_upstreams_state_and_a_lazy_cache_the_block(hd64: RawModel, kv: int) -> None:
    """A plain cache's state is upstream's: the stream count first, the rotation sizes (PR #28498), then the
    cells and rows, nothing else (the independent reader takes every byte); a lazy cache's starts with the
    block."""
    assert (llama_cpp.LLAMA_SESSION_VERSION, llama_cpp.LLAMA_STATE_SEQ_VERSION) == (11, 4)
    plain = filled(hd64, kv)
    blob = plain.seq_state(0)
    assert parse_ext_block(blob[SEQ_HEADER:]) == (0, {})
    assert struct.unpack_from("<III", blob, SEQ_HEADER) == (1, 0 if kv == F16 else 64, 0 if kv == F16 else 64)
    whole = plain.state()
    assert EXT_TAG.to_bytes(4, "little") not in whole
    arch, [cache] = parse_context_state(whole)
    assert arch == "llama" and cache.ext_version == 0 and len(cache.positions) == 40
    assert all(t.type == kv for t in cache.k + cache.v)

    lazy = filled(hd64, Q8, lazy=True)
    version, entries = parse_ext_block(lazy.seq_state(0)[SEQ_HEADER:])
    assert version == llama_cpp.LLAMA_STATE_EXT_VERSION == 1 and set(entries) == {EXT_LAYOUT, EXT_LAZY}
    assert struct.unpack("<iiI", entries[EXT_LAYOUT]) == (F16, F16, 2)  # its f16 phase


def test_a_lazy_cache_records_its_rung_and_a_compact_state_its_written_rung(smollm2_path: Path) -> None:
    ladder = make_llama(smollm2_path, "ladder", n_ctx=1024)
    ladder.eval(prompt_tokens(ladder))
    assert ladder.kv_lazy_info().phase == "f16"
    states = {rung: ladder.save_state(seq_id=0, rung=rung).llama_state for rung in (None, "q4_0")}
    for rung, written in ((None, F16), ("q4_0", Q4)):
        cache = parse_seq_state(states[rung])
        assert cache.lazy_rung == F16  # the rung when saved
        assert cache.type_k == written
        assert all(t.type == cache.type_k for t in cache.k + cache.v)  # the rows are what the block says
    with pytest.raises(ValueError, match="last rung"):
        ladder.save_state(seq_id=0, rung="q8_0")  # a middle rung the cells have not reached
    with pytest.raises(ValueError, match="sequence state"):
        ladder.save_state(rung="q4_0")
    assert ladder.kv_lazy_info().phase == "f16"  # the live cache is unchanged


def test_an_upstream_state_without_the_block_reads_as_upstream_reads_it(hd64: RawModel) -> None:
    src = filled(hd64, Q8)
    bare = with_block(src.seq_state(0), None)
    want = src.decode([7])
    assert struct.unpack_from("<I", bare, SEQ_HEADER)[0] == 1  # the stream count first: upstream's layout

    same = RawContext(hd64, Q8, n_ctx=512)
    assert check(same, bare, 0) == (llama_cpp.LLAMA_STATE_CHECK_OK, "")
    ok, err = same.set_seq_state(bare, 0)
    assert ok, err
    assert np.array_equal(same.decode([7]), want)  # bit for bit

    f16 = RawContext(hd64, F16, n_ctx=512)  # the rows say q8_0: not what an f16 cache reads
    rc, reason = check(f16, bare, 0)
    assert rc == llama_cpp.LLAMA_STATE_CHECK_REFUSED and "K/V type mismatch" in reason and "q8_0" in reason


def test_a_plain_f16_state_is_converted_by_a_lazy_cache_that_has_stepped(hd64: RawModel) -> None:
    """Upstream's state carries no block: a lazy cache on its q8_0 rung learns the rows' type from the rows
    themselves and converts them as it reads them (as it did when every state carried the block)."""
    src = filled(hd64, F16, n=40)
    blob = src.seq_state(0)
    lazy = RawContext(hd64, Q8, n_ctx=512, n_seq=2, lazy=True)
    lazy.decode(random_tokens(6, 300), seq_id=1)  # past the f16 view (256 cells): the q8_0 rung
    assert lazy.lazy_info().phase == "q8_0"
    assert check(lazy, blob, 0) == (llama_cpp.LLAMA_STATE_CHECK_OK, "")
    ok, err = lazy.set_seq_state(blob, 0)
    assert ok, err
    assert lazy.pos_max(0) == 39 and lazy.pos_max(1) == 299


def test_an_unknown_entry_is_skipped_unless_it_is_required(hd64: RawModel) -> None:
    src = filled(hd64, Q8, lazy=True)
    blob = src.seq_state(0)
    want = filled(hd64, Q8, lazy=True).decode([7])
    optional = with_block(blob, [(77, b"future"), layout_entry(blob), (78, b"")])
    required = with_block(blob, [layout_entry(blob), (79 | EXT_REQUIRED, b"window")])

    dst = RawContext(hd64, Q8, n_ctx=512, n_seq=2, lazy=True)
    assert check(dst, optional, 0) == (llama_cpp.LLAMA_STATE_CHECK_OK, "")
    ok, err = dst.set_seq_state(optional, 0)
    assert ok, err
    assert np.array_equal(dst.decode([7]), want)

    dst.decode(random_tokens(2, 10), seq_id=1)
    rc, reason = check(dst, required, 1)
    assert rc == llama_cpp.LLAMA_STATE_CHECK_REFUSED and "needs extension 79" in reason
    ok, err = dst.set_seq_state(required, 1)
    assert not ok and "needs extension 79" in err
    assert (dst.pos_max(0), dst.pos_max(1)) == (40, -1)  # only the destination was emptied


def test_a_state_of_the_layout_version_before_the_block_is_refused(hd64: RawModel) -> None:
    """The in-memory blobs carry no version: a state written by an earlier engine (the layout after
    the rotation sizes, not in the extension block) is refused by the new reader, never misread (the
    app re-reads such a snapshot's transcript, see tests/core/test_persistence.py)."""
    blob = filled(hd64, Q8, lazy=True).seq_state(0)
    type_k, type_v, n_layer = struct.unpack("<iiI", layout_entry(blob)[1])
    bare = with_block(blob, None)
    at = SEQ_HEADER + 12  # after the stream count and the rotation sizes
    old = bare[:at] + struct.pack("<iiI", type_k, type_v, n_layer) + bare[at:]
    dst = RawContext(hd64, Q8, n_ctx=512, lazy=True)
    rc, reason = check(dst, old, 0)
    assert rc == llama_cpp.LLAMA_STATE_CHECK_REFUSED and reason  # a cell or layer count that does not fit
    assert not dst.set_seq_state(old, 0)[0]


DAMAGES = {"tag": SEQ_HEADER, "block size": SEQ_HEADER + 8, "entry size": SEQ_HEADER + 16}


def damaged_block_verdict(model: RawModel, damage: str) -> dict[str, object]:
    """A lazy cache's sequence state with one field of its extension block overwritten: the engine's check
    and whether the restore went through."""
    blob = bytearray(filled(model, Q8, lazy=True).seq_state(0))
    struct.pack_into("<I", blob, DAMAGES[damage], 0x7FFFFFFF)
    dst = RawContext(model, Q8, n_ctx=512, lazy=True)
    rc, reason = check(dst, bytes(blob), 0)
    return {"rc": rc, "reason": reason, "restored": dst.set_seq_state(bytes(blob), 0)[0]}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_block_is_refused(hd64: RawModel, damage: str) -> None:
    """In a child process (this file run as a program): an abort fails this case, not the run."""
    proc = subprocess.run([sys.executable, "-m", "tests.native.test_state_format", str(hd64.path), damage],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, f"the child died (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    verdict = json.loads(proc.stdout.strip().splitlines()[-1])
    assert verdict["rc"] == llama_cpp.LLAMA_STATE_CHECK_REFUSED and verdict["reason"]
    assert not verdict["restored"]


# ---------------------------------------------------------------- the queries


def test_the_check_changes_nothing_where_a_refused_restore_empties_its_destination(hd64: RawModel) -> None:
    q8_state = filled(hd64, Q8, n=60).seq_state(0)
    ctx = RawContext(hd64, F16, n_ctx=512, n_seq=2)
    ctx.decode(random_tokens(3, 30), seq_id=0)
    ctx.decode(random_tokens(4, 20), seq_id=1)
    before = ctx.state()
    rc, reason = check(ctx, q8_state, 1)
    assert rc == llama_cpp.LLAMA_STATE_CHECK_REFUSED and "K/V type mismatch" in reason
    assert ctx.state() == before  # sequence 1 still holds its cells
    ok, err = ctx.set_seq_state(q8_state, 1)
    assert not ok and "K/V type mismatch" in err
    assert (ctx.pos_max(0), ctx.pos_max(1)) == (29, -1)


def test_the_check_counts_the_cells_a_sequence_restore_keeps(hd64: RawModel) -> None:
    """The same state fits an empty sequence and not one beside a long conversation: the engine
    knows the cells the restore keeps (the bindings cannot)."""
    state = filled(hd64, Q8, n=300).seq_state(0)
    ctx = RawContext(hd64, Q8, n_ctx=512, n_seq=2)
    assert check(ctx, state, 1)[0] == llama_cpp.LLAMA_STATE_CHECK_OK
    ctx.decode(random_tokens(5, 300), seq_id=0)
    rc, reason = check(ctx, state, 1)
    assert rc == llama_cpp.LLAMA_STATE_CHECK_REFUSED and "holds at most" in reason
    assert ctx.pos_max(0) == 299


def test_the_check_of_a_whole_context_state(smollm2_path: Path, gemma3_path: Path) -> None:
    smol = make_llama(smollm2_path, "q8_0")
    smol.eval(prompt_tokens(smol))
    whole = smol.save_state()
    assert smol.state_refusal(whole) is None
    gemma = make_llama(gemma3_path, "q8_0")
    data = whole.llama_state
    reason = ctypes.create_string_buffer(256)
    rc = llama_cpp.llama_state_check_data(gemma._ctx.ctx, data, len(data), reason, len(reason))
    assert rc == llama_cpp.LLAMA_STATE_CHECK_REFUSED and "wrong model arch" in reason.value.decode()
    rc = llama_cpp.llama_state_check_data(smol._ctx.ctx, data + b"\0", len(data) + 1, reason, len(reason))
    assert rc == llama_cpp.LLAMA_STATE_CHECK_REFUSED and "after its end" in reason.value.decode()


def test_the_rotation_of_a_rung_comes_from_the_engine(smollm2_path: Path, gemma3_path: Path) -> None:
    """Per cache, from each cache's own head size: Gemma-3's SWA cache rotates K by 256 like its base
    (head size 256 in both); SmolLM2 by 64. The f16 rung is unrotated; a plain cache has no rungs."""

    def rot(llm: llama_cpp.Llama) -> tuple[int, ...]:
        info = llm.kv_lazy_info()
        return info.rungs, (info.n_rot_k, info.n_rot_v, info.n_rot_k_swa, info.n_rot_v_swa)

    ladder = make_llama(smollm2_path, "ladder", n_ctx=1024)
    assert rot(ladder) == (("f16", "q8_0", "q4_0"), (64, 64, 0, 0))
    assert ladder.state_metadata()["n_rot_k"] == 0  # cells on the f16 rung are not rotated
    assert ladder.state_metadata(written_at="q4_0")["n_rot_k"] == 64
    assert rot(make_llama(smollm2_path, "q8_0")) == ((), (0, 0, 0, 0))  # a plain cache has no rungs
    assert make_llama(smollm2_path, "q8_0").state_metadata()["n_rot_k"] == 64  # but its cells are rotated
    gemma = make_llama(gemma3_path, "ladder", n_ctx=1024)
    assert rot(gemma) == (("f16", "q8_0", "q4_0"), (256, 64, 256, 64))
    gemma.eval(prompt_tokens(gemma))
    meta = gemma.save_state(seq_id=0, rung="q4_0").metadata
    assert (meta["n_rot_k"], meta["n_rot_v"], meta["n_rot_k_swa"], meta["n_rot_v_swa"]) == (256, 64, 256, 64)


def test_a_compact_state_is_converted_once(smollm2_path: Path) -> None:
    """Measuring a compact state (llama_state_seq_get_size) counts its converted rows, it does not
    convert them: the size costs nothing next to the data."""
    ladder = make_llama(smollm2_path, "ladder", n_ctx=2048)
    tokens = ladder.tokenize(b" ".join(b"word%d" % i for i in range(500)))[:500]
    ladder.eval(tokens)
    ctx = ladder._ctx.ctx
    compact = llama_cpp.LLAMA_STATE_SEQ_FLAGS_LAST_RUNG
    sizes, datas = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        size = llama_cpp.llama_state_seq_get_size_ext(ctx, 0, compact)
        sizes.append(time.perf_counter() - t0)
        buf = (ctypes.c_uint8 * size)()
        t0 = time.perf_counter()
        assert llama_cpp.llama_state_seq_get_data_ext(ctx, buf, size, 0, compact) == size
        datas.append(time.perf_counter() - t0)
    assert min(sizes) < 0.2 * min(datas), (sizes, datas)


if __name__ == "__main__":  # python -m tests.native.test_state_format MODEL DAMAGE (a damaged-block child)
    print(json.dumps(damaged_block_verdict(RawModel(Path(sys.argv[1])), sys.argv[2])))
