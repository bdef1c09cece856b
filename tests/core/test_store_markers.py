"""The lines where the KV cache took a step ("Context compacted to 8-bit here") are stored with their
conversation and come back where they were (issue 45, defect 8): a store round trip, what a rewritten
message takes with it, a branch, undo of a delete, the Markdown export, and the migration from v7."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from lazykv.core.chat.conversation import Conversation, Marker, ReplyStats
from lazykv.core.history import connection
from lazykv.core.history.records import loaded, new_uid
from lazykv.core.history.store import Store

HI = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"},
      {"role": "user", "content": "Again"}, {"role": "assistant", "content": "Hello again"}]
STEP = "Context compacted to 8-bit here (at token 144)"
IN_REPLY = "Context compacted to 4-bit during this reply (at token 160)"
STATS_JSON = '{"ttft_s": 0.5, "tokens_per_s": 9.0, "n_tokens": 3}'


def test_markers_are_stored_with_their_messages_and_come_back_where_they_were(store: Store) -> None:
    uid = new_uid()
    markers = {0: [(2, STEP)], 3: [(5, "inside"), (11, IN_REPLY)]}
    conv_id = store.sync_transcript(uid, HI, 0, create=True, markers=markers).id
    record = store.conversation(conv_id)
    assert record.markers == markers
    assert loaded(record).conversation.markers() == [Marker(0, 2, STEP), Marker(3, 5, "inside"),
                                                     Marker(3, 11, IN_REPLY)]
    store.sync_transcript(uid, HI, 4)  # a save that does not say (None): the stored ones stay
    assert store.conversation(conv_id).markers == markers
    store.sync_transcript(uid, HI, 4, markers={3: [(11, IN_REPLY)]})  # the caller's are the truth
    assert store.conversation(conv_id).markers == {3: [(11, IN_REPLY)]}
    regenerated = [*HI[:3], {"role": "assistant", "content": "Hey"}]  # the reply rewritten: its go
    store.sync_transcript(uid, regenerated, 4, markers={})
    assert store.conversation(conv_id).markers == {}


def test_a_rewritten_reply_takes_its_markers_with_it_and_a_system_message_keeps_the_turns_right(
    store: Store,
) -> None:
    uid = new_uid()
    conv_id = store.sync_transcript(uid, HI, 0, create=True, markers={1: [(11, STEP)], 3: [(11, "x")]}).id
    store.sync_transcript(uid, [*HI[:3], {"role": "assistant", "content": "Other"}], 4)  # no markers said
    assert store.conversation(conv_id).markers == {1: [(11, STEP)]}  # the old reply's row went
    system = [{"role": "system", "content": "Be brief"}, *HI]
    other = store.sync_transcript(new_uid(), system, 0, create=True, markers={2: [(11, STEP)]}).id
    assert loaded(store.conversation(other)).conversation.markers() == [Marker(1, 11, STEP)]


def test_a_damaged_value_reads_as_none_and_the_conversation_still_opens(store: Store) -> None:
    conv_id = store.sync_transcript(new_uid(), HI, 0, create=True, markers={1: [(11, STEP)]}).id
    for damaged in ("not json", '{"a": 1}', '[[-1, "x"], [1]]', '[["1", "x"]]'):
        store._db.execute("UPDATE messages SET markers = ? WHERE seq = 1", (damaged,))
        assert store.conversation(conv_id).markers == {}
    store._db.execute("""UPDATE messages SET markers = '[[3, "kept"], [2, 5]]' WHERE seq = 1""")
    assert store.conversation(conv_id).markers == {1: [(3, "kept")]}


def test_a_branch_and_an_undone_delete_keep_the_markers(store: Store) -> None:
    uid = new_uid()
    conv_id = store.sync_transcript(uid, HI, 0, create=True, markers={1: [(11, STEP)]}).id
    branch = store.create_branch(new_uid(), uid, HI[:2], markers={1: [(11, STEP)]}).id
    assert store.conversation(branch).markers == {1: [(11, STEP)]}
    restored = store.undelete(store.delete(conv_id).record).id
    assert store.conversation(restored).markers == {1: [(11, STEP)]}


def test_the_markdown_export_has_each_marker_as_a_line_where_it_was(store: Store) -> None:
    reply = "First line\n```\ncode\n```\nLast line"
    messages = [HI[0], {"role": "assistant", "content": reply}]
    markers = {0: [(2, STEP)], 1: [(14, IN_REPLY), (len(reply), "Under the reply")]}
    conv_id = store.sync_transcript(new_uid(), messages, 0, create=True, markers=markers).id
    text = store.export_markdown(conv_id)
    assert f"## User\n\nHi\n\n_{STEP}_\n\n## Assistant" in text
    # inside a code block: after it, not inside it
    assert f"First line\n```\ncode\n```\n\n_{IN_REPLY}_\n\nLast line\n\n_Under the reply_\n" in text


def test_a_conversation_shown_after_a_reopen_has_the_markers_a_conversation_had(store: Store) -> None:
    """From the Conversation the window holds to the one it opens: same turns, same markers."""
    conversation = Conversation()
    conversation.add("user", "Hi")
    conversation.add_marker(0, 2, STEP)
    conversation.add("assistant", "Hello there")
    conversation.add_marker(1, 11, IN_REPLY)
    conv_id = store.sync_transcript(new_uid(), conversation.turns(), 0, create=True,
                                    markers=conversation.markers_by_turn()).id
    assert loaded(store.conversation(conv_id)).conversation.markers() == conversation.markers()
    assert conversation.add_marker(1, 11, IN_REPLY) is None  # the same line is not added twice
    assert conversation.markers() == [Marker(0, 2, STEP), Marker(1, 11, IN_REPLY)]


def test_a_version_7_database_gets_the_markers_column_and_keeps_every_conversation(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    for step in range(7):
        connection.MIGRATIONS[step](db)
    db.execute("PRAGMA user_version = 7")
    for n in range(1, 4):
        db.execute("INSERT INTO conversations (uid, title, created, updated, parent_uid, parent_title,"
                   " branch_at) VALUES (?, ?, 1, 2, ?, ?, ?)",
                   (f"{n:032x}", f"Chat {n}", *((f"{1:032x}", "Chat 1", 1) if n == 3 else (None,) * 3)))
        db.executemany("INSERT INTO messages (conv_id, seq, role, content, stats, versions)"
                       " VALUES (?, ?, ?, ?, ?, ?)",
                       [(n, 0, "user", f"Hi {n}", None, None),
                        (n, 1, "assistant", f"Hello {n}", STATS_JSON, f'["Hey {n}", "Hello {n}"]')])
    db.close()
    store = Store(path, tmp_path / "snaps")
    try:
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == connection.SCHEMA_VERSION == 10
        assert [s.title for s in store.list_conversations()] == ["Chat 3", "Chat 2", "Chat 1"]
        for n in range(1, 4):
            record = store.conversation(n)
            assert [m["content"] for m in record.messages] == [f"Hi {n}", f"Hello {n}"]
            assert record.stats == {1: ReplyStats(0.5, 9.0, 3)}
            assert record.versions == {1: [f"Hey {n}", f"Hello {n}"]}
            assert record.markers == {}
        assert store.conversation(3).branch is not None and store.conversation(3).branch.parent_id == 1
        store.sync_transcript(f"{2:032x}", store.conversation(2).messages, 2, markers={1: [(7, STEP)]})
        assert store.conversation(2).markers == {1: [(7, STEP)]}
    finally:
        store.close()
