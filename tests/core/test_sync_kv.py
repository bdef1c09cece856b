"""EngineSession.sync_kv: the cache holds the conversation on screen when it changed without a reply
(another version of the last reply chosen; issue 30, defect 5), on the real engine."""

from __future__ import annotations

from pathlib import Path

from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.kinds import KvMode
from tests.core.test_engine_snapshot import reply


def test_sync_keeps_the_common_prefix_reads_the_version_shown_and_the_next_reply_reuses_it(
    smollm2_path: Path,
) -> None:
    s = EngineSession()
    try:
        s.load(LoadSpec(smollm2_path, n_ctx=512, kv_mode=KvMode.LAZY, kv_recent=0))
        user = [{"role": "user", "content": "Name a colour."}]
        text, _ = reply(s, user)
        before = s.cached_tokens()
        shown = [*user, {"role": "assistant", "content": "Blue, the colour of a clear sky over the sea."}]

        read = s.sync_kv(shown)

        cached = s.cached_tokens()
        prompt = s.chat_prompt([*shown, {"role": "user", "content": "Why?"}]).tokens
        assert cached == prompt[: len(cached)]  # the version shown, and nothing of the other one
        assert 0 < read < len(cached) and cached[:10] == before[:10]  # the prefix was kept, not re-read
        assert s.kv_status().n_cells_used == len(cached)
        _, reused = reply(s, [*shown, {"role": "user", "content": "Why?"}])
        assert reused == len(cached)
        assert text
    finally:
        s.close()
