"""Property: any conversation the app can hold is stored and read back exactly (issue 24, the Hypothesis
tests): every plane of Unicode, private use, RTL, combining marks and NUL in its messages, title and
system prompt; its settings, reply figures and reply versions; through a reopened file and through an
export and import."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lazykv.core.chat.conversation import ReplyStats
from lazykv.core.history.records import clean_title, new_uid
from lazykv.core.history.store import Store

TEXT = st.text(st.characters(codec="utf-8"), max_size=120)  # any code point but unpaired surrogates
JSON_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), TEXT)
STATS = st.builds(ReplyStats, st.floats(0, 1e4), st.one_of(st.none(), st.floats(0, 1e6)),
                  st.integers(0, 10**9), st.text(st.characters(codec="utf-8"), max_size=30))  # fmt: skip


@st.composite
def conversations(draw: st.DrawFn) -> dict[str, Any]:
    messages = draw(st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                                                    "content": TEXT}), max_size=6))  # fmt: skip
    indices = st.sampled_from(range(len(messages)))
    return {
        "messages": messages,
        "title": draw(TEXT),
        "system_prompt": draw(TEXT),
        "settings": draw(st.dictionaries(st.text(max_size=12), JSON_VALUE, max_size=4)),
        "stats": draw(st.dictionaries(indices, STATS, max_size=3)) if messages else {},
        "versions": draw(st.dictionaries(indices, st.lists(TEXT, min_size=2, max_size=3), max_size=2))
        if messages else {},
    }


@settings(max_examples=35, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chats=st.lists(conversations(), min_size=1, max_size=3))
def test_a_store_save_load_round_trip_of_arbitrary_conversations(chats: list[dict[str, Any]]) -> None:
    folder = Path(tempfile.mkdtemp(prefix="lazykv-roundtrip-"))
    try:
        store = Store(folder / "c.sqlite3", folder / "snapshots")
        ids = [store.sync_transcript(new_uid(), c["messages"], 0, title=c["title"],
                                     system_prompt=c["system_prompt"], settings=c["settings"], create=True,
                                     stats=c["stats"], versions=c["versions"]).id for c in chats]  # fmt: skip
        store.close()
        store = Store(folder / "c.sqlite3", folder / "snapshots")  # read back from the file
        try:
            for conv_id, chat in zip(ids, chats, strict=True):
                record = store.conversation(conv_id)
                assert record.messages == chat["messages"]
                assert record.title == clean_title(chat["title"])
                assert record.system_prompt == chat["system_prompt"]
                assert record.settings == chat["settings"]
                assert record.stats == chat["stats"]
                assert record.versions == chat["versions"]
                again = store.import_json(store.export_json(conv_id))
                copy = store.conversation(again.id)
                assert copy.messages == chat["messages"] and copy.title == record.title
                assert copy.system_prompt == chat["system_prompt"]
            listed = {summary.id for summary in store.list_conversations()}
            assert set(ids) <= listed
        finally:
            store.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
