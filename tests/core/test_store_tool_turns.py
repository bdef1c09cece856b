"""Tool turns in the history: saved and opened again (plain and encrypted), exported and imported (JSON,
Markdown shown as text), an older app's export and database still read, a snapshot bound to the calls."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from lazykv.core.chat.conversation import Conversation
from lazykv.core.history import connection
from lazykv.core.history.keys import database_key
from lazykv.core.history.records import loaded, new_uid
from lazykv.core.history.snapshot import transcript_digest
from lazykv.core.history.store import Store
from lazykv.core.kinds import ToolStatus

ARGS = '{"query": "<script>alert(1)</script>", "limit": 3}'
CALL = {"id": "call_1", "type": "function", "function": {"name": "web__search", "arguments": ARGS}}
OUTPUT = "<b>not bold</b> ```fence``` [link](https://example.com)"


def _conversation() -> Conversation:
    c = Conversation("Use tools.")
    c.add("user", "Search for it")
    c.add_tool_calls("", [CALL])
    c.add_tool_result("call_1", "web__search", OUTPUT, ToolStatus.ERROR, truncated=True)
    c.add("assistant", "The search failed.")
    return c


def _saved(store: Store, c: Conversation) -> int:
    return store.sync_transcript(new_uid(), c.turns(), 0, system_prompt=c.system_prompt, create=True).id


@pytest.mark.parametrize("key", [None, database_key(bytes(range(32)))], ids=["plain", "encrypted"])
def test_tool_turns_survive_save_and_reopen(tmp_path: Path, key: bytes | None) -> None:
    c = _conversation()
    store = Store(tmp_path / "c.sqlite3", tmp_path / "snaps", key=key)
    conv_id = _saved(store, c)
    store.close()
    store = Store(tmp_path / "c.sqlite3", tmp_path / "snaps", key=key)
    try:
        record = store.conversation(conv_id)
        assert record.messages == c.turns()
        opened = loaded(record)
        assert opened.messages == c.messages()  # what a resume sends: OpenAI's shape, no app keys
        assert opened.conversation.turns()[2]["tool"] == {"status": "error", "truncated": True,
                                                          "server": "web", "tool": "search"}
        # a later sync appends after the tool turns: they compare equal to what was stored
        opened.conversation.add("user", "Try again")
        synced = store.sync_transcript(record.uid, opened.conversation.turns(), len(record.messages))
        assert not synced.merged and len(synced.messages) == 5
        assert [s.id for s in store.search("alert")] == []  # arguments are not message text
        assert [s.id for s in store.search("bold")] == [conv_id]  # a tool's output is
    finally:
        store.close()


def test_a_damaged_tool_field_reads_as_none_and_the_conversation_opens(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.sqlite3", tmp_path / "snaps")
    try:
        conv_id = _saved(store, _conversation())
        store._db.execute("UPDATE messages SET tool_fields = 'not json' WHERE role = 'tool'")
        store._db.execute("UPDATE messages SET tool_fields = '{\"tool_calls\": 5}' WHERE seq = 1")
        messages = store.conversation(conv_id).messages
        assert messages[1] == {"role": "assistant", "content": ""}
        assert messages[2] == {"role": "tool", "content": OUTPUT, "tool_call_id": "", "name": ""}
        assert len(loaded(store.conversation(conv_id)).conversation) == 4
    finally:
        store.close()


def test_export_and_import_keep_tool_turns(tmp_path: Path) -> None:
    c = _conversation()
    store = Store(tmp_path / "c.sqlite3", tmp_path / "snaps")
    try:
        exported = store.export_json(_saved(store, c))
        assert exported["version"] == 3
        again = json.loads(json.dumps(exported))
        imported = store.import_json(again).id
        assert store.conversation(imported).messages == c.turns()
        older = {**again, "version": 2, "uid": new_uid()}
        with pytest.raises(ValueError, match="message 2: tool calls and results are read from version 3"):
            store.import_json(older)
        older["messages"] = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
        assert store.conversation(store.import_json(older).id).messages == older["messages"]
        bad = {**again, "uid": new_uid(), "messages": [*again["messages"][:2],
                                                       {**again["messages"][2], "tool": {"status": "x"}}]}
        with pytest.raises(ValueError, match="message 3: tool must have exactly the fields"):
            store.import_json(bad)
    finally:
        store.close()


def test_markdown_shows_the_call_and_its_result_as_text(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.sqlite3", tmp_path / "snaps")
    try:
        text = store.export_markdown(_saved(store, _conversation()))
    finally:
        store.close()
    assert "**Tool call:** `web › search` (id `call_1`)" in text
    assert '```json\n{\n  "query": "<script>alert(1)</script>",\n  "limit": 3\n}\n```' in text
    assert "## Tool result: `web › search`\n\n_the tool failed · output cut to fit_" in text
    assert f"````text\n{OUTPUT}\n````" in text  # a fence longer than the output's own
    assert text.index("## User") < text.index("Tool call") < text.index("Tool result") < text.index(
        "The search failed.")


def test_a_version_9_database_is_migrated_keeping_its_conversations_and_search(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    for step in range(9):
        connection.MIGRATIONS[step](db)
    db.execute("PRAGMA user_version = 9")
    db.execute("INSERT INTO conversations (uid, title, created, updated) VALUES (?, 'Old', 1, 2)",
               ("a" * 32,))
    db.executemany("INSERT INTO messages (conv_id, seq, role, content, stats, versions, markers)"
                   " VALUES (1, ?, ?, ?, ?, ?, ?)",
                   [(0, "user", "Tell me about pelicans", None, None, None),
                    (1, "assistant", "Pelicans fish", None, '["Birds", "Pelicans fish"]', '[[3, "step"]]')])
    with pytest.raises(sqlite3.IntegrityError):  # before: no tool role
        db.execute("INSERT INTO messages (conv_id, seq, role, content) VALUES (1, 2, 'tool', 'x')")
    db.close()
    store = Store(path, tmp_path / "snaps")
    try:
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == connection.SCHEMA_VERSION == 10
        record = store.conversation(1)
        assert record.messages == [{"role": "user", "content": "Tell me about pelicans"},
                                   {"role": "assistant", "content": "Pelicans fish"}]
        assert record.versions == {1: ["Birds", "Pelicans fish"]} and record.markers == {1: [(3, "step")]}
        assert [s.id for s in store.search("pelicans")] == [1]
        c = loaded(record).conversation
        c.add("user", "Search")
        c.add_tool_calls("", [CALL])
        c.add_tool_result("call_1", "web__search", "flamingo facts")
        store.sync_transcript(record.uid, c.turns(), 2)
        assert store.conversation(1).messages == c.turns()
        assert [s.id for s in store.search("flamingo")] == [1]
        store.sync_transcript(record.uid, c.turns()[:2], 5)  # taken back: the index follows the rows
        assert store.search("flamingo") == [] and [s.id for s in store.search("pelicans")] == [1]
    finally:
        store.close()


def test_a_snapshot_is_bound_to_the_tool_calls_and_old_digests_stay() -> None:
    plain = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    canonical = json.dumps([["user", "Hi"], ["assistant", "Hello"]], separators=(",", ":"))
    assert transcript_digest(plain) == hashlib.sha256(canonical.encode()).hexdigest()  # as saved before
    messages = _conversation().messages()
    other = json.loads(json.dumps(messages))
    other[2]["tool_calls"][0]["function"]["arguments"] = "{}"
    assert transcript_digest(messages) != transcript_digest(other)
    reordered = [{**m, "tool_calls": [{"function": CALL["function"], "type": "function", "id": "call_1"}]}
                 if "tool_calls" in m else m for m in messages]
    assert transcript_digest(reordered) == transcript_digest(messages)  # key order does not count
