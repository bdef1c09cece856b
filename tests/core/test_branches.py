"""A branch's cache from its parent's (real engine), and the snapshots' shared pieces."""

from __future__ import annotations

import ctypes
import dataclasses
import json
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from lazykv.core.engine.engine import EngineSession
from lazykv.core.history import pieces
from lazykv.core.history.branches import CHECKPOINT_NOTE, open_branch
from lazykv.core.history.persistence import OpenHow
from lazykv.core.history.records import new_uid
from lazykv.core.history.snapshot import (
    WHOLE_STATE_VERSION,
    SnapshotHeader,
    write_snapshot,
)
from tests.core.test_persistence import App

TOPICS = ["tulips", "roses", "basil", "apple trees", "tomatoes", "lavender", "ferns", "cacti"]


def transcript(n_turns: int, words: int = 40) -> list[dict[str, str]]:
    out = []
    for i in range(n_turns):
        topic = TOPICS[i % len(TOPICS)]
        out.append({"role": "user", "content": f"Tell me about {topic}, please ({i})."})
        text = " ".join(f"{topic} need care {j}." for j in range(words))
        out.append({"role": "assistant", "content": text})
    return out


def next_logits(engine: EngineSession, token: int) -> np.ndarray:
    llama = engine._llama
    assert llama is not None
    llama.eval([token])
    ptr = llama_cpp.llama_get_logits_ith(llama.ctx, -1)
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), (llama.n_vocab(),)).copy()


def create(app: App, messages: list[dict[str, str]]) -> int:
    return app.store.sync_transcript(new_uid(), messages, 0, create=True).id


@pytest.fixture
def app(tmp_path: Path, smollm2_path: Path):
    app = App(tmp_path, smollm2_path, "lazy", n_ctx=4096)
    yield app
    app.close()


def test_a_branch_opens_from_its_parents_snapshot_bit_for_bit_and_shares_its_pieces(app: App) -> None:
    parent = transcript(4)
    probe = app.engine.tokenize(" Also")[-1]
    # the parent as it was at the branch point (two messages in), then read to its end
    app.engine.rebuild_kv(parent[:2], lambda d, t: None)
    assert app.engine.kv_status().phase == "f16"  # before the lazy cache's first step
    expected = next_logits(app.engine, probe)
    app.engine.sync_kv(parent)
    assert app.engine.kv_status().phase == "f16"  # still: the cells kept are the ones read then
    parent_id = create(app, parent)
    parent_saved = app.persistence.save(parent_id, parent)
    branch_id = create(app, parent[:2])
    app.engine.clear_kv()

    result = open_branch(app.persistence, parent_id, parent, branch_id, 2, lambda d, t: None)

    assert result.how is OpenHow.RESTORED, result.note
    assert result.n_tokens == len(app.engine.transcript_tokens(parent[:2]))
    assert np.array_equal(next_logits(app.engine, probe).view(np.uint32), expected.view(np.uint32))
    saved = result.saved
    assert saved is not None
    # the branch wrote only its own pieces: its cells are the parent's first ones, layer by layer
    assert saved.written < saved.size / 2
    stored = app.db.call(lambda s: s.stored_bytes())
    assert stored < parent_saved.size + saved.size - saved.size / 2
    # deleting the parent (and erasing what it left) keeps every piece the branch holds
    deleted = app.store.delete(parent_id)
    app.store.erase(deleted.record)
    app.engine.clear_kv()
    assert app.persistence.open(branch_id, parent[:2], lambda d, t: None).how is OpenHow.RESTORED
    left = {p.file for p in app.store.conversation(branch_id).snapshot.pieces}
    assert {p.name for p in (app.db.snapshots_dir / "pieces").iterdir()} == left


def test_a_branch_of_the_open_parent_takes_the_live_cache(app: App) -> None:
    parent = transcript(3)
    app.engine.rebuild_kv(parent, lambda d, t: None)
    parent_id, branch_id = create(app, parent), create(app, parent[:4])
    result = open_branch(app.persistence, parent_id, parent, branch_id, 4, lambda d, t: None, live=True)
    assert result.how is OpenHow.RESTORED and result.saved is not None
    assert app.engine.cached_tokens() == app.engine.transcript_tokens(parent[:4])


def test_a_parent_cache_that_dropped_its_oldest_turns_is_re_read_and_says_so(app: App) -> None:
    parent = transcript(3)
    app.engine.rebuild_kv(parent[2:], lambda d, t: None)  # what "drop oldest" leaves in the cache
    parent_id, branch_id = create(app, parent), create(app, parent[:4])
    result = open_branch(app.persistence, parent_id, parent, branch_id, 4, lambda d, t: None, live=True)
    assert result.how is OpenHow.REBUILT and "oldest turns were dropped" in result.note
    assert app.engine.cached_tokens() == app.engine.transcript_tokens(parent[:4])


