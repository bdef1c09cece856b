"""EngineSession.stream_continue: a reply cut off goes on where it stopped (issue 30, friction), on the
real engine."""

from __future__ import annotations

import threading
from pathlib import Path

from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.types import SamplingSettings
from lazykv.core.kinds import FinishReason, KvMode

GREEDY = SamplingSettings(temperature=0.0, seed=1)


def _run(stream):  # noqa: ANN001, ANN202 - a reply generator
    pieces = []
    while True:
        try:
            pieces.append(next(stream))
        except StopIteration as end:
            return "".join(pieces), end.value


def test_a_cut_reply_goes_on_as_if_it_had_not_been_cut(smollm2_path: Path) -> None:
    s = EngineSession()
    try:
        s.load(LoadSpec(smollm2_path, n_ctx=512, kv_mode=KvMode.LAZY, kv_recent=0))
        user = [{"role": "user", "content": "Count from one to twenty in words, separated by commas."}]
        whole, _ = _run(s.stream_reply(user, GREEDY, threading.Event(), max_tokens=24))
        cut, result = _run(s.stream_reply(user, GREEDY, threading.Event(), max_tokens=8))
        assert result.finish_reason is FinishReason.LENGTH and whole.startswith(cut)
        rest, more = _run(s.stream_continue([*user, {"role": "assistant", "content": cut}], GREEDY,
                                            threading.Event(), max_tokens=16))
        assert rest and more.n_reused > 0  # the conversation so far was in the cache
        assert (cut + rest)[:40] == whole[:40]  # greedy: the same words as the uncut reply
    finally:
        s.close()
