"""A sliding-window model's state restored from a snapshot holds only the window's last cells of its
sliding layers. A prompt that keeps less of it than the window needs (a regenerated reply, an edited
message, an API request that shares only part of a saved prefix) must not reuse the cut cache: the next
token would attend through a window with holes. The engine re-reads instead, and the reply is the one a
fresh context gives."""

from __future__ import annotations

from pathlib import Path

from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from tests.core.test_window_checkpoints import TEXT, reply
from tests.native.rawctx import engine_threads


def test_a_cut_past_a_restored_window_is_read_again_not_reused(gemma3_path: Path) -> None:
    spec = LoadSpec(gemma3_path, n_ctx=2048, kv_mode="f16", n_threads=engine_threads())
    saved, fresh = EngineSession(), EngineSession()
    saved.load(spec)
    fresh.load(spec)
    try:
        tokens = saved.tokenize(TEXT.read_text())[:1400]
        reply(saved, tokens, 8)  # the parent: 1,400 tokens read, a reply
        snapshot = saved.capture_kv()
        saved.clear_kv()
        saved.restore_kv(snapshot.tokens, snapshot.state)
        shorter = tokens[:1000]  # 400 tokens back: the window's first cells are gone
        text, n_reused = reply(saved, shorter, 8)
        assert n_reused == 0  # read again, not reused with holes in the window
        assert (text, 0) == reply(fresh, shorter, 8)
        # within the window a cut is kept: the restored cache's own prompt, from its last token
        saved.clear_kv()
        saved.restore_kv(snapshot.tokens, snapshot.state)
        assert reply(saved, snapshot.tokens, 8)[1] == len(snapshot.tokens)
    finally:
        saved.close()
        fresh.close()