def test_a_snapshot_saved_whole_before_pieces_still_opens(app: App) -> None:
    """A format-3 snapshot (the whole state in one file, the row without pieces) is read as before."""
    messages = transcript(1)
    app.engine.rebuild_kv(messages, lambda d, t: None)
    conv = create(app, messages)
    kv = app.engine.capture_kv()
    saved = app.persistence.save(conv, messages)  # for a current header, then replaced by a format-3 file
    header = dataclasses.replace(
        SnapshotHeader.from_bytes(json.dumps(json.loads(app.store.conversation(conv).snapshot.header_json),
                                             sort_keys=True, separators=(",", ":")).encode()),
        format_version=WHOLE_STATE_VERSION, encryption="none")
    path = app.db.snapshots_dir / "old.lkv"
    sha = write_snapshot(path, header, kv.tokens, kv.state, None)
    path.rename(app.db.snapshots_dir / f"{sha}.lkv")
    app.store.set_snapshot(conv, sha, 1, len(kv.tokens), json.dumps(dataclasses.asdict(header)))
    assert saved.sha256 != sha and app.store.conversation(conv).snapshot.pieces == ()
    assert not list((app.db.snapshots_dir / "pieces").iterdir())  # the pieces only it held went with it
    app.engine.clear_kv()
    app.persistence.set_crypto(None)
    from lazykv.core.history.persistence import Crypto

    app.persistence.set_crypto(Crypto("none"))
    assert app.persistence.open(conv, messages, lambda d, t: None).how is OpenHow.RESTORED
    assert app.engine.cached_tokens() == kv.tokens


def test_a_sliding_window_model_branches_exactly_anywhere_live_and_at_the_end_from_its_snapshot(
        tmp_path: Path, gemma3_path: Path) -> None:
    app = App(tmp_path, gemma3_path, "f16", n_ctx=2048)
    try:
        parent = transcript(7, words=30)  # past gemma-3's window (512) and the cells its snapshot keeps
        probe = app.engine.tokenize(" Also")[-1]
        app.engine.rebuild_kv(parent[:2], lambda d, t: None)
        expected = next_logits(app.engine, probe)
        app.engine.sync_kv(parent)
        assert app.engine.kv_status().n_cells_used > 1100
        parent_id = create(app, parent)
        app.persistence.save(parent_id, parent)
        # the open parent's window-sized cache went back to its checkpoint at message 2: exact far back
        live = create(app, parent[:2])
        result = open_branch(app.persistence, parent_id, parent, live, 2, lambda d, t: None, live=True)
        assert result.how is OpenHow.RESTORED, result.note
        assert np.array_equal(next_logits(app.engine, probe).view(np.uint32), expected.view(np.uint32))
        # its snapshot (a sequence state) keeps the window's last cells and the window checkpoints the
        # parent took (message 2's end, where it was read to first): a branch at its last message or at
        # message 2 is exact; one at message 4 reads again from message 2's checkpoint, and says so
        near, far, between = create(app, parent), create(app, parent[:2]), create(app, parent[:4])
        app.engine.clear_kv()
        result = open_branch(app.persistence, parent_id, parent, near, len(parent), lambda d, t: None)
        assert result.how is OpenHow.RESTORED, result.note
        result = open_branch(app.persistence, parent_id, parent, far, 2, lambda d, t: None)
        assert result.how is OpenHow.RESTORED, result.note
        assert np.array_equal(next_logits(app.engine, probe).view(np.uint32), expected.view(np.uint32))
        result = open_branch(app.persistence, parent_id, parent, between, 4, lambda d, t: None)
        tokens = app.engine.transcript_tokens(parent[:4])
        read = len(tokens) - len(app.engine.transcript_tokens(parent[:2]))
        assert result.how is OpenHow.REBUILT and result.n_tokens == read
        assert result.note == CHECKPOINT_NOTE.format(n=read)
        assert app.engine.cached_tokens() == tokens
    finally:
        app.close()


# --- the pieces themselves (no engine) -------------------------------------------------------------


def test_a_shared_run_at_another_offset_shares_its_pieces() -> None:
    rng = np.random.default_rng(1)
    run = rng.integers(0, 256, 600_000, dtype=np.uint8).tobytes()
    a = b"head-a" + run + rng.integers(0, 256, 30_000, dtype=np.uint8).tobytes()
    b = rng.integers(0, 256, 12_345, dtype=np.uint8).tobytes() + run + b"tail"
    key = pieces.address_key(bytes(32), b"test")
    pa, pb = pieces.split(a, key), pieces.split(b, key)
    assert all(pieces.MIN_PIECE <= p.end - p.start <= pieces.MAX_PIECE for p in pa[:-1])
    shared = {p.address for p in pa} & {p.address for p in pb}
    shared_bytes = sum(p.end - p.start for p in pa if p.address in shared)
    assert shared_bytes > len(run) - 3 * pieces.MAX_PIECE


@pytest.mark.parametrize("key", [None, bytes(range(32))])
def test_a_piece_swapped_damaged_or_under_another_key_is_refused(tmp_path: Path, key: bytes | None) -> None:
    data = [np.random.default_rng(i).integers(0, 256, 10_000, dtype=np.uint8).tobytes() for i in range(2)]
    addr = [pieces.address(None if key is None else b"k" * 32, d) for d in data]
    for i in range(2):
        pieces.write_piece(tmp_path, f"{i}", addr[i], data[i], key)
    entries = [(addr[0], len(data[0])), (addr[1], len(data[1]))]
    out = pieces.assemble(entries, lambda a: pieces.Location(tmp_path / str(addr.index(a)), key))
    assert bytes(out) == data[0] + data[1]
    with pytest.raises(pieces.PieceError):  # the other piece's file in its place
        pieces.assemble(entries, lambda a: pieces.Location(tmp_path / "1", key))
    raw = bytearray((tmp_path / "0").read_bytes())
    raw[len(raw) // 2] ^= 4
    (tmp_path / "0").write_bytes(raw)
    with pytest.raises(pieces.PieceError):
        pieces.assemble(entries, lambda a: pieces.Location(tmp_path / str(addr.index(a)), key))
    if key is not None:
        with pytest.raises(pieces.PieceError):
            pieces.assemble(entries[1:], lambda a: pieces.Location(tmp_path / "1", bytes(32)))
